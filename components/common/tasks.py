"""Tasks, each defined once: answer shape, parser, scoring, metric names, what a report draws.

validate-data checks training answers with `Task.check_answer`, evaluate scores model answers
with `Task.score` and draws samples with `Task.shapes`, so they all read an answer the same way.

Tasks (`TASKS`, looked up with `get_task`):

* ``""``: free text. Every answer is valid; exact match is equality after stripping.
* ``"json"``: the answer holds JSON (a ```` ```json ```` block in training data). Exact match
  is equality of the parsed values.
* ``"detection"``: a JSON list of ``{"label", "bbox"}`` findings (``"bbox_2d"`` accepted, see
  `components.common.answers.parse_findings`). Gold and predicted boxes are both in the
  dataset's box convention (`components.common.boxes`: pixel, norm1000, resized_pixel); both
  are mapped to pixels of the ORIGINAL image before IoU, so the metrics mean the same for
  every model family. A prediction matches a gold finding of the same label at IoU >= the
  threshold, one-to-one (`match_findings`).
* ``"key_value"``: a JSON object of field -> value (strings or numbers, in a ```` ```json ````
  block in training data), e.g. ``{"invoice_number": "INV-0042", "total": "1,234.50"}``.
  Fields and values are compared after `normalize_value` (strip, collapse whitespace,
  case-insensitive; numbers as their JSON text). A predicted field is a true positive when
  the gold answer has that field with an equal value; every other predicted field is a false
  positive and every unmatched gold field a false negative, so precision / recall / F1 are
  field-level and aggregate like detection's. Exact match: every field equal, none extra.

Every `Task.score` returns the per-sample dict that `components.evaluate.metrics.aggregate`
reads: json_valid, exact_match, tp, fp, fn, n_pred, n_gold, error. Pure Python (scipy
optional).
"""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from components.common import bounded_json, boxes
from components.common import metrics as metric_record
from components.common.answers import (
    FENCE_RE,
    extract_fenced,
    extract_json_text,
    first_json,
    is_finite_number,
    parse_findings,
)


# Optional: optimal assignment. Found, not imported: scipy.optimize takes ~1 s to import on a loaded 2-core
# machine, and every `vlm-lora ... --help` imports this module through the config; it is imported on first match.
def _have(module: str) -> bool:
    """Whether `module` can be imported, without importing it (an import hook that refuses it: False)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


HAVE_SCIPY: bool = _have("scipy")
MATCH_METHODS: tuple[str, ...] = ("auto", "hungarian", "greedy")


@dataclass(frozen=True)
class Geometry:
    """How to read the box numbers of one sample: their convention and the image they belong to.

    Attributes:
        convention: One of `boxes.CONVENTIONS`. Default "pixel".
        image_size: (width, height) of the original image, px; needed unless pixel. Default None.
        rule: Smart-resize settings (for resized_pixel). Default Qwen2.5-VL's.
    """

    convention: str = "pixel"
    image_size: tuple[int, int] | None = None
    rule: boxes.ResizeRule = field(default_factory=boxes.ResizeRule)

    def to_pixels(self, box: Sequence[float]) -> list[float]:
        """Returns the box in pixels of the original image.

        Raises:
            boxes.BoxError: An unknown convention, or no image size for a convention that needs one.
        """
        if self.convention == "pixel":
            return [float(v) for v in box]
        if self.image_size is None:
            raise boxes.BoxError(f"a {self.convention} box needs the image size to be read in pixels")
        return boxes.to_pixels(box, self.convention, self.image_size, self.rule)


PIXEL = Geometry()


@dataclass(frozen=True)
class Shape:
    """One finding as a report draws it.

    Attributes:
        label: The finding's label.
        box: (x1, y1, x2, y2) in pixels of the original image, in the answer's order (not sorted).
        valid: x1 < x2 and y1 < y2. An invalid box has zero area: the metric never matches it,
            so a report must not draw it as a rectangle spanning its corners.
    """

    label: str
    box: tuple[float, float, float, float]
    valid: bool


ScoreFn = Callable[..., dict[str, Any]]


@dataclass(frozen=True)
class Task:
    """One task's definition.

    Attributes:
        name: Key in `TASKS`.
        summary: One line for help texts and reports.
        metrics: Names of `components.common.metrics.METRICS` that mean something for this task
            (a name not in that record is refused when the task is defined).
        parse: answer text -> (parsed value, None) or (None, reason).
        check_answer: training answer text -> "" when it has the task's shape, else why not.
        score: (pred_text, gold_text, geometry=PIXEL, iou_threshold=0.5, method="auto",
            pred_geometry=None) -> the per-sample score dict. Raises ValueError when the gold
            answer is invalid.
        shapes: (answer text, geometry) -> the `Shape`s a report draws ([] when nothing to draw
            or the answer does not parse).
    """

    name: str
    summary: str
    metrics: tuple[str, ...]
    parse: Callable[[str], tuple[Any, str | None]]
    check_answer: Callable[[str], str]
    score: ScoreFn
    shapes: Callable[[str, Geometry], list[Shape]]

    def __post_init__(self) -> None:
        unknown = [name for name in self.metrics if name not in metric_record.BY_NAME]
        if unknown:
            raise ValueError(f"task {self.name!r}: metrics {unknown} are not in components.common.metrics.METRICS")


def resolve_method(method: str, have_scipy: bool = HAVE_SCIPY) -> str:
    """Returns "hungarian" or "greedy" for a match method.

    Raises:
        ValueError: An unknown method, or "hungarian" without scipy.
    """
    if method not in MATCH_METHODS:
        raise ValueError(f"unknown match method {method!r}; expected one of {MATCH_METHODS}")
    if method == "auto":
        method = "hungarian" if have_scipy else "greedy"
    if method == "hungarian" and not have_scipy:
        raise ValueError("method 'hungarian' needs scipy, which is not importable")
    return method


def match_findings(
    pred: Sequence[dict],
    gold: Sequence[dict],
    iou_threshold: float = 0.5,
    method: str = "auto",
) -> list[tuple[int, int]]:
    """Matches predicted findings to gold findings one-to-one (boxes of one convention).

    A pair ``(p, g)`` is eligible when the labels are equal (exact, case-sensitive) and
    ``boxes.iou`` is at least ``iou_threshold`` and above 0. ``"hungarian"`` maximises the
    number of pairs, then the total IoU (scipy); ``"greedy"`` repeatedly takes the eligible
    pair with the highest IoU (ties: lower pred, then lower gold index); ``"auto"`` is
    hungarian when scipy is importable, else greedy.

    Args:
        pred: Predicted findings (``{"label", "bbox"}`` dicts).
        gold: Gold findings.
        iou_threshold: Minimum IoU of a match, in [0, 1]. Default 0.5.
        method: One of `MATCH_METHODS`. Default "auto".

    Returns:
        ``[(pred_index, gold_index), ...]`` sorted by pred index.

    Raises:
        ValueError: An unknown method, a threshold outside [0, 1], or "hungarian" without scipy.
    """
    method = resolve_method(method)
    if not 0.0 <= iou_threshold <= 1.0:
        raise ValueError(f"iou_threshold must be in [0, 1], got {iou_threshold}")
    eligible: dict[tuple[int, int], float] = {}
    for p, pf in enumerate(pred):
        for g, gf in enumerate(gold):
            if pf["label"] != gf["label"]:
                continue
            score = boxes.iou(pf["bbox"], gf["bbox"])
            if score > 0 and score >= iou_threshold:  # a zero IoU never matches, even at threshold 0
                eligible[(p, g)] = score
    if not eligible:
        return []
    if method == "greedy":
        used_p: set[int] = set()
        used_g: set[int] = set()
        pairs = []
        for (p, g), _ in sorted(eligible.items(), key=lambda kv: (-kv[1], kv[0])):
            if p not in used_p and g not in used_g:
                used_p.add(p)
                used_g.add(g)
                pairs.append((p, g))
        return sorted(pairs)
    # Weight = bonus + IoU with bonus > any total IoU: maximum cardinality, then maximum IoU.
    bonus = float(min(len(pred), len(gold)) + 1)
    cost = [[0.0] * len(gold) for _ in pred]
    for (p, g), score in eligible.items():
        cost[p][g] = -(bonus + score)
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(cost)
    return sorted((int(p), int(g)) for p, g in zip(rows, cols) if (int(p), int(g)) in eligible)


def _invalid(error: str | None, n_gold: int) -> dict[str, Any]:
    return {
        "json_valid": False,
        "exact_match": False,
        "tp": 0,
        "fp": 0,
        "fn": n_gold,
        "n_pred": 0,
        "n_gold": n_gold,
        "error": error,
    }


def _valid(exact: bool, tp: int, n_pred: int, n_gold: int) -> dict[str, Any]:
    return {
        "json_valid": True,
        "exact_match": exact,
        "tp": tp,
        "fp": n_pred - tp,
        "fn": n_gold - tp,
        "n_pred": n_pred,
        "n_gold": n_gold,
        "error": None,
    }


# ------------------------------------------------------------------------------ detection


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
        return _invalid(error, len(gold))
    pred_geometry = pred_geometry or geometry
    pred_px, gold_px = _in_pixels(pred, pred_geometry), _in_pixels(gold, geometry)
    matches = match_findings(pred_px, gold_px, iou_threshold, method)
    if pred_geometry.convention == geometry.convention:
        exact = Counter(map(_finding_key, pred)) == Counter(map(_finding_key, gold))
    else:
        exact = Counter(map(_rounded_key, pred_px)) == Counter(map(_rounded_key, gold_px))
    return _valid(exact, len(matches), len(pred), len(gold))


def detection_shapes(text: str, geometry: Geometry = PIXEL) -> list[Shape]:
    """Returns the findings of a detection answer as pixel `Shape`s ([] when it does not parse)."""
    findings, _ = parse_findings(text)
    shapes = []
    for finding in findings or []:
        x1, y1, x2, y2 = geometry.to_pixels(finding["bbox"])
        shapes.append(Shape(finding["label"], (x1, y1, x2, y2), boxes.is_proper((x1, y1, x2, y2))))
    return shapes


def _check_detection(text: str) -> str:
    if extract_fenced(text, "json") is None:
        return "has no ```json fenced block"
    _, reason = parse_findings(text)
    return reason or ""


# ----------------------------------------------------------------------------------- json


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


def _check_json(text: str) -> str:
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
        return _invalid(error, 0)
    return _valid(pred == gold, 0, 0, 0)


# ----------------------------------------------------------------------------------- text


def score_text(
    pred_text: str,
    gold_text: str,
    geometry: Geometry = PIXEL,
    iou_threshold: float = 0.5,
    method: str = "auto",
    pred_geometry: Geometry | None = None,
) -> dict[str, Any]:
    """Scores a free-text answer: exact match after stripping (geometry, threshold unused)."""
    return _valid(str(pred_text).strip() == str(gold_text).strip(), 0, 0, 0)


# ------------------------------------------------------------------------------ key_value


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


def _check_key_value(text: str) -> str:
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
        return _invalid(error, len(gold))
    tp = sum(1 for key, value in pred.items() if gold.get(key) == value)
    return _valid(pred == gold, tp, len(pred), len(gold))


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


def _no_shapes(text: str, geometry: Geometry = PIXEL) -> list[Shape]:
    return []


TASKS: dict[str, Task] = {
    "": Task(
        name="",
        summary="free text; exact match after stripping",
        metrics=("exact_match_rate",),
        parse=lambda text: (text, None),
        check_answer=lambda text: "",
        score=score_text,
        shapes=_no_shapes,
    ),
    "json": Task(
        name="json",
        summary="a ```json block; exact match of the parsed values",
        metrics=("json_valid_rate", "exact_match_rate"),
        parse=parse_json,
        check_answer=_check_json,
        score=score_json,
        shapes=_no_shapes,
    ),
    "detection": Task(
        name="detection",
        summary='JSON list of {"label", "bbox" | "bbox_2d"}; boxes matched by label and IoU in pixels',
        metrics=("f1", "precision", "recall", "json_valid_rate", "exact_match_rate"),
        parse=parse_findings,
        check_answer=_check_detection,
        score=score_detection,
        shapes=detection_shapes,
    ),
    "key_value": Task(
        name="key_value",
        summary="a ```json object of field -> string / number; fields matched by normalised value",
        metrics=("f1", "precision", "recall", "exact_match_rate", "json_valid_rate"),
        parse=parse_key_value,
        check_answer=_check_key_value,
        score=score_key_value,
        shapes=_no_shapes,
    ),
}

# ------------------------------------------------------------------------------ strict gold

GOLD_CODES: dict[str, str] = {
    "E_GOLD_FENCE": "a gold answer's ```json block has no closing ``` fence",
    "E_GOLD_BLOCKS": "a gold answer has more than one ```json block (scoring reads the first, training teaches all)",
    "E_GOLD_DUPLICATE_KEY": "a gold answer's JSON object has the same key twice (scoring would keep one)",
    "E_GOLD_KEY_COLLISION": "two key_value gold fields are one field once compared (case, spaces)",
    "E_GOLD_EMPTY_KEY": "a key_value gold field name is empty",
    "E_GOLD_MIXED_BOX_KEYS": 'a detection gold finding has both "bbox" and a different "bbox_2d"',
}
"""The codes of `check_gold`: what the tolerant parsers would read silently in a gold answer."""


@dataclass(frozen=True)
class GoldProblem:
    """Why a gold answer is refused: a `GOLD_CODES` code and a message naming the field and the fix."""

    code: str
    message: str


class _RepeatedKey(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads' object_pairs_hook: raises _RepeatedKey at the first key an object holds twice."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _RepeatedKey(key)
        seen.add(key)
    return dict(pairs)


def _gold_json(text: str) -> tuple[Any, GoldProblem | None]:
    """Returns the JSON of a gold answer's first ```json block, strictly: (value, None), (None, problem), or
    (None, None) when there is no such block or it is not JSON (the task's own check says so)."""
    blocks = [m for m in FENCE_RE.finditer(text) if m.group(1).strip().lower() == "json"]
    if not blocks:
        return None, None
    block = blocks[0]
    if not block.group(0).endswith("```"):
        return None, GoldProblem(
            "E_GOLD_FENCE", "the ```json block has no closing ``` fence (the answer runs to its end): add ``` after "
            "the JSON, as the model must learn to write it",
        )  # fmt: skip
    if len(blocks) > 1:
        return None, GoldProblem(
            "E_GOLD_BLOCKS", f"the answer has {len(blocks)} ```json blocks; scoring reads the first and training "
            "teaches the model to write all of them: keep the one answer block",
        )  # fmt: skip
    try:
        return bounded_json.loads(block.group(2), object_pairs_hook=_no_repeats), None
    except _RepeatedKey as exc:
        return None, GoldProblem(
            "E_GOLD_DUPLICATE_KEY", f"key {exc.key!r} appears twice in one object; a JSON reader keeps only the "
            "last value: keep the right one and remove the other",
        )  # fmt: skip
    except (ValueError, RecursionError):
        return None, None


def _key_value_problem(data: Any) -> GoldProblem | None:
    """Returns the first empty or colliding field of a key_value gold object (None when fine)."""
    if not isinstance(data, dict):
        return None
    first: dict[str, str] = {}
    for key in data:
        if not key.strip():
            return GoldProblem("E_GOLD_EMPTY_KEY", f"field {key!r} has an empty name: name the field or remove it")
        norm = normalize_value(key)
        if norm in first:
            return GoldProblem(
                "E_GOLD_KEY_COLLISION", f"fields {first[norm]!r} and {key!r} differ only in case or spaces, so "
                "scoring reads them as one field and keeps one value: merge them into one field",
            )  # fmt: skip
        first[norm] = key
    return None


def _mixed_box_problem(data: Any) -> GoldProblem | None:
    """Returns the first detection gold finding with both box keys holding different boxes (None when fine)."""
    for k, item in enumerate(data if isinstance(data, list) else []):
        if isinstance(item, dict) and "bbox" in item and "bbox_2d" in item and item["bbox"] != item["bbox_2d"]:
            return GoldProblem(
                "E_GOLD_MIXED_BOX_KEYS", f"finding {k} has \"bbox\": {json.dumps(item['bbox'])} and a different "
                f"\"bbox_2d\": {json.dumps(item['bbox_2d'])}; scoring would use \"bbox\" silently: keep one key",
            )  # fmt: skip
    return None


def check_gold(task: str, text: str) -> GoldProblem | None:
    """Checks a gold (training or held-out) answer strictly, beyond the task's shape (`Task.check_answer`).

    The tolerant parsers (`parse_findings`, `parse_key_value`) stay for model output; a gold
    answer must not need their tolerance, since scoring would then keep one of two readings
    without saying so. For the json, detection and key_value tasks, in this order:
    E_GOLD_FENCE (the ```json block is not closed), E_GOLD_BLOCKS (more than one ```json block),
    E_GOLD_DUPLICATE_KEY (an object of its
    JSON, at any depth, has a key twice); key_value: E_GOLD_EMPTY_KEY (a field name of only
    spaces), E_GOLD_KEY_COLLISION (two fields equal after `normalize_value`); detection:
    E_GOLD_MIXED_BOX_KEYS (a finding with "bbox" and a different "bbox_2d"). An answer with
    no ```json block, or one that is not JSON, is left to `Task.check_answer`.

    Args:
        task: A name in `TASKS`.
        text: The gold answer.

    Returns:
        The first GoldProblem, or None when the answer passes (always None for the free-text task).
    """
    if task not in ("json", "detection", "key_value") or not isinstance(text, str):
        return None
    data, problem = _gold_json(text)
    if problem is not None or data is None:
        return problem
    if task == "key_value":
        return _key_value_problem(data)
    return _mixed_box_problem(data) if task == "detection" else None


TASK_NAMES: tuple[str, ...] = tuple(TASKS)
"""Names of the tasks, the one list that config and validate-data check `data.task` against."""


def get_task(name: str) -> Task:
    """Returns the task called name.

    Raises:
        ValueError: No such task (the message lists them).
    """
    if name not in TASKS:
        raise ValueError(f"task {name!r} is not one of {', '.join(repr(k) for k in TASKS)}")
    return TASKS[name]
