"""Provenance: every clean row names the user's file, line and image; evaluate and the quarantine show it.

validate-data writes `components.common.provenance.ORIGIN_KEY` into each clean row; a clean
set validated again keeps the first origin; train-lora leaves the key out of what `swift sft`
reads; evaluate carries it into its predictions and its report (`file:line`, image name).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.common.provenance import ORIGIN_KEY, image_name, origin_of, where
from components.train_lora._data import materialize_dataset
from components.validate_data.types import DataError
from tests.test_validate_data import Run, fenced, line, png, read_jsonl, row, write_lines


def _user_data(tmp_path: Path, n: int = 6) -> Path:
    folder = tmp_path / "user"
    for i in range(n):
        png(folder / "pics" / f"drawing_{i}.png", size=(64, 48 + 8 * i), color=(20 * i, 90, 200))
    rows = [line(row(f"find the holes {i}", [f"pics/drawing_{i}.png"], answer=fenced(i))) for i in range(n)]
    return write_lines(folder / "train.jsonl", ["", *rows])  # a blank first line: rows start at line 2


def test_clean_rows_name_the_users_file_line_and_image(tmp_path):
    path = _user_data(tmp_path)
    run = Run(tmp_path / "out")
    run([path])
    train, evals = run.rows()
    for out in train + evals:
        origin = origin_of(out)
        assert origin["file"] == str(path)
        i = int(out["messages"][0]["content"].rsplit(" ", 1)[1])
        assert origin["line"] == i + 2 and origin["images"] == [f"pics/drawing_{i}.png"]
        assert out["images"][0].startswith("images/") and "drawing" not in out["images"][0]  # hashed in the clean set


def test_a_clean_set_validated_again_keeps_the_users_origin(tmp_path):
    path = _user_data(tmp_path)
    first = Run(tmp_path / "first")
    first([path], eval_fraction=0.0001)
    clean = first.train / "data.jsonl"
    second = Run(tmp_path / "second")
    with pytest.raises(DataError):  # every row is now too long: nothing left (the outputs are written first)
        second([clean], max_length=1, max_invalid_fraction=1.0, report_out=str(tmp_path / "r.html"))
    # quarantined under the clean file's line, with the user's file:line and image name
    record = read_jsonl(second.quarantine)[0]
    assert record["file"] == str(clean) and record["code"] == "E_TOKENS"
    assert record["origin"].startswith(f"{path}:") and record["origin_images"][0].startswith("pics/drawing_")
    report = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert f"originally <code>{record['origin']}</code>" in report and record["origin_images"][0] in report
    # a re-validation that keeps the rows keeps their first origin, not the clean set's file:line
    third = Run(tmp_path / "third")
    third([clean], eval_fraction=0.0001)
    assert {origin_of(r)["file"] for r in sum(third.rows(), [])} == {str(path)}


def test_quarantine_records_have_no_origin_fields_for_plain_rows(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", ["{broken"] + [line(row(f"q{i}", [], answer=fenced(1))) for i in range(3)])
    run = Run(tmp_path / "out")
    run([path], max_invalid_fraction=1.0)
    assert all(set(q) == {"file", "line", "code", "message", "raw"} for q in run.quarantined())


def test_train_lora_strips_the_origin_before_swift_reads_the_rows(tmp_path):
    path = _user_data(tmp_path, 3)
    run = Run(tmp_path / "out")
    run([path])
    out = tmp_path / "swift.jsonl"
    materialize_dataset(run.train, out)
    rows = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert rows and all(ORIGIN_KEY not in r for r in rows)
    assert all(Path(r["images"][0]).is_absolute() for r in rows)


def test_origin_helpers():
    assert image_name("data:image/png;base64," + "A" * 500).startswith("(inline image/png image")
    assert image_name("x" * 300).endswith("…") and len(image_name("x" * 300)) == 200
    assert origin_of({ORIGIN_KEY: {"file": "f", "line": True}}) is None  # malformed: ignored
    assert where(origin_of({ORIGIN_KEY: {"file": "gs://b/t.jsonl", "line": 3}})) == "gs://b/t.jsonl:3"


def test_evaluate_carries_the_users_origin_into_predictions_and_report(tmp_path):
    from components.evaluate._report import render_report
    from components.evaluate.core import evaluate, load_eval_rows

    path = _user_data(tmp_path)
    run = Run(tmp_path / "out")
    run([path])
    rows = load_eval_rows(run.eval)
    assert all(r["origin"]["file"] == str(path) for r in rows)

    def generate(model_dir, model_type, rows, batch_size, max_new_tokens):
        return (["no boxes"] * len(rows) if model_dir == "base" else [r["gold"] for r in rows]), len(rows)

    predictions = tmp_path / "predictions.jsonl"
    result = evaluate("tuned", "base", "qwen3_vl", str(run.eval), str(predictions), generate_fn=generate)
    written = [json.loads(x) for x in predictions.read_text(encoding="utf-8").splitlines()]
    assert [w["origin"] for w in written] == [r["origin"] for r in rows]
    first = written[0]["origin"]
    assert first["images"][0].startswith("pics/drawing_")
    page = render_report(result.tuned, result.reference, result.samples, iou_threshold=0.5, worst_n=len(rows))
    assert f"{where(first)}</b>" in page and first["images"][0] in page
    assert "images/" not in page.split("<h2>Worst")[1].split("<pre>")[0]  # the hashed name is not what a card shows


def test_evaluate_of_a_dataset_without_origins_names_its_own_file(tmp_path):
    from components.evaluate.core import load_eval_rows

    folder = tmp_path / "eval"
    folder.mkdir()
    plain = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": fenced(1)}]}
    (folder / "data.jsonl").write_text(json.dumps(plain) + "\n", encoding="utf-8")
    assert where(load_eval_rows(folder)[0]["origin"]) == f"{folder / 'data.jsonl'}:1"
