"""validate-data reads exactly a data snapshot's files and records the data lineage."""

from __future__ import annotations

import json

import pytest

from components.common import snapshot as snap
from components.snapshot_data.core import resolve_sources
from components.validate_data.core import snapshot_files
from components.validate_data.types import DataError
from tests.test_validate_data import Run, line, png, row, write_lines


def _shard(folder, name, n, start=0):
    png(folder / "images" / "a.png")
    return write_lines(folder / name, [line(row(f"q{start + i}", ["images/a.png"])) for i in range(n)])


def _validate(run, snapshot, **kwargs):
    train, held_out = snapshot_files(snapshot)
    return run(train, eval_files=held_out, snapshot=snapshot, **kwargs)


def test_snapshot_rows_are_validated_and_the_lineage_is_written(tmp_path):
    _shard(tmp_path / "d", "part-0.jsonl", 6)
    _shard(tmp_path / "d", "part-1.jsonl", 4, start=6)
    s = resolve_sources(str(tmp_path / "d")).snapshot
    run = Run(tmp_path / "out")
    result = _validate(run, s, lineage={"training_key": "k1"})
    assert result.counts["n_lines"] == 10
    lineage = json.loads((run.train / snap.LINEAGE_FILE).read_text())
    assert lineage["snapshot"] == s and lineage["training_key"] == "k1" and lineage["n_rows"] == 10
    assert lineage["task"] == ""  # the task the rows were checked for: serve's smoke test reads it
    assert lineage["files"][str(tmp_path / "d" / "part-1.jsonl")] == {"rows": 4, "quarantined": 0}
    assert result.stats["lineage"] == lineage


def test_rows_added_since_the_champion_are_reported(tmp_path):
    _shard(tmp_path / "d", "part-0.jsonl", 6)
    old = resolve_sources(str(tmp_path / "d")).snapshot
    first = _validate(Run(tmp_path / "a"), old)
    _shard(tmp_path / "d", "part-0.jsonl", 14)  # 8 rows appended to the shard
    new = resolve_sources(str(tmp_path / "d")).snapshot
    report = tmp_path / "report.html"
    second = _validate(Run(tmp_path / "b"), new, previous_lineage=first.stats["lineage"], report_out=str(report))
    since = second.stats["since"]
    assert since["changed"] == [str(tmp_path / "d" / "part-0.jsonl")] and not since["added"]
    assert (since["rows_before"], since["rows_now"]) == (6, 14)
    html = report.read_text()
    assert "Since the champion's data" in html and "+8 rows" in html and "(6 → 14 rows)" in html


def test_a_file_overwritten_after_the_snapshot_is_a_named_error_not_a_mix(tmp_path):
    shard = _shard(tmp_path / "d", "part-0.jsonl", 4)
    s = resolve_sources(str(tmp_path / "d")).snapshot
    _shard(tmp_path / "d", "part-0.jsonl", 5)
    with pytest.raises(DataError, match="overwritten since the data snapshot was taken"):
        _validate(Run(tmp_path / "out"), s)
    shard.unlink()
    with pytest.raises(DataError, match="deleted since the data snapshot"):
        _validate(Run(tmp_path / "out"), s)


def test_gs_snapshot_is_read_at_its_generation(gcs_client, gcs_bucket, tmp_path):
    png(tmp_path / "a.png")
    bucket = gcs_client.bucket(gcs_bucket)
    bucket.blob("d/images/a.png").upload_from_filename(str(tmp_path / "a.png"))
    rows = "\n".join(line(row(f"q{i}", ["images/a.png"])) for i in range(5)) + "\n"
    bucket.blob("d/part-0.jsonl").upload_from_string(rows)
    s = resolve_sources(f"gs://{gcs_bucket}/d/").snapshot
    result = _validate(Run(tmp_path / "ok"), s, max_invalid_fraction=0.0)
    assert result.counts["n_lines"] == 5
    bucket.blob("d/part-0.jsonl").upload_from_string(rows + rows)  # overwritten in place
    with pytest.raises(DataError, match="overwritten since the data snapshot was taken"):
        _validate(Run(tmp_path / "late"), s)


def test_a_lone_surrogate_escape_is_quarantined_and_the_other_rows_kept(tmp_path):
    png(tmp_path / "images" / "a.png")
    good = [line(row(f"q{i}", ["images/a.png"])) for i in range(4)]
    bad = line(row("X", ["images/a.png"])).replace("X", "\\ud800")
    f = write_lines(tmp_path / "train.jsonl", [*good, bad])
    run = Run(tmp_path / "out")
    result = run([f], max_invalid_fraction=0.5)
    assert result.counts["n_valid"] == 4 and result.counts["E_ENCODING"] == 1
    (issue,) = run.quarantined()
    assert issue["line"] == 5 and issue["code"] == "E_ENCODING" and "lone surrogate" in issue["message"]
    assert len(run.rows()[0]) + len(run.rows()[1]) == 4
