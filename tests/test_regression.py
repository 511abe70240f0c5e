"""The regression set (issue 44): its metrics, its rows through snapshot-data and validate-data, the config rule.

The gate's decision on a tuned model that passes the task metric and fails the regression rule
is in tests/test_regression_gate.py.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from PIL import Image

from components.common import regression as reg
from components.common import snapshot as snap
from components.common.tasks import Geometry
from components.snapshot_data.core import SnapshotError, snapshot_data
from components.validate_data._regression import EmptyRegressionSet, validate_regression, validate_regression_snapshot
from components.validate_data.types import DataError
from pipelines.config import ConfigError, load_config
from pipelines.demo import drawing_render, drawings

BOX = '```json\n[{"label": "note", "bbox": [10, 20, 50, 30]}]\n```'


# --- metrics --------------------------------------------------------------------------------


def test_vqa_exact_match_normalises_case_punctuation_articles_and_number_words():
    assert reg.normalize_answer("  The Two. ") == "2"
    assert reg.normalize_answer("1:2") == "1:2" and reg.normalize_answer("PART-042,") == "part-042"
    row = reg.score_row("vqa", "Yes.", "yes")
    assert row["exact_match"] == 1.0 and row["score"] == 1.0 and row["anls"] == pytest.approx(0.75)
    assert reg.score_row("vqa", "three", "3")["exact_match"] == 1.0
    assert reg.score_row("vqa", "no", "yes")["score"] == 0.0


def test_anls_is_one_minus_the_normalised_distance_and_zero_below_half():
    assert reg.anls("PART-042", "part-042") == 1.0  # case-folded
    assert reg.anls("PART-043", "PART-042") == pytest.approx(1 - 1 / 8)
    assert reg.anls("PART", "PART-042") == pytest.approx(0.5)  # at the threshold: kept
    assert reg.anls("P", "PART-042") == 0.0
    assert reg.edit_distance("kitten", "sitting") == 3


def test_cer_is_clipped_at_one_per_row_and_a_rise_is_a_drop():
    assert reg.cer("PART-042", "PART-042") == 0.0
    assert reg.cer("PART-043", "PART-042") == pytest.approx(1 / 8)
    assert reg.cer("x" * 400, "PART-042") == 1.0  # a run-away answer counts as one wrong row
    assert reg.cer("", "") == 0.0 and reg.cer("a", "") == 1.0
    kinds = ["ocr", "ocr"]
    ref = [reg.score_row("ocr", "PART-042", "PART-042"), reg.score_row("ocr", "PART-7", "PART-7")]
    tuned = [reg.score_row("ocr", "PART-0", "PART-042"), reg.score_row("ocr", "PART-7", "PART-7")]
    summary = reg.summarize(kinds, ref, tuned)
    ocr = summary["kinds"]["ocr"]
    assert ocr["reference"]["cer"] == 0.0 and ocr["tuned"]["cer"] == pytest.approx(0.125)
    assert ocr["delta"]["cer"] == pytest.approx(0.125)  # tuned - reference: a rise
    (drop, overall) = reg.check_drops(summary, {"ocr": 0.1})
    assert (drop.name, drop.metric, drop.ok) == ("ocr", "cer", False) and drop.drop == pytest.approx(0.125)
    assert "worse by 0.125 > max_drop 0.100" in drop.describe()
    assert overall.name == "overall" and overall.drop == pytest.approx(0.125)
    assert all(d.ok for d in reg.check_drops(summary, {"ocr": 0.2, "overall": 0.2}))


def test_grounding_hits_at_iou_half_in_pixels_whatever_the_convention():
    geometry = Geometry("pixel", (200, 100))
    assert reg.score_row("grounding", BOX, BOX, geometry)["score"] == 1.0
    shifted = '[{"label": "anything", "bbox": [20, 20, 60, 30]}]'  # IoU 30/50 = 0.6: a hit, label not compared
    assert reg.score_row("grounding", shifted, BOX, geometry)["hits"] == 1
    far = '[{"label": "note", "bbox": [30, 20, 70, 30]}]'  # IoU 20/60: no hit
    assert reg.score_row("grounding", far, BOX, geometry)["hits"] == 0
    # the base model answers in norm1000 ([0, 1000] of the image): 10/200 -> 50, 20/100 -> 200, ...
    norm = '[{"bbox_2d": [50, 200, 250, 300], "label": "note"}]'
    base = reg.score_row("grounding", norm, BOX, geometry, Geometry("norm1000", (200, 100)))
    assert base["hits"] == 1 and base["json_valid"]
    invalid = reg.score_row("grounding", "the note is at the bottom left", BOX, geometry)
    assert invalid["json_valid"] is False and invalid["score"] == 0.0 and invalid["error"]


def test_summary_has_the_shape_the_registry_reads_and_overall_weighs_each_kind_the_same():
    rows = [("vqa", "yes", "yes"), ("vqa", "no", "yes"), ("vqa", "2", "2"), ("ocr", "AB", "AB"),
            ("grounding", BOX, BOX)]  # fmt: skip
    kinds = [k for k, _, _ in rows]
    ref = [reg.score_row(k, gold, gold) for k, _, gold in rows]
    tuned = [reg.score_row(k, ans, gold) for k, ans, gold in rows]
    summary = reg.summarize(kinds, ref, tuned)
    assert set(summary) == {"overall", "kinds"} and list(summary["kinds"]) == ["vqa", "ocr", "grounding"]
    for entry in [summary["overall"], *summary["kinds"].values()]:
        assert set(entry) == {"reference", "tuned", "delta"}
        assert "n" not in entry["delta"]
    vqa = summary["kinds"]["vqa"]
    assert vqa["reference"]["n"] == 3 and vqa["tuned"]["exact_match"] == pytest.approx(2 / 3)
    assert set(vqa["tuned"]) == {"n", "exact_match", "anls", "score"}
    # overall = mean of the kinds' scores (vqa 2/3, ocr 1, grounding 1), not of the 5 rows (4/5)
    assert summary["overall"]["tuned"] == {"n": 5, "score": pytest.approx((2 / 3 + 1 + 1) / 3)}
    assert summary["overall"]["delta"]["score"] == pytest.approx((2 / 3 + 1 + 1) / 3 - 1)
    json.dumps(summary)  # plain data: it goes into the Metrics metadata


def test_max_drop_names_the_known_kinds_and_fills_the_rest():
    assert reg.max_drops() == {"overall": 0.05, "vqa": 0.05, "ocr": 0.05, "grounding": 0.05}
    assert reg.max_drops({"ocr": 0.2})["ocr"] == 0.2
    problem = reg.max_drop_problem({"ocrr": 0.1})
    assert "'ocrr'" in problem and "did you mean 'ocr'" in problem and "overall, vqa, ocr, grounding" in problem
    assert "number >= 0" in reg.max_drop_problem({"vqa": -0.1})
    with pytest.raises(ValueError, match="unknown kind 'captioning'"):
        reg.max_drops({"captioning": 0.1})


# --- config ---------------------------------------------------------------------------------


def _config(tmp_path: Path, eval_section: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(
        f"pipeline: {{name: demo, root: {tmp_path / 'runs'}}}\nmodel: {{source: m, cache: {tmp_path / 'c'}}}\n"
        f"data: {{train: t.jsonl}}\neval:\n{eval_section}"
    )
    return path


def test_unknown_kind_in_the_rule_is_refused_at_config_load_naming_the_known_kinds(tmp_path):
    path = _config(tmp_path, "  regression: r.jsonl\n  regression_max_drop: {ocr: 0.1, captioning: 0.05}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert f"{path}:6" in message and "eval.regression_max_drop" in message and "'captioning'" in message
    assert "overall, vqa, ocr, grounding" in message


def test_partial_rule_is_completed_with_the_default(tmp_path):
    cfg = load_config(_config(tmp_path, "  regression: r.jsonl\n  regression_max_drop: {ocr: 0.1}\n"))
    assert cfg.eval.regression == "r.jsonl"
    assert cfg.eval.regression_max_drop == {"overall": 0.05, "vqa": 0.05, "ocr": 0.1, "grounding": 0.05}


# --- rows: validate-data --------------------------------------------------------------------


def _png(path: Path, size=(200, 100)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (255, 255, 255)).save(path)


def _row(kind, gold: str, question: str = "<image>q", image: str = "img/a.png") -> dict:
    out = {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": gold}],
           "images": [image]}  # fmt: skip
    if kind is not None:
        out["kind"] = kind
    return out


def _write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _good_rows() -> list[dict]:
    return [_row("vqa", "2", "<image>how many holes?"), _row("ocr", "PART-042", "<image>read it"),
            _row("grounding", BOX, "<image>box the note")]  # fmt: skip


def test_good_rows_make_a_marked_dataset_with_their_kinds(tmp_path):
    _png(tmp_path / "data" / "img" / "a.png")
    src = _write(tmp_path / "data" / "regression.jsonl", _good_rows())
    result = validate_regression([str(src)], str(tmp_path / "out"), str(tmp_path / "q.jsonl"))
    assert result.counts == {"n_lines": 3, "n_valid": 3, "n_invalid": 0, "n_vqa": 1, "n_ocr": 1, "n_grounding": 1}
    rows = [json.loads(x) for x in (tmp_path / "out" / "data.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["vqa", "ocr", "grounding"]
    assert (tmp_path / "out" / "complete.json").is_file() and len(result.manifest_sha256) == 64
    assert "3 valid (1 vqa, 1 ocr, 1 grounding), 0 quarantined" in result.summary()


def test_unknown_kind_and_missing_gold_are_quarantined_with_their_codes(tmp_path):
    _png(tmp_path / "data" / "img" / "a.png")
    bad = [
        _row("vqaa", "2", "<image>how many?"),  # line 4: a typo
        _row(None, "2", "<image>how many now?"),  # line 5: no kind
        _row("ocr", "   ", "<image>read"),  # line 6: empty gold
        _row("grounding", "at the bottom left", "<image>where?"),  # line 7: not a list of boxes
        _row("grounding", '```json\n[{"label": "note", "bbox": [10, 20, 500, 30]}]\n```', "<image>where now?"),
    ]  # line 8: a box outside the 200x100 image
    src = _write(tmp_path / "data" / "regression.jsonl", _good_rows() + bad)
    result = validate_regression([str(src)], str(tmp_path / "out"), str(tmp_path / "q.jsonl"), max_invalid_fraction=0.7)
    found = [(i.line, i.code) for i in result.issues]
    assert found == [(4, "E_REGRESSION_KIND"), (5, "E_REGRESSION_KIND"), (6, "E_REGRESSION_GOLD"),
                     (7, "E_REGRESSION_GOLD"), (8, "E_BOX")]  # fmt: skip
    assert "'vqaa' is not one of vqa, ocr, grounding (did you mean 'vqa'?)" in result.issues[0].message
    assert "no 'kind'" in result.issues[1].message
    quarantined = [json.loads(x) for x in (tmp_path / "q.jsonl").read_text().splitlines()]
    assert [q["code"] for q in quarantined] == [code for _, code in found] and quarantined[0]["line"] == 4
    assert result.counts["n_valid"] == 3 and result.counts["E_REGRESSION_KIND"] == 2
    # the policy of the task data applies: 5 of 8 invalid is more than 0.5 allows
    with pytest.raises(DataError, match="5 of 8 lines invalid"):
        validate_regression([str(src)], str(tmp_path / "out2"), str(tmp_path / "q2.jsonl"), max_invalid_fraction=0.5)


def test_a_set_that_quarantines_to_nothing_is_a_named_error_and_publishes_nothing(tmp_path):
    _png(tmp_path / "data" / "img" / "a.png")
    src = _write(tmp_path / "data" / "regression.jsonl", [_row("caption", "a drawing"), _row(None, "yes")])
    with pytest.raises(EmptyRegressionSet) as err:
        validate_regression([str(src)], str(tmp_path / "out"), str(tmp_path / "q.jsonl"), max_invalid_fraction=1.0)
    message = str(err.value)
    assert "regression set (eval.regression) is empty after validation: all 2 of its rows were quarantined" in message
    assert "E_REGRESSION_KIND: 2" in message and str(tmp_path / "q.jsonl") in message
    assert not (tmp_path / "out").exists()  # nothing for evaluate to read
    assert len((tmp_path / "q.jsonl").read_text().splitlines()) == 2  # the quarantine says why


def test_the_regression_snapshot_is_read_as_snapshot_data_saw_it(tmp_path):
    data = tmp_path / "data"
    _png(data / "img" / "a.png")
    train = _write(data / "train.jsonl", [_row(None, BOX, "<image>detect")])
    src = _write(tmp_path / "reg" / "regression.jsonl", _good_rows())
    _png(tmp_path / "reg" / "img" / "a.png")
    result = snapshot_data(train=str(train), regression=str(tmp_path / "reg") + "/")
    plain = snapshot_data(train=str(train))
    # the regression set stays out of the data's fingerprint and training key: it retrains nothing
    assert (result.fingerprint, result.training_key) == (plain.fingerprint, plain.training_key)
    assert plain.regression_json == ""
    regression_snapshot = snap.parse(result.regression_json)
    assert [e["uri"] for e in regression_snapshot["train"]] == [str(src.resolve())]
    assert "regression set: 1 file(s)" in result.summary
    out = validate_regression_snapshot(
        result.regression_json, out=str(tmp_path / "o"), quarantine_out=str(tmp_path / "q")
    )
    assert out.counts["n_valid"] == 3
    src.write_text(src.read_text() + json.dumps(_row("vqa", "3", "<image>and now?")) + "\n")  # changed since
    with pytest.raises(DataError, match="overwritten since the data snapshot"):
        validate_regression_snapshot(
            result.regression_json, out=str(tmp_path / "o2"), quarantine_out=str(tmp_path / "q2")
        )
    with pytest.raises(DataError, match="no regression snapshot"):
        validate_regression_snapshot("", out=str(tmp_path / "o3"), quarantine_out=str(tmp_path / "q3"))


def test_a_regression_file_that_is_also_training_data_is_refused(tmp_path):
    _png(tmp_path / "data" / "img" / "a.png")
    train = _write(tmp_path / "data" / "train.jsonl", [_row(None, BOX)])
    with pytest.raises(SnapshotError, match="is both regression data .* and training or held-out data"):
        snapshot_data(train=str(train), regression=str(train))


# --- the demo's set ---------------------------------------------------------------------------


def test_demo_regression_set_is_deterministic_valid_and_on_drawings_of_its_own(tmp_path):
    a = drawings.generate_regression(tmp_path / "a")
    b = drawings.generate_regression(tmp_path / "b")
    assert a["n_rows"] == 12
    text = Path(a["regression"]).read_text()
    assert text == Path(b["regression"]).read_text()
    for i in range(4):
        name = f"images/regression_{i:05d}.png"
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    rows = [json.loads(x) for x in text.splitlines()]
    assert [r["kind"] for r in rows[:3]] == ["ocr", "vqa", "grounding"]
    # the facts are those of the drawing: the part number the title block prints, the note's ink box
    _, _, facts = drawing_render.render_drawing_facts(256, random.Random("drawings:0:regression:0"))
    assert rows[0]["messages"][-1]["content"] == facts["part_number"]
    assert json.loads(rows[2]["messages"][-1]["content"].split("\n")[1])[0]["bbox"] == facts["note_bbox"]
    result = validate_regression([a["regression"]], str(tmp_path / "out"), str(tmp_path / "q.jsonl"))
    assert result.counts["n_valid"] == 12 and result.counts["n_invalid"] == 0


def test_render_drawing_is_unchanged_by_the_facts():
    """The facts draw no random numbers: the task's drawings are the bytes they were."""
    image, findings = drawing_render.render_drawing(256, random.Random("drawings:0:train:3"))
    same, same_findings, facts = drawing_render.render_drawing_facts(256, random.Random("drawings:0:train:3"))
    assert image.tobytes() == same.tobytes() and findings == same_findings
    assert facts["part_number"].startswith("PART-") and facts["holes"] == sum(f["label"] == "hole" for f in findings)
