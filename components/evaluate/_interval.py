"""Bootstrap confidence intervals over rows: on every evaluate figure and on the gate's margin.

The held-out set is a sample; a 16-row F1 of 0.60 could as well be 0.35 or 0.80. `intervals`
redraws the rows with replacement (`DRAWS` times, paired: one draw takes the same rows for both
models, so the margin's interval is that of a difference measured on one set), recomputes each
figure from the drawn rows' counts with `metrics.figures` (as `metrics.aggregate` does), and returns the percentile
interval at `LEVEL`. The seed is fixed: the same scores give the same interval.

The gate reads it with `eval.gate_on: lower_bound` (the tuned value's and the margin's lower
bounds must clear min_value and min_margin); `point` (the default) decides on the point values,
as before, and the interval is reported beside them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from components.evaluate.metrics import GATE_METRICS, figures

DRAWS = 2000  # percentile intervals at 95 %: 2000 draws put each bound within ~0.01 of its limit (16 rows)
LEVEL = 0.95
SEED = 54
FIGURES = GATE_METRICS  # every gateable figure (components.common.metrics) gets an interval
GATE_ON = ("point", "lower_bound")
_CHUNK = 250  # draws at a time: a 10,000-row set holds 250 x 10,000 weights (20 MB), not 2000 x


def _counts(scores: Sequence[dict[str, Any]]) -> Any:
    import numpy as np

    return np.array(
        [[s["tp"], s["fp"], s["fn"], bool(s["json_valid"]), bool(s["exact_match"])] for s in scores], dtype=float
    )


def _figures(sums: Any, n: int) -> dict[str, list[float]]:
    """The figures of `metrics.figures` (the formula `metrics.aggregate` uses) per draw's summed counts."""
    out: dict[str, list[float]] = {f: [] for f in FIGURES}
    for tp, fp, fn, valid, exact in sums.tolist():
        values = figures(tp, fp, fn, valid, exact, n)
        for figure in FIGURES:
            out[figure].append(values[figure])
    return out


def intervals(
    tuned: Sequence[dict[str, Any]], reference: Sequence[dict[str, Any]], *, draws: int = DRAWS, level: float = LEVEL,
    seed: int = SEED,
) -> dict[str, Any]:  # fmt: skip
    """Returns the bootstrap intervals of both models' figures and of their difference.

    Args:
        tuned: The tuned model's per-row scores (`metrics.score_sample`), in row order.
        reference: The reference model's, the same rows in the same order.
        draws: Bootstrap draws. Default DRAWS.
        level: Coverage of the interval. Default 0.95.
        seed: Random seed. Default SEED.

    Returns:
        {"n", "draws", "level", "tuned": {figure: [low, high]}, "reference": {...},
        "margin": {figure: [low, high]} (tuned - reference)}; {} without rows.

    Raises:
        ValueError: The two lists differ in length.
    """
    import numpy as np

    if len(tuned) != len(reference):
        raise ValueError(f"{len(tuned)} tuned scores but {len(reference)} reference scores: score the same rows")
    n = len(tuned)
    if n == 0:
        return {}
    t, r = _counts(tuned), _counts(reference)
    rng = np.random.default_rng(seed)
    drawn: dict[str, dict[str, list[Any]]] = {side: {f: [] for f in FIGURES} for side in ("tuned", "reference")}
    for start in range(0, draws, _CHUNK):
        weights = rng.multinomial(n, np.full(n, 1.0 / n), size=min(_CHUNK, draws - start)).astype(float)
        for side, counts in (("tuned", t), ("reference", r)):
            for figure, values in _figures(weights @ counts, n).items():
                drawn[side][figure].append(values)
    lo, hi = 100 * (1 - level) / 2, 100 * (1 + level) / 2
    out: dict[str, Any] = {"n": n, "draws": draws, "level": level, "tuned": {}, "reference": {}, "margin": {}}
    for figure in FIGURES:
        tv, rv = np.concatenate(drawn["tuned"][figure]), np.concatenate(drawn["reference"][figure])
        for side, values in (("tuned", tv), ("reference", rv), ("margin", tv - rv)):
            out[side][figure] = [float(np.percentile(values, lo)), float(np.percentile(values, hi))]
    return out


def flat_metrics(ci: dict[str, Any]) -> dict[str, float]:
    """Returns the intervals as Metrics entries: `<base|tuned|margin>_<figure>_ci_low` / `_ci_high`."""
    names = {"reference": "base", "tuned": "tuned", "margin": "margin"}
    return {
        f"{names[side]}_{figure}_ci_{end}": value
        for side in names
        for figure, bounds in ci.get(side, {}).items()
        for end, value in zip(("low", "high"), bounds)
    }
