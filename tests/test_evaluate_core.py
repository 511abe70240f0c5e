"""Unit tests of the evaluate core with a fake generator (the real one runs in the pipeline test)."""

import json
from pathlib import Path

import pytest

from components.evaluate.core import EvalError, evaluate, load_eval_rows
from components.evaluate.settings import EvalSettings

GOLD = [
    '```json\n[{"label": "title_block", "bbox": [180, 200, 250, 250]}]\n```',
    '```json\n[{"label": "hole", "bbox": [10, 10, 30, 30]}, {"label": "title_block", "bbox": [170, 200, 250, 250]}]\n```',
]


def _settings(**gate) -> EvalSettings:
    """The eval settings these tests score with: budget 64 tokens, batch 4, and the given gate."""
    return EvalSettings(max_new_tokens=64, batch_size=4, **gate)


def _dataset(tmp_path: Path, golds=GOLD) -> Path:
    ds = tmp_path / "eval"
    ds.mkdir()
    with open(ds / "data.jsonl", "w") as f:
        for i, gold in enumerate(golds):
            row = {
                "messages": [{"role": "user", "content": "<image>Find things"}, {"role": "assistant", "content": gold}],
                "images": [f"images/{i}.png"],
            }
            f.write(json.dumps(row) + "\n")
    return ds


def _fake(answers_by_model):
    calls = []

    def generate(model_dir, model_type, rows, batch_size, max_new_tokens):
        calls.append((model_dir, model_type, len(rows), batch_size, max_new_tokens))
        return answers_by_model[model_dir], 7 * len(rows)

    return generate, calls


def test_load_eval_rows_splits_prompt_and_gold(tmp_path):
    ds = _dataset(tmp_path)
    rows = load_eval_rows(ds)
    assert [r["gold"] for r in rows] == GOLD
    assert rows[0]["messages"] == [{"role": "user", "content": "<image>Find things"}]
    assert rows[0]["images"] == [str((ds / "images/0.png").resolve())]
    assert len(load_eval_rows(ds, max_samples=1)) == 1


def test_empty_eval_set_is_a_named_error(tmp_path):
    ds = tmp_path / "e"
    ds.mkdir()
    (ds / "data.jsonl").write_text("")
    with pytest.raises(EvalError, match="eval set is empty"):
        load_eval_rows(ds)
    with pytest.raises(EvalError, match="no data.jsonl"):
        load_eval_rows(tmp_path / "missing")


def test_tuned_beats_reference_and_passes_gate(tmp_path):
    ds = _dataset(tmp_path)
    gen, calls = _fake({"tuned": GOLD, "base": ["no idea", "```json\n[oops\n```"]})
    result = evaluate(
        "tuned",
        "base",
        "qwen3_vl",
        str(ds),
        str(tmp_path / "p.jsonl"),
        _settings(min_value=0.5, min_margin=0.1),
        generate_fn=gen,
    )
    assert result.passed and result.reason.startswith("PASS")
    assert result.tuned["f1"] == 1.0 and result.tuned["json_valid_rate"] == 1.0
    assert result.reference["f1"] == 0.0 and result.reference["json_valid_rate"] == 0.0
    assert result.tuned["generated_tokens_per_second"] > 0
    assert calls == [("base", "qwen3_vl", 2, 4, 64), ("tuned", "qwen3_vl", 2, 4, 64)]
    lines = [json.loads(x) for x in Path(result.predictions).read_text().splitlines()]
    assert [x["line"] for x in lines] == [1, 2]
    assert lines[0]["tuned_score"]["tp"] == 1 and lines[1]["reference_score"]["json_valid"] is False


def test_gate_fails_when_threshold_unreachable(tmp_path):
    ds = _dataset(tmp_path)
    half = [GOLD[0], "```json\n[]\n```"]
    gen, _ = _fake({"tuned": half, "base": half})
    result = evaluate(
        "tuned", "base", "qwen3_vl", str(ds), str(tmp_path / "p.jsonl"), _settings(min_margin=0.01), generate_fn=gen
    )
    assert not result.passed and result.reason.startswith("FAIL")
    assert result.tuned["recall"] == pytest.approx(1 / 3)


def test_model_returning_too_few_answers_is_an_error(tmp_path):
    ds = _dataset(tmp_path)
    gen, _ = _fake({"tuned": GOLD, "base": GOLD[:1]})
    with pytest.raises(EvalError, match="reference model returned 1 answers for 2 prompts"):
        evaluate("tuned", "base", "qwen3_vl", str(ds), str(tmp_path / "p.jsonl"), generate_fn=gen)


def test_missing_reference_model_is_a_named_error(tmp_path):
    """With the real generator, model folders are checked before any model is loaded."""
    from components.evaluate.core import check_model_dir

    ds = _dataset(tmp_path)
    tuned = tmp_path / "tuned"
    tuned.mkdir()
    (tuned / "config.json").write_text("{}")
    with pytest.raises(EvalError, match=r"reference model .*champion: folder not found"):
        evaluate(str(tuned), str(tmp_path / "champion"), "qwen3_vl", str(ds), str(tmp_path / "p.jsonl"))
    with pytest.raises(EvalError, match="reference model: no path given"):
        evaluate(str(tuned), "", "qwen3_vl", str(ds), str(tmp_path / "p.jsonl"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(EvalError, match="tuned model .*empty: no config.json"):
        evaluate(str(tmp_path / "empty"), str(tuned), "qwen3_vl", str(ds), str(tmp_path / "p.jsonl"))
    with pytest.raises(EvalError, match="reference model /gcs/bucket/champion: folder not found"):
        check_model_dir("gs://bucket/champion", "reference")  # read through the Cloud Storage FUSE mount
    assert check_model_dir(str(tuned), "tuned") == str(tuned)


def test_answers_without_json_count_as_failures(tmp_path):
    ds = _dataset(tmp_path)
    gen, _ = _fake({"tuned": ["I see a drawing.", ""], "base": ["", "nothing"]})
    result = evaluate("tuned", "base", "qwen3_vl", str(ds), str(tmp_path / "p.jsonl"), generate_fn=gen)
    assert result.tuned["json_valid_rate"] == 0.0 and result.tuned["f1"] == 0.0
    assert result.tuned["fn"] == 3


# --- the reference: base, the registry's champion, or a configured folder ---------------


def test_reference_is_the_base_without_a_uri():
    from components.common.reference import resolve_reference

    ref = resolve_reference("", "", "/runs/stage-model/model")
    assert (ref.model_dir, ref.kind, ref.label, ref.version) == ("/runs/stage-model/model", "base", "base", "")
    assert ref.metrics() == {"reference_is_champion": 0.0, "reference_version": 0.0}


def test_champion_on_cloud_storage_is_read_through_the_fuse_mount():
    from components.common.reference import resolve_reference

    ref = resolve_reference("gs://bucket/root/run-7/merge-export/merged_model/", "3", "/base")
    assert ref.model_dir == "/gcs/bucket/root/run-7/merge-export/merged_model"
    assert (ref.kind, ref.label, ref.version) == ("champion", "champion@3", "3")
    assert ref.metrics() == {"reference_is_champion": 1.0, "reference_version": 3.0}


def test_configured_folder_is_a_reference_but_not_a_champion():
    from components.common.reference import resolve_reference

    ref = resolve_reference("gs://bucket/golden", "", "/base")
    assert (ref.model_dir, ref.kind, ref.label) == ("/gcs/bucket/golden", "folder", "gs://bucket/golden")
    assert ref.metrics()["reference_is_champion"] == 0.0


def test_same_model_compares_uris_and_fuse_paths(tmp_path):
    from components.evaluate.core import same_model

    assert same_model("gs://b/run/merged", "/gcs/b/run/merged/")
    assert same_model(str(tmp_path / "m"), str(tmp_path / "m") + "/")
    assert not same_model("gs://b/run-1/merged", "gs://b/run-2/merged")
    assert not same_model("", "")


def test_tuned_model_that_is_already_the_champion_is_not_promoted(tmp_path):
    """A cached merge that an earlier run registered: generated once, and the gate fails."""
    ds = _dataset(tmp_path)
    gen, calls = _fake({"model": GOLD})
    result = evaluate("model", "model", "qwen3_vl", str(ds), str(tmp_path / "p.jsonl"), _settings(), generate_fn=gen)
    assert len(calls) == 1
    assert result.tuned == result.reference and result.tuned["f1"] == 1.0
    assert not result.passed and "is the reference model itself" in result.reason


def test_report_names_the_reference(tmp_path):
    from components.evaluate._report import render_report

    page = render_report(
        {"f1": 0.9},
        {"f1": 0.8},
        [],
        passed=True,
        reason="PASS",
        reference_name="champion@3",
        reference_detail="gs://b/run-7/merged",
    )
    assert "<th>champion@3</th>" in page
    assert "Reference model: <b>champion@3</b> (<code>gs://b/run-7/merged</code>)" in page
    assert "Reference model:" not in render_report({"f1": 0.9}, {"f1": 0.8}, [])


def test_run_summary_names_a_non_base_reference():
    from pipelines.local_console import format_summary

    run = {"run_dir": "r", "wall_s": 1.0, "tasks": {}, "passed": True, "metrics": {"base_f1": 0.5, "tuned_f1": 0.75}}
    assert "eval (held-out):        base      tuned" in format_summary(run)
    run["metrics"]["reference"] = "/models/golden"
    text = format_summary(run)
    assert "reference model: /models/golden" in text and " ref      tuned" in text


def _image_dataset(tmp_path: Path, golds, size) -> Path:
    from PIL import Image

    ds = _dataset(tmp_path, golds)
    (ds / "images").mkdir()
    for i in range(len(golds)):
        Image.new("RGB", size, "white").save(ds / f"images/{i}.png")
    return ds


def test_norm1000_answers_of_the_base_model_match_pixel_gold(tmp_path):
    # 640 x 480 image, gold in pixels; the base model (Qwen3-VL) answers the same box in 0-1000
    ds = _image_dataset(tmp_path, ['```json\n[{"label": "hole", "bbox": [64, 48, 320, 240]}]\n```'], (640, 480))
    norm = '```json\n[\n\t{"bbox_2d": [100, 100, 500, 500], "label": "hole"}\n]\n```'
    gen, _ = _fake({"tuned": ['[{"label": "hole", "bbox": [64, 48, 320, 240]}]'], "base": [norm]})
    out = tmp_path / "p.jsonl"
    result = evaluate(
        "tuned", "base", "qwen3_vl", str(ds), str(out), generate_fn=gen, reference_box_convention="norm1000"
    )
    assert result.reference["f1"] == 1.0 and result.tuned["f1"] == 1.0
    # read as pixels (what the pipeline did before), the base model's answer misses
    before = evaluate("tuned", "base", "qwen3_vl", str(ds), str(out), generate_fn=gen)
    assert before.reference["f1"] == 0.0 and before.tuned["f1"] == 1.0


def test_norm1000_dataset_scores_in_pixels(tmp_path):
    gold = '```json\n[{"bbox_2d": [100, 100, 500, 500], "label": "hole"}]\n```'
    ds = _image_dataset(tmp_path, [gold], (640, 480))
    gen, _ = _fake({"tuned": [gold], "base": ['[{"bbox_2d": [100, 100, 500, 520], "label": "hole"}]']})
    result = evaluate(
        "tuned", "base", "", str(ds), str(tmp_path / "p.jsonl"), generate_fn=gen, box_convention="norm1000"
    )
    assert result.tuned["f1"] == 1.0 and result.reference["f1"] == 1.0
    assert result.samples[0]["box_convention"] == "norm1000" and result.samples[0]["image_size"] == [640, 480]


def test_resized_pixel_answers_on_an_image_that_is_not_a_multiple_of_28(tmp_path):
    from components.common.boxes import ResizeRule, from_pixels, smart_resize

    size = (250, 130)  # smart resize: 252 x 140
    assert smart_resize(130, 250) == (140, 252)
    gold_px = [50, 26, 150, 104]
    ds = _image_dataset(tmp_path, [json.dumps([{"label": "a", "bbox": gold_px}])], size)
    resized = from_pixels(gold_px, "resized_pixel", size)
    assert resized != gold_px
    gen, _ = _fake(
        {
            "tuned": [json.dumps([{"label": "a", "bbox": gold_px}])],
            "base": [json.dumps([{"bbox_2d": resized, "label": "a"}])],
        }
    )
    result = evaluate(
        "tuned",
        "base",
        "",
        str(ds),
        str(tmp_path / "p.jsonl"),
        EvalSettings(iou_threshold=0.95),
        generate_fn=gen,
        reference_box_convention="resized_pixel",
        resize_rule=ResizeRule(),
    )
    assert result.reference["f1"] == 1.0


def test_unknown_convention_and_missing_image_are_named_errors(tmp_path):
    ds = _dataset(tmp_path)  # images do not exist
    gen, _ = _fake({"tuned": GOLD, "base": GOLD})
    with pytest.raises(EvalError, match="box_convention 'auto'"):
        evaluate("tuned", "base", "", str(ds), str(tmp_path / "p.jsonl"), generate_fn=gen, box_convention="auto")
    with pytest.raises(EvalError, match="cannot read its size"):
        evaluate("tuned", "base", "", str(ds), str(tmp_path / "p.jsonl"), generate_fn=gen, box_convention="norm1000")
