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

The package, one concept per module (import the names from here, not from the modules):

* `_types`: `Geometry` (a sample's box convention and image size), `Shape` (what a report
  draws) and the per-sample score dict.
* `_matching`: `match_findings`, one-to-one by label and IoU (hungarian with scipy, else greedy).
* `_detection`, `_json` (json and free text), `_key_value`: each task's parser, check and scorer.
* `_registry`: `Task`, `TASKS`, `TASK_NAMES`, `get_task`: one record per task.
* `_gold`: `check_gold`, the strict reading of gold answers, and its `GOLD_CODES`.
"""

from __future__ import annotations

from components.common.answers import parse_findings
from components.common.tasks._detection import detection_shapes, score_detection
from components.common.tasks._gold import GOLD_CODES, GoldProblem, check_gold
from components.common.tasks._json import parse_json, score_json, score_text
from components.common.tasks._key_value import key_value_rows, normalize_value, parse_key_value, score_key_value
from components.common.tasks._matching import HAVE_SCIPY, MATCH_METHODS, match_findings, resolve_method
from components.common.tasks._registry import TASK_NAMES, TASKS, Task, get_task
from components.common.tasks._types import PIXEL, Geometry, ScoreFn, Shape

__all__ = [
    "GOLD_CODES",
    "HAVE_SCIPY",
    "MATCH_METHODS",
    "PIXEL",
    "TASKS",
    "TASK_NAMES",
    "Geometry",
    "GoldProblem",
    "ScoreFn",
    "Shape",
    "Task",
    "check_gold",
    "detection_shapes",
    "get_task",
    "key_value_rows",
    "match_findings",
    "normalize_value",
    "parse_findings",
    "parse_json",
    "parse_key_value",
    "resolve_method",
    "score_detection",
    "score_json",
    "score_key_value",
    "score_text",
]
