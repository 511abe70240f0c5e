"""Model answers: fenced blocks and the findings list of the detection task.

Shared by validate-data (a training answer must have the shape evaluate reads) and
evaluate (scores the model's answers), so both read an answer the same way. Pure Python.

A detection answer is a JSON list of findings, each ``{"label": str, "bbox": [x1, y1,
x2, y2]}`` (or ``"bbox_2d"``, the key of the Qwen-VL grounding cookbook), usually inside a
```` ```json ```` fenced block; :func:`parse_findings` says exactly what is accepted. What
the numbers mean (pixels, 0-1000, resized pixels) is not the parser's business: see
`components.common.boxes` and `components.common.tasks`.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from components.common import bounded_json

# A fenced block: three backticks, an optional info string (a word such as
# ``json``), the body, then closing backticks or the end of the text.
FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[ \t]*\n?(.*?)(?:```|\Z)", re.DOTALL)


def extract_fenced(text: str, info: str = "json") -> str | None:
    """Returns the body of the first fenced block with the given info string.

    A fence left unclosed runs to the end of the text (see `FENCE_RE`).

    Args:
        text: The answer.
        info: The info string to look for, compared case-insensitively after stripping;
            "" = a block without one. Default "json".

    Returns:
        The block's body, or None when no block has that info string.
    """
    wanted = info.strip().lower()
    return next((m.group(2) for m in FENCE_RE.finditer(text) if m.group(1).strip().lower() == wanted), None)


def extract_json_text(text: str) -> str | None:
    """Returns the candidate JSON text of an answer, in the order of `parse_findings`, or None."""
    blocks = [(m.group(1).strip().lower(), m.group(2)) for m in FENCE_RE.finditer(text)]
    for wanted in ("json", ""):
        for info, body in blocks:
            if info == wanted:
                return body
    stripped = text.strip()
    if stripped.startswith(("[", "{")):
        return stripped
    start, end = stripped.find("["), stripped.rfind("]")
    if start != -1 and end > start:
        return stripped[start : end + 1]
    return None


def is_finite_number(value: Any) -> bool:
    """Returns whether value is an int or float (not a bool) and finite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} is not valid JSON")


BOX_KEYS: tuple[str, ...] = ("bbox", "bbox_2d")
"""Keys a finding's box may have, in order of preference; parsed findings use "bbox"."""


def first_json(text: str, kind: type, *, finite: bool = True) -> Any:
    """Returns the first JSON value of a type (list or dict) that starts at some "[" / "{" of text, or None.

    Prose around it is fine. With `finite` (default), NaN and Infinity make a candidate invalid.
    """
    decoder = json.JSONDecoder(parse_constant=_reject_constant) if finite else json.JSONDecoder()
    if bounded_json.depth(text) > bounded_json.MAX_DEPTH:  # raw_decode would recurse past Python's limit
        return None
    opener = "[" if kind is list else "{"
    start = text.find(opener)
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            value = None
        if isinstance(value, kind):
            return value
        start = text.find(opener, start + 1)
    return None


def parse_findings(text: str) -> tuple[list[dict] | None, str | None]:
    """Extracts the list of findings from a model answer.

    What is looked at, in this order (the first that applies is used, the
    others are not tried):

    1. the body of the first fenced block whose info string is ``json``
       (case-insensitive), e.g. ```` ```json\\n[...]\\n``` ````;
    2. otherwise the body of the first fenced block without an info string;
    3. otherwise (no such fenced block) the whole stripped text if it starts
       with ``[`` or ``{``, else the substring from the first ``[`` to the
       last ``]``; when that substring is not valid JSON (prose that holds
       other brackets, such as "boxes [x1, y1, x2, y2]: [...]"), the first
       JSON list that starts at a ``[`` of the text.

    A fence left unclosed (e.g. a generation cut by ``max_new_tokens``) runs
    to the end of the text. Fenced blocks with another info string (e.g.
    ``python``) are ignored.

    The candidate text is valid when ``json.loads`` parses it (``NaN`` and
    ``Infinity`` are rejected) into a list (possibly empty) whose every item
    is an object with:

    * ``"label"``: a non-empty string;
    * ``"bbox"`` or ``"bbox_2d"`` (the Qwen-VL cookbook's key; ``"bbox"`` wins
      when both are present): a list of exactly 4 finite numbers (int or
      float, not bool).

    Other keys are allowed and dropped; key order does not matter. Coordinates are not required to be
    ordered; a box with ``x2 <= x1`` or ``y2 <= y1`` has zero area and never
    matches (see ``components.common.boxes.iou``).

    Args:
        text: The model answer.

    Returns:
        ``(findings, None)`` with findings normalised to
        ``[{"label": str, "bbox": [n, n, n, n]}, ...]`` in answer order, or
        ``(None, reason)`` with a human-readable reason when invalid.
    """
    if not isinstance(text, str):
        return None, f"answer is not a string but {type(text).__name__}"
    candidate = extract_json_text(text)
    if candidate is None:
        return None, "no JSON list found (no ```json fence and no '[...]')"
    try:
        data = bounded_json.loads(candidate, parse_constant=_reject_constant)
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        in_prose = not FENCE_RE.search(text) and not text.strip().startswith(("[", "{"))
        data = first_json(text, list) if in_prose else None
        if data is None:
            return None, f"invalid JSON: {exc}"
    if not isinstance(data, list):
        return None, f"JSON is a {type(data).__name__}, not a list"
    findings: list[dict] = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            return None, f"item {i} is a {type(item).__name__}, not an object"
        label = item.get("label")
        if not isinstance(label, str) or not label:
            return None, f"item {i} has no non-empty string 'label'"
        bbox = next((item[key] for key in BOX_KEYS if key in item), None)
        if not isinstance(bbox, list) or len(bbox) != 4 or not all(map(is_finite_number, bbox)):
            return None, f"item {i} 'bbox' is not a list of 4 finite numbers: {bbox!r}"
        findings.append({"label": label, "bbox": list(bbox)})
    return findings, None
