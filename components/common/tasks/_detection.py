"""The detection task: a JSON list of {"label", "bbox"} findings, scored in pixels of the original image."""

from __future__ import annotations

from collections import Counter
from typing import Any

from components.common import boxes
from components.common.answers import extract_fenced, parse_findings
from components.common.tasks._matching import match_findings
from components.common.tasks._types import PIXEL, Geometry, Shape, invalid_score, valid_score


def _finding_key(finding: dict) -> tuple:
    return (finding["label"], tuple(float(v) for v in finding["bbox"]))


def _rounded_key(finding: dict) -> tuple:
    return (finding["label"], tuple(round(v) for v in finding["bbox"]))


def _in_pixels(findings: list[dict], geometry: Geometry) -> list[dict]:
    return [{"label": f["label"], "bbox": geometry.to_pixels(f["bbox"])} for f in findings]


def score_detection(
    pred_text: str,
    gold_text: str,
    geometry: Geometry = PIXEL,
    iou_threshold: float = 0.5,
    method: str = "auto",
    pred_geometry: Geometry | None = None,
) -> dict[str, Any]:
    """Scores one detection answer against the gold answer, in pixels of the original image.

    Args:
        pred_text: The model answer.
        gold_text: The gold answer (the dataset row's assistant turn).
        geometry: Convention of the gold boxes and the image size. Default pixel.
        iou_threshold: Minimum IoU of a match. Default 0.5.
        method: Matching method, see `match_findings`. Default "auto".
        pred_geometry: Convention of the answer's boxes when it differs from the gold's (an
            untuned base model answers in its own family's convention); None = `geometry`.
            Default None.

    Returns:
        ``json_valid``; ``exact_match`` (the parsed answer equals the gold as multisets of
        (label, box); numbers compared by value in the answers' own convention when both
        are in one convention, else as pixel boxes rounded to whole pixels); ``tp``, ``fp``,
        ``fn``; ``n_pred``, ``n_gold``; ``error`` (None, or why the answer is invalid). An
        invalid answer has tp = fp = 0 and fn = n_gold.

    Raises:
        ValueError: The gold answer is invalid (a dataset bug), or its boxes cannot be read
            in pixels (`boxes.BoxError`).
    """
    gold, gold_error = parse_findings(gold_text)
    if gold is None:
        raise ValueError(f"gold answer is invalid ({gold_error}): {gold_text!r}")
    pred, error = parse_findings(pred_text)
    if pred is None:
        return invalid_score(error, len(gold))
    pred_geometry = pred_geometry or geometry
    pred_px, gold_px = _in_pixels(pred, pred_geometry), _in_pixels(gold, geometry)
    matches = match_findings(pred_px, gold_px, iou_threshold, method)
    if pred_geometry.convention == geometry.convention:
        exact = Counter(map(_finding_key, pred)) == Counter(map(_finding_key, gold))
    else:
        exact = Counter(map(_rounded_key, pred_px)) == Counter(map(_rounded_key, gold_px))
    return valid_score(exact, len(matches), len(pred), len(gold))


def detection_shapes(text: str, geometry: Geometry = PIXEL) -> list[Shape]:
    """Returns the findings of a detection answer as pixel `Shape`s ([] when it does not parse)."""
    findings, _ = parse_findings(text)
    shapes = []
    for finding in findings or []:
        x1, y1, x2, y2 = geometry.to_pixels(finding["bbox"])
        shapes.append(Shape(finding["label"], (x1, y1, x2, y2), boxes.is_proper((x1, y1, x2, y2))))
    return shapes


def check_detection(text: str) -> str:
    """`Task.check_answer` of detection: "" for a ```json block holding a valid findings list, else why not."""
    if extract_fenced(text, "json") is None:
        return "has no ```json fenced block"
    _, reason = parse_findings(text)
    return reason or ""
