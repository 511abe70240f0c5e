"""JSON from users and models, parsed to a bounded depth: a named error, never a RecursionError.

Python's `json` recurses once per level: text nested ~1,000 brackets deep (a degenerate model
answer within the seed's `max_new_tokens`, a hand-made model `config.json`, a data row) raises
RecursionError from inside the parser, and code walking a parsed value recurses again. `loads`
measures the nesting first (strings skipped, in C-speed regular expressions) and refuses text
deeper than `MAX_DEPTH` with `TooDeep`, a `ValueError` like `json.JSONDecodeError`, so every
`except ValueError` that handles bad JSON handles it too.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 100  # answers, rows and model configs nest 2-6 levels; Python's limit is ~1,000 frames
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # unrolled: linear, no backtracking blow-up
_BRACKET = re.compile(r"[\[\]{}]")


class TooDeep(ValueError):
    """JSON text nests deeper than `MAX_DEPTH` levels."""


def depth(text: str) -> int:
    """The deepest nesting of [ ] and { } in `text`, outside JSON strings (brackets in an unclosed string count)."""
    level = deepest = 0
    for bracket in _BRACKET.findall(_STRING.sub('""', text)):
        if bracket in "[{":
            level += 1
            deepest = max(deepest, level)
        else:
            level = max(level - 1, 0)
    return deepest


def check_depth(text: str, max_depth: int = MAX_DEPTH) -> None:
    """Raises TooDeep when `text` nests deeper than `max_depth` (default `MAX_DEPTH`)."""
    found = depth(text)
    if found > max_depth:
        raise TooDeep(f"JSON nested {found} levels deep, more than {max_depth}")


def loads(text: str | bytes, max_depth: int = MAX_DEPTH, **kwargs: Any) -> Any:
    """`json.loads` that refuses nesting deeper than `max_depth` (default `MAX_DEPTH`).

    Raises:
        TooDeep: The text nests too deeply (a ValueError).
        ValueError: As `json.loads` (json.JSONDecodeError, a number over Python's digit limit).
    """
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8")
    check_depth(text, max_depth)
    try:
        return json.loads(text, **kwargs)
    except RecursionError:  # a hook that recurses; the depth check makes this unreachable for plain JSON
        raise TooDeep(f"JSON nested more deeply than Python can parse (over {max_depth} levels)") from None
