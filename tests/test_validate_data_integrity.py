"""validate-data's row checks against careless and hostile input (issue #41, row checks).

Image paths no file can have (a NUL byte, a name over 255 bytes, a symlink loop), a
5,000-digit integer, outputs that cannot be written, the CLI's argument rules (those of the
config), train/eval leakage and EXIF orientation: each a quarantined row with a code or a
named error, never a traceback and never silent.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from components.validate_data import core
from components.validate_data.core import DataError
from tests.test_validate_data import Run, good_rows, line, png, row, write_lines

CLI = [sys.executable, "-m", "components.validate_data"]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def data(tmp_path) -> Path:
    """A dataset folder with four good images."""
    folder = tmp_path / "data"
    for i in range(4):
        png(folder / "img" / f"d{i}.png", color=(i * 60, 100, 255 - i * 60))
    return folder


@pytest.fixture
def run(tmp_path) -> Run:
    return Run(tmp_path / "out")


def good_lines() -> list[str]:
    return [line(r) for r in good_rows()]


def only_issue(result: core.ValidationResult, path: Path, code: str) -> core.Issue:
    """Returns the one quarantined line (line 5 of `path`) after checking that the four good rows were kept."""
    assert [(i.file, i.line, i.code) for i in result.issues] == [(str(path), 5, code)]
    assert result.counts["n_valid"] == 4
    return result.issues[0]


# --- image paths no file can have, and numbers Python will not read ------------------


def test_image_path_with_a_nul_byte_is_quarantined(data, run):
    path = write_lines(data / "train.jsonl", [*good_lines(), line(row("q", ["img/d0\u0000.png"]))])
    issue = only_issue(run([path], max_invalid_fraction=0.5), path, "E_IMAGE_PATH")
    assert "NUL byte" in issue.message


def test_image_name_over_255_bytes_is_quarantined(data, run):
    long_name = "é" * 130 + ".png"  # 264 bytes in UTF-8, 134 characters
    path = write_lines(data / "train.jsonl", [*good_lines(), line(row("q", [f"img/{long_name}"]))])
    issue = only_issue(run([path], max_invalid_fraction=0.5), path, "E_IMAGE_PATH")
    assert "264 bytes" in issue.message and "255" in issue.message


def test_relative_symlink_loop_is_quarantined(data, run):
    os.symlink(data / "img" / "loop.png", data / "img" / "loop.png")
    path = write_lines(data / "train.jsonl", [*good_lines(), line(row("q", ["img/loop.png"]))])
    issue = only_issue(run([path], max_invalid_fraction=0.5), path, "E_IMAGE_PATH")
    assert "symlink loop" in issue.message


def test_absolute_symlink_loop_is_named_as_a_loop(data, run):
    loop = data / "img" / "loop.png"
    os.symlink(loop, loop)
    path = write_lines(data / "train.jsonl", [*good_lines(), line(row("q", [str(loop)]))])
    issue = only_issue(run([path], max_invalid_fraction=0.5), path, "E_IMAGE_MISSING")
    assert "symlink loop" in issue.message and str(loop) in issue.message


def test_five_thousand_digit_integer_is_a_json_error(data, run):
    bad = line(row("q", ["img/d0.png"]))[:-1] + ', "n": ' + "9" * 5000 + "}"
    path = write_lines(data / "train.jsonl", [*good_lines(), bad])
    issue = only_issue(run([path], max_invalid_fraction=0.5), path, "E_JSON")
    assert "4300 digits" in issue.message and "as a string" in issue.message
    assert run.quarantined()[0]["raw"] == bad


# --- outputs that cannot be written: named before anything is read --------------------


@pytest.mark.parametrize("taken", ["report.html", "quarantine.jsonl"])
def test_cli_output_file_that_is_a_folder_is_named(data, tmp_path, taken):
    path = write_lines(data / "train.jsonl", good_lines())
    out = tmp_path / "out"
    (out / taken).mkdir(parents=True)
    done = subprocess.run([*CLI, str(path), "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert f"{out / taken}: is a folder, but a file goes here" in done.stderr
    assert (out / taken).is_dir() and not (out / "train").exists()


def test_cli_out_that_is_a_file_is_named(data, tmp_path):
    path = write_lines(data / "train.jsonl", good_lines())
    out = tmp_path / "out"
    out.write_text("not a folder")
    done = subprocess.run([*CLI, str(path), "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert f"{out} is a file, not a folder" in done.stderr
    assert out.read_text() == "not a folder"


def test_dataset_folder_that_is_a_file_is_named(data, tmp_path):
    path = write_lines(data / "train.jsonl", good_lines())
    (tmp_path / "train_out").write_text("x")
    with pytest.raises(DataError, match=r"train_out .*train_out: is a file, but a dataset folder goes here"):
        core.validate_data([str(path)], str(tmp_path / "train_out"), str(tmp_path / "e"), str(tmp_path / "q.jsonl"))


def _check_paths_as_nobody(inputs: list[str], out: Path) -> str:
    """Runs check_paths in a forked child as user nobody (root may write anywhere); returns its error or ""."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, check, report through the pipe, exit without pytest's clean-up
        message = ""
        try:
            os.setgid(65534)
            os.setuid(65534)
            core.check_paths(inputs, train_out=str(out / "train"), eval_out=str(out / "eval"),
                             quarantine_out=str(out / "quarantine.jsonl"))  # fmt: skip
        except DataError as exc:
            message = str(exc)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the test
            message = f"unexpected {type(exc).__name__}: {exc}"
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        message = f.read().decode()
    os.waitpid(pid, 0)
    return message


def test_read_only_out_is_named(data):
    """As a user who cannot write --out (nobody, in a child, when the tests run as root: root writes anywhere)."""
    top = Path(tempfile.mkdtemp(prefix="vd-ro-", dir="/tmp"))
    try:
        os.chmod(top, 0o755)
        lines = write_lines(top / "train.jsonl", good_lines())
        out = top / "read-only"
        out.mkdir()
        os.chmod(out, 0o555)
        if os.geteuid() == 0:
            message = _check_paths_as_nobody([str(lines)], out)
        else:
            with pytest.raises(DataError) as caught:
                core.check_paths([str(lines)], train_out=str(out / "train"), eval_out=str(out / "eval"),
                                 quarantine_out=str(out / "quarantine.jsonl"))  # fmt: skip
            message = str(caught.value)
    finally:
        os.chmod(top / "read-only", 0o755)
        subprocess.run(["rm", "-rf", str(top)], check=True)
    assert f"the folder {out} is not writable by this user" in message


# --- gold answers parsed strictly --------------------------------------------------

KV_GOOD = [
    '```json\n{"invoice": "A-%d", "total": "1.00"}\n```' % i  # noqa: UP031 - the braces are JSON's
    for i in range(4)
]
KV_BAD = {
    "E_GOLD_FENCE": '```json\n{"invoice": "A-9", "total": "1.00"}',
    "E_GOLD_DUPLICATE_KEY": '```json\n{"total": "1.00", "total": "999.00"}\n```',
    "E_GOLD_KEY_COLLISION": '```json\n{"total": "1.00", "Total ": "999.00"}\n```',
    "E_GOLD_EMPTY_KEY": '```json\n{"": "1.00", "total": "2.00"}\n```',
}


@pytest.mark.parametrize("code", list(KV_BAD))
def test_key_value_bad_gold_is_quarantined_with_its_code(data, run, code):
    good = [line(row(f"read invoice {i}", [f"img/d{i}.png"], answer=a)) for i, a in enumerate(KV_GOOD)]
    path = write_lines(data / "train.jsonl", [*good, line(row("read it", ["img/d0.png"], answer=KV_BAD[code]))])
    result = run([path], max_invalid_fraction=0.5, task="key_value")
    issue = only_issue(result, path, code)
    assert str(issue).startswith(f"{path}:5: {code}: messages[1].content (assistant, the gold answer): ")
    assert result.counts[code] == 1
    assert run.quarantined()[0]["code"] == code


def test_detection_gold_with_two_different_boxes_is_quarantined(data, run):
    answer = '```json\n[{"label": "hole", "bbox": [1, 2, 30, 40], "bbox_2d": [100, 200, 300, 400]}]\n```'
    path = write_lines(data / "train.jsonl", [*good_lines(), line(row("q", ["img/d0.png"], answer=answer))])
    issue = only_issue(run([path], max_invalid_fraction=0.5, task="detection"), path, "E_GOLD_MIXED_BOX_KEYS")
    assert '"bbox_2d": [100, 200, 300, 400]' in issue.message and "keep one key" in issue.message
