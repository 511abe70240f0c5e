"""Tests of the key_value task (components.common.tasks) and its report card."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from components.common import tasks
from components.common.tasks import TASK_NAMES, get_task, key_value_rows, normalize_value, parse_key_value
from components.evaluate._report import render_report
from components.evaluate.metrics import aggregate, gate, score_sample

KV = get_task("key_value")
GOLD = {"invoice_number": "INV-0042", "date": "2026-03-14", "total": "1,234.50", "vendor": "ACME GmbH"}


def fenced(obj) -> str:
    return "```json\n" + json.dumps(obj) + "\n```"


def test_registered_once_with_f1_metrics():
    assert "key_value" in TASK_NAMES and TASK_NAMES == tuple(tasks.TASKS)
    assert KV.name == "key_value" and {"f1", "exact_match_rate", "json_valid_rate"} <= set(KV.metrics)
    assert KV.shapes(fenced(GOLD), tasks.PIXEL) == []


def test_config_and_validate_data_read_the_registry():
    from components.validate_data import types as validate_types
    from pipelines.config import _inputs

    assert validate_types.TASKS == TASK_NAMES
    assert _inputs.TASK_NAMES is TASK_NAMES


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (fenced(GOLD), {k: normalize_value(v) for k, v in GOLD.items()}),
        ('{"A":  "x  Y "}', {"a": "x y"}),  # bare, normalised
        ('Sure: {"total": 12.5, "n": 3} done', {"total": "12.5", "n": "3"}),  # prose around, numbers as text
        ('```\n{"a": "b"}\n```', {"a": "b"}),  # fence without info string
        ('```json\n{"a": "b"', None),  # unclosed and cut: invalid
    ],
)
def test_parse_is_tolerant(text, expected):
    fields, reason = parse_key_value(text)
    assert fields == expected, reason


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("no json here", "no JSON object"),
        (fenced([1, 2]), "not an object"),
        (fenced({"a": ["x"]}), "not a string or number"),
        (fenced({"a": True}), "not a string or number"),
        (fenced({"a": None}), "not a string or number"),
        (42, "not a string"),
    ],
)
def test_parse_rejects(text, reason):
    fields, why = parse_key_value(text)
    assert fields is None and reason in why


def test_check_answer_for_training_rows():
    assert KV.check_answer(fenced(GOLD)) == ""
    assert KV.check_answer(fenced({"total": 12.5})) == ""  # numbers are fine
    assert "no ```json" in KV.check_answer(json.dumps(GOLD))  # training answers are fenced
    assert "no fields" in KV.check_answer(fenced({}))
    assert "not an object" in KV.check_answer(fenced([{"label": "x", "bbox": [0, 0, 1, 1]}]))
    assert "not a string or number" in KV.check_answer(fenced({"a": {"b": "c"}}))


def test_score_field_level_with_normalisation():
    pred = {
        "Invoice_Number": " inv-0042 ",  # key and value normalised: match
        "date": "2026-03-15",  # wrong value: fp + fn
        "total": "1,234.50",  # match
        "extra": "x",  # not in gold: fp
    }  # vendor missing: fn
    score = score_sample(fenced(pred), fenced(GOLD), task="key_value")
    assert score == {
        "json_valid": True,
        "exact_match": False,
        "tp": 2,
        "fp": 2,
        "fn": 2,
        "n_pred": 4,
        "n_gold": 4,
        "error": None,
    }
    perfect = {k: v.upper() for k, v in GOLD.items()}
    assert score_sample(json.dumps(perfect), fenced(GOLD), task="key_value")["exact_match"] is True
    numbers = KV.score(fenced({"total": 1234.5}), fenced({"total": "1234.5"}))
    assert numbers["tp"] == 1 and numbers["exact_match"]


def test_invalid_answer_and_invalid_gold():
    score = KV.score("I see an invoice.", fenced(GOLD))
    assert score["json_valid"] is False and (score["tp"], score["fp"], score["fn"]) == (0, 0, 4)
    with pytest.raises(ValueError, match="gold answer is invalid"):
        KV.score(fenced(GOLD), "not json")


def test_aggregate_and_gate_on_f1():
    scores = [
        KV.score(fenced(GOLD), fenced(GOLD)),  # 4 tp
        KV.score(fenced({**GOLD, "date": "x"}), fenced(GOLD)),  # 3 tp, 1 fp, 1 fn
        KV.score("garbage", fenced(GOLD)),  # 4 fn
    ]
    m = aggregate(scores)
    assert (m["tp"], m["fp"], m["fn"]) == (7, 1, 5)
    assert m["precision"] == pytest.approx(7 / 8) and m["recall"] == pytest.approx(7 / 12)
    assert m["f1"] == pytest.approx(2 * 7 / (2 * 7 + 1 + 5))
    assert m["exact_match_rate"] == pytest.approx(1 / 3) and m["json_valid_rate"] == pytest.approx(2 / 3)
    base = aggregate([KV.score("garbage", fenced(GOLD))])
    passed, _ = gate(m, base, "f1", 0.0, 0.1)
    assert passed and base["f1"] == 0.0


def test_detection_is_unchanged():
    findings = [{"label": "hole", "bbox": [0, 0, 10, 10]}]
    assert get_task("detection").score(fenced(findings), fenced(findings))["tp"] == 1
    assert get_task("detection").check_answer(fenced(GOLD)) != ""  # an object is not a findings list


def test_rows_for_the_report():
    rows = key_value_rows(fenced(GOLD), fenced({"DATE": "2026-03-14", "total": "9", "x": 1}))
    assert rows == [
        ("invoice_number", "INV-0042", None, False),
        ("date", "2026-03-14", "2026-03-14", True),
        ("total", "1,234.50", "9", False),
        ("vendor", "ACME GmbH", None, False),
        ("x", None, "1", False),
    ]
    assert key_value_rows(fenced(GOLD), "garbage")[0] == ("invoice_number", "INV-0042", None, False)


def test_report_card_shows_a_field_table_not_boxes(tmp_path):
    image = tmp_path / "doc.png"
    Image.new("RGB", (64, 64), "white").save(image)
    tuned_text = fenced({**GOLD, "vendor": "<b>Evil</b>"})
    sample = {
        "line": 7,
        "images": [str(image)],
        "gold": fenced(GOLD),
        "tuned": tuned_text,
        "tuned_score": KV.score(tuned_text, fenced(GOLD)),
        "reference": "garbage",
        "reference_score": KV.score("garbage", fenced(GOLD)),
    }
    metrics = aggregate([sample["tuned_score"]])
    page = render_report(metrics, metrics, [sample], worst_n=1, task="key_value")
    assert 'class="metrics fields"' in page and "<th>vendor</th><td>ACME GmbH</td>" in page
    assert "<td>&lt;b&gt;Evil&lt;/b&gt;</td>" in page and "<b>Evil" not in page  # escaped
    assert page.count("✓</td>") == 3 and page.count("✗</td>") == 1
    assert "tuned field F1 0.750" in page and "Boxes:" not in page and "data:image/png;base64," in page
    detection_page = render_report(metrics, metrics, [], worst_n=1)
    assert "fields" not in detection_page  # other tasks: no field table


def test_report_speaks_fields_and_shows_the_base_answer_as_text(tmp_path):
    image = tmp_path / "doc.png"
    Image.new("RGB", (64, 64), "white").save(image)
    base = "\ufffd" * 40 + "total\x07"  # a random base model's stray byte tokens, decoded
    sample = {"line": 2, "images": [str(image)], "gold": fenced(GOLD), "tuned": fenced(GOLD),
              "tuned_score": KV.score(fenced(GOLD), fenced(GOLD)), "reference": base,
              "reference_score": KV.score(base, fenced(GOLD))}  # fmt: skip
    metrics = aggregate([sample["tuned_score"]])
    page = render_report(metrics, metrics, [sample], worst_n=1, task="key_value")
    assert "boxes matched" not in page and "IoU" not in page
    assert "F1 (per field, values equal after normalising)" in page
    assert "\ufffd" not in page and "⟨40 undecodable byte sequences: \\ufffd …⟩" in page
    assert '<span class="ctl">\\x07</span>' in page
