"""The data settings' rules, one copy: the config (`data.*`), validate-data's core and its CLI check with them.

Pure Python, so `pipelines/config.py` and `components/` both import it. Each rule says what
a setting may be; `setting_problem` returns what is wrong ("must be ..., got ...") or "".

Settings:
    eval_fraction: Held-out fraction of the hash split, 0 < f < 1 (NaN is not).
    max_invalid_fraction: Largest tolerated fraction of invalid lines, 0 <= f <= 1.
    leakage: What validate-data does with an eval row whose image (by content hash) or
        (images, prompt) is also a train row's: one of `LEAKAGE_MODES`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

LEAKAGE_MODES: tuple[str, ...] = ("quarantine", "error", "warn")
"""quarantine: the eval copy is quarantined (E_LEAK), the default; error: validation fails, naming the
rows; warn: the rows stay, counted and listed in the report."""
DEFAULT_LEAKAGE = "quarantine"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "eval_fraction": (lambda v: _number(v) and 0.0 < v < 1.0, "a number between 0 and 1 (exclusive)"),
    "max_invalid_fraction": (lambda v: _number(v) and 0.0 <= v <= 1.0, "a number between 0 and 1"),
    "leakage": (lambda v: v in LEAKAGE_MODES, "one of " + ", ".join(LEAKAGE_MODES)),
}
"""{setting: (the check, what the value must be)}."""


def expected(name: str) -> str:
    """Returns what a setting must be, e.g. "a number between 0 and 1 (exclusive)"."""
    return RULES[name][1]


def setting_problem(name: str, value: Any) -> str:
    """Checks one data setting against its rule.

    Args:
        name: A key of `RULES` (eval_fraction, max_invalid_fraction, leakage).
        value: The value given.

    Returns:
        "" when the value is allowed, else "must be <what>, got <value>".
    """
    ok, what = RULES[name]
    return "" if ok(value) else f"must be {what}, got {value!r}"
