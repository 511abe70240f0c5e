"""The json task (a ```json block, exact match of the parsed values) and the free-text task."""

from __future__ import annotations

from typing import Any

from components.common import bounded_json
from components.common.answers import extract_fenced, extract_json_text
from components.common.tasks._types import PIXEL, Geometry, invalid_score, valid_score


def parse_json(text: str) -> tuple[Any, str | None]:
    """Parses the JSON of an answer (fenced or not, as `parse_findings` looks for it)."""
    if not isinstance(text, str):
        return None, f"answer is not a string but {type(text).__name__}"
    candidate = extract_json_text(text)
    if candidate is None:
        return None, "no JSON found (no ```json fence and no '[...]')"
    try:
        return bounded_json.loads(candidate), None
    except ValueError as exc:
        return None, f"invalid JSON: {exc}"


def check_json(text: str) -> str:
    """`Task.check_answer` of json: "" for a ```json block holding valid JSON, else why not."""
    body = extract_fenced(text, "json")
    if body is None:
        return "has no ```json fenced block"
    try:
        bounded_json.loads(body)
    except ValueError as exc:
        return f"invalid JSON in the fence: {exc}"
    return ""


def score_json(
    pred_text: str,
    gold_text: str,
    geometry: Geometry = PIXEL,
    iou_threshold: float = 0.5,
    method: str = "auto",
    pred_geometry: Geometry | None = None,
) -> dict[str, Any]:
    """Scores a JSON answer: valid, and exact match of the parsed values (geometry, threshold unused).

    Raises:
        ValueError: The gold answer is not JSON.
    """
    gold, gold_error = parse_json(gold_text)
    if gold_error:
        raise ValueError(f"gold answer is invalid ({gold_error}): {gold_text!r}")
    pred, error = parse_json(pred_text)
    if error:
        return invalid_score(error, 0)
    return valid_score(pred == gold, 0, 0, 0)


def score_text(
    pred_text: str,
    gold_text: str,
    geometry: Geometry = PIXEL,
    iou_threshold: float = 0.5,
    method: str = "auto",
    pred_geometry: Geometry | None = None,
) -> dict[str, Any]:
    """Scores a free-text answer: exact match after stripping (geometry, threshold unused)."""
    return valid_score(str(pred_text).strip() == str(gold_text).strip(), 0, 0, 0)
