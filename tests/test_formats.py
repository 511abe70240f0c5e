"""The conversion step (components.validate_data._formats): each form users already have, validated whole.

One run through the validate-data core per format family; the counts per form are what the summary,
the Metrics (counts) and the HTML report say; a row that would lose a field is quarantined by name.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image

from components.common.provenance import ORIGIN_KEY
from components.validate_data import _formats
from components.validate_data.core import validate_data
from components.validate_data.types import DataError


def _png(path: Path, shade: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (64, 48), (shade, 255 - shade, 90)).save(path)
    return path


def _run(tmp_path: Path, data: list[str], **kwargs):
    out = tmp_path / "out"
    result = validate_data(
        data, str(out / "train"), str(out / "eval"), str(out / "q.jsonl"), report_out=str(out / "report.html"),
        max_invalid_fraction=0.5, **kwargs,
    )  # fmt: skip
    return result, (out / "report.html").read_text(encoding="utf-8"), out


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _quarantine(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "q.jsonl").read_text().splitlines()]


def test_sharegpt_and_llava_rows_convert_and_are_counted(tmp_path):
    rows = []
    for i in range(6):
        _png(tmp_path / "img" / f"{i}.png", 30 * i)
        rows.append({"conversations": [{"from": "human", "value": f"<image>\nWhat part is drawn? {i}"},
                                       {"from": "gpt", "value": f"a bracket {i}"}],
                     "images": [f"img/{i}.png"], "system": "You read drawings."})  # fmt: skip
    for i in range(6, 10):
        _png(tmp_path / "img" / f"{i}.png", 20 * i)
        rows.append({"id": f"llava-{i}", "image": f"img/{i}.png",
                     "conversations": [{"from": "human", "value": f"<image>\nDescribe {i}."},
                                       {"from": "gpt", "value": f"a plate with {i} holes"}]})  # fmt: skip
    rows.append({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "x"}], "score": 3})
    rows.append({"conversations": [{"from": "narrator", "value": "hi"}, {"from": "gpt", "value": "x"}]})
    result, report, out = _run(tmp_path, [_jsonl(tmp_path / "sharegpt.jsonl", rows)])

    c = result.counts
    assert (c["n_form_sharegpt"], c["n_form_llava"], c["E_CONVERT"], c["n_valid"]) == (6, 4, 2, 10)
    assert "rows read by form (the conversion step): 6 sharegpt, 4 llava" in result.summary()
    assert "6 sharegpt, 4 llava; 2 could not convert whole" in report
    bad = {q["line"]: q["message"] for q in _quarantine(out)}
    assert "'score'" in bad[11] and "would be dropped" in bad[11]
    assert "'narrator' is not one of" in bad[12]
    written = [json.loads(line) for split in ("train", "eval") for line in (out / split / "data.jsonl").open()]
    assert {r["messages"][0]["role"] for r in written} == {"system", "user"}
    records = {r[ORIGIN_KEY].get("record") for r in written}
    assert {f"llava-{i}" for i in range(6, 10)} <= records  # the LLaVA id is carried as the origin's record


def test_swift_query_response_rows_convert(tmp_path):
    rows = [{"query": "<image>What is the scale?", "response": f"1:{i + 1}", "images": [f"img/{i}.png"],
             "history": [["Is this a drawing?", "Yes."]]} for i in range(5)]  # fmt: skip
    for i in range(5):
        _png(tmp_path / "img" / f"{i}.png", 40 * i)
    rows.append({"query": "no answer"})
    result, _, out = _run(tmp_path, [_jsonl(tmp_path / "swift.jsonl", rows)])
    assert (result.counts["n_form_query_response"], result.counts["E_CONVERT"]) == (5, 1)
    assert "without 'response'" in _quarantine(out)[0]["message"]
    row = json.loads((out / "train" / "data.jsonl").open().readline())
    assert [m["role"] for m in row["messages"]] == ["user", "assistant", "user", "assistant"]


def test_llamafactory_json_list_with_a_column_map(tmp_path):
    info = {"drawings": {"file_name": "data.json", "formatting": "sharegpt",
                         "columns": {"messages": "dialog", "images": "pictures"},
                         "tags": {"role_tag": "speaker", "content_tag": "text", "user_tag": "engineer",
                                  "assistant_tag": "model"}}}  # fmt: skip
    (tmp_path / "dataset_info.json").write_text(json.dumps(info))
    records = []
    for i in range(5):
        _png(tmp_path / "img" / f"{i}.png", 50 * i)
        records.append({"dialog": [{"speaker": "engineer", "text": "<image>Part number?"},
                                   {"speaker": "model", "text": f"P-{i}"}], "pictures": [f"img/{i}.png"]})  # fmt: skip
    records.append(
        {"dialog": [{"speaker": "engineer", "text": "hi", "weight": 1.0}, {"speaker": "model", "text": "x"}]}
    )
    (tmp_path / "data.json").write_text(json.dumps(records))
    result, report, out = _run(tmp_path, [str(tmp_path / "data.json")], columns=str(tmp_path / "dataset_info.json"))
    assert (result.counts["n_form_llamafactory"], result.counts["E_CONVERT"], result.counts["n_valid"]) == (5, 1, 5)
    assert "dialog[0]: field(s) 'weight' would be dropped" in _quarantine(out)[0]["message"]
    assert _quarantine(out)[0]["line"] == 6  # the record's number in the JSON list
    with pytest.raises(DataError, match="formatting 'alpaca'"):
        (tmp_path / "alpaca.json").write_text(json.dumps({"a": {"file_name": "x.json"}}))
        _run(tmp_path / "again", [str(tmp_path / "data.json")], columns=str(tmp_path / "alpaca.json"))


def _hf_rows(n: int) -> dict[str, list]:
    buf = []
    for i in range(n):
        b = io.BytesIO()
        Image.new("RGB", (64, 48), (25 * i, 80, 200)).save(b, format="PNG")
        buf.append([{"bytes": b.getvalue(), "path": f"d{i}.png"}])
    return {"messages": [[{"role": "user", "content": "<image>Title block?"},
                          {"role": "assistant", "content": f"sheet {i}"}] for i in range(n)], "images": buf}  # fmt: skip


def test_hugging_face_save_to_disk_folder_and_parquet(tmp_path):
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({
        "messages": [{"role": datasets.Value("string"), "content": datasets.Value("string")}],
        "images": datasets.Sequence(datasets.Image()),
    })  # fmt: skip
    ds = datasets.Dataset.from_dict(_hf_rows(6), features=features)
    ds.save_to_disk(str(tmp_path / "hf"))
    ds.to_parquet(str(tmp_path / "rows.parquet"))

    result, report, _ = _run(tmp_path / "a", [str(tmp_path / "hf")])
    assert (result.counts["n_form_messages"], result.counts["n_valid"], result.counts["n_images"]) == (6, 6, 6)
    result, _, _ = _run(tmp_path / "b", [str(tmp_path / "rows.parquet")])
    assert (result.counts["n_form_messages"], result.counts["n_valid"]) == (6, 6)
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "splits"))
    with pytest.raises(DataError, match="holds splits train, test; pass one split's folder"):
        _run(tmp_path / "c", [str(tmp_path / "splits")])


def test_convert_row_names_what_it_would_lose():
    with pytest.raises(_formats.ConvertReject, match="history\\[0\\] is not a \\[query, response\\] pair"):
        _formats.convert_row({"query": "q", "response": "r", "history": [["only one"]]})
    with pytest.raises(_formats.ConvertReject, match="is int, not a string"):
        _formats.convert_row({"conversations": [{"from": "human", "value": 3}]})
    native = {"messages": [{"role": "user", "content": "a"}], "extra": 1}
    assert _formats.convert_row(native) == (native, "messages")  # the project's own form passes unchanged


def test_vlm_lora_validate_takes_a_column_map(tmp_path, capsys):
    from components.validate_data.__main__ import main

    info = {"d": {"formatting": "sharegpt", "columns": {"messages": "turns"},
                  "tags": {"role_tag": "role", "content_tag": "text", "user_tag": "u", "assistant_tag": "a"}}}  # fmt: skip
    (tmp_path / "dataset_info.json").write_text(json.dumps(info))
    rows = [{"turns": [{"role": "u", "text": f"q{i}"}, {"role": "a", "text": f"r{i}"}]} for i in range(4)]
    (tmp_path / "in").mkdir()
    data = _jsonl(tmp_path / "in" / "lf.jsonl", rows)  # --out outside the data file's folder (h50b's rule)
    out = str(tmp_path / "out")
    assert (
        main([data, "--columns", f"{tmp_path / 'dataset_info.json'}:d", "--eval-fraction", "0.25", "--out", out]) == 0
    )
    assert "rows read by form (the conversion step): 4 llamafactory" in capsys.readouterr().out
    assert main([data, "--columns", str(tmp_path / "missing.json"), "--out", str(tmp_path / "o2")]) == 1
    assert "missing.json: not a readable dataset_info.json" in capsys.readouterr().err


def test_a_forged_origin_in_another_form_is_refused(tmp_path):
    forged = {"file": "/etc/passwd", "line": 1, "images": []}
    rows = [{"id": f"llava-{i}", "conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": "r"}]}
            for i in range(3)]  # fmt: skip
    rows[1][ORIGIN_KEY] = forged
    result, _, out = _run(tmp_path, [_jsonl(tmp_path / "llava.jsonl", rows)])
    assert (result.counts["n_valid"], result.counts["E_RESERVED_KEY"]) == (2, 1)
    (bad,) = _quarantine(out)
    assert (bad["line"], bad["code"]) == (2, "E_RESERVED_KEY")
    assert "origin" not in bad and bad["file"] == str(tmp_path / "llava.jsonl")  # never "/etc/passwd:1"
    written = [json.loads(line) for split in ("train", "eval") for line in (out / split / "data.jsonl").open()]
    assert {r[ORIGIN_KEY]["record"] for r in written} == {"llava-0", "llava-2"}  # the step's own origins kept
