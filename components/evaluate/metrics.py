"""Metrics of the evaluate step: parse model answers, match boxes, score, gate.

Pure Python (scipy optional), no torch and no kfp, so it can be unit tested
and reused anywhere. What a task's answer is and how one sample is scored is defined
once, in ``components.common.tasks``; this module aggregates and gates.

A model answer is expected to contain a JSON list of findings, each finding an
object ``{"label": str, "bbox": [x1, y1, x2, y2]}``, usually inside a
```` ```json ```` fenced block. See :func:`parse_findings` for exactly what is
accepted (it lives in ``components.common.answers`` and is re-exported here).

Box matching: a predicted finding matches a gold finding when the labels are
equal (exact, case-sensitive string comparison) and their IoU is at least the
threshold. Each gold finding is matched at most once and each prediction at
most once, so duplicated predictions are false positives. The assignment is
optimal (maximum number of matches, then maximum total IoU) via the Hungarian
algorithm when scipy is importable, otherwise greedy; see
:func:`match_findings`. Boxes are compared in pixels of the original image: a row's
boxes in another convention (norm1000, resized_pixel) are converted first (``geometry``
of :func:`score_sample`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from components.common import metrics as metric_record
from components.common import tasks
from components.common.answers import is_finite_number, parse_findings  # noqa: F401 (re-exported)
from components.common.boxes import iou  # noqa: F401 (re-exported)
from components.common.tasks import MATCH_METHODS, PIXEL, Geometry  # noqa: F401 (re-exported)

HAVE_SCIPY: bool = tasks.HAVE_SCIPY

GATE_METRICS: tuple[str, ...] = metric_record.GATE_METRICS
"""Metrics of :func:`aggregate` that :func:`gate` can compare (`components.common.metrics`)."""

GATE_METRIC_RANGES: dict[str, tuple[float, float]] = metric_record.GATE_METRIC_RANGES
"""Each gate metric's range (`components.common.metrics`): all are rates in [0, 1]."""

GATE_TOLERANCE: float = 1e-9
"""Slack in :func:`gate` comparisons, to absorb float rounding (0.7 - 0.6)."""

_SAMPLE_KEYS: tuple[str, ...] = ("json_valid", "exact_match", "tp", "fp", "fn")


def match_findings(
    pred: Sequence[dict],
    gold: Sequence[dict],
    iou_threshold: float = 0.5,
    method: str = "auto",
) -> list[tuple[int, int]]:
    """Matches predicted findings to gold findings one-to-one; see `components.common.tasks.match_findings`.

    ``"auto"`` resolves with this module's :data:`HAVE_SCIPY`.

    Args:
        pred: Predicted findings (``{"label", "bbox"}`` dicts).
        gold: Gold findings.
        iou_threshold: Minimum IoU of a match, in ``[0, 1]``.
        method: One of :data:`MATCH_METHODS`.

    Returns:
        ``[(pred_index, gold_index), ...]`` sorted by pred index.

    Raises:
        ValueError: On an unknown method, a threshold outside ``[0, 1]``, or
            ``"hungarian"`` without scipy.
    """
    method = tasks.resolve_method(method, HAVE_SCIPY)
    return tasks.match_findings(pred, gold, iou_threshold=iou_threshold, method=method)


def score_sample(
    pred_text: str,
    gold_text: str,
    iou_threshold: float = 0.5,
    method: str = "auto",
    geometry: Geometry = PIXEL,
    task: str = "detection",
    pred_geometry: Geometry | None = None,
) -> dict:
    """Scores one model answer against the gold answer with the task's definition.

    Detection (the default) maps both answers' boxes to pixels of the original image with
    ``geometry`` before matching; see `components.common.tasks.score_detection`.

    Args:
        pred_text: The model answer.
        gold_text: The gold answer (the assistant turn of the dataset row).
        iou_threshold: Minimum IoU of a match. Default 0.5.
        method: Matching method, see :func:`match_findings`. Default "auto".
        geometry: Box convention and image size of the row. Default pixel (no conversion).
        task: A name of `components.common.tasks.TASKS`. Default "detection".
        pred_geometry: Convention of the answer's boxes when it differs from the gold's;
            None = `geometry`. Default None.

    Returns:
        A dict with:

        * ``json_valid``: the answer parses (see :func:`parse_findings`);
        * ``exact_match``: the parsed answer equals the gold as multisets of
          ``(label, bbox)`` (order-insensitive; numbers compared by value, so
          ``10 == 10.0``; a duplicated finding breaks the match);
        * ``tp``, ``fp``, ``fn``: matched preds, unmatched preds, unmatched
          golds. An invalid answer has ``tp = fp = 0`` and ``fn = n_gold``;
        * ``n_pred``, ``n_gold``: number of findings (``n_pred = 0`` when
          invalid);
        * ``error``: ``None``, or why the answer is invalid.

    Raises:
        ValueError: If the gold answer itself is invalid (a dataset bug), or the task is unknown.
    """
    method = tasks.resolve_method(method, HAVE_SCIPY)
    return tasks.get_task(task).score(pred_text, gold_text, geometry, iou_threshold, method, pred_geometry)


def aggregate(samples: Sequence[dict]) -> dict:
    """Aggregates per-sample scores into micro-averaged metrics.

    ``tp``, ``fp`` and ``fn`` are summed over all samples (micro average over
    boxes); an invalid answer contributes its gold boxes as ``fn``. Then:

    * if ``tp + fp + fn == 0`` (nothing to find and nothing predicted in the
      whole set): ``precision = recall = f1 = 1.0``;
    * otherwise ``precision = tp / (tp + fp)``, or ``0.0`` when there is no
      prediction; ``recall = tp / (tp + fn)``, or ``0.0`` when there is no
      gold box (every prediction is then a false positive);
      ``f1 = 2 * precision * recall / (precision + recall)``, or ``0.0``
      when both are 0.

    Args:
        samples: Outputs of :func:`score_sample`.

    Returns:
        ``{"n", "json_valid_rate", "exact_match_rate", "precision", "recall",
        "f1", "tp", "fp", "fn", "n_json_valid", "n_exact_match"}``.

    Raises:
        ValueError: If ``samples`` is empty or a sample misses a key.
    """
    if not samples:
        raise ValueError(
            "eval set is empty: no samples to aggregate (check the eval dataset "
            "path and that the generation step produced answers)"
        )
    for i, sample in enumerate(samples):
        missing = [k for k in _SAMPLE_KEYS if k not in sample]
        if missing:
            raise ValueError(f"sample {i} misses keys {missing}; expected {_SAMPLE_KEYS}")
    n = len(samples)
    tp = sum(int(s["tp"]) for s in samples)
    fp = sum(int(s["fp"]) for s in samples)
    fn = sum(int(s["fn"]) for s in samples)
    n_valid = sum(bool(s["json_valid"]) for s in samples)
    n_exact = sum(bool(s["exact_match"]) for s in samples)
    return {
        "n": n,
        **figures(tp, fp, fn, n_valid, n_exact, n),
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "n_json_valid": n_valid,
        "n_exact_match": n_exact,
    }


def figures(tp: float, fp: float, fn: float, n_valid: float, n_exact: float, n: float) -> dict[str, float]:
    """Computes every gateable figure (`components.common.metrics.GATE_METRICS`) from summed counts.

    The one formula of each figure: :func:`aggregate` calls it on the scores' sums, and
    `components.evaluate._interval` on each bootstrap draw's.

    Args:
        tp: True positives (matched predictions).
        fp: False positives.
        fn: False negatives.
        n_valid: Answers that parse.
        n_exact: Answers equal to the gold.
        n: Answers (> 0).

    Returns:
        {figure: value} for every name of `GATE_METRICS` (a test checks that none is missing).
    """
    if tp + fp + fn == 0:
        precision = recall = f1 = 1.0
    else:
        precision = tp / (tp + fp) if tp + fp > 0 else 0.0
        recall = tp / (tp + fn) if tp + fn > 0 else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return {"json_valid_rate": n_valid / n, "exact_match_rate": n_exact / n, "precision": precision,
            "recall": recall, "f1": f1}  # fmt: skip


def _metric_value(metrics: dict, metric: str, which: str) -> float:
    if metric not in metrics:
        raise ValueError(f"{which} metrics have no {metric!r}; keys: {sorted(metrics)}")
    value = metrics[metric]
    if not is_finite_number(value):
        raise ValueError(f"{which} {metric} must be a finite number, got {value!r}")
    return float(value)


def gate(
    candidate: dict,
    reference: dict | None,
    metric: str = "f1",
    min_value: float = 0.0,
    min_margin: float = 0.0,
    *,
    gate_on: str = "point",
    ci: dict | None = None,
) -> tuple[bool, str]:
    """Decides whether a candidate model is good enough to promote.

    Passes iff ``candidate[metric] >= min_value`` and
    ``candidate[metric] - reference[metric] >= min_margin``, both up to
    :data:`GATE_TOLERANCE`. ``min_margin`` may be negative to tolerate a
    small regression. With ``reference=None`` (no baseline) only
    ``min_value`` is checked.

    Args:
        candidate: Aggregated metrics of the fine-tuned model.
        reference: Aggregated metrics of the baseline (e.g. the base model),
            or None.
        metric: One of :data:`GATE_METRICS`.
        min_value: Absolute floor for the candidate.
        min_margin: Required improvement over the reference.
        gate_on: "point" (the values themselves decide) or "lower_bound" (the lower bounds of
            the tuned value's and the margin's bootstrap intervals, `ci`, must clear
            min_value and min_margin). Default "point".
        ci: `_interval.intervals` of these scores (needed with lower_bound). Default None.

    Returns:
        ``(passed, reason)`` with a human-readable reason either way.

    Raises:
        ValueError: On an unknown metric, or a metric missing from or not a
            finite number in the inputs.
    """
    if metric not in GATE_METRICS:
        raise ValueError(f"unknown gate metric {metric!r}; allowed: {', '.join(GATE_METRICS)}")
    if gate_on not in ("point", "lower_bound"):
        raise ValueError(f"gate_on {gate_on!r} is not point or lower_bound")
    if gate_on == "lower_bound":
        return _gate_on_bounds(ci or {}, reference is not None, metric, min_value, min_margin)
    cand = _metric_value(candidate, metric, "candidate")
    checks: list[tuple[bool, str]] = [
        (
            cand >= min_value - GATE_TOLERANCE,
            f"{metric} {cand:.4f} {'>=' if cand >= min_value - GATE_TOLERANCE else '<'} min_value {min_value:.4f}",
        )
    ]
    if reference is not None:
        ref = _metric_value(reference, metric, "reference")
        margin = cand - ref
        ok = margin >= min_margin - GATE_TOLERANCE
        checks.append(
            (
                ok,
                f"margin {margin:+.4f} over reference {ref:.4f} {'>=' if ok else '<'} min_margin {min_margin:+.4f}",
            )
        )
    else:
        checks.append((True, "no reference, margin not checked"))
    passed = all(ok for ok, _ in checks)
    if passed:
        return True, "PASS: " + "; ".join(msg for _, msg in checks)
    return False, "FAIL: " + "; ".join(msg for ok, msg in checks if not ok)


def _gate_on_bounds(
    ci: dict, has_reference: bool, metric: str, min_value: float, min_margin: float
) -> tuple[bool, str]:
    """The gate on the intervals' lower bounds (`eval.gate_on: lower_bound`)."""
    if metric not in ci.get("tuned", {}):
        raise ValueError(f"gate_on lower_bound needs a bootstrap interval of {metric!r} (no held-out rows scored?)")
    pct = f"{100 * ci['level']:.0f}%"
    low, high = ci["tuned"][metric]
    ok = low >= min_value - GATE_TOLERANCE
    checks = [
        (ok, f"{metric} {pct} CI [{low:.3f}, {high:.3f}]: lower bound {'>=' if ok else '<'} min_value {min_value:g}")
    ]
    if has_reference:
        low, high = ci["margin"][metric]
        ok = low >= min_margin - GATE_TOLERANCE
        checks.append(
            (
                ok,
                f"margin {pct} CI [{low:+.3f}, {high:+.3f}]: lower bound {'>=' if ok else '<'} min_margin {min_margin:+g}",
            )
        )
    passed = all(ok for ok, _ in checks)
    shown = checks if passed else [c for c in checks if not c[0]]
    return passed, ("PASS: " if passed else "FAIL: ") + "; ".join(msg for _, msg in shown) + f" ({ci['n']} rows)"


def gate_with_regression(task_passed: bool, task_reason: str, drops: Sequence[Any]) -> tuple[bool, str, list[str]]:
    """Adds the regression rule to the task metric's gate decision.

    The tuned model passes only when the task metric passed (`gate`) and no regression check
    failed (`components.common.regression.check_drops`: each kind, and the overall score, may
    drop by at most its max_drop). The reason names every rule that failed: "task metric: ..."
    and "regression <kind>: <metric> <reference> -> <tuned> (worse by X > max_drop Y)".

    Args:
        task_passed: `gate`'s decision.
        task_reason: `gate`'s reason ("PASS: ..." or "FAIL: ...").
        drops: The regression checks (`regression.Drop`s).

    Returns:
        (passed, reason, failed rules: "task" and "regression:<kind or overall>").
    """
    task_text = task_reason.split(": ", 1)[1] if ": " in task_reason else task_reason
    failed = [] if task_passed else ["task"]
    failed += [f"regression:{d.name}" for d in drops if not d.ok]
    if not failed:
        names = ", ".join(d.name for d in drops)
        return True, f"PASS: task metric: {task_text}; regression: within max_drop ({names})", failed
    parts = [] if task_passed else [f"task metric: {task_text}"]
    parts += [f"regression {d.describe()}" for d in drops if not d.ok]
    return False, "FAIL: " + "; ".join(parts), failed
