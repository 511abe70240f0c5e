"""Command-line overrides: `section.key=value` words, read as YAML scalars and applied on top of a file."""

from __future__ import annotations

import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from components.common import secrets
from pipelines._yaml_forms import ambiguous_form
from pipelines.config._errors import ConfigError
from pipelines.config._schema import SECTIONS


def parse_overrides(items: typing.Iterable[str]) -> dict[str, Any]:
    """Parses `section.key=value` command-line overrides; values are read as YAML scalars.

    `eval.max_samples=4` → {"eval.max_samples": 4}; `swift.lora_rank=16`, `data.train=gs://b/x`,
    `vertex.labels={team: vision}` (a YAML flow mapping) work the same way.

    Raises:
        ConfigError: An item without `=`, or a key that is not `section.key`.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*", key):
            raise ConfigError(
                f"override {secrets.redact(repr(item))}: expected section.key=value (e.g. eval.max_samples=4 or "
                "swift.lora_rank=16)"
            )
        try:
            value = yaml.safe_load(text) if text.strip() else ""
            form = ambiguous_form(yaml.compose(text, Loader=yaml.SafeLoader)) if text.strip() else None
        except (yaml.YAMLError, ValueError) as exc:  # ValueError: a date that is none (2026-13-01), a huge number
            first = secrets.redact(str(exc).splitlines()[0])
            raise ConfigError(f"override {secrets.redact(repr(item))}: the value is not YAML ({first})") from None
        if form:
            raise ConfigError(f"override {key}={secrets.redact(form[2])}: the value is {form[3]}")
        out[key] = value
    return out


def apply_overrides(raw: dict[str, Any], overrides: Mapping[str, Any] | None, path: Path) -> dict[str, Any]:
    """Writes `overrides` into the file's data `raw` (in place), each value as the schema wants it.

    Args:
        raw: The config file's data, a mapping of sections.
        overrides: {"section.key": value} (`parse_overrides`), or None.
        path: The config file, for the message.

    Returns:
        {"section.key": value} as applied (numbers read from text, `override_value`).

    Raises:
        ConfigError: An override into a section of the file that is not a mapping.
    """
    overridden = dict(overrides or {})
    for key, value in overridden.items():
        section, name = key.split(".", 1)
        if not isinstance(raw.get(section, {}), dict):
            raise ConfigError(f"override {key}: section '{section}' of {path} is not a mapping")
        overridden[key] = value = override_value(section, name, value)
        raw[section] = {**(raw.get(section) or {}), name: value}
    return overridden


def override_of(key: str, overridden: Mapping[str, Any]) -> str:
    """The override `key` (or a key under it, `register.serving_env.X`) came from, else `key`."""
    return next((k for k in overridden if key == k or key.startswith(k + ".")), key)


_NUMBER_TEXT = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def override_value(section: str, name: str, value: Any) -> Any:
    """An override's value as the schema wants it: number-like text becomes a number where a number is wanted.

    YAML 1.1 reads `1e-4` (no dot) as text; on the command line users write it so. Text that
    is a number becomes a float where the field is a number (an integer when it is a whole
    number and the field an integer), and in `swift` (ms-swift's numeric arguments). Text
    elsewhere (a name, a path) stays text.

    Args:
        section: The override's section, e.g. "swift".
        name: The key in it, e.g. "learning_rate".
        value: The value `parse_overrides` read.

    Returns:
        The value, converted or unchanged.
    """
    if not (isinstance(value, str) and _NUMBER_TEXT.fullmatch(value.strip())):
        return value
    number = float(value)
    if section == "swift":
        return int(number) if number.is_integer() and "e" not in value.lower() and "." not in value else number
    cls = SECTIONS.get(section)
    field_type = typing.get_type_hints(cls).get(name) if cls else None
    if field_type is float:
        return number
    if field_type is int and number.is_integer():
        return int(number)
    return value
