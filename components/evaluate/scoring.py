"""Both models' answers scored with the task's definition, and the per-row records evaluate writes.

Held-out rows are scored by the task (`components.evaluate.metrics.score_sample`); regression
rows by their kind's metric (`components.common.regression.score_row`), with the regression
rule's checks (`regression.check_drops`). The records (row, geometry, each model's answer and
score) go to the predictions JSONL, held-out rows first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from components.common import regression as reg
from components.common.tasks import Geometry
from components.evaluate.metrics import aggregate, score_sample


def task_scores(
    answers: list[str],
    rows: list[dict[str, Any]],
    geometries: list[Geometry],
    pred_geometries: list[Geometry],
    iou_threshold: float,
    task: str,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Scores one model's answers to the held-out rows with the task's definition: (aggregate, per-row scores)."""
    scores = [
        score_sample(answer, row["gold"], iou_threshold, geometry=geometry, pred_geometry=pred_geometry, task=task)
        for answer, row, geometry, pred_geometry in zip(answers, rows, geometries, pred_geometries)
    ]
    return aggregate(scores), scores


def regression_scores(
    rows: list[dict[str, Any]],
    reference_answers: list[str],
    tuned_answers: list[str],
    geometries: tuple[list[Geometry], list[Geometry]],
    max_drop: dict[str, float] | None,
) -> tuple[dict[str, Any], list[reg.Drop], list[dict[str, Any]]]:
    """Scores both models on the regression rows; returns (the figures, the rule's checks, the row records)."""
    gold_geometries, ref_geometries = geometries
    samples = []
    for row, geometry, ref_geometry, r_ans, t_ans in zip(
        rows, gold_geometries, ref_geometries, reference_answers, tuned_answers
    ):
        samples.append(
            {
                "set": "regression",
                "kind": row["kind"],
                "line": row["line"],
                "origin": row["origin"],
                "images": row["images"],
                "question": reg.question_text(row["messages"]),
                "box_convention": geometry.convention,
                "image_size": list(geometry.image_size) if geometry.image_size else None,
                "gold": row["gold"],
                "tuned": t_ans,
                "tuned_score": reg.score_row(row["kind"], t_ans, row["gold"], geometry),
                "reference": r_ans,
                "reference_score": reg.score_row(row["kind"], r_ans, row["gold"], geometry, ref_geometry),
            }
        )
    summary = reg.summarize(
        [s["kind"] for s in samples], [s["reference_score"] for s in samples], [s["tuned_score"] for s in samples]
    )
    return summary, reg.check_drops(summary, max_drop), samples


def write_predictions(path: str, samples: list[dict[str, Any]]) -> None:
    """Writes the per-row records (held-out, then regression) as JSONL."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for sample in samples:
            f.write(json.dumps(sample, ensure_ascii=False) + "\n")


def sample_records(
    rows: list[dict[str, Any]],
    geometries: list[Any],
    reference_box_convention: str,
    tuned: tuple[list[str], list[Any]],
    reference: tuple[list[str], list[Any]],
) -> list[dict[str, Any]]:
    """One predictions record per held-out row: the row, its geometry, each model's answer and score."""
    return [
        {
            "line": row["line"],
            "origin": row["origin"],
            "images": row["images"],
            "box_convention": geometry.convention,
            "reference_box_convention": reference_box_convention,
            "image_size": list(geometry.image_size) if geometry.image_size else None,
            "gold": row["gold"],
            "tuned": t_ans,
            "tuned_score": t_score,
            "reference": r_ans,
            "reference_score": r_score,
        }
        for row, geometry, t_ans, t_score, r_ans, r_score in zip(rows, geometries, *tuned, *reference)
    ]
