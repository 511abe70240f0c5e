"""One-to-one matching of predicted to gold findings by label and IoU (hungarian with scipy, else greedy)."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

from components.common import boxes


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
