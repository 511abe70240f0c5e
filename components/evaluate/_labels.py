"""Per-label precision / recall / F1 for the evaluate report, counted exactly as the metric counts.

Detection: each sample's gold and answer boxes are read in pixels of the original image
(the sample's convention; the reference's own convention for its answers), matched one-to-
one by `components.common.tasks.match_findings` at the run's IoU threshold (same label, IoU
>= threshold, Hungarian when scipy is there), then counted per label: a matched prediction is
a tp of its label, an unmatched one a fp, an unmatched gold box a fn; an answer that does not
parse makes every gold box of the sample a fn. Summed over labels, these are the aggregate
tp / fp / fn of `components.evaluate.metrics.aggregate`.

key_value: per field, as `score_key_value` counts: a field with the gold's value is a tp, a
wrong or extra field a fp, a gold field not matched a fn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from components.common import tasks
from components.common.answers import parse_findings
from components.common.boxes import BoxError, ResizeRule
from components.common.tasks import Geometry, key_value_rows, parse_key_value


def _counts() -> dict[str, int]:
    return {"tp": 0, "fp": 0, "fn": 0, "n_gold": 0}


def _detection(sample: dict[str, Any], answer_key: str, iou: float, rule: ResizeRule, out: dict) -> None:
    size = sample.get("image_size")
    size = tuple(size) if size else None
    convention = sample.get("box_convention") or "pixel"
    pred_convention = sample.get("reference_box_convention") or convention if answer_key == "reference" else convention
    gold, _ = parse_findings(sample["gold"])
    pred, _ = parse_findings(sample.get(answer_key) or "")
    try:
        gold_px = [
            {"label": f["label"], "bbox": Geometry(convention, size, rule).to_pixels(f["bbox"])} for f in gold or []
        ]
        pred_px = [
            {"label": f["label"], "bbox": Geometry(pred_convention, size, rule).to_pixels(f["bbox"])}
            for f in pred or []
        ]
    except BoxError:
        return
    for g in gold_px:
        out.setdefault(g["label"], _counts())["n_gold"] += 1
    matches = tasks.match_findings(pred_px, gold_px, iou, tasks.resolve_method("auto")) if pred is not None else []
    matched_pred, matched_gold = {p for p, _ in matches}, {g for _, g in matches}
    for p, finding in enumerate(pred_px):
        out.setdefault(finding["label"], _counts())["tp" if p in matched_pred else "fp"] += 1
    for g, finding in enumerate(gold_px):
        if g not in matched_gold:
            out[finding["label"]]["fn"] += 1


def _key_value(sample: dict[str, Any], answer_key: str, out: dict) -> None:
    answer = sample.get(answer_key) or ""
    valid = parse_key_value(answer)[0] is not None
    for name, gold, pred, match in key_value_rows(sample["gold"], answer if valid else ""):
        counts = out.setdefault(name, _counts())
        counts["n_gold"] += gold is not None
        if match:
            counts["tp"] += 1
            continue
        counts["fp"] += pred is not None
        counts["fn"] += gold is not None


def _rates(counts: dict[str, int]) -> dict[str, float]:
    tp, fp, fn = counts["tp"], counts["fp"], counts["fn"]
    if tp + fp + fn == 0:
        return {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def per_label(
    samples: Sequence[dict[str, Any]],
    answer_key: str = "tuned",
    task: str = "detection",
    iou_threshold: float = 0.5,
    rule: ResizeRule | None = None,
) -> dict[str, dict[str, float]]:
    """Returns {label: tp, fp, fn, n_gold, precision, recall, f1} of one model's answers.

    Args:
        samples: evaluate's per-sample records (gold, tuned, reference, box conventions, image size).
        answer_key: "tuned" or "reference". Default "tuned".
        task: "detection" or "key_value"; any other task has no labels ({}). Default "detection".
        iou_threshold: The run's match threshold. Default 0.5.
        rule: Smart-resize settings for resized_pixel samples; None = Qwen2.5-VL's. Default None.

    Returns:
        Per label (detection) or field (key_value), sorted by label.
    """
    out: dict[str, dict[str, Any]] = {}
    rule = rule or ResizeRule()
    for sample in samples:
        if task == "detection":
            _detection(sample, answer_key, iou_threshold, rule, out)
        elif task == "key_value":
            _key_value(sample, answer_key, out)
    return {label: {**c, **_rates(c)} for label, c in sorted(out.items())}
