"""`load_config`: a config file (and its overrides) read, built into a `Config` and checked."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.common import secrets
from components.train_lora.job_env import JobEnvError, check_job_env
from pipelines._config_secrets import secret_problem
from pipelines.config._checks import check_config
from pipelines.config._errors import ConfigError, Where
from pipelines.config._overrides import apply_overrides, override_of
from pipelines.config._paths import resolve_config_path
from pipelines.config._schema import SECTIONS, Config, build_section, did_you_mean
from pipelines.config._swift import check_swift_section
from pipelines.config._yaml import line_map, read_yaml


def load_config(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Config:
    """Loads and validates one config file, with optional `section.key` overrides.

    Args:
        path: The YAML file.
        overrides: {"section.key": value} applied on top of the file before any check
            (`parse_overrides` reads them from `key=value` words); checked by the same schema,
            and an error in one names the override. Default none.

    Returns:
        The validated `Config`.

    Raises:
        ConfigError: The file is missing or unreadable, over `MAX_CONFIG_BYTES`, not YAML,
            has a duplicate key, expands past `MAX_YAML_NODES` through aliases, has an
            unknown key, a missing required key, a value of the wrong type or range, a
            non-finite number, a hub token in place of its name, or a local pipeline root /
            model cache under a file. The message names the file, the line and the key.
    """
    path = resolve_config_path(path)
    raw, node = read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a config must be a mapping with sections pipeline, model, data, swift, eval")
    lines = line_map(node) if node is not None else {}
    overridden = apply_overrides(raw, overrides, path)
    where = _where(path, lines, overridden)
    _refuse_secret(raw, path, overridden, where)
    return check_config(_build_config(raw, path, where), raw, where)


def _where(path: Path, lines: Mapping[str, int], overridden: Mapping[str, Any]) -> Where:
    """`where(key)`: `file:line` of a key (or of its section), or `file (override key=value)` for an override."""

    def where(key: str) -> str:
        if key in overridden:  # quoted with any secret in it masked (the sweep below refuses it)
            return f"{path} (override {key}={secrets.redact(json.dumps(overridden[key], default=str))})"
        line = lines.get(key) or lines.get(key.split(".")[0])
        return f"{path}:{line}" if line else str(path)

    return where


def _refuse_secret(raw: dict[str, Any], path: Path, overridden: Mapping[str, Any], where: Where) -> None:
    """Refuses a secret anywhere in the config (`pipelines._config_secrets`); an override's value is not echoed."""
    found = secret_problem(raw)
    if found:
        key = override_of(found[0], overridden)
        raise ConfigError(f"{f'{path} (override {key}=...)' if key in overridden else where(key)}: {found[1]}")


def _build_config(raw: dict[str, Any], path: Path, where: Where) -> Config:
    """Builds the `Config` from the file's sections (each by its schema), `swift` and `environment`.

    Raises:
        ConfigError: An unknown or missing section, or a section's unknown key, missing key or wrong type.
    """
    sections = SECTIONS
    unknown = sorted(map(str, set(raw) - set(sections) - {"swift", "environment"}))  # YAML keys may be non-strings
    if unknown:
        hint = did_you_mean(unknown[0], [*sections, "swift", "environment"])
        raise ConfigError(
            f"{where(unknown[0])}: unknown section '{unknown[0]}'{hint}; allowed: pipeline, model, data, swift, eval, "
            "vertex, resources, images, register, deploy, schedule, tracking, gke, environment"
        )
    for required in ("pipeline", "model", "data"):
        if required not in raw:
            raise ConfigError(f"{path}: missing required section '{required}'")
    built = {name: build_section(cls, raw[name], name, where) for name, cls in sections.items() if name in raw}
    swift = check_swift_section(raw.get("swift"), where)
    environment = _environment(raw.get("environment"), where)
    return Config(path=str(path), swift=swift, environment=environment, **built)


def _environment(environment: Any, where: Where) -> dict[str, Any]:
    """The `environment` section as read: a mapping of variable names the job may set (`check_job_env`).

    Raises:
        ConfigError: Not a mapping, or a variable the job sets itself or may not be set.
    """
    environment = environment or {}
    if not isinstance(environment, dict):
        raise ConfigError(
            f"{where('environment')}: section 'environment' must be a mapping of variable names to values"
        )
    try:
        check_job_env(environment, "environment")
    except JobEnvError as exc:
        key = next((f"environment.{k}" for k in map(str, environment) if f"environment.{k}" in str(exc)), "environment")
        raise ConfigError(f"{where(key)}: {exc}") from None
    return dict(environment)
