"""Range-checked number types for the commands' argparse options (`type=` callables).

`type=float` takes `nan`, `inf` and `-1`; `--fetch-timeout nan` then quarantined every row and
`--max-length -1` did too. These refuse such values at the command line, where argparse prints
one line (`error: argument --fetch-timeout: ...`) and exits 2 (with `OneLineParser`; a plain
ArgumentParser prints its usage before that line).
"""

from __future__ import annotations

import argparse
import math
import typing
from collections.abc import Callable


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (`prog: error: ...`, exit 2), not the usage and the line.

    `--help` still prints the usage; a refused value names its flag and what it must be.
    """

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def any_number(text: str) -> float:
    """A number (nan and inf included): a setting whose range its own rule checks, with that rule's words."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


any_number.__name__ = "float"


def _number(text: str, kind: type) -> float | int:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def ranged(kind: type, low: float | None = None, high: float | None = None, what: str = "") -> Callable[[str], float]:
    """An argparse `type` accepting `kind` (int or float) in [low, high] (None: unbounded), finite.

    Args:
        kind: int or float.
        low: Smallest value allowed. Default None.
        high: Largest value allowed. Default None.
        what: The range in words for the message, e.g. "a positive number of seconds". Default: from the bounds.

    Returns:
        The callable argparse calls on the option's text.
    """
    words = what or (
        f"from {low} to {high}"
        if low is not None and high is not None
        else f"at least {low}"
        if low is not None
        else f"at most {high}"
    )

    def parse(text: str) -> float:
        value = _number(text, kind)
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text!r} is out of range: must be {words}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its own messages
    return parse


def positive(kind: type, what: str = "") -> Callable[[str], float]:
    """A finite value > 0 (an int: at least 1)."""
    if kind is int:
        return ranged(int, 1, None, what or "a positive integer")

    def parse(text: str) -> float:
        value = _number(text, float)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} is out of range: must be {what or 'a positive number'}")
        return value

    parse.__name__ = "float"
    return parse


def non_negative(kind: type, what: str = "") -> Callable[[str], float]:
    """A finite value >= 0."""
    return ranged(kind, 0, None, what or ("0 or a positive integer" if kind is int else "0 or a positive number"))
