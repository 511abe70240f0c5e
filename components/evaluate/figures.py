"""evaluate's figures as its Metrics records them, beyond the two models' aggregates: regression and per label."""

from __future__ import annotations

from components.common import regression as reg
from components.common.boxes import ResizeRule
from components.evaluate.result import EvalResult


def regression_metrics(result: EvalResult, max_drop: dict[str, float] | None = None) -> tuple[dict, dict]:
    """The regression figures as evaluate's Metrics records them: (flat entries, metadata).

    Args:
        result: An EvalResult with a regression set.
        max_drop: The rule's max drops as configured (names left out: the default). Default None.

    Returns:
        (flat: {"base_regression_<kind>_<figure>", "tuned_regression_<kind>_<figure>" per kind,
        "base_regression_score" and "tuned_regression_score" overall, "regression_<kind or
        overall>_drop", "regression_passed"}; metadata: {"regression": the `summarize` shape,
        "regression_max_drop": the rule in full, "gate_failed": the failed rules}); ({}, {})
        without a regression set.
    """
    if result.regression is None:
        return {}, {}
    flat: dict[str, float] = {}
    sides = (("base", "reference"), ("tuned", "tuned"))
    for kind, entry in (result.regression or {}).get("kinds", {}).items():
        for prefix, side in sides:
            flat.update({f"{prefix}_regression_{kind}_{key}": value for key, value in entry[side].items()})
    for prefix, side in sides:
        flat[f"{prefix}_regression_score"] = result.regression[reg.OVERALL][side]["score"]
    flat.update({f"regression_{drop.name}_drop": drop.drop for drop in result.drops})
    flat["regression_passed"] = float(all(drop.ok for drop in result.drops))
    meta = {"regression": result.regression, "regression_max_drop": reg.max_drops(max_drop),
            "gate_failed": list(result.failed_rules)}  # fmt: skip
    return flat, meta


def label_metrics(
    result: EvalResult, task: str, iou_threshold: float, rule: ResizeRule | None
) -> dict[str, dict[str, dict[str, float]]]:
    """Per-label figures of both models on the held-out rows, as evaluate's Metrics metadata records them.

    Args:
        result: The EvalResult (its per-sample records).
        task: The task ("detection", "key_value"; others have no labels: {}).
        iou_threshold: The IoU at which a box counts as a hit.
        rule: The resize rule the boxes were scored under.

    Returns:
        {label: {"reference": {tp, fp, fn, n_gold, precision, recall, f1}, "tuned": {...}}}, labels sorted; what
        register imports as one Model Registry evaluation slice per label.
    """
    from components.evaluate._labels import per_label

    ref = per_label(result.samples, "reference", task, iou_threshold, rule)
    new = per_label(result.samples, "tuned", task, iou_threshold, rule)
    return {k: {"reference": ref.get(k, {}), "tuned": new.get(k, {})} for k in sorted(set(ref) | set(new))}
