"""The thin wrappers: a core's StepOutputs written into KFP artifacts by one helper."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from kfp import dsl

from components.common.kfp_outputs import StepOutputs, write_outputs
from tests.test_evaluate_core import GOLD, _dataset, _fake


def test_write_outputs_logs_numbers_sets_metadata_and_returns_the_values():
    metrics, report = dsl.Metrics(uri="m"), dsl.HTML(uri="r")
    out = StepOutputs(
        metrics={"tuned_f1": 0.5, "reference": "base", "labels": {"a": {}}, "passed": 1.0},
        metadata={"report": {"reference": "base"}},
        uris={"report": "gs://b/r.html"},
        values=(True, "PASS"),
    )
    got = write_outputs(out, metrics, ("passed", "reason"), report=report)
    assert list(metrics.metadata) == ["tuned_f1", "reference", "labels", "passed"]  # the core's order
    assert report.metadata == {"reference": "base"} and report.uri == "gs://b/r.html"
    assert got == (True, "PASS") and got.passed is True and got.reason == "PASS"
    assert write_outputs(StepOutputs()) is None
    with pytest.raises(KeyError):
        write_outputs(StepOutputs(metadata={"missing": {}}))


def test_write_outputs_copies_files_whole_before_it_writes_any_metadata(tmp_path):
    src, dst = tmp_path / "work" / "curve.html", tmp_path / "out" / "loss_curve"
    src.parent.mkdir()
    dst.parent.mkdir()
    src.write_bytes(b"<html>\xc3\xa9 new</html>")
    dst.write_text("old")
    curve, adapter = dsl.HTML(uri=str(dst)), dsl.Model(uri=str(tmp_path / "adapter"))
    write_outputs(StepOutputs(files={"loss_curve": str(src)}, metadata={"adapter": {"a": 1}}), loss_curve=curve,
                  adapter=adapter)  # fmt: skip
    assert dst.read_bytes() == b"<html>\xc3\xa9 new</html>" and adapter.metadata == {"a": 1}
    assert [p.name for p in dst.parent.iterdir()] == ["loss_curve"]  # the staging file renamed, none left
    # a copy that fails leaves the old file and no staging file, and nothing is written after it
    dst.write_text("old")
    again = dsl.Model(uri=str(tmp_path / "adapter2"))
    with pytest.raises(FileNotFoundError):
        write_outputs(StepOutputs(files={"loss_curve": str(src) + ".missing"}, metadata={"adapter": {"a": 1}}),
                      loss_curve=curve, adapter=again)  # fmt: skip
    assert dst.read_text() == "old" and [p.name for p in dst.parent.iterdir()] == ["loss_curve"]
    assert again.metadata == {}


def test_write_outputs_names_a_metrics_entry_that_is_neither_a_number_nor_json():
    metrics = dsl.Metrics(uri="m")
    with pytest.raises(TypeError, match=r"Metrics entry 'peak_mem' is set .*neither a number .* nor JSON data"):
        write_outputs(StepOutputs(metrics={"loss": 0.5, "peak_mem": {1, 2}}), metrics)
    assert metrics.metadata == {"loss": 0.5}  # logged up to the bad entry
    write_outputs(StepOutputs(metrics={"flag": True, "n": 3, "block": {"a": [1, None]}}), metrics)
    assert metrics.metadata["flag"] is True and metrics.metadata["block"] == {"a": [1, None]}


def _run_component(tmp_path, monkeypatch, **extra):
    import components.evaluate.step as step
    from components.evaluate.component import evaluate

    ds = _dataset(tmp_path)
    gen, _ = _fake({str(tmp_path / "tuned"): GOLD, str(tmp_path / "base"): ["no idea", GOLD[1]]})
    monkeypatch.setattr(step, "run_eval", functools.partial(step.run_eval, generate_fn=gen))
    metrics, report = dsl.Metrics(uri=str(tmp_path / "m")), dsl.HTML(uri=str(tmp_path / "r.html"))
    args = dict(
        base_model=dsl.Model(uri=str(tmp_path / "base"), metadata={"model_type": "qwen3_vl"}),
        tuned_model=dsl.Model(uri=str(tmp_path / "tuned")), eval_dataset=dsl.Dataset(uri=str(ds)),
        settings={"max_new_tokens": 4, "batch_size": 2}, swift_args={}, base_box_convention="", metrics=metrics, predictions=dsl.Dataset(uri=str(tmp_path / "p.jsonl")),
        report=report,
    )  # fmt: skip
    return evaluate.python_func(**{**args, **extra}), metrics, report


def test_the_evaluate_wrapper_writes_the_cores_outputs(tmp_path, monkeypatch):
    (passed, reason), metrics, report = _run_component(tmp_path, monkeypatch)
    assert passed is True and reason.startswith("PASS: f1 1.0000")
    meta = metrics.metadata
    assert list(meta)[:2] == ["base_n", "base_json_valid_rate"] and meta["tuned_f1"] == 1.0 and meta["base_f1"] == 0.8
    assert meta["passed"] == 1.0 and meta["reference"] == "base" and "labels" in meta and "tuned_f1_ci_low" in meta
    assert report.metadata == {"reference": "base", "reference_uri": str(tmp_path / "base")}
    assert "F1" in Path(report.path).read_text()


def test_the_evaluate_wrapper_refuses_a_bad_max_pixels(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match=r"evaluate: swift.max_pixels must be a whole number of pixels >= 0, got -1"):
        _run_component(tmp_path, monkeypatch, swift_args={"max_pixels": -1})
