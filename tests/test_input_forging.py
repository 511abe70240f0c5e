"""Issue 50, input that cannot forge or sneak: validate-data and snapshot-data on hostile rows and paths.

A path naming an existing file is that file (never taken for base64); the origin record is
reserved; `videos` / `audios` are refused by name; a gold answer with two ```json blocks is
refused; `--out` inside a data folder is refused and the project's outputs are never listed
as data; files the project creates or truncates are never opened through a planted link.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from components.common.files import SymlinkRefused, open_nofollow
from components.common.lock import LockError, hold_folder
from components.common.provenance import ORIGIN_KEY
from components.snapshot_data.core import resolve_sources
from components.validate_data import _sources
from components.validate_data.types import DataError
from tests.test_validate_data import Run, good_rows, line, png, read_jsonl, row, write_lines

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "components.validate_data"]


@pytest.fixture
def data(tmp_path) -> Path:
    folder = tmp_path / "data"
    for i in range(4):
        png(folder / "img" / f"d{i}.png", color=(i * 60, 100, 255 - i * 60))
    return folder


@pytest.fixture
def run(tmp_path) -> Run:
    return Run(tmp_path / "out")


# ---------------------------------------------------------------- a path is a path


def test_an_existing_image_under_a_long_extension_less_path_is_that_file_not_base64(data, run):
    long_dir = "/".join(["abcdefghij" * 4] * 6)  # 245 characters of base64's alphabet, slashes included
    name = f"{long_dir}/scan"
    assert len(name) > 200 and _sources._BASE64_RE.match(name)
    (data / name).parent.mkdir(parents=True)
    Image.new("RGB", (64, 48), (9, 99, 199)).save(data / name, format="PNG")
    assert _sources.resolve(name, str(data)).kind == "file"
    path = write_lines(data / "train.jsonl", [line(r) for r in good_rows()] + [line(row("q", [name]))])
    result = run([path])
    assert result.counts["n_valid"] == 5 and not result.issues
    assert _sources.resolve("QUJD" * 60, str(data)).kind == "base64"  # no such file: still base64


# ---------------------------------------------------------------- reserved and unsupported keys


def test_a_raw_row_cannot_forge_its_origin(data, run, tmp_path):
    forged = {**row("q", ["img/d0.png"]), ORIGIN_KEY: {"file": "/etc/passwd", "line": 1, "images": ["x"]}}
    broken = {**row("q", ["img/nope.png"]), ORIGIN_KEY: {"file": "/etc/passwd", "line": 2}}
    path = write_lines(data / "train.jsonl", [*(line(r) for r in good_rows()), line(forged), line(broken)])
    report = tmp_path / "report.html"
    result = run([path], max_invalid_fraction=0.5, report_out=str(report))
    codes = {i.line: i.code for i in result.issues}
    assert codes == {5: "E_RESERVED_KEY", 6: "E_RESERVED_KEY"}
    message = next(i.message for i in result.issues if i.line == 5)
    assert f"key {ORIGIN_KEY!r} is reserved" in message and "remove the key" in message
    for record in run.quarantined():
        assert "origin" not in record and record["file"] == str(path)  # never "/etc/passwd:1"
    assert "/etc/passwd:" not in report.read_text(encoding="utf-8").replace('"file": "/etc/passwd"', "")
    assert all(ORIGIN_KEY not in r or r[ORIGIN_KEY]["file"] == str(path) for r in sum(run.rows(), []))


def test_a_clean_set_edited_after_validation_loses_the_right_to_carry_origins(data, tmp_path):
    path = write_lines(data / "train.jsonl", [line(r) for r in good_rows(8)])
    first = Run(tmp_path / "first")
    first([path], eval_fraction=0.0001)
    clean = first.train / "data.jsonl"
    again = Run(tmp_path / "again")
    lines = clean.read_text(encoding="utf-8").splitlines()
    kept = again([clean], eval_fraction=0.0001)  # the clean set as written: its origins stand
    assert kept.counts["n_valid"] == len(lines) >= 4 and not kept.issues
    edited = json.loads(lines[0])
    edited[ORIGIN_KEY]["file"] = "/etc/passwd"
    clean.write_text("\n".join([json.dumps(edited), *lines[1:]]) + "\n", encoding="utf-8")
    third = Run(tmp_path / "third")
    with pytest.raises(DataError, match="no valid training rows left"):  # the file lost its marker's trust whole
        third([clean], eval_fraction=0.0001, max_invalid_fraction=1.0)
    records = read_jsonl(third.quarantine)
    assert [r["code"] for r in records] == ["E_RESERVED_KEY"] * len(lines)
    assert "edited since" in records[0]["message"] and all("origin" not in r for r in records)


@pytest.mark.parametrize("key", ["videos", "audios"])
def test_media_keys_ms_swift_reads_are_refused_by_name(data, run, key):
    sneaky = {**row("q", ["img/d0.png"]), key: ["clip.mp4"]}
    path = write_lines(data / "train.jsonl", [*(line(r) for r in good_rows()), line(sneaky)])
    result = run([path], max_invalid_fraction=0.5)
    assert [(i.line, i.code) for i in result.issues] == [(5, "E_MEDIA_KEY")]
    assert f"field {key!r}" in result.issues[0].message
    assert all(key not in r for r in sum(run.rows(), []))


def test_a_gold_answer_with_two_json_blocks_is_refused(data, run):
    two = "```json\n[]\n```\nor maybe\n```json\n" + '[{"label": "hole", "bbox": [1, 2, 30, 40]}]\n```'
    path = write_lines(data / "train.jsonl", [*(line(r) for r in good_rows()), line(row("q", ["img/d1.png"], two))])
    result = run([path], max_invalid_fraction=0.5, task="detection")
    assert [(i.line, i.code) for i in result.issues] == [(5, "E_GOLD_BLOCKS")]
    assert "2 ```json blocks" in result.issues[0].message


# ---------------------------------------------------------------- outputs are not data


def test_cli_refuses_out_inside_the_data_folder(data):
    path = write_lines(data / "train.jsonl", [line(r) for r in good_rows()])
    out = data / "checked"
    done = subprocess.run([*CLI, str(path), "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"--out {out} is inside {data}, the folder of the data file {path}" in done.stderr
    assert not out.exists()


def test_a_folder_source_never_lists_the_projects_own_outputs(data, tmp_path):
    path = write_lines(data / "train.jsonl", [line(r) for r in good_rows(8)])
    out = tmp_path / "validated"
    done = subprocess.run([*CLI, str(path), "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    os.rename(out, data / "validated")  # moved into the data folder afterwards (or written there by an older version)
    found = resolve_sources(str(data))
    assert [e["uri"] for e in found.snapshot["train"]] == [str(path.resolve())]
    assert any(f"{data / 'validated'}: an output of this project" in n for n in found.notes)
    named = resolve_sources(str(data / "validated" / "train" / "data.jsonl"))  # named as a file: used
    assert len(named.snapshot["train"]) == 1


# ---------------------------------------------------------------- no write through a planted link


def test_a_planted_symlink_lock_file_is_refused_and_its_target_untouched(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me\n")
    (out / ".validate-data.lock").symlink_to(victim)
    with pytest.raises(LockError, match=r"the lock file is a symbolic link \(to .*precious.txt\); it is not followed"):
        with hold_folder(out, "validate-data", fix="-"):
            pass
    assert victim.read_text() == "keep me\n"


def test_the_cli_with_a_planted_lock_link_fails_in_one_line_and_truncates_nothing(data, tmp_path):
    path = write_lines(data / "train.jsonl", [line(r) for r in good_rows()])
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me\n")
    (out / ".validate-data.lock").symlink_to(victim)
    done = subprocess.run([*CLI, str(path), "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr and "symbolic link" in done.stderr
    assert victim.read_text() == "keep me\n"


def test_open_nofollow_refuses_a_link_and_writes_plain_files(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    link = tmp_path / "out.jsonl"
    link.symlink_to(victim)
    for mode in ("w", "wb", "x"):
        with pytest.raises(SymlinkRefused, match="is a symbolic link"):
            open_nofollow(link, mode)
    assert victim.read_text() == "keep"
    with open_nofollow(tmp_path / "plain.txt") as f:
        f.write("ok")
    assert (tmp_path / "plain.txt").read_text() == "ok"


def test_validate_data_temporary_files_are_never_written_through_a_link(data, run, monkeypatch):
    """A link planted at the quarantine's temporary name: the write is refused, the target untouched."""
    from components.validate_data import _write

    victim = data.parent / "precious.txt"
    victim.write_text("keep me\n")
    path = write_lines(data / "train.jsonl", [line(r) for r in good_rows()] + ["{broken"])
    run.quarantine.parent.mkdir(parents=True)
    _write.temp_name(run.quarantine).symlink_to(victim)
    with pytest.raises(SymlinkRefused):
        run([path], max_invalid_fraction=0.5)
    assert victim.read_text() == "keep me\n"


def test_convert_never_writes_through_a_dangling_link_at_its_output(tmp_path):
    from components.validate_data._convert import ConvertError, convert_file
    from tests.test_validate_data_integrity import detection_file

    src = detection_file(tmp_path, [[100, 100, 400, 300]])
    out = tmp_path / "out.jsonl"
    victim = tmp_path / "elsewhere" / "created.jsonl"
    out.symlink_to(victim)  # dangling: exists() is False, a plain write would create the target
    with pytest.raises(ConvertError, match="exists"):
        convert_file(src, out, to="norm1000")
    assert not victim.exists() and not victim.parent.exists()
    result = convert_file(src, tmp_path / "real.jsonl", to="norm1000")
    assert result.rows == 1 and (tmp_path / "real.jsonl").is_file()
