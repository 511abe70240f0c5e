"""A champion's `data_snapshot.json` of the wrong shape (issue #41): a named error that names the
file and the field, from snapshot-data (core and command line) and from validate-data, never
a traceback or a silent "no lineage"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from components.common import snapshot as snap
from components.common.snapshot import LINEAGE_FILE, SnapshotError
from components.snapshot_data.core import snapshot_data
from components.validate_data.core import validate_snapshot
from components.validate_data.types import DataError

ROOT = Path(__file__).resolve().parents[1]


def _data(tmp_path: Path) -> Path:
    folder = tmp_path / "d"
    folder.mkdir()
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}
    (folder / "a.jsonl").write_text(json.dumps(row) + "\n")
    return folder


def _good_lineage(data: Path) -> dict:
    first = snapshot_data(train=str(data))
    return {"snapshot": json.loads(first.snapshot_json), "training_key": first.training_key, "n_rows": 1}


def _spoil(lineage: dict, case: str):
    bad = json.loads(json.dumps(lineage))
    if case == "list":
        return [bad]
    if case == "snapshot-list":
        bad["snapshot"] = [bad["snapshot"]]
    elif case == "train-string":
        bad["snapshot"]["train"] = "a.jsonl"
    elif case == "entry-string":
        bad["snapshot"]["train"] = ["a.jsonl"]
    elif case == "uri-number":
        bad["snapshot"]["train"][0]["uri"] = 7
    elif case == "training-key-number":
        bad["training_key"] = 12345
    elif case == "n-rows-string":
        bad["n_rows"] = "many"
    elif case == "files-list":
        bad["files"] = ["a.jsonl"]
    return bad


FIELDS = {
    "list": "expected a JSON object {...}, found a list",
    "snapshot-list": "field 'snapshot' must be an object",
    "train-string": "field 'snapshot.train' must be a list of file entries, found a string",
    "entry-string": "field 'snapshot.train[0]' must be an object, found a string",
    "uri-number": "field 'snapshot.train[0].uri' must be a file name, found a number (7)",
    "training-key-number": "field 'training_key' must be a string, found a number (12345)",
    "n-rows-string": "field 'n_rows' must be a whole number, found a string",
    "files-list": "field 'files' must be an object",
}


@pytest.mark.parametrize("case", sorted(FIELDS))
def test_wrong_shape_is_a_named_error_in_snapshot_data(case, tmp_path):
    data = _data(tmp_path)
    champion = tmp_path / "champion"
    champion.mkdir()
    (champion / LINEAGE_FILE).write_text(json.dumps(_spoil(_good_lineage(data), case)))
    with pytest.raises(SnapshotError) as err:
        snapshot_data(train=str(data), champion_dir=str(champion))
    message = str(err.value)
    assert message.startswith(f"{champion / LINEAGE_FILE}: ") and FIELDS[case] in message, message
    assert "restore the file" in message  # the fix


def test_not_json_is_a_named_error_and_a_missing_file_is_unknown(tmp_path):
    champion = tmp_path / "champion"
    champion.mkdir()
    assert snap.read_lineage(str(champion)) is None  # a model from before snapshots
    (champion / LINEAGE_FILE).write_text('{"snapshot": ')
    with pytest.raises(SnapshotError, match=r"data_snapshot.json: not valid JSON"):
        snap.read_lineage(str(champion))


def test_a_good_lineage_is_read(tmp_path):
    data = _data(tmp_path)
    champion = tmp_path / "champion"
    champion.mkdir()
    lineage = {**_good_lineage(data), "files": {"x": {"rows": 1, "quarantined": 0}}, "n_train": 1, "n_eval": 0}
    (champion / LINEAGE_FILE).write_text(json.dumps(lineage))
    assert snap.read_lineage(str(champion)) == lineage
    assert snapshot_data(train=str(data), champion_dir=str(champion)).up_to_date


def test_cli_exits_1_without_a_traceback(tmp_path):
    data = _data(tmp_path)
    champion = tmp_path / "champion"
    champion.mkdir()
    (champion / LINEAGE_FILE).write_text(json.dumps(_spoil(_good_lineage(data), "train-string")))
    proc = subprocess.run(
        [sys.executable, "-m", "components.snapshot_data", str(data), "--champion", str(champion)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "data_snapshot.json: field 'snapshot.train' must be a list" in proc.stderr


def test_validate_data_names_the_damaged_lineage(tmp_path):
    data = _data(tmp_path)
    lineage = _good_lineage(data)
    champion = tmp_path / "champion"
    champion.mkdir()
    (champion / LINEAGE_FILE).write_text(json.dumps(_spoil(lineage, "uri-number")))
    with pytest.raises(DataError, match=r"data_snapshot.json: field 'snapshot.train\[0\].uri'"):
        validate_snapshot(
            snap.canonical(lineage["snapshot"]),
            train_out=str(tmp_path / "train"),
            eval_out=str(tmp_path / "eval"),
            quarantine_out=str(tmp_path / "q.jsonl"),
            champion_dir=str(champion),
        )
