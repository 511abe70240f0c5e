"""The config's error type and the one way a list of field checks is refused."""

from __future__ import annotations

import typing
from collections.abc import Iterable
from typing import Any

# `where(key)`: "file:line" of a dotted key (or "file (override key=value)"), for error messages.
Where = typing.Callable[[str], str]
# (dotted key, whether its value is fine, what it must be): one field check of a section.
Check = tuple[str, bool, str]


class ConfigError(ValueError):
    """A config file is invalid; the message names file, line, key and the fix."""


def refuse_bad_fields(cfg: Any, checks: Iterable[Check], where: Where) -> None:
    """Raises for the first failed check, naming its key, what it must be and its value.

    Args:
        cfg: The config (or anything with the checked sections as attributes).
        checks: (`section.name`, ok, what it must be), in the order they are reported.
        where: `file:line` of a dotted key.

    Raises:
        ConfigError: "<where>: '<key>' must be <expected>, got <value>" for the first check not ok.
    """
    for key, ok, expected in checks:
        if not ok:
            section, name = key.split(".")
            value = getattr(getattr(cfg, section), name)
            raise ConfigError(f"{where(key)}: '{key}' must be {expected}, got {value!r}")
