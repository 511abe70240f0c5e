"""Metrics of the evaluate step: parse model answers, match boxes, score, gate.

Pure Python (scipy optional), no torch and no kfp, so it can be unit tested
and reused anywhere.

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
:func:`match_findings`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from components.common.answers import is_finite_number, parse_findings

try:  # Optional: optimal assignment.
    from scipy.optimize import linear_sum_assignment as _linear_sum_assignment
except ImportError:  # pragma: no cover - depends on the environment
    _linear_sum_assignment = None

HAVE_SCIPY: bool = _linear_sum_assignment is not None

GATE_METRICS: tuple[str, ...] = (
    "f1",
    "precision",
    "recall",
    "json_valid_rate",
    "exact_match_rate",
)
"""Metrics of :func:`aggregate` that :func:`gate` can compare."""

GATE_TOLERANCE: float = 1e-9
"""Slack in :func:`gate` comparisons, to absorb float rounding (0.7 - 0.6)."""

MATCH_METHODS: tuple[str, ...] = ("auto", "hungarian", "greedy")

_SAMPLE_KEYS: tuple[str, ...] = ("json_valid", "exact_match", "tp", "fp", "fn")


def _area(box: Sequence[float]) -> float:
    x1, y1, x2, y2 = box
    return max(0.0, x2 - x1) * max(0.0, y2 - y1)


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two ``[x1, y1, x2, y2]`` boxes.

    Boxes are continuous (``x2 - x1`` is the width). A box with ``x2 <= x1``
    or ``y2 <= y1`` is degenerate and has zero area. When the union has zero
    area (both boxes degenerate, even if equal) the result is ``0.0``.

    Args:
        a: First box.
        b: Second box.

    Returns:
        IoU in ``[0, 1]``.

    Raises:
        ValueError: If a box does not have 4 coordinates.
    """
    if len(a) != 4 or len(b) != 4:
        raise ValueError(f"boxes must have 4 coordinates [x1, y1, x2, y2], got {a!r} and {b!r}")
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(0.0, iw) * max(0.0, ih) if _area(a) > 0 and _area(b) > 0 else 0.0
    union = _area(a) + _area(b) - inter
    if union <= 0:
        return 0.0
    return float(inter / union)


def match_findings(
    pred: Sequence[dict],
    gold: Sequence[dict],
    iou_threshold: float = 0.5,
    method: str = "auto",
) -> list[tuple[int, int]]:
    """Matches predicted findings to gold findings one-to-one.

    A pair ``(p, g)`` is eligible when ``pred[p]["label"] == gold[g]["label"]``
    and ``iou(pred[p]["bbox"], gold[g]["bbox"]) >= iou_threshold``. Each pred
    and each gold index appears in at most one pair, so a duplicated
    prediction can match only once and the copies are false positives.

    Methods:

    * ``"hungarian"``: optimal assignment with
      ``scipy.optimize.linear_sum_assignment``; it maximises the number of
      matched pairs first and, among those, the total IoU.
    * ``"greedy"``: repeatedly takes the eligible pair with the highest IoU
      (ties: lower pred index, then lower gold index) whose pred and gold are
      both still free. It can match fewer pairs than the optimum, e.g. when
      the best-overlapping pred steals the only gold another pred could match.
    * ``"auto"``: ``"hungarian"`` if scipy is importable, else ``"greedy"``.

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
    if method not in MATCH_METHODS:
        raise ValueError(f"unknown match method {method!r}; expected one of {MATCH_METHODS}")
    if not 0.0 <= iou_threshold <= 1.0:
        raise ValueError(f"iou_threshold must be in [0, 1], got {iou_threshold}")
    if method == "auto":
        method = "hungarian" if HAVE_SCIPY else "greedy"
    if method == "hungarian" and not HAVE_SCIPY:
        raise ValueError("method 'hungarian' needs scipy, which is not importable")

    eligible: dict[tuple[int, int], float] = {}
    for p, pf in enumerate(pred):
        for g, gf in enumerate(gold):
            if pf["label"] != gf["label"]:
                continue
            score = iou(pf["bbox"], gf["bbox"])
            # A zero IoU never matches, even with iou_threshold == 0.
            if score > 0 and score >= iou_threshold:
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

    # Weight = bonus + IoU with bonus > any total IoU, so that one more match
    # always beats a higher IoU sum: maximum cardinality, then maximum IoU.
    bonus = float(min(len(pred), len(gold)) + 1)
    cost = [[0.0] * len(gold) for _ in pred]
    for (p, g), score in eligible.items():
        cost[p][g] = -(bonus + score)
    rows, cols = _linear_sum_assignment(cost)
    return sorted((int(p), int(g)) for p, g in zip(rows, cols) if (int(p), int(g)) in eligible)


def _as_key(finding: dict) -> tuple:
    return (finding["label"], tuple(float(v) for v in finding["bbox"]))


def score_sample(pred_text: str, gold_text: str, iou_threshold: float = 0.5, method: str = "auto") -> dict:
    """Scores one model answer against the gold answer.

    Args:
        pred_text: The model answer.
        gold_text: The gold answer (the assistant turn of the dataset row).
        iou_threshold: Minimum IoU of a match.
        method: Matching method, see :func:`match_findings`.

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
        ValueError: If the gold answer itself is invalid (a dataset bug).
    """
    gold, gold_error = parse_findings(gold_text)
    if gold is None:
        raise ValueError(f"gold answer is invalid ({gold_error}): {gold_text!r}")
    pred, error = parse_findings(pred_text)
    if pred is None:
        return {
            "json_valid": False,
            "exact_match": False,
            "tp": 0,
            "fp": 0,
            "fn": len(gold),
            "n_pred": 0,
            "n_gold": len(gold),
            "error": error,
        }
    matches = match_findings(pred, gold, iou_threshold=iou_threshold, method=method)
    tp = len(matches)
    return {
        "json_valid": True,
        "exact_match": Counter(map(_as_key, pred)) == Counter(map(_as_key, gold)),
        "tp": tp,
        "fp": len(pred) - tp,
        "fn": len(gold) - tp,
        "n_pred": len(pred),
        "n_gold": len(gold),
        "error": None,
    }


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
    if tp + fp + fn == 0:
        precision = recall = f1 = 1.0
    else:
        precision = tp / (tp + fp) if tp + fp > 0 else 0.0
        recall = tp / (tp + fn) if tp + fn > 0 else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return {
        "n": n,
        "json_valid_rate": n_valid / n,
        "exact_match_rate": n_exact / n,
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "n_json_valid": n_valid,
        "n_exact_match": n_exact,
    }


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

    Returns:
        ``(passed, reason)`` with a human-readable reason either way.

    Raises:
        ValueError: On an unknown metric, or a metric missing from or not a
            finite number in the inputs.
    """
    if metric not in GATE_METRICS:
        raise ValueError(f"unknown gate metric {metric!r}; allowed: {', '.join(GATE_METRICS)}")
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
