"""Tests of components.evaluate.metrics on hand-made answers."""

from __future__ import annotations

import json

import pytest

from components.common import answers
from components.evaluate import metrics
from components.evaluate.metrics import (
    aggregate,
    gate,
    iou,
    match_findings,
    parse_findings,
    score_sample,
)


def answer(findings: list[dict]) -> str:
    return "```json\n" + json.dumps(findings) + "\n```"


def f(label: str, bbox: list[float]) -> dict:
    return {"label": label, "bbox": bbox}


HOLE = f("hole", [10, 10, 20, 20])
TITLE = f("title_block", [150, 200, 250, 250])


# ---------------------------------------------------------------- parse_findings


def test_parse_fenced_json():
    text = "Here you go:\n" + answer([HOLE, TITLE]) + "\nDone."
    assert parse_findings(text) == ([HOLE, TITLE], None)


def test_parse_prefers_json_fence_over_other_fences():
    text = "```\nnot json\n```\n```JSON\n" + json.dumps([HOLE]) + "\n```"
    assert parse_findings(text) == ([HOLE], None)


def test_parse_bare_fence_and_bare_list():
    assert parse_findings("```\n" + json.dumps([HOLE]) + "\n```") == ([HOLE], None)
    assert parse_findings(json.dumps([HOLE])) == ([HOLE], None)
    assert parse_findings("The answer is " + json.dumps([HOLE]) + ".") == ([HOLE], None)


def test_parse_drops_extra_keys_and_accepts_floats():
    text = answer([{"label": "hole", "bbox": [1.5, 2, 3, 4], "score": 0.9}])
    assert parse_findings(text) == ([f("hole", [1.5, 2, 3, 4])], None)


def test_parse_empty_list_is_valid():
    assert parse_findings("```json\n[]\n```") == ([], None)


def test_parse_no_json():
    findings, reason = parse_findings("I cannot see any drawing.")
    assert findings is None
    assert "no JSON" in reason


def test_parse_invalid_json():
    findings, reason = parse_findings('```json\n[{"label": "hole", "bbox": [1, 2, 3, 4]\n```')
    assert findings is None
    assert reason.startswith("invalid JSON")


def test_parse_truncated_generation_is_invalid():
    findings, reason = parse_findings('```json\n[{"label": "hole", "bbox": [1, 2')
    assert findings is None and reason.startswith("invalid JSON")


def test_parse_not_a_list():
    findings, reason = parse_findings('```json\n{"label": "hole", "bbox": [1, 2, 3, 4]}\n```')
    assert findings is None
    assert "not a list" in reason


@pytest.mark.parametrize(
    "item, fragment",
    [
        ("[1, 2, 3, 4]", "not an object"),
        ('{"bbox": [1, 2, 3, 4]}', "'label'"),
        ('{"label": 3, "bbox": [1, 2, 3, 4]}', "'label'"),
        ('{"label": "", "bbox": [1, 2, 3, 4]}', "'label'"),
        ('{"label": "hole"}', "'bbox'"),
        ('{"label": "hole", "bbox": [1, 2, 3]}', "'bbox'"),
        ('{"label": "hole", "bbox": [1, 2, 3, "4"]}', "'bbox'"),
        ('{"label": "hole", "bbox": [1, 2, 3, true]}', "'bbox'"),
        ('{"label": "hole", "bbox": {"x": 1}}', "'bbox'"),
    ],
)
def test_parse_bad_items(item, fragment):
    findings, reason = parse_findings(f"```json\n[{item}]\n```")
    assert findings is None
    assert "item 0" in reason and fragment in reason


def test_parse_rejects_nan():
    findings, reason = parse_findings('[{"label": "hole", "bbox": [NaN, 2, 3, 4]}]')
    assert findings is None and "NaN" in reason


def test_parse_non_string():
    findings, reason = parse_findings(None)  # type: ignore[arg-type]
    assert findings is None and "not a string" in reason


def test_parse_findings_is_the_shared_one():
    # validate-data checks training answers with the same parser evaluate scores with
    assert parse_findings is answers.parse_findings


def test_extract_fenced_finds_the_block_by_info_string():
    text = "intro\n```python\nx = 1\n```\n``` JSON \n[1]\n```\n```\n[2]\n```"
    assert answers.extract_fenced(text) == "[1]\n"
    assert answers.extract_fenced(text, "") == "[2]\n"
    assert answers.extract_fenced(text, "yaml") is None
    assert answers.extract_fenced("```json\n[3") == "[3"  # an unclosed fence runs to the end


# ----------------------------------------------------------------------- iou


def test_iou_values():
    assert iou([0, 0, 10, 10], [0, 0, 10, 10]) == 1.0
    assert iou([0, 0, 10, 10], [5, 0, 15, 10]) == pytest.approx(50 / 150)
    assert iou([0, 0, 10, 10], [20, 20, 30, 30]) == 0.0
    assert iou([0, 0, 10, 10], [10, 0, 20, 10]) == 0.0  # touching edges


def test_iou_degenerate_boxes_no_division_by_zero():
    assert iou([5, 5, 5, 5], [5, 5, 5, 5]) == 0.0
    assert iou([0, 0, 0, 10], [0, 0, 10, 10]) == 0.0
    assert iou([10, 10, 0, 0], [0, 0, 10, 10]) == 0.0  # inverted = zero area
    assert iou([10, 10, 0, 0], [10, 10, 0, 0]) == 0.0


def test_iou_bad_length():
    with pytest.raises(ValueError, match="4 coordinates"):
        iou([0, 0, 1], [0, 0, 1, 1])


# ------------------------------------------------------------ match_findings


def test_match_iou_threshold_boundary():
    gold = [f("hole", [0, 0, 10, 10])]
    exactly = [f("hole", [0, 0, 10, 5])]  # IoU 0.5
    below = [f("hole", [0, 0, 10, 4.9])]  # IoU 0.49
    above = [f("hole", [0, 0, 10, 5.1])]  # IoU 0.51
    assert iou(exactly[0]["bbox"], gold[0]["bbox"]) == 0.5
    assert match_findings(exactly, gold, 0.5) == [(0, 0)]
    assert match_findings(below, gold, 0.5) == []
    assert match_findings(above, gold, 0.5) == [(0, 0)]
    assert match_findings(above, gold, 0.52) == []


def test_match_label_must_match():
    assert match_findings([f("dimension", HOLE["bbox"])], [HOLE]) == []
    assert match_findings([f("Hole", HOLE["bbox"])], [HOLE]) == []


def test_match_duplicates_match_once():
    assert match_findings([HOLE, HOLE, HOLE], [HOLE]) in ([(0, 0)], [(1, 0)], [(2, 0)])
    assert match_findings([HOLE, HOLE], [HOLE], method="greedy") == [(0, 0)]


# Greedy takes P0-G0 (IoU 0.818) first, leaving P1 (which only overlaps G0
# enough) unmatched; the optimal assignment is P0-G1 and P1-G0.
G0, G1 = [0, 0, 10, 10], [4, 0, 14, 10]
P0, P1 = [1, 0, 11, 10], [-3, 0, 7, 10]


def test_hungarian_vs_greedy_fixture_ious():
    assert iou(P0, G0) == pytest.approx(9 / 11)
    assert iou(P0, G1) == pytest.approx(7 / 13)
    assert iou(P1, G0) == pytest.approx(7 / 13)
    assert iou(P1, G1) == pytest.approx(3 / 17)


def test_greedy_is_suboptimal():
    pred, gold = [f("hole", P0), f("hole", P1)], [f("hole", G0), f("hole", G1)]
    assert match_findings(pred, gold, 0.5, method="greedy") == [(0, 0)]


def test_hungarian_is_optimal():
    pred, gold = [f("hole", P0), f("hole", P1)], [f("hole", G0), f("hole", G1)]
    assert match_findings(pred, gold, 0.5, method="hungarian") == [(0, 1), (1, 0)]
    assert match_findings(pred, gold, 0.5) == [(0, 1), (1, 0)]  # auto


def test_hungarian_maximises_matches_before_iou_sum():
    # One perfect pair (IoU 1.0) beats the IoU sum of the two-pair assignment
    # (6/14 + 5/15 = 0.76), but two matches must win over one.
    gold = [f("hole", [0, 0, 10, 10]), f("hole", [4, 0, 14, 10])]
    pred = [f("hole", [0, 0, 10, 10]), f("hole", [-5, 0, 5, 10])]
    assert iou(pred[0]["bbox"], gold[1]["bbox"]) == pytest.approx(6 / 14)
    assert iou(pred[1]["bbox"], gold[0]["bbox"]) == pytest.approx(5 / 15)
    assert iou(pred[1]["bbox"], gold[1]["bbox"]) < 0.3
    assert match_findings(pred, gold, 0.3, method="hungarian") == [(0, 1), (1, 0)]
    assert match_findings(pred, gold, 0.3, method="greedy") == [(0, 0)]


def test_hungarian_prefers_higher_iou_at_equal_cardinality():
    gold = [f("hole", [0, 0, 10, 10])]
    pred = [f("hole", [0, 0, 10, 6]), f("hole", [0, 0, 10, 9])]
    assert match_findings(pred, gold, 0.5, method="hungarian") == [(1, 0)]


def test_auto_falls_back_to_greedy_without_scipy(monkeypatch):
    monkeypatch.setattr(metrics, "HAVE_SCIPY", False)
    pred, gold = [f("hole", P0), f("hole", P1)], [f("hole", G0), f("hole", G1)]
    assert match_findings(pred, gold, 0.5) == [(0, 0)]
    with pytest.raises(ValueError, match="scipy"):
        match_findings(pred, gold, 0.5, method="hungarian")


def test_match_bad_arguments():
    with pytest.raises(ValueError, match="method"):
        match_findings([HOLE], [HOLE], method="magic")
    with pytest.raises(ValueError, match="iou_threshold"):
        match_findings([HOLE], [HOLE], iou_threshold=1.5)


def test_match_zero_threshold_still_needs_overlap():
    assert match_findings([f("hole", [50, 50, 60, 60])], [HOLE], iou_threshold=0.0) == []


# -------------------------------------------------------------- score_sample


def test_score_empty_pred_and_empty_gold_is_perfect():
    s = score_sample("```json\n[]\n```", "```json\n[]\n```", 0.5)
    assert s == {
        "json_valid": True,
        "exact_match": True,
        "tp": 0,
        "fp": 0,
        "fn": 0,
        "n_pred": 0,
        "n_gold": 0,
        "error": None,
    }
    agg = aggregate([s])
    assert (agg["precision"], agg["recall"], agg["f1"]) == (1.0, 1.0, 1.0)


def test_score_empty_pred_nonempty_gold():
    s = score_sample("```json\n[]\n```", answer([HOLE, TITLE]), 0.5)
    assert (s["json_valid"], s["exact_match"], s["tp"], s["fp"], s["fn"]) == (
        True,
        False,
        0,
        0,
        2,
    )
    agg = aggregate([s])
    assert (agg["precision"], agg["recall"], agg["f1"]) == (0.0, 0.0, 0.0)


def test_score_exact_match_is_order_insensitive_and_numeric():
    pred = answer([f("title_block", [150.0, 200, 250, 250]), HOLE])
    s = score_sample(pred, answer([HOLE, TITLE]), 0.5)
    assert s["exact_match"] is True
    assert (s["tp"], s["fp"], s["fn"]) == (2, 0, 0)


def test_score_near_miss_is_tp_but_not_exact():
    pred = answer([f("hole", [10, 10, 20, 21]), TITLE])
    s = score_sample(pred, answer([HOLE, TITLE]), 0.5)
    assert s["exact_match"] is False
    assert (s["tp"], s["fp"], s["fn"]) == (2, 0, 0)


def test_score_duplicates_are_false_positives():
    s = score_sample(answer([HOLE, HOLE]), answer([HOLE]), 0.5)
    assert (s["tp"], s["fp"], s["fn"]) == (1, 1, 0)
    assert s["exact_match"] is False


def test_score_label_mismatch():
    s = score_sample(answer([f("dimension", HOLE["bbox"])]), answer([HOLE]), 0.5)
    assert (s["tp"], s["fp"], s["fn"]) == (0, 1, 1)
    assert s["exact_match"] is False


def test_score_invalid_prediction():
    s = score_sample("no idea", answer([HOLE, TITLE]), 0.5)
    assert s["json_valid"] is False and s["exact_match"] is False
    assert (s["tp"], s["fp"], s["fn"]) == (0, 0, 2)
    assert "no JSON" in s["error"]


def test_score_threshold_is_used():
    pred = answer([f("hole", [10, 10, 20, 16])])  # IoU 0.6 with HOLE
    assert score_sample(pred, answer([HOLE]), 0.5)["tp"] == 1
    assert score_sample(pred, answer([HOLE]), 0.7)["tp"] == 0


def test_score_invalid_gold_raises():
    with pytest.raises(ValueError, match="gold answer is invalid"):
        score_sample(answer([HOLE]), "garbage", 0.5)


# ----------------------------------------------------------------- aggregate


def test_aggregate_by_hand():
    samples = [
        {"json_valid": True, "exact_match": False, "tp": 2, "fp": 1, "fn": 0},
        {"json_valid": True, "exact_match": False, "tp": 1, "fp": 0, "fn": 1},
        {"json_valid": False, "exact_match": False, "tp": 0, "fp": 0, "fn": 2},
        {"json_valid": True, "exact_match": True, "tp": 1, "fp": 0, "fn": 0},
    ]
    agg = aggregate(samples)
    # tp=4, fp=1, fn=3 -> P = 4/5, R = 4/7, F1 = 2PR/(P+R) = 2/3.
    assert agg["n"] == 4
    assert (agg["tp"], agg["fp"], agg["fn"]) == (4, 1, 3)
    assert (agg["n_json_valid"], agg["n_exact_match"]) == (3, 1)
    assert agg["json_valid_rate"] == 0.75
    assert agg["exact_match_rate"] == 0.25
    assert agg["precision"] == pytest.approx(0.8)
    assert agg["recall"] == pytest.approx(4 / 7)
    assert agg["f1"] == pytest.approx(2 / 3)


def test_aggregate_from_scored_samples():
    gold = answer([HOLE, TITLE])
    samples = [
        score_sample(answer([HOLE, TITLE]), gold, 0.5),  # tp 2
        score_sample(answer([HOLE, HOLE]), gold, 0.5),  # tp 1, fp 1, fn 1
        score_sample("oops", gold, 0.5),  # fn 2
    ]
    agg = aggregate(samples)
    assert (agg["tp"], agg["fp"], agg["fn"]) == (3, 1, 3)
    assert agg["precision"] == pytest.approx(3 / 4)
    assert agg["recall"] == pytest.approx(3 / 6)
    assert agg["f1"] == pytest.approx(2 * 0.75 * 0.5 / 1.25)
    assert agg["json_valid_rate"] == pytest.approx(2 / 3)
    assert agg["exact_match_rate"] == pytest.approx(1 / 3)


def test_aggregate_only_false_positives():
    agg = aggregate([{"json_valid": True, "exact_match": False, "tp": 0, "fp": 3, "fn": 0}])
    assert (agg["precision"], agg["recall"], agg["f1"]) == (0.0, 0.0, 0.0)


def test_aggregate_empty_raises():
    with pytest.raises(ValueError, match="eval set is empty"):
        aggregate([])


def test_aggregate_missing_key_raises():
    with pytest.raises(ValueError, match="misses keys"):
        aggregate([{"json_valid": True, "tp": 1}])


# ---------------------------------------------------------------------- gate


def test_gate_passes_with_margin_despite_float_rounding():
    ok, reason = gate({"f1": 0.7}, {"f1": 0.6}, "f1", min_value=0.5, min_margin=0.1)
    assert ok is True
    assert reason.startswith("PASS") and "f1" in reason


def test_gate_fails_on_margin():
    ok, reason = gate({"f1": 0.7}, {"f1": 0.6}, "f1", min_value=0.5, min_margin=0.11)
    assert ok is False
    assert reason.startswith("FAIL") and "margin" in reason and "min_value" not in reason


def test_gate_fails_on_min_value():
    ok, reason = gate({"f1": 0.4}, {"f1": 0.1}, "f1", min_value=0.5, min_margin=0.0)
    assert ok is False
    assert "min_value" in reason and "margin" not in reason


def test_gate_regression_fails_by_default_and_negative_margin_tolerates_it():
    cand, ref = {"recall": 0.58}, {"recall": 0.6}
    assert gate(cand, ref, "recall")[0] is False
    assert gate(cand, ref, "recall", min_margin=-0.05)[0] is True


def test_gate_equal_metrics_pass_with_zero_margin():
    assert gate({"f1": 0.5}, {"f1": 0.5})[0] is True


def test_gate_other_metric_and_no_reference():
    ok, reason = gate({"json_valid_rate": 0.9}, None, "json_valid_rate", min_value=0.8)
    assert ok is True and "no reference" in reason
    assert gate({"json_valid_rate": 0.7}, None, "json_valid_rate", min_value=0.8)[0] is False


def test_gate_unknown_metric():
    with pytest.raises(ValueError, match="allowed: f1"):
        gate({"accuracy": 1.0}, {"accuracy": 0.0}, "accuracy")


def test_gate_missing_metric_in_input():
    with pytest.raises(ValueError, match="reference metrics have no 'f1'"):
        gate({"f1": 1.0}, {"precision": 0.0})
