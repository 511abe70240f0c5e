"""The gate's regression rule on a damaged tuned model: the task metric passes, the regression rule fails.

Issue 44 asks for a deliberately damaged adapter. On the tiny random model a weight-level damage
cannot be shown: its answers to the regression rows are wrong before and after tuning (every
score near 0, CER 1), so no drop can be measured. The damage is made at the scoring input
instead: evaluate's core runs on the demo's own held-out drawings and regression set (both
validated as the pipeline validates them), with a generator whose "tuned model" answers the
held-out rows right (the task gate passes) and the OCR rows with the digits gone, while the
reference read them right. The decision, the Metrics, the report and the run summary must all
say that the regression rule failed, for which kind, and by how much.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from components.evaluate._report import render_report
from components.evaluate.core import EvalError, evaluate, regression_metrics
from components.evaluate.metrics import gate
from components.evaluate.settings import EvalSettings
from components.validate_data._regression import validate_regression
from components.validate_data.core import validate_data
from pipelines.demo import drawings
from pipelines.local_console import format_summary, regression_table


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, str]:
    """The demo's held-out drawings (4) and its regression set (12 rows on 4 other drawings), validated."""
    root = tmp_path_factory.mktemp("regression-gate")
    demo = drawings.generate_dataset(root / "drawings", n_train=4, n_eval=4)
    result = validate_data(
        [demo["train"]], str(root / "train"), str(root / "eval"), str(root / "q.jsonl"), [demo["eval"]],
        task="detection",
    )  # fmt: skip
    regression = validate_regression(
        [drawings.generate_regression(root / "regression")["regression"]], str(root / "reg"), str(root / "rq.jsonl")
    )
    return {"eval": result.eval_dir, "eval_marker": result.stats["manifests"]["eval"], "regression": str(root / "reg"),
            "regression_marker": regression.manifest_sha256, "root": str(root)}  # fmt: skip


def _damaged(text: str) -> str:
    return re.sub(r"\d", "", text)  # "PART-042" -> "PART-": 3 of 8 characters lost, CER 0.375


def _generator(damage_tuned_ocr: bool = True, tuned_task_right: bool = True):
    """A fake generator: the base knew every regression answer and none of the task; the tuned model learnt the task
    and (damaged) lost the OCR answers' digits."""

    def generate(model_dir, model_type, rows, batch_size, max_new_tokens):
        answers = []
        for row in rows:
            if not row["kind"]:  # a held-out task row
                right = model_dir == "tuned" and tuned_task_right
                answers.append(row["gold"] if right else "I see a drawing.")
            elif model_dir == "tuned" and row["kind"] == "ocr" and damage_tuned_ocr:
                answers.append(_damaged(row["gold"]))
            else:
                answers.append(row["gold"])
        return answers, 5 * len(rows)

    return generate


def _evaluate(datasets, tmp_path, **kwargs):
    settings = EvalSettings(min_margin=0.1, regression_max_drop={"overall": 0.2})
    args = {"generate_fn": _generator(), "settings": settings, **kwargs}
    return evaluate(
        "tuned", "base", "qwen3_vl", datasets["eval"], str(tmp_path / "predictions.jsonl"),
        dataset_marker=datasets["eval_marker"], regression_dir=datasets["regression"],
        regression_marker=datasets["regression_marker"], **args,
    )  # fmt: skip


def test_damaged_model_passes_the_task_metric_and_fails_the_regression_rule(datasets, tmp_path):
    result = _evaluate(datasets, tmp_path)
    # the task metric alone would promote it
    assert result.tuned["f1"] == 1.0 and result.reference["f1"] == 0.0
    task_passed, _ = gate(result.tuned, result.reference, "f1", 0.0, 0.1)
    assert task_passed
    # the regression rule does not
    assert result.passed is False and result.failed_rules == ["regression:ocr"]
    assert result.reason == "FAIL: regression ocr cer 0.000 -> 0.375 (worse by 0.375 > max_drop 0.050)"
    ocr = result.regression["kinds"]["ocr"]
    assert ocr["reference"]["cer"] == 0.0 and ocr["tuned"]["cer"] == pytest.approx(0.375)
    assert ocr["delta"]["cer"] == pytest.approx(0.375) and ocr["tuned"]["n"] == 4
    for kind in ("vqa", "grounding"):  # untouched kinds: no change
        assert result.regression["kinds"][kind]["delta"]["score"] == 0.0
    drops = {d.name: d for d in result.drops}
    assert drops["overall"].ok and drops["overall"].drop == pytest.approx(0.375 / 3)  # within the 0.2 allowed
    # the predictions: the 4 held-out rows, then the 12 regression rows
    lines = [json.loads(x) for x in Path(result.predictions).read_text().splitlines()]
    assert len(lines) == 16 and [x.get("set") for x in lines[4:]] == ["regression"] * 12
    assert {x["kind"] for x in lines[4:] if x["tuned_score"]["score"] < 1} == {"ocr"}


def test_metrics_record_the_shape_the_registry_reads(datasets, tmp_path):
    result = _evaluate(datasets, tmp_path)
    flat, meta = regression_metrics(result, {"overall": 0.2})
    assert set(meta["regression"]) == {"overall", "kinds"}
    assert set(meta["regression"]["kinds"]) == {"vqa", "ocr", "grounding"}
    assert all(set(e) == {"reference", "tuned", "delta"} for e in meta["regression"]["kinds"].values())
    assert meta["regression_max_drop"] == {"overall": 0.2, "vqa": 0.05, "ocr": 0.05, "grounding": 0.05}
    assert meta["gate_failed"] == ["regression:ocr"]
    assert flat["base_regression_ocr_cer"] == 0.0 and flat["tuned_regression_ocr_cer"] == pytest.approx(0.375)
    assert flat["regression_ocr_drop"] == pytest.approx(0.375) and flat["regression_passed"] == 0.0
    assert flat["tuned_regression_score"] == pytest.approx(1 - 0.375 / 3) and flat["base_regression_score"] == 1.0
    assert all(isinstance(v, float | int) for v in flat.values())  # Metrics.log_metric takes numbers
    json.dumps(meta)


def test_report_says_which_kind_failed_and_shows_the_rows_side_by_side(datasets, tmp_path):
    result = _evaluate(datasets, tmp_path)
    html = render_report(
        result.tuned, result.reference, result.samples, result.passed, result.reason,
        regression=result.regression, regression_samples=result.regression_samples, drops=result.drops,
    )  # fmt: skip
    assert "FAILED the gate" in html and "Regression set (12 rows" in html
    assert "Regression rule failed: ocr cer 0.000 -&gt; 0.375 (worse by 0.375 &gt; max_drop 0.050)" in html
    table = html.split('<table class="metrics regression">')[1].split("</table>")[0]
    ocr_row = table.split("<th>ocr</th>")[1].split("</tr>")[0]
    assert "cer (lower is better)" in ocr_row and "+0.375" in ocr_row and "failed" in ocr_row
    assert table.count("failed") == 1 and table.count(">held<") == 3  # vqa, grounding, overall held
    cards = html.split("<h3>Worst regressions")[1]
    assert cards.startswith(" (4 of 4 rows that scored lower tuned)")
    ocr_rows = [s for s in result.regression_samples if s["kind"] == "ocr"]
    for sample in ocr_rows:  # each: the reference's answer, the tuned answer, the gold
        part = sample["gold"]
        assert f"<pre>{part}</pre>" in cards and f"<pre>{_damaged(part)}</pre>" in cards
    assert "vqa</b>" not in cards and "grounding</b>" not in cards


def test_run_summary_prints_the_regression_table_and_the_decision(datasets, tmp_path):
    result = _evaluate(datasets, tmp_path)
    flat, meta = regression_metrics(result, {"overall": 0.2})
    metrics = {"reference": "base", **flat, **meta}
    table = regression_table(metrics)
    assert table[0].startswith("regression set (12 rows):") and "base" in table[0] and "max drop" in table[0]
    ocr = next(x for x in table if x.strip().startswith("ocr cer (lower better)"))
    assert re.search(r"0\.000\s+0\.375\s+\+0\.375\s+0\.050\s+FAILED$", ocr), ocr
    assert [x.split()[0] for x in table[1:]] == ["vqa", "ocr", "grounding", "overall"]
    assert sum("held" in x for x in table) == 3
    summary = format_summary({"run_dir": "r", "wall_s": 1.0, "tasks": {}, "metrics": metrics, "passed": result.passed,
                              "reason": result.reason})  # fmt: skip
    assert summary.splitlines()[-1] == f"gate passed: False ({result.reason})"
    assert regression_table({"base_f1": 0.1}) == []  # no regression set: no lines
    assert regression_metrics(dataclasses.replace(result, regression=None)) == ({}, {})


def test_both_rules_failing_are_both_named(datasets, tmp_path):
    result = _evaluate(datasets, tmp_path, generate_fn=_generator(tuned_task_right=False))
    assert result.failed_rules == ["task", "regression:ocr"]
    assert result.reason.startswith("FAIL: task metric: margin +0.0000 over reference 0.0000 < min_margin +0.1000")
    assert result.reason.endswith("; regression ocr cer 0.000 -> 0.375 (worse by 0.375 > max_drop 0.050)")


def test_intact_model_passes_both_rules(datasets, tmp_path):
    result = _evaluate(datasets, tmp_path, generate_fn=_generator(damage_tuned_ocr=False))
    assert result.passed and result.failed_rules == []
    assert result.reason.startswith("PASS: task metric: f1 1.0000 >= min_value 0.0000")
    assert result.reason.endswith("regression: within max_drop (vqa, ocr, grounding, overall)")


def test_a_regression_set_changed_after_validation_is_refused(datasets, tmp_path):
    import shutil

    copy = tmp_path / "reg"
    shutil.copytree(datasets["regression"], copy)
    rows = (copy / "data.jsonl").read_text().splitlines()
    (copy / "data.jsonl").write_text("\n".join(rows[:-1]) + "\n")  # a row lost after validate-regression wrote it
    with pytest.raises(EvalError, match="data.jsonl"):
        evaluate(
            "tuned", "base", "qwen3_vl", datasets["eval"], str(tmp_path / "p.jsonl"), generate_fn=_generator(),
            regression_dir=str(copy), regression_marker=datasets["regression_marker"],
        )  # fmt: skip
