"""Hostile and careless local data sources for snapshot-data (issue #41): dangling and
self-pointing symlinks, `..` symlink loops under a glob, files that change while they are
listed, and an --out that cannot be written. Each is a note or a named error, never a
traceback or a hang; the manifest is written whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from components.common.snapshot import SnapshotError
from components.snapshot_data import _local
from components.snapshot_data import core as snapshot_core
from components.snapshot_data.core import resolve_sources

ROOT = Path(__file__).resolve().parents[1]
ROW = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}) + "\n"


def _write(path: Path, text: str = ROW) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "components.snapshot_data", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def data(tmp_path) -> Path:
    _write(tmp_path / "data" / "a.jsonl")
    _write(tmp_path / "data" / "img" / "cat.png", "png")
    return tmp_path / "data"


# ---------------------------------------------------------------- symlinks that lead nowhere


def test_dangling_image_link_is_a_note(data):
    (data / "img" / "gone.png").symlink_to(data / "img" / "missing.png")
    result = resolve_sources(str(data))
    assert [e["uri"] for e in result.snapshot["train"]] == [str((data / "a.jsonl").resolve())]
    note = [n for n in result.notes if "gone.png" in n]
    assert len(note) == 1 and "a dangling symlink (its target" in note[0] and note[0].endswith("skipped")


def test_self_pointing_link_is_a_note(data):
    loop = data / "img" / "self.png"
    loop.symlink_to(loop)
    result = resolve_sources(f"{data}/*.jsonl")  # its folder's assets walk meets it
    assert [n for n in result.notes if "self.png: a symlink loop" in n]


@pytest.mark.parametrize("kind", ["dangling", "self"])
def test_broken_jsonl_link_is_a_named_error(data, kind):
    link = data / "b.jsonl"
    link.symlink_to(link if kind == "self" else data / "missing.jsonl")
    words = "a symlink loop" if kind == "self" else "a dangling symlink"
    for source in (str(data), f"{data}/**/*.jsonl", str(link)):
        with pytest.raises(SnapshotError) as err:
            resolve_sources(source)
        assert str(err.value).startswith(f"{link}: {words}") and "remove it" in str(err.value), source


def test_cli_over_broken_links_exits_1_without_a_traceback(data):
    (data / "b.jsonl").symlink_to(data / "b.jsonl")
    (data / "img" / "gone.png").symlink_to(data / "nowhere")
    proc = _cli(str(data))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "b.jsonl: a symlink loop" in proc.stderr


# ---------------------------------------------------------------- directory symlinks under globs


def test_glob_over_two_parent_links_ends_without_duplicates(tmp_path):
    """`glob` followed both `..` links, 2^depth paths (past 120 s). It takes well under a second now;
    the 60 s bound (over 50x) only keeps a regression from hanging the suite."""
    root = tmp_path / "data"
    _write(root / "r0.jsonl")
    _write(root / "a" / "b" / "r.jsonl")
    (root / "a" / "b" / "up").symlink_to("..")
    (root / "a" / "up2").symlink_to("..")
    proc = _cli(f"{root}/**/*.jsonl", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "2 train file(s)" in proc.stdout and "more than one source" not in proc.stdout
    assert proc.stdout.count("a symlink to a folder, not followed") == 2


def test_glob_over_one_loop_gives_no_false_duplicates(tmp_path):
    root = tmp_path / "data"
    for i in range(4):
        _write(root / f"part-{i}" / "rows.jsonl")
    (root / "part-0" / "loop").symlink_to("..")
    result = resolve_sources(f"{root}/**/*.jsonl")
    assert len(result.snapshot["train"]) == 4
    assert not [n for n in result.notes if "more than one source" in n]
    assert [n for n in result.notes if n.startswith(f"{root / 'part-0' / 'loop'}: a symlink to a folder")]


def test_glob_still_matches_what_it_did(tmp_path):
    """The walk that replaced `glob.glob` matches the same files: `*` in one segment, `**` across, no hidden."""
    root = tmp_path / "d"
    for rel in ("2026-01/part-0.jsonl", "2026-01/deep/part-1.jsonl", "2026-02/part-2.jsonl", ".hidden/part-3.jsonl"):
        _write(root / rel)

    def uris(source: str) -> list[str]:
        return sorted(Path(e["uri"]).relative_to(root).as_posix() for e in resolve_sources(source).snapshot["train"])

    assert uris(f"{root}/2026-*/part-*.jsonl") == ["2026-01/part-0.jsonl", "2026-02/part-2.jsonl"]
    assert uris(f"{root}/**/*.jsonl") == ["2026-01/deep/part-1.jsonl", "2026-01/part-0.jsonl", "2026-02/part-2.jsonl"]
    assert uris(f"{root}/2026-0[2]/*.jsonl") == ["2026-02/part-2.jsonl"]
    linked = tmp_path / "linked"
    linked.symlink_to(root)  # a symlink named in the source itself is followed
    assert len(resolve_sources(f"{linked}/*/part-*.jsonl").snapshot["train"]) == 2


# ---------------------------------------------------------------- files that change while listed


def test_a_file_changed_while_hashed_is_listed_again(data, monkeypatch):
    """The first hash of a.jsonl sees it rewritten mid-way (a real write); the second listing is clean."""
    monkeypatch.setattr(snapshot_core, "LIST_RETRY_S", 0.0)
    real, calls = _local.sha256_file, []

    def hash_while_written(path):
        calls.append(path)
        digest = real(path)
        if len(calls) == 1:
            Path(path).write_text(ROW * 2)  # a writer appends while the snapshot hashes
        return digest

    monkeypatch.setattr(_local, "sha256_file", hash_while_written)
    entry = resolve_sources(str(data)).snapshot["train"][0]
    assert len(calls) == 2 and entry["size"] == len(ROW * 2) and entry["sha256"] == real(data / "a.jsonl")


def test_a_file_that_keeps_changing_is_a_named_error(data, monkeypatch):
    monkeypatch.setattr(snapshot_core, "LIST_RETRY_S", 0.0)
    real = _local.sha256_file

    def always_written(path):
        digest = real(path)
        with open(path, "a") as f:
            f.write(ROW)
        return digest

    monkeypatch.setattr(_local, "sha256_file", always_written)
    with pytest.raises(SnapshotError) as err:
        resolve_sources(str(data))
    message = str(err.value)
    assert message.startswith(f"{(data / 'a.jsonl').resolve()}: changed while it was hashed") and "retry" in message


def test_folder_churning_during_the_listing_never_gives_a_traceback(data, monkeypatch):
    """A writer adds and deletes images and JSONL files as fast as it can (15 of 15 runs gave a
    traceback). Each snapshot is a result or a named error that says to retry."""
    monkeypatch.setattr(snapshot_core, "LIST_RETRY_S", 0.05)
    stop = threading.Event()

    def churn():
        i = 0
        while not stop.is_set():
            for name in (f"img/x{i % 50}.png", f"sub{i % 7}/y{i % 50}.jsonl"):
                path = data / name
                path.parent.mkdir(exist_ok=True)
                path.write_text(ROW)
                if i % 2:
                    path.unlink(missing_ok=True)
            if i % 5 == 0:
                for sub in data.glob("sub*"):
                    for f in sub.glob("*"):
                        f.unlink(missing_ok=True)
                    try:
                        sub.rmdir()
                    except OSError:
                        pass
            i += 1

    writer = threading.Thread(target=churn, daemon=True)
    writer.start()
    outcomes = []
    try:
        for _ in range(15):
            try:
                outcomes.append(len(resolve_sources(str(data)).snapshot["train"]))
            except SnapshotError as exc:
                assert "retry" in str(exc), str(exc)
                outcomes.append(str(exc))
    finally:
        stop.set()
        writer.join(10)
    assert len(outcomes) == 15
    print("outcomes (train files, or the error):", outcomes)


# ---------------------------------------------------------------- --out


def test_out_is_written_whole_with_a_unique_temporary_name(data, tmp_path, monkeypatch):
    out = tmp_path / "o" / "manifest.json"
    names = []
    real_replace = os.replace

    def spy(src, dst):
        if Path(dst) == out:  # not the images' hash cache (components.snapshot_data._hashes)
            names.append(Path(src).name)
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    snapshot_core.snapshot_data(train=str(data), manifest_out=out)
    snapshot_core.snapshot_data(train=str(data), manifest_out=out)
    assert json.loads(out.read_text())["train"][0]["uri"].endswith("a.jsonl")
    assert len(names) == 2 and names[0] != names[1] and all(".partial-" in n for n in names)
    assert sorted(p.name for p in out.parent.iterdir()) == ["manifest.json"]


def test_out_naming_a_folder_is_a_named_error(data, tmp_path):
    folder = tmp_path / "taken"
    folder.mkdir()
    proc = _cli(str(data), "--out", str(folder))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{folder}: cannot write the manifest there" in proc.stderr and "--out" in proc.stderr
