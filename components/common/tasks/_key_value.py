"""The key_value task: a JSON object of field -> string / number, scored field by field after `normalize_value`."""

from __future__ import annotations

import json
from typing import Any

from components.common import bounded_json
from components.common.answers import extract_fenced, extract_json_text, first_json, is_finite_number
from components.common.tasks._types import PIXEL, Geometry, invalid_score, valid_score


def normalize_value(value: Any) -> str:
    """Returns a key-value field or value as compared: text, stripped, whitespace collapsed, case-folded.

    A number becomes its JSON text first (12.5 -> "12.5"), so it equals the same number written
    as a string.
    """
    text = value if isinstance(value, str) else json.dumps(value)
    return " ".join(text.split()).casefold()


def _json_object(text: str) -> tuple[dict | None, str | None]:
    """Returns the answer's JSON object as written, or (None, reason); see `parse_key_value`."""
    if not isinstance(text, str):
        return None, f"answer is not a string but {type(text).__name__}"
    candidate = extract_json_text(text)
    if candidate is not None:
        try:
            data = bounded_json.loads(candidate)
        except ValueError as exc:
            data = first_json(text, dict, finite=False)  # prose or a cut-off answer around an object
            return (data, None) if data is not None else (None, f"invalid JSON: {exc}")
        return (data, None) if isinstance(data, dict) else (None, f"JSON is a {type(data).__name__}, not an object")
    data = first_json(text, dict, finite=False)
    return (data, None) if data is not None else (None, "no JSON object found (no ```json fence and no '{...}')")


def parse_key_value(text: str) -> tuple[dict[str, str] | None, str | None]:
    """Parses a key-value answer into {normalised field: normalised value}.

    The JSON is looked for as `parse_json` does (first ```json block, else a bare block, else
    the stripped text, else from the first "[" to the last "]"); when there is none, or it is
    not valid JSON, the first JSON object in the text is used (prose around it is fine).
    Valid: a JSON object whose every value is a string or a finite number (not a bool, list,
    object or null). Fields and values are normalised with `normalize_value`; two fields
    equal after normalisation keep the later value.

    Returns:
        ``(fields, None)``, or ``(None, reason)`` when invalid.
    """
    data, error = _json_object(text)
    if data is None:
        return None, error
    fields: dict[str, str] = {}
    for key, value in data.items():
        if isinstance(value, bool) or not (isinstance(value, str) or is_finite_number(value)):
            return None, f"field {key!r} is {json.dumps(value)[:40]}, not a string or number"
        fields[normalize_value(key)] = normalize_value(value)
    return fields, None


def check_key_value(text: str) -> str:
    """`Task.check_answer` of key_value: "" for a ```json block holding a non-empty valid object, else why not."""
    if extract_fenced(text, "json") is None:
        return "has no ```json fenced block"
    fields, reason = parse_key_value(text)
    if fields is None:
        return reason or "invalid"
    return "" if fields else "the JSON object has no fields"


def score_key_value(
    pred_text: str,
    gold_text: str,
    geometry: Geometry = PIXEL,
    iou_threshold: float = 0.5,
    method: str = "auto",
    pred_geometry: Geometry | None = None,
) -> dict[str, Any]:
    """Scores a key-value answer field by field (geometry, threshold and method unused).

    Returns:
        The per-sample score dict: tp = predicted fields whose normalised value equals the
        gold's; fp = the other predicted fields (wrong value or not in the gold); fn = gold
        fields not matched (a wrong value counts as one fp and one fn); exact_match = the
        normalised objects are equal. An invalid answer has tp = fp = 0 and fn = n_gold.

    Raises:
        ValueError: The gold answer is invalid (a dataset bug).
    """
    gold, gold_error = parse_key_value(gold_text)
    if gold is None:
        raise ValueError(f"gold answer is invalid ({gold_error}): {gold_text!r}")
    pred, error = parse_key_value(pred_text)
    if pred is None:
        return invalid_score(error, len(gold))
    tp = sum(1 for key, value in pred.items() if gold.get(key) == value)
    return valid_score(pred == gold, tp, len(pred), len(gold))


def key_value_rows(gold_text: str, pred_text: str) -> list[tuple[str, str | None, str | None, bool]]:
    """Returns (field, gold value, predicted value, match) rows for a report, gold fields first.

    Values are shown as written (numbers as JSON text) and None where the answer lacks the
    field; match compares normalised values as `score_key_value` does. An answer that does
    not parse contributes no values.
    """

    def raw(text: str) -> dict[str, tuple[str, str]]:
        if parse_key_value(text)[0] is None:
            return {}
        data = _json_object(text)[0] or {}
        return {normalize_value(k): (k, v if isinstance(v, str) else json.dumps(v)) for k, v in data.items()}

    gold, pred = raw(gold_text), raw(pred_text)
    rows = []
    for key in list(gold) + [k for k in pred if k not in gold]:
        g, p = gold.get(key), pred.get(key)
        match = g is not None and p is not None and normalize_value(g[1]) == normalize_value(p[1])
        rows.append(((g or p)[0], g[1] if g else None, p[1] if p else None, match))
    return rows
