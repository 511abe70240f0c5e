"""The regression set: general rows that guard what the model already knew, each scored by a standard metric.

A fine-tune that wins on its task can lose general ability (reading text, answering about
other images, grounding other objects). The regression set (`eval.regression`) holds rows
in the task rows' JSONL form (`messages` + `images`) with one more field, ``"kind"``, that
says how its answer is scored. validate-data checks the rows (`row_problem`), evaluate
scores the reference and the tuned model on them (`score_row`, `aggregate`, `summarize`)
and the gate refuses a tuned model that dropped more than `eval.regression_max_drop`
(`check_drops`). Pure Python.

Kinds (`KINDS`):

* ``vqa``: a short answer. ``exact_match`` after `normalize_answer` (case, punctuation at
  the ends of words, articles, number words: the VQA benchmark's normalisation) and ANLS
  (`anls`: 1 - the edit distance over the longer answer's length, 0 below 0.5 similarity;
  the DocVQA metric). The gate reads exact_match.
* ``ocr``: text read off the image. ``cer`` (`cer`: character error rate, edit distance over
  the gold text's length, whitespace collapsed, case kept), lower is better; a row's CER is
  clipped at 1, so one run-away answer counts as one wrong row, not as twenty; the kind's CER
  is the mean over rows. ``exact_match`` too (the same texts equal). The gate reads cer: a
  rise is a drop.
* ``grounding``: boxes of objects the task does not label, the gold a JSON list of
  ``{"label", "bbox"}`` as the detection task writes it, in the dataset's box convention.
  ``hit_rate``: gold boxes matched one-to-one by a predicted box at IoU >= `GROUNDING_IOU`
  (labels not compared: the question names the object), over all gold boxes;
  ``json_valid_rate`` too. The gate reads hit_rate.

Every row's score also holds ``score`` in [0, 1], higher is better (vqa: exact match; ocr:
1 - CER; grounding: its hit rate). A kind's ``score`` is its gate metric turned that way,
and the overall ``score`` is the mean of the kinds' scores (each kind weighs the same,
whatever its number of rows).

`summarize` returns the shape evaluate's Metrics record under ``regression`` (and the Model
Registry evaluation reads): ``{"overall": {"reference", "tuned", "delta"}, "kinds": {kind:
{"reference", "tuned", "delta"}}}``, delta = tuned - reference for every figure but ``n``.
"""

from __future__ import annotations

import difflib
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from components.common import tasks
from components.common.answers import is_finite_number, parse_findings
from components.common.tasks import PIXEL, Geometry

KIND_KEY = "kind"
"""The field of a regression row that names its kind."""

OVERALL = "overall"
"""The name of the rule over all kinds in `eval.regression_max_drop` and in `summarize`'s shape."""

DEFAULT_MAX_DROP = 0.05
"""The absolute drop allowed for a kind, and overall, when `eval.regression_max_drop` does not name it."""

GROUNDING_IOU = 0.5
"""IoU at which a predicted box hits a gold box of a grounding row (the standard Acc@0.5)."""

ANLS_THRESHOLD = 0.5
"""ANLS counts a similarity below this as 0 (the DocVQA definition)."""

GATE_TOLERANCE = 1e-9
"""Slack in `check_drops`, to absorb float rounding."""

CODES: dict[str, str] = {
    "E_REGRESSION_KIND": "a regression row's kind is missing or not one of vqa, ocr, grounding",
    "E_REGRESSION_GOLD": "a regression row's gold answer is empty, or not of its kind's form (grounding: a ```json "
    "list of boxes)",
}
"""The quarantine codes of `row_problem` (validate-data adds them to its own)."""


@dataclass(frozen=True)
class Kind:
    """How one kind of regression row is scored.

    Attributes:
        name: Key in `KINDS`.
        summary: One line for reports and docs.
        metrics: The figures `aggregate` returns besides n and score, in the order reports show them.
        gate_metric: The figure `check_drops` compares.
        higher_is_better: Whether a larger gate_metric is better (False for CER: a rise is a drop).
    """

    name: str
    summary: str
    metrics: tuple[str, ...]
    gate_metric: str
    higher_is_better: bool = True


KINDS: dict[str, Kind] = {
    "vqa": Kind("vqa", "short answer: normalised exact match and ANLS", ("exact_match", "anls"), "exact_match"),
    "ocr": Kind(
        "ocr",
        "text read off the image: character error rate (lower is better)",
        ("cer", "exact_match"),
        "cer",
        higher_is_better=False,
    ),  # fmt: skip
    "grounding": Kind(
        "grounding",
        f"boxes of other objects: hits at IoU >= {GROUNDING_IOU}",
        ("hit_rate", "json_valid_rate"),
        "hit_rate",
    ),  # fmt: skip
}
KIND_NAMES: tuple[str, ...] = tuple(KINDS)
"""The kinds, the one list that config, validate-data and evaluate check names against."""


# ------------------------------------------------------------------------------- texts

_ARTICLES = {"a", "an", "the"}
_NUMBER_WORDS = {w: str(i) for i, w in enumerate("zero one two three four five six seven eight nine ten".split())}
_EDGE_PUNCTUATION = string.punctuation + "“”‘’«»"


def normalize_answer(text: str) -> str:
    """Returns a short answer as exact match compares it (the VQA benchmark's normalisation, in short).

    Case-folded; whitespace collapsed; punctuation at the start and end of each word removed
    (so "Yes." is "yes" while "1:2", "PART-042" and "12.5" keep theirs); the articles a, an,
    the dropped; number words zero to ten written as digits.
    """
    words = []
    for word in str(text).casefold().split():
        word = word.strip(_EDGE_PUNCTUATION)
        if not word or word in _ARTICLES:
            continue
        words.append(_NUMBER_WORDS.get(word, word))
    return " ".join(words)


def _collapse(text: str) -> str:
    return " ".join(str(text).split())


def edit_distance(a: str, b: str, limit: int | None = None) -> int:
    """Returns the Levenshtein distance of two texts (insertions, deletions, substitutions; each 1).

    Args:
        a: One text.
        b: The other.
        limit: Stop early and return `limit` once the distance is known to reach it; None = exact.
            Default None.
    """
    if abs(len(a) - len(b)) >= (limit if limit is not None else 1 << 62):
        return limit
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i]
        for j, cb in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        if limit is not None and min(current) >= limit:
            return limit
        previous = current
    return previous[-1]


def cer(pred: str, gold: str) -> float:
    """Returns the character error rate of an answer, clipped to [0, 1].

    Edit distance between the texts (whitespace collapsed, case kept) over the gold text's
    length, at most 1: an answer as long again as the gold and wholly wrong is as wrong as one
    that is twenty times as long. An empty gold text: 0 for an empty answer, else 1.
    """
    p, g = _collapse(pred), _collapse(gold)
    if not g:
        return 0.0 if not p else 1.0
    return min(1.0, edit_distance(p, g, limit=len(g)) / len(g))


def anls(pred: str, gold: str, threshold: float = ANLS_THRESHOLD) -> float:
    """Returns the ANLS of one answer: 1 - normalised edit distance, or 0 when that similarity is below `threshold`.

    Both texts are case-folded and whitespace collapsed; the distance is divided by the longer
    text's length (two empty texts: 1.0).
    """
    p, g = _collapse(pred).casefold(), _collapse(gold).casefold()
    longest = max(len(p), len(g))
    if not longest:
        return 1.0
    limit = int(longest * (1 - threshold)) + 1  # beyond this the answer scores 0 anyway
    similarity = 1.0 - edit_distance(p, g, limit=limit) / longest
    return similarity if similarity >= threshold else 0.0


# ------------------------------------------------------------------------------- rows


def _score_vqa(pred: str, gold: str, geometry: Geometry, pred_geometry: Geometry | None) -> dict[str, Any]:
    exact = bool(normalize_answer(gold)) and normalize_answer(pred) == normalize_answer(gold)
    return {"exact_match": float(exact), "anls": anls(pred, gold), "score": float(exact), "error": None}


def _score_ocr(pred: str, gold: str, geometry: Geometry, pred_geometry: Geometry | None) -> dict[str, Any]:
    rate = cer(pred, gold)
    return {"cer": rate, "exact_match": float(_collapse(pred) == _collapse(gold)), "score": 1.0 - rate, "error": None}


def _score_grounding(pred: str, gold: str, geometry: Geometry, pred_geometry: Geometry | None) -> dict[str, Any]:
    gold_findings, gold_error = parse_findings(gold)
    if not gold_findings:
        raise ValueError(f"grounding gold answer is invalid ({gold_error or 'no box'}): {gold!r}")
    gold_px = [{"label": "", "bbox": geometry.to_pixels(f["bbox"])} for f in gold_findings]
    found, error = parse_findings(pred)
    if found is None:
        return {"hits": 0, "n_gold": len(gold_px), "n_pred": 0, "json_valid": False, "score": 0.0, "error": error}
    pred_px = [{"label": "", "bbox": (pred_geometry or geometry).to_pixels(f["bbox"])} for f in found]
    hits = len(tasks.match_findings(pred_px, gold_px, GROUNDING_IOU))  # labels blanked: the question names it
    return {"hits": hits, "n_gold": len(gold_px), "n_pred": len(pred_px), "json_valid": True,
            "score": hits / len(gold_px), "error": None}  # fmt: skip


_SCORERS: dict[str, Callable[..., dict[str, Any]]] = {"vqa": _score_vqa, "ocr": _score_ocr,
                                                      "grounding": _score_grounding}  # fmt: skip


def score_row(
    kind: str, pred: str, gold: str, geometry: Geometry = PIXEL, pred_geometry: Geometry | None = None
) -> dict[str, Any]:
    """Scores one answer to a regression row by its kind's metric.

    Args:
        kind: One of `KIND_NAMES`.
        pred: The model's answer.
        gold: The row's gold answer.
        geometry: Convention and image size of the gold boxes (grounding). Default pixel.
        pred_geometry: Convention of the answer's boxes when it differs from the gold's (the base
            model answers in its family's); None = `geometry`. Default None.

    Returns:
        {"kind", "score" (in [0, 1], higher is better), the kind's per-row figures (vqa:
        exact_match, anls; ocr: cer, exact_match; grounding: hits, n_gold, n_pred, json_valid),
        "error" (None, or why a grounding answer does not parse)}.

    Raises:
        ValueError: An unknown kind, or a grounding gold answer without boxes (a dataset bug:
            validate-data quarantines such rows).
    """
    if kind not in _SCORERS:
        raise ValueError(f"regression kind {kind!r} is not one of {', '.join(KIND_NAMES)}")
    return {"kind": kind, **_SCORERS[kind](str(pred), str(gold), geometry, pred_geometry)}


def aggregate(kind: str, scores: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Aggregates the row scores of one kind.

    Args:
        kind: One of `KIND_NAMES`.
        scores: `score_row` outputs of that kind (at least one).

    Returns:
        {"n", the kind's metrics (vqa: exact_match, anls: means; ocr: cer, exact_match: means;
        grounding: hit_rate = hits / gold boxes, json_valid_rate), "score": the gate metric with
        higher better (ocr: 1 - cer)}.

    Raises:
        ValueError: An unknown kind, or no scores.
    """
    if kind not in KINDS:
        raise ValueError(f"regression kind {kind!r} is not one of {', '.join(KIND_NAMES)}")
    if not scores:
        raise ValueError(f"no {kind} rows to aggregate")
    n = len(scores)
    if kind == "grounding":
        n_gold = sum(int(s["n_gold"]) for s in scores)
        out = {"hit_rate": sum(int(s["hits"]) for s in scores) / n_gold if n_gold else 0.0,
               "json_valid_rate": sum(bool(s["json_valid"]) for s in scores) / n}  # fmt: skip
    else:
        out = {metric: sum(float(s[metric]) for s in scores) / n for metric in KINDS[kind].metrics}
    gate_value = out[KINDS[kind].gate_metric]
    return {"n": n, **out, "score": gate_value if KINDS[kind].higher_is_better else 1.0 - gate_value}


def _delta(reference: dict[str, float], tuned: dict[str, float]) -> dict[str, float]:
    return {k: tuned[k] - reference[k] for k in tuned if k != "n" and k in reference}


def summarize(
    kinds: Sequence[str], reference: Sequence[dict[str, Any]], tuned: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """Returns the regression figures of both models: per kind and overall, with the deltas.

    Args:
        kinds: Each row's kind, in row order.
        reference: The reference model's `score_row` outputs, in row order.
        tuned: The tuned model's, in row order.

    Returns:
        {"overall": {"reference": {"n", "score"}, "tuned": {...}, "delta": {"score"}},
        "kinds": {kind: {"reference": aggregate, "tuned": aggregate, "delta": tuned - reference
        per figure}}} for the kinds present, in `KIND_NAMES` order; overall score = the mean of
        the kinds' scores.

    Raises:
        ValueError: The three sequences differ in length, or are empty.
    """
    if not (len(kinds) == len(reference) == len(tuned)) or not kinds:
        raise ValueError(f"regression rows: {len(kinds)} kinds, {len(reference)} and {len(tuned)} scores")
    out: dict[str, Any] = {"kinds": {}}
    for kind in (k for k in KIND_NAMES if k in kinds):
        picked = [i for i, k in enumerate(kinds) if k == kind]
        ref = aggregate(kind, [reference[i] for i in picked])
        new = aggregate(kind, [tuned[i] for i in picked])
        out["kinds"][kind] = {"reference": ref, "tuned": new, "delta": _delta(ref, new)}
    sides = {}
    for side in ("reference", "tuned"):
        scores = [entry[side]["score"] for entry in out["kinds"].values()]
        sides[side] = {"n": len(kinds), "score": sum(scores) / len(scores)}
    out[OVERALL] = {**sides, "delta": _delta(sides["reference"], sides["tuned"])}
    return {OVERALL: out.pop(OVERALL), "kinds": out["kinds"]}


# ------------------------------------------------------------------------------- the gate rule


def max_drop_problem(max_drop: Any) -> str:
    """Returns what is wrong with an `eval.regression_max_drop` mapping ("" when it is fine).

    A mapping of `overall` and kind names to the absolute drop allowed, each a number >= 0.
    """
    if not isinstance(max_drop, dict):
        return f"must be a mapping of {OVERALL} and kind names to numbers, e.g. {{{OVERALL}: 0.05, ocr: 0.1}}"
    known = (OVERALL, *KIND_NAMES)
    for name, value in max_drop.items():
        if name not in known:
            close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            return f"names an unknown kind {name!r}{hint}; the known names are {', '.join(known)}"
        if not is_finite_number(value) or value < 0:
            return f"{name}: must be a number >= 0 (an absolute drop, e.g. 0.05), got {value!r}"
    return ""


def max_drops(max_drop: dict[str, float] | None = None) -> dict[str, float]:
    """Returns the drop allowed for overall and every kind: the given ones, `DEFAULT_MAX_DROP` for the rest.

    Raises:
        ValueError: `max_drop_problem` finds a problem.
    """
    max_drop = dict(max_drop or {})
    if problem := max_drop_problem(max_drop):
        raise ValueError(f"regression_max_drop {problem}")
    return {name: float(max_drop.get(name, DEFAULT_MAX_DROP)) for name in (OVERALL, *KIND_NAMES)}


@dataclass(frozen=True)
class Drop:
    """One rule of the regression gate, checked.

    Attributes:
        name: `OVERALL` or a kind.
        metric: The figure compared ("score" overall, else the kind's gate metric).
        reference: The reference model's value.
        tuned: The tuned model's value.
        drop: How much worse the tuned model is (a CER rise counts as a drop; < 0 = better).
        allowed: The drop allowed.
    """

    name: str
    metric: str
    reference: float
    tuned: float
    drop: float
    allowed: float

    @property
    def ok(self) -> bool:
        """Whether the drop is within what is allowed."""
        return self.drop <= self.allowed + GATE_TOLERANCE

    def describe(self) -> str:
        """One phrase, e.g. "ocr cer 0.050 -> 0.400 (worse by 0.350 > max_drop 0.050)"."""
        values = f"{self.name} {self.metric} {self.reference:.3f} -> {self.tuned:.3f}"
        if abs(self.drop) < 0.0005:
            return f"{values} (no change)"
        if self.drop < 0:
            return f"{values} (better by {-self.drop:.3f})"
        return f"{values} (worse by {self.drop:.3f} {'<=' if self.ok else '>'} max_drop {self.allowed:.3f})"


def check_drops(summary: dict[str, Any], max_drop: dict[str, float] | None = None) -> list[Drop]:
    """Checks the regression rule: no kind, and not the overall score, dropped more than allowed.

    Args:
        summary: `summarize` output.
        max_drop: {`OVERALL` or kind: absolute drop allowed}; missing names get
            `DEFAULT_MAX_DROP`. Default None (all defaults).

    Returns:
        One `Drop` per kind present (in `KIND_NAMES` order), then the overall one; `Drop.ok` says
        which passed.

    Raises:
        ValueError: An invalid max_drop (`max_drop_problem`).
    """
    allowed = max_drops(max_drop)
    out = []
    for kind, entry in summary["kinds"].items():
        spec = KINDS[kind]
        ref, new = float(entry["reference"][spec.gate_metric]), float(entry["tuned"][spec.gate_metric])
        drop = ref - new if spec.higher_is_better else new - ref
        out.append(Drop(kind, spec.gate_metric, ref, new, drop, allowed[kind]))
    ref, new = float(summary[OVERALL]["reference"]["score"]), float(summary[OVERALL]["tuned"]["score"])
    out.append(Drop(OVERALL, "score", ref, new, ref - new, allowed[OVERALL]))
    return out


# ------------------------------------------------------------------------------- rows as data


def row_problem(row: dict[str, Any]) -> tuple[str, str] | None:
    """Checks a regression row's kind and gold answer (after the row passed the task rows' own checks).

    Args:
        row: The parsed row (``messages`` whose last is the assistant's gold answer, ``images``, ``kind``).

    Returns:
        None when fine, else (code, message): E_REGRESSION_KIND (no kind, or not one of
        `KIND_NAMES`, with the closest), E_REGRESSION_GOLD (an empty gold answer; grounding: not a
        ```json list of {"label", "bbox"} with at least one box, or one a strict reading refuses).
    """
    kind = row.get(KIND_KEY)
    if kind is None:
        return "E_REGRESSION_KIND", f"the row has no {KIND_KEY!r}; add one of {', '.join(KIND_NAMES)}"
    if kind not in KINDS:
        close = difflib.get_close_matches(str(kind), KIND_NAMES, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return "E_REGRESSION_KIND", f"kind {kind!r} is not one of {', '.join(KIND_NAMES)}{hint}"
    gold = row["messages"][-1]["content"]
    if not gold.strip():
        return "E_REGRESSION_GOLD", f"the gold answer (the last, assistant message) of this {kind} row is empty"
    if kind == "grounding":
        problem = tasks.check_gold("detection", gold)
        reason = problem.message if problem else tasks.get_task("detection").check_answer(gold)
        if not reason and not parse_findings(gold)[0]:
            reason = "the list has no box"
        if reason:
            return "E_REGRESSION_GOLD", (
                f"grounding gold answer: {reason}; write the boxes as the detection task does: "
                '```json [{"label": ..., "bbox": [x1, y1, x2, y2]}] ```'
            )
    return None


_WORD = re.compile(r"\S+")


def question_text(messages: Sequence[dict[str, Any]]) -> str:
    """Returns the user's text of a row's prompt messages, image tags removed (for reports)."""
    text = " ".join(m["content"] for m in messages if m.get("role") == "user")
    return " ".join(_WORD.findall(text.replace("<image>", " ")))
