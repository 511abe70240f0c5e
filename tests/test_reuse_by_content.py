"""Issue 50, reuse by content: a changed file is never reused, and the line that says so names it.

On the cores: snapshot-data's images counted by their bytes (an image rewritten with the same
size and mtime, as `cp -p` / `rsync -t` leave it, changes the snapshot; the note names it), the
completion markers of train-lora's adapter and merge-export's merged model (a flipped byte or a
truncated file drops the kfp.local cache entry, so the task runs again; merge-export refuses a
changed adapter), and a staged base changed in the model cache (the entry is dropped, and
stage-model stages it again, naming the file).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from PIL import Image

from components.common import manifest
from components.merge_export import core as merge_core
from components.merge_export.errors import MergeError
from components.snapshot_data import _hashes
from components.snapshot_data.core import resolve_sources
from components.stage_model.core import stage_local
from components.stage_model.entry import verify_entry
from pipelines.cache_check import check_cache_entries

ROW = b'{"messages": [{"role": "user", "content": "<image>hi"}, {"role": "assistant", "content": "a"}], "images": ["x.png"]}\n'
RUN = "demo-2026-12-01-10-00-00-000000"


@pytest.fixture(autouse=True)
def _own_hash_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def _data(folder: Path, colour: tuple[int, int, int] = (10, 20, 30)) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.jsonl").write_bytes(ROW)
    Image.new("RGB", (16, 16), colour).save(folder / "x.png")
    return folder


def _rewrite_keeping_size_and_mtime(path: Path, colour: tuple[int, int, int]) -> None:
    """What `cp -p` / `rsync -t` of another image of the same size leaves: other bytes, same size and mtime."""
    st = path.stat()
    other = path.with_name("other.png.tmp")
    Image.new("RGB", (16, 16), colour).save(other, format="PNG")
    assert other.stat().st_size == st.st_size  # a plain colour: the same PNG size
    shutil.copyfile(other, path)
    other.unlink()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)


# ---------------------------------------------------------------- snapshot-data


def test_an_image_rewritten_with_the_same_size_and_mtime_changes_the_snapshot_and_is_named(tmp_path):
    data = _data(tmp_path / "d")
    before = resolve_sources(str(data))
    _rewrite_keeping_size_and_mtime(data / "x.png", (200, 20, 30))
    after = resolve_sources(str(data))
    assert after.snapshot["fingerprint"] != before.snapshot["fingerprint"]
    assert after.snapshot["train"][0]["assets"] != before.snapshot["train"][0]["assets"]
    assert (
        f"{data / 'x.png'}: content changed since the last snapshot (other bytes, same size and modification time)"
        in (after.notes)
    )
    again = resolve_sources(str(data))  # nothing changed since: same snapshot, no note
    assert again.snapshot == after.snapshot and not any("content changed" in n for n in again.notes)


def test_unchanged_images_are_not_read_again_and_a_touch_alone_changes_nothing(tmp_path, monkeypatch):
    data = _data(tmp_path / "d")
    first = resolve_sources(str(data)).snapshot
    reads: list[str] = []
    real = _hashes.blake2b_file
    monkeypatch.setattr(_hashes, "blake2b_file", lambda p: reads.append(str(p)) or real(p))
    assert resolve_sources(str(data)).snapshot == first and reads == []  # inode, size, mtime, ctime as cached
    os.utime(data / "x.png")  # a new mtime (and ctime), the same bytes
    assert resolve_sources(str(data)).snapshot == first and reads == [str(data / "x.png")]


def test_without_a_usable_hash_cache_every_image_is_hashed(tmp_path, monkeypatch):
    data = _data(tmp_path / "d")
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # the cache cannot be written: no error
    first = resolve_sources(str(data)).snapshot
    _rewrite_keeping_size_and_mtime(data / "x.png", (20, 200, 30))
    assert resolve_sources(str(data)).snapshot["fingerprint"] != first["fingerprint"]


# ---------------------------------------------------------------- the kfp.local cache


def _entry(cache: Path, key: str, name: str, uri: Path, metadata: dict) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"{key}.json"
    artifact = {"__kfp_artifact__": True, "schema_title": "system.Model", "uri": str(uri), "metadata": metadata}
    path.write_text(json.dumps({name: artifact}))
    return path


def _flip(path: Path, at: int = -100) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def _adapter(folder: Path) -> str:
    """An adapter folder as train-lora leaves it: its files, then the completion marker last."""
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(os.urandom(4096))
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    (folder / "base_model.json").write_text(json.dumps({"model_type": "qwen3_vl"}))
    return manifest.write_manifest(folder, producer="train-lora")


@pytest.mark.parametrize("tamper", ["flipped byte", "truncated"])
def test_a_tampered_cached_adapter_is_dropped_and_named(tmp_path, tamper):
    root = tmp_path / "root"
    adapter = root / RUN / "train-lora" / "adapter"
    digest = _adapter(adapter)
    cache = root / ".kfp_cache"
    kept = _entry(cache, "a" * 64, "adapter", adapter, {"manifest_sha256": digest})
    assert check_cache_entries(cache, root) == [] and kept.is_file()
    weights = adapter / "adapter_model.safetensors"
    if tamper == "flipped byte":
        _flip(weights)
    else:
        weights.write_bytes(weights.read_bytes()[:1000])
    lines = check_cache_entries(cache, root)
    assert len(lines) == 1 and not kept.exists()
    assert lines[0].startswith("cache: train-lora's output adapter changed since train-lora wrote it (")
    assert f"{adapter}/adapter_model.safetensors: " in lines[0] and "train-lora runs again" in lines[0]
    assert ("same size, other bytes" if tamper == "flipped byte" else "size 1000 bytes") in lines[0]


def test_a_large_marked_folder_gets_the_quick_check_a_flip_in_a_rewritten_file_is_still_caught(tmp_path, monkeypatch):
    """Above FULL_CHECK_MAX_BYTES a file whose inode, mtime and ctime are unchanged is not hashed; a rewrite changes ctime."""
    from pipelines import cache_check

    monkeypatch.setattr(cache_check, "FULL_CHECK_MAX_BYTES", 10)
    root = tmp_path / "root"
    adapter = root / RUN / "train-lora" / "adapter"
    digest = _adapter(adapter)
    cache = root / ".kfp_cache"
    reads: list[str] = []
    real = manifest.sha256_file
    monkeypatch.setattr(manifest, "sha256_file", lambda p, *a: reads.append(Path(p).name) or real(p, *a))
    kept = _entry(cache, "b" * 64, "adapter", adapter, {"manifest_sha256": digest})
    assert check_cache_entries(cache, root) == [] and reads == [manifest.MANIFEST_FILE]  # the marker's own digest
    _flip(adapter / "adapter_model.safetensors")
    lines = check_cache_entries(cache, root)
    assert len(lines) == 1 and "adapter_model.safetensors: sha256" in lines[0] and not kept.exists()


def test_the_marker_itself_edited_is_caught_by_its_recorded_digest(tmp_path):
    root = tmp_path / "root"
    adapter = root / RUN / "train-lora" / "adapter"
    digest = _adapter(adapter)
    (adapter / "adapter_model.safetensors").write_bytes(b"other")
    manifest.write_manifest(adapter, producer="someone")  # a marker that matches the edited files
    kept = _entry(root / ".kfp_cache", "c" * 64, "adapter", adapter, {"manifest_sha256": digest})
    lines = check_cache_entries(root / ".kfp_cache", root)
    assert len(lines) == 1 and "complete.json: the marker changed since it was written" in lines[0]
    assert not kept.exists()


# ---------------------------------------------------------------- merge-export


@pytest.fixture(scope="module")
def tiny_base() -> Path:
    from pipelines.demo.tiny_model import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="module")
def merged(tiny_base, tmp_path_factory):
    """merge-export's real core on a peft adapter; the merge itself by peft (swift export takes a minute)."""
    from tests.test_merge_export import _make_adapter, _peft_merge

    base = tmp_path_factory.mktemp("reuse")
    adapter = _make_adapter(tiny_base, base / "adapter")
    marker = manifest.write_manifest(adapter, producer="train-lora")

    def peft_export(adapter_dir, base_dir, tmp_out, work_dir):
        _peft_merge(Path(base_dir), adapter_dir, tmp_out)
        return 0.0, {}

    real = merge_core._export
    merge_core._export = peft_export
    try:
        root = base / "root"
        out = root / RUN / "merge-export" / "merged_model"
        result = merge_core.merge_export(
            str(adapter), str(tiny_base), str(out), str(base / "work"), verify_logits=False, adapter_marker=marker
        )
    finally:
        merge_core._export = real
    return adapter, marker, root, out, result


def test_merge_export_writes_a_marker_its_metadata_records(merged):
    _, _, _, out, result = merged
    body = manifest.verify_manifest(out, expected_sha256=result.metadata["manifest_sha256"])
    assert {"model.safetensors", "config.json", "lineage.json", "README.md"} <= set(body["files"])
    assert body["producer"] == "merge-export"


@pytest.mark.parametrize("tamper", ["flipped byte", "truncated"])
def test_a_tampered_cached_merged_model_is_dropped_and_named(merged, tmp_path, tamper):
    _, _, _, out, result = merged
    copy = tmp_path / "root" / RUN / "merge-export" / "merged_model"
    shutil.copytree(out, copy)  # the module's merged model stays whole for the other tests
    root = tmp_path / "root"
    kept = _entry(root / ".kfp_cache", "d" * 64, "merged_model", copy, result.metadata)
    assert check_cache_entries(root / ".kfp_cache", root) == []
    weights = copy / "model.safetensors"
    if tamper == "flipped byte":
        _flip(weights, len(weights.read_bytes()) // 2)
    else:
        os.truncate(weights, weights.stat().st_size - 7)
    lines = check_cache_entries(root / ".kfp_cache", root)
    assert len(lines) == 1 and not kept.exists()
    assert (
        f"merge-export's output merged_model changed since merge-export wrote it ({copy}/model.safetensors: "
        in (lines[0])
    )


@pytest.mark.parametrize("tamper", ["flipped byte", "truncated"])
def test_merge_export_refuses_an_adapter_changed_since_train_lora_wrote_it(merged, tmp_path, tiny_base, tamper):
    adapter, marker, _, _, _ = merged
    copy = tmp_path / "adapter"
    shutil.copytree(adapter, copy)
    weights = copy / "adapter_model.safetensors"
    if tamper == "flipped byte":
        _flip(weights)
    else:
        os.truncate(weights, 100)
    with pytest.raises(MergeError, match=r"adapter_model\.safetensors: (sha256|size 100 bytes)") as caught:
        merge_core.merge_export(str(copy), str(tiny_base), str(tmp_path / "out"), str(tmp_path / "w"),
                                adapter_marker=marker)  # fmt: skip
    assert "train the adapter again" in str(caught.value) and not (tmp_path / "out").exists()


# ---------------------------------------------------------------- stage-model's model cache


def test_a_staged_base_changed_in_the_model_cache_is_a_miss_that_restages_naming_the_file(tiny_base, tmp_path, caplog):
    root = tmp_path / "root"
    model_cache = tmp_path / "model-cache"  # outside the pipeline root, as model.cache may be
    staged = stage_local(tiny_base, model_cache)
    entry = Path(staged.entry)
    kept = _entry(root / ".kfp_cache", "e" * 64, "model", entry, {"cache_hit": False})
    assert check_cache_entries(root / ".kfp_cache", root) == [] and kept.is_file()
    config = entry / "config.json"
    good = config.read_bytes()
    config.write_bytes(good.replace(b'"', b"'", 1))  # one byte other, the same size
    lines = check_cache_entries(root / ".kfp_cache", root)
    assert len(lines) == 1 and not kept.exists()
    assert f"cache: stage-model's output model changed since stage-model wrote it ({entry}/config.json: " in lines[0]
    with caplog.at_level("WARNING", logger="stage_model"):
        again = stage_local(tiny_base, model_cache)
    assert again.cache_hit is False and config.read_bytes() == good and verify_entry(entry) == (True, "ok")
    assert any("changed since it was staged (config.json: sha256 mismatch)" in r.message for r in caplog.records)
