"""A stage's frozen settings rebuilt from the dict its KFP input carries (`EvalSettings`, `TrainSettings`,
`DeploySettings`): unknown keys refused, each value checked against its field's type. A JSON struct carries numbers
as doubles, so a whole float is taken as the integer it is, and an integer where a number is wanted as that number.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from typing import Any

WANTED = {int: "an integer", float: "a number", str: "a string"}


def rebuild(
    cls: type,
    values: Mapping[str, Any],
    error: type[Exception],
    *,
    unknown: Callable[[str, list[str]], str],
    wrong: Callable[[str, str, Any], str],
    mapping: str = "a mapping",
) -> Any:
    """`cls(**values)` with each value as its field holds it; keys left out take their defaults.

    Args:
        cls: The settings dataclass (fields typed int, float, str or a mapping).
        values: The task input.
        error: The stage's error type, raised with the message below.
        unknown: (first unknown key, the field names) -> the message for a key the settings do not have.
        wrong: (field name, what it wants, the value) -> the message for a value of the wrong type.
        mapping: What a mapping field wants, in that message. Default "a mapping".
    """
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    extra = sorted(set(values) - set(names), key=str)
    if extra:
        raise error(unknown(extra[0], names))
    out = {}
    for name, value in values.items():
        hint = hints[name]
        if not _fits(hint, value):
            raise error(wrong(name, WANTED.get(hint, mapping), value))
        out[name] = hint(value) if hint in (int, float) else value if hint is str else dict(value)
    return cls(**out)


def _fits(hint: Any, value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if hint is int:
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if hint is float:
        return isinstance(value, (int, float))
    if hint is str:
        return isinstance(value, str)
    return isinstance(value, Mapping)
