"""The task registry: one `Task` record per task (`TASKS`, looked up with `get_task`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from components.common import metrics as metric_record
from components.common.answers import parse_findings
from components.common.tasks._detection import check_detection, detection_shapes, score_detection
from components.common.tasks._json import check_json, parse_json, score_json, score_text
from components.common.tasks._key_value import check_key_value, parse_key_value, score_key_value
from components.common.tasks._types import Geometry, ScoreFn, Shape, no_shapes


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


TASKS: dict[str, Task] = {
    "": Task(
        name="",
        summary="free text; exact match after stripping",
        metrics=("exact_match_rate",),
        parse=lambda text: (text, None),
        check_answer=lambda text: "",
        score=score_text,
        shapes=no_shapes,
    ),
    "json": Task(
        name="json",
        summary="a ```json block; exact match of the parsed values",
        metrics=("json_valid_rate", "exact_match_rate"),
        parse=parse_json,
        check_answer=check_json,
        score=score_json,
        shapes=no_shapes,
    ),
    "detection": Task(
        name="detection",
        summary='JSON list of {"label", "bbox" | "bbox_2d"}; boxes matched by label and IoU in pixels',
        metrics=("f1", "precision", "recall", "json_valid_rate", "exact_match_rate"),
        parse=parse_findings,
        check_answer=check_detection,
        score=score_detection,
        shapes=detection_shapes,
    ),
    "key_value": Task(
        name="key_value",
        summary="a ```json object of field -> string / number; fields matched by normalised value",
        metrics=("f1", "precision", "recall", "exact_match_rate", "json_valid_rate"),
        parse=parse_key_value,
        check_answer=check_key_value,
        score=score_key_value,
        shapes=no_shapes,
    ),
}

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
