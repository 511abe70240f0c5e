"""Issue 41, outputs: written whole, one writer per folder, reused outputs checked.

Real `python -m components.validate_data` processes into one `--out`, a real `kill -9`
mid-write, completion markers (`components.common.manifest`) checked by the readers
(train-lora, evaluate) and by `pipelines.run`'s check of the kfp.local cache.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from components.common import manifest
from components.common.lock import FolderInUse, hold_folder
from components.common.manifest import ManifestError, verify_manifest
from components.evaluate.core import EvalError, load_eval_rows
from components.train_lora._data import materialize_dataset
from components.train_lora.core import TrainError
from components.validate_data.core import validate_data
from pipelines.cache_check import check_cache_entries

ROOT = Path(__file__).resolve().parents[1]
COUNTS = re.compile(r"(\d+) valid \((\d+) train, (\d+) eval\)")


def _dataset(folder: Path, n_train: int, n_eval: int, tag: str) -> tuple[Path, Path]:
    """Writes a train and an eval JSONL (distinct rows; 12 PNGs for train, 4 others for eval: no leakage)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(12):
        Image.new("RGB", (64 + i, 48), (10 * i, 100, 200)).save(folder / f"img{i}.png")
    for i in range(4):
        Image.new("RGB", (96 + i, 48), (200, 10 * i, 100)).save(folder / f"eval{i}.png")

    def rows(n: int, split: str) -> str:
        return "".join(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": f"<image>{tag} {split} question {i}?"},
                        {"role": "assistant", "content": f"answer {i}"},
                    ],
                    "images": [f"img{i % 12}.png" if split == "train" else f"eval{i % 4}.png"],
                }
            )
            + "\n"
            for i in range(n)
        )

    (folder / "train.jsonl").write_text(rows(n_train, "train"))
    (folder / "eval.jsonl").write_text(rows(n_eval, "eval"))
    return folder / "train.jsonl", folder / "eval.jsonl"


def _cli(data: tuple[Path, Path], out: Path, **popen) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "components.validate_data", str(data[0]), "--eval", str(data[1]), "--out", str(out)]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    stdout, stderr = proc.communicate(timeout=180)
    return proc.returncode, stdout, stderr


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _assert_whole(out: Path, n_train: int, n_eval: int, tag: str) -> None:
    """DIR holds exactly one run's output: markers verify, the counts and every row are that run's."""
    for split, n in (("train", n_train), ("eval", n_eval)):
        verify_manifest(out / split)
        rows = _rows(out / split / "data.jsonl")
        assert len(rows) == n
        assert all(r["messages"][0]["content"].startswith(f"<image>{tag} {split}") for r in rows)
        assert all((out / split / ref).is_file() for r in rows for ref in r["images"])
        assert json.loads((out / split / "token_stats.json").read_text())["rows"] == n
    assert not [p.name for p in out.iterdir() if ".partial-" in p.name or ".staging-" in p.name or p.suffix == ".tmp"]


def test_two_validate_data_into_one_out_never_mix(tmp_path):
    """Started together: each reports its own counts and the folder holds one of them whole, or one is refused by name."""
    a, b = _dataset(tmp_path / "a", 3000, 300, "A"), _dataset(tmp_path / "b", 2000, 200, "B")
    out = tmp_path / "out"
    procs = {"A": _cli(a, out), "B": _cli(b, out)}
    results = {tag: _finish(p) for tag, p in procs.items()}
    expected = {"A": (3000, 300), "B": (2000, 200)}
    succeeded = []
    for tag, (code, stdout, stderr) in results.items():
        assert "Traceback" not in stderr, stderr
        if code == 0:
            assert COUNTS.search(stdout).groups()[1:] == tuple(str(n) for n in expected[tag]), stdout
            succeeded.append(tag)
        else:
            other = procs["B" if tag == "A" else "A"].pid
            assert code == 1 and f"is in use by another validate-data (pid {other} on " in stderr, stderr
            assert "--out OTHER_DIR" in stderr
    assert succeeded
    # the folder is the whole output of the run that wrote it last (both ran: one after the other)
    first_row = _rows(out / "train" / "data.jsonl")[0]["messages"][0]["content"]
    last = "A" if first_row.startswith("<image>A") else "B"
    assert last in succeeded
    _assert_whole(out, *expected[last], last)
    verify_manifest(out)  # DIR's own marker: complete


def test_a_second_writer_is_refused_by_name_while_the_first_holds_the_folder(tmp_path):
    data = _dataset(tmp_path / "a", 20, 4, "A")
    out = tmp_path / "out"
    with hold_folder(out, "validate-data", fix="wait") as taken:
        assert taken.previous == {}
        with pytest.raises(FolderInUse, match=rf"is in use by another validate-data \(pid {os.getpid()} on "):
            with hold_folder(out, "validate-data", fix="wait"):
                pass
        proc = _cli(data, out)
        code, _, stderr = _finish(proc)
    assert code == 1 and f"(pid {os.getpid()} on " in stderr and "--out OTHER_DIR" in stderr, stderr
    assert not (out / "train").exists()
    proc = _cli(data, out)  # released: the next writer goes ahead
    assert _finish(proc)[0] == 0
    _assert_whole(out, 20, 4, "A")


_KILL_AFTER_COPIES = """
import os, signal, sys
from components.validate_data import _write
copies = []
def copy_then_die(src, dst, _copy=_write.copy_file):
    _copy(src, dst)
    copies.append(dst)
    if len(copies) == 5:
        os.kill(os.getpid(), signal.SIGKILL)
_write.copy_file = copy_then_die
from components.validate_data.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def test_kill_9_while_rewriting_an_existing_out_leaves_the_old_output_whole(tmp_path):
    """A writer killed mid-write (SIGKILL after 5 image copies) leaves the previous output whole,
    DIR marked incomplete (no DIR/complete.json); the next writer takes over and cleans up."""
    a, b = _dataset(tmp_path / "a", 40, 6, "A"), _dataset(tmp_path / "b", 30, 5, "B")
    out = tmp_path / "out"
    assert _finish(_cli(a, out))[0] == 0
    cmd = [sys.executable, "-c", _KILL_AFTER_COPIES, str(b[0]), "--eval", str(b[1]), "--out", str(out)]
    killed = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert killed.returncode == -signal.SIGKILL
    assert [p.name for p in out.iterdir() if ".staging-" in p.name], "the killed writer leaves its staging folder"
    for split, n in (("train", 40), ("eval", 6)):  # the old output, whole and still verifying
        verify_manifest(out / split)
        assert len(_rows(out / split / "data.jsonl")) == n
    with pytest.raises(ManifestError, match="no completion marker"):
        verify_manifest(out)  # DIR says it is incomplete
    proc = _cli(b, out)
    code, _, stderr = _finish(proc)
    assert code == 0, stderr
    assert "which ended while writing; its leftovers are removed" in stderr
    _assert_whole(out, 30, 5, "B")
    verify_manifest(out)


@pytest.fixture
def validated(tmp_path) -> Path:
    data = _dataset(tmp_path / "src", 16, 16, "T")
    out = tmp_path / "v"
    validate_data([str(data[0])], str(out / "train"), str(out / "eval"), str(out / "q.jsonl"), [str(data[1])])
    return out


def test_marker_names_the_file_and_what_differs(validated):
    eval_dir = validated / "eval"
    body = verify_manifest(eval_dir)
    assert {"data.jsonl", "token_stats.json"} <= set(body["files"]) and any(
        f.startswith("images/") for f in body["files"]
    )
    data = eval_dir / "data.jsonl"
    lines = data.read_text().splitlines(keepends=True)
    size = data.stat().st_size
    data.write_text("".join(lines[:3]))  # truncated from 16 to 3 rows
    with pytest.raises(ManifestError) as err:
        verify_manifest(eval_dir)
    assert err.value.file == "data.jsonl" and f"the completion marker says {size}" in str(err.value)
    data.write_text("".join(lines).replace("answer 1", "answer 9", 1))  # same size, other bytes
    with pytest.raises(ManifestError, match=r"data.jsonl: sha256 .*same size, other bytes"):
        verify_manifest(eval_dir)
    data.write_text("".join(lines))
    image = sorted((eval_dir / "images").iterdir())[0]
    image.unlink()
    with pytest.raises(ManifestError, match=rf"images/{image.name}: listed in the completion marker but missing"):
        verify_manifest(eval_dir)


def test_marker_edited_after_it_was_written_is_caught_by_its_recorded_digest(validated):
    digest = manifest.sha256_file(validated / "train" / manifest.MANIFEST_FILE)
    verify_manifest(validated / "train", expected_sha256=digest)
    marker = validated / "train" / manifest.MANIFEST_FILE
    body = json.loads(marker.read_text())
    del body["files"]["data.jsonl"]
    marker.write_text(json.dumps(body))
    with pytest.raises(ManifestError, match="the marker changed since it was written"):
        verify_manifest(validated / "train", expected_sha256=digest)


def test_readers_refuse_a_truncated_dataset_by_name(validated, tmp_path):
    assert len(load_eval_rows(validated / "eval")) == 16
    assert materialize_dataset(validated / "train", tmp_path / "m.jsonl") == 16
    for split in ("train", "eval"):
        data = validated / split / "data.jsonl"
        data.write_text("".join(data.read_text().splitlines(keepends=True)[:3]))
    with pytest.raises(EvalError, match=r"eval/data.jsonl: size \d+ bytes, the completion marker says \d+"):
        load_eval_rows(validated / "eval")
    with pytest.raises(TrainError, match=r"train/data.jsonl: size \d+ bytes.*run validate-data again"):
        materialize_dataset(validated / "train", tmp_path / "m.jsonl")


def test_readers_given_the_recorded_digest_refuse_a_removed_or_edited_marker(validated, tmp_path):
    """On Vertex the wrappers pass the artifact's manifest_sha256: a marker deleted with the rows is no escape."""
    digests = {split: manifest.sha256_file(validated / split / manifest.MANIFEST_FILE) for split in ("train", "eval")}
    assert len(load_eval_rows(validated / "eval", expected_marker=digests["eval"])) == 16
    assert materialize_dataset(validated / "train", tmp_path / "m.jsonl", digests["train"]) == 16
    for split in ("train", "eval"):
        data = validated / split / "data.jsonl"
        data.write_text("".join(data.read_text().splitlines(keepends=True)[:3]))
        (validated / split / manifest.MANIFEST_FILE).unlink()
    assert len(load_eval_rows(validated / "eval")) == 3  # an unmarked folder of an older release still reads
    with pytest.raises(EvalError, match="eval"):
        load_eval_rows(validated / "eval", expected_marker=digests["eval"])
    with pytest.raises(TrainError, match="run validate-data again"):
        materialize_dataset(validated / "train", tmp_path / "m.jsonl", digests["train"])


def test_a_failed_write_leaves_the_previous_output_and_no_staging(validated, tmp_path, monkeypatch):
    from components.validate_data import _write

    before = verify_manifest(validated / "train")["files"]
    data = _dataset(tmp_path / "other", 10, 3, "O")

    def broken_copy(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_write, "copy_file", broken_copy)
    with pytest.raises(OSError, match="No space left"):
        validate_data([str(data[0])], str(validated / "train"), str(validated / "eval"), str(validated / "q.jsonl"),
                      [str(data[1])])  # fmt: skip
    assert verify_manifest(validated / "train")["files"] == before
    assert not [p.name for p in validated.iterdir() if ".staging-" in p.name or ".partial-" in p.name]


def _cache_entry(cache: Path, key: str, dataset: Path, digest: str = "") -> Path:
    meta = {"rows": 16, **({"manifest_sha256": digest} if digest else {})}
    entry = cache / f"{key}.json"
    artifact = {"__kfp_artifact__": True, "schema_title": "system.Dataset", "uri": str(dataset), "metadata": meta}
    entry.write_text(json.dumps({"eval_dataset": artifact, "n_eval": 16}))
    return entry


def test_a_cached_dataset_that_changed_is_dropped_from_the_kfp_local_cache(tmp_path):
    """#41 must-show 3, core: a truncated cached eval set is a cache miss, named in one line."""
    root = tmp_path / "root"
    task = root / "demo-2026-11-27-10-00-00-000000" / "validate-data"
    data = _dataset(tmp_path / "src", 16, 16, "T")
    validate_data([str(data[0])], str(task / "train_dataset"), str(task / "eval_dataset"), str(task / "quarantine"),
                  [str(data[1])])  # fmt: skip
    cache = root / ".kfp_cache"
    cache.mkdir()
    digest = manifest.sha256_file(task / "eval_dataset" / manifest.MANIFEST_FILE)
    kept = _cache_entry(cache, "a" * 64, task / "eval_dataset", digest)
    assert check_cache_entries(cache, root) == [] and kept.is_file()
    data_file = task / "eval_dataset" / "data.jsonl"
    data_file.write_text("".join(data_file.read_text().splitlines(keepends=True)[:3]))
    lines = check_cache_entries(cache, root)
    assert len(lines) == 1 and not kept.exists()
    assert lines[0].startswith("cache: validate-data's output eval_dataset changed since validate-data wrote it (")
    assert f"{task / 'eval_dataset'}/data.jsonl: size" in lines[0] and "validate-data runs again" in lines[0]


def test_a_cached_dataset_whose_marker_is_gone_is_dropped_when_its_producer_recorded_one(validated, tmp_path):
    root = validated
    cache = root / ".kfp_cache"
    cache.mkdir()
    digest = manifest.sha256_file(validated / "eval" / manifest.MANIFEST_FILE)
    recorded = _cache_entry(cache, "b" * 64, validated / "eval", digest)
    (validated / "eval" / manifest.MANIFEST_FILE).unlink()
    unrecorded = _cache_entry(cache, "c" * 64, validated / "eval")  # an older producer: nothing to check against
    lines = check_cache_entries(cache, root)
    assert len(lines) == 1 and "complete.json: no completion marker" in lines[0]
    assert not recorded.exists() and unrecorded.is_file()
