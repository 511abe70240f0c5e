"""Tests of components.stage_model.core on tiny fake model folders."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from components.stage_model import transfer
from components.stage_model.core import result_summary, stage_local, stage_model
from components.stage_model.entry import MANIFEST, verify_entry
from components.stage_model.errors import StageError
from components.stage_model.listing import list_files
from components.stage_model.metadata import check_model

ARCH = "Qwen3VLForConditionalGeneration"
# 4*8 + 8 + 3*5 = 55 parameters, bf16-free: numpy has no bf16, so the mix is F32/F16.
TENSORS = {
    "model.layers.0.q_proj.weight": np.arange(32, dtype=np.float32).reshape(4, 8),
    "model.layers.0.q_proj.bias": np.ones(8, dtype=np.float32),
    "model.visual.patch.weight": np.zeros((3, 5), dtype=np.float16),
}
N_PARAMS = 32 + 8 + 15


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_model(folder: Path, arch: str = ARCH, tensors: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(
        json.dumps({"architectures": [arch], "torch_dtype": "bfloat16", "text_config": {"hidden_size": 8}})
    )
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 128}))
    (folder / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    (folder / "preprocessor_config.json").write_text(json.dumps({"patch_size": 16}))
    (folder / "README.md").write_text("tiny fake model\n")
    save_file(TENSORS if tensors is None else tensors, str(folder / "model.safetensors"))
    return folder


@pytest.fixture
def model(tmp_path) -> Path:
    return make_model(tmp_path / "src" / "tiny-qwen3-vl")


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "cache"


def files_of(folder: Path) -> list[str]:
    return list_files(folder)


# --- staging and the cache ---------------------------------------------------------


def test_first_stage_copies_files_and_writes_manifest(model, cache):
    result = stage_local(model, cache)
    entry = Path(result.entry)
    assert result.cache_hit is False
    assert entry.parent.parent == (cache / "local").resolve()
    assert entry.parent.name == "tiny-qwen3-vl"
    assert entry.name.startswith("sha256-") and len(entry.name) == len("sha256-") + 16

    src_files = sorted(p.name for p in model.iterdir())
    total = sum((model / f).stat().st_size for f in src_files)
    assert result.bytes_copied == total

    manifest = json.loads((entry / MANIFEST).read_text())
    assert manifest == result.manifest
    assert manifest["revision"] == entry.name
    assert manifest["source"] == str(model.resolve())
    assert manifest["scheme"] == "local"
    assert manifest["total_bytes"] == total
    assert sorted(manifest["files"]) == src_files
    for rel, info in manifest["files"].items():
        assert (entry / rel).read_bytes() == (model / rel).read_bytes()
        assert info["size"] == (model / rel).stat().st_size
        assert info["sha256"] == sha(model / rel)
    # no temporary files are left behind
    assert not [p for p in entry.rglob("*") if ".partial-" in p.name]
    assert verify_entry(entry) == (True, "ok")


def test_second_stage_is_a_cache_hit(model, cache):
    first = stage_local(model, cache)
    manifest_before = (Path(first.entry) / MANIFEST).read_bytes()
    second = stage_local(model, cache)
    assert second.cache_hit is True
    assert second.bytes_copied == 0
    assert second.entry == first.entry
    assert second.manifest == first.manifest
    assert second.metadata["cache_hit"] is True
    assert first.metadata["cache_hit"] is False
    assert (Path(first.entry) / MANIFEST).read_bytes() == manifest_before


def test_truncated_file_is_detected_and_repaired(model, cache):
    entry = Path(stage_local(model, cache).entry)
    weights = entry / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[:-10])
    valid, reason = verify_entry(entry)
    assert valid is False
    assert "model.safetensors" in reason and "size" in reason

    again = stage_local(model, cache)
    assert again.cache_hit is False
    assert Path(again.entry) == entry
    # only the broken file is copied again
    assert again.bytes_copied == len(good)
    assert weights.read_bytes() == good
    assert verify_entry(entry) == (True, "ok")


def test_same_size_corruption_is_detected_by_sha(model, cache):
    entry = Path(stage_local(model, cache).entry)
    tok = entry / "tokenizer.json"
    data = bytearray(tok.read_bytes())
    data[-2] ^= 0x01
    tok.write_bytes(bytes(data))
    valid, reason = verify_entry(entry)
    assert valid is False and "tokenizer.json" in reason and "sha256" in reason
    again = stage_local(model, cache)
    assert again.cache_hit is False
    assert again.bytes_copied == (model / "tokenizer.json").stat().st_size
    assert tok.read_bytes() == (model / "tokenizer.json").read_bytes()


def test_deleted_file_in_entry_is_detected_and_repaired(model, cache):
    entry = Path(stage_local(model, cache).entry)
    (entry / "preprocessor_config.json").unlink()
    valid, reason = verify_entry(entry)
    assert valid is False and "preprocessor_config.json" in reason and "missing" in reason
    again = stage_local(model, cache)
    assert again.cache_hit is False
    assert (entry / "preprocessor_config.json").read_bytes() == (model / "preprocessor_config.json").read_bytes()


def test_missing_manifest_means_restage(model, cache):
    entry = Path(stage_local(model, cache).entry)
    (entry / MANIFEST).unlink()
    valid, reason = verify_entry(entry)
    assert valid is False and "manifest" in reason
    again = stage_local(model, cache)
    assert again.cache_hit is False
    assert (entry / MANIFEST).is_file()
    # the files were intact, so nothing had to be copied, but the manifest is back
    assert again.bytes_copied == 0
    assert verify_entry(entry) == (True, "ok")
    assert stage_local(model, cache).cache_hit is True


def test_unreadable_manifest_means_restage(model, cache):
    entry = Path(stage_local(model, cache).entry)
    (entry / MANIFEST).write_text("{not json")
    valid, reason = verify_entry(entry)
    assert valid is False and "unreadable manifest" in reason
    again = stage_local(model, cache)
    assert again.cache_hit is False
    assert json.loads((entry / MANIFEST).read_text())["revision"] == entry.name


def test_manifest_of_wrong_shape_means_restage(model, cache):
    entry = Path(stage_local(model, cache).entry)
    (entry / MANIFEST).write_text(json.dumps({"files": {"config.json": {"sha256": "x"}}}))
    valid, _ = verify_entry(entry)
    assert valid is False
    assert stage_local(model, cache).cache_hit is False
    assert verify_entry(entry) == (True, "ok")


def test_changed_source_is_a_new_revision(model, cache):
    first = stage_local(model, cache)
    (model / "README.md").write_text("changed\n")
    second = stage_local(model, cache)
    assert second.cache_hit is False
    assert second.entry != first.entry
    assert Path(second.entry).parent == Path(first.entry).parent
    assert second.manifest["revision"] != first.manifest["revision"]
    assert (Path(second.entry) / "README.md").read_text() == "changed\n"
    # the old entry is untouched and still valid
    assert verify_entry(Path(first.entry)) == (True, "ok")
    assert (Path(first.entry) / "README.md").read_text() == "tiny fake model\n"


def test_revision_depends_on_content_not_on_location(tmp_path, cache):
    a = stage_local(make_model(tmp_path / "a" / "m"), cache)
    b = stage_local(make_model(tmp_path / "b" / "m"), cache)
    assert a.manifest["revision"] == b.manifest["revision"]
    assert b.cache_hit is True


# --- check_model -------------------------------------------------------------------


def test_metadata_counts_parameters_and_dtype(model, cache):
    result = stage_local(model, cache)
    meta = result.metadata
    assert meta["architecture"] == ARCH
    assert meta["model_type"] == "qwen3_vl"
    assert meta["num_parameters"] == N_PARAMS == sum(t.size for t in TENSORS.values())
    assert meta["dtype"] == "F32"  # 40 of the 55 parameters are float32
    assert meta["torch_dtype"] == "bfloat16"
    assert result.manifest["model"]["num_parameters"] == N_PARAMS
    summary = result_summary(result)
    assert "manifest" not in summary
    assert summary["revision"] == result.manifest["revision"]
    assert summary["total_bytes"] == result.manifest["total_bytes"]
    # flat: the Model artifact's metadata is read as base_model.metadata["model_type"]
    assert summary["num_parameters"] == N_PARAMS and summary["model_type"] == "qwen3_vl"
    assert "metadata" not in summary


def test_metadata_dtype_is_the_majority_dtype(tmp_path):
    folder = make_model(
        tmp_path / "m",
        tensors={"a": np.zeros((10, 10), dtype=np.float16), "b": np.zeros(3, dtype=np.float32)},
    )
    meta = check_model(folder, files_of(folder))
    assert meta["dtype"] == "F16"
    assert meta["num_parameters"] == 103


def test_sharded_model_counts_all_shards(tmp_path):
    folder = make_model(tmp_path / "m")
    (folder / "model.safetensors").unlink()
    save_file({"a": np.zeros((2, 3), dtype=np.float32)}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({"b": np.zeros(7, dtype=np.float32)}, str(folder / "model-00002-of-00002.safetensors"))
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert check_model(folder, files_of(folder))["num_parameters"] == 13


@pytest.mark.parametrize(
    "arch, model_type",
    [
        ("Qwen3VLMoeForConditionalGeneration", "qwen3_moe_vl"),
        ("Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl"),
        ("Qwen2VLForConditionalGeneration", "qwen2_vl"),
    ],
)
def test_other_supported_architectures(tmp_path, arch, model_type):
    folder = make_model(tmp_path / "m", arch=arch)
    assert check_model(folder, files_of(folder))["model_type"] == model_type


def check_error(folder: Path) -> str:
    with pytest.raises(StageError) as info:
        check_model(folder, files_of(folder))
    return str(info.value)


def test_no_config_json(model):
    (model / "config.json").unlink()
    msg = check_error(model)
    assert str(model) in msg and "config.json" in msg


def test_unparsable_config_json(model):
    (model / "config.json").write_text("{oops")
    msg = check_error(model)
    assert str(model / "config.json") in msg and "cannot parse" in msg


def test_unsupported_architecture_names_arch_and_config(tmp_path):
    folder = make_model(tmp_path / "m", arch="LlamaForCausalLM")
    msg = check_error(folder)
    assert "'LlamaForCausalLM'" in msg
    assert str(folder / "config.json") in msg
    assert "not supported" in msg and ARCH in msg


def test_config_without_architectures(model):
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3_vl"}))
    msg = check_error(model)
    assert "(none)" in msg


@pytest.mark.parametrize("missing", ["tokenizer.json", "tokenizer_config.json"])
def test_missing_tokenizer(model, missing):
    (model / missing).unlink()
    msg = check_error(model)
    assert "tokenizer files missing" in msg and str(model) in msg


def test_vocab_and_merges_replace_tokenizer_json(model):
    (model / "tokenizer.json").unlink()
    (model / "vocab.json").write_text("{}")
    (model / "merges.txt").write_text("#version: 0.2\n")
    assert check_model(model, files_of(model))["architecture"] == ARCH


def test_missing_preprocessor(model):
    (model / "preprocessor_config.json").unlink()
    msg = check_error(model)
    assert "preprocessor_config.json" in msg and str(model) in msg


def test_processor_config_replaces_preprocessor_config(model):
    (model / "preprocessor_config.json").rename(model / "processor_config.json")
    assert check_model(model, files_of(model))["model_type"] == "qwen3_vl"


def test_no_safetensors(model):
    (model / "model.safetensors").unlink()
    (model / "pytorch_model.bin").write_bytes(b"\0" * 16)
    msg = check_error(model)
    assert "no *.safetensors" in msg and str(model) in msg


def test_index_lists_a_missing_shard(model):
    index = {"weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    msg = check_error(model)
    assert str(model / "model.safetensors.index.json") in msg
    assert "model-00002-of-00002.safetensors" in msg
    assert "'model.safetensors'" not in msg and ": model.safetensors" not in msg


def test_unparsable_index(model):
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))
    msg = check_error(model)
    assert "model.safetensors.index.json" in msg and "cannot parse" in msg


def test_truncated_safetensors_data(model):
    path = model / "model.safetensors"
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    assert len(data) > 8 + n + 4
    path.write_bytes(data[:-4])  # header intact, tensor data short by 4 bytes
    msg = check_error(model)
    assert str(path) in msg and "truncated" in msg


def test_safetensors_cut_inside_header(model):
    path = model / "model.safetensors"
    path.write_bytes(path.read_bytes()[:20])
    msg = check_error(model)
    assert str(path) in msg and "header" in msg


def test_garbage_safetensors_header(model):
    path = model / "model.safetensors"
    garbage = b"\x00\xffnot json at all\x00"
    path.write_bytes(struct.pack("<Q", len(garbage)) + garbage + b"\0" * 64)
    msg = check_error(model)
    assert str(path) in msg and "unreadable safetensors header" in msg


def test_huge_header_length(model):
    path = model / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 2**40) + b"{}")
    msg = check_error(model)
    assert str(path) in msg and "exceeds the file" in msg


def test_file_shorter_than_header_length_field(model):
    path = model / "model.safetensors"
    path.write_bytes(b"\x01\x02")
    msg = check_error(model)
    assert str(path) in msg and "8-byte" in msg


@pytest.mark.parametrize(
    "header",
    [
        [1, 2, 3],
        {"w": 5},
        {"w": {"dtype": "F32", "shape": [2]}},
        {"w": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}},
    ],
)
def test_json_header_of_wrong_shape(model, header):
    path = model / "model.safetensors"
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 8)
    msg = check_error(model)
    assert str(path) in msg and "unreadable safetensors header" in msg


def test_broken_source_is_not_staged(model, cache):
    (model / "model.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(StageError):
        stage_local(model, cache)
    assert not list(cache.rglob(MANIFEST))


# --- sources -----------------------------------------------------------------------


def test_source_folder_not_found(tmp_path, cache):
    missing = tmp_path / "no-such-model"
    with pytest.raises(StageError) as info:
        stage_model(str(missing), str(cache))
    assert str(missing) in str(info.value) and "not found" in str(info.value)


def test_source_that_is_a_file(tmp_path, cache):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"x")
    with pytest.raises(StageError, match="folder not found"):
        stage_model(str(f), str(cache))


@pytest.mark.parametrize("source", ["s3://bucket/models/x", "ftp://host/model", "file:///tmp/model"])
def test_unknown_scheme(source, cache):
    with pytest.raises(StageError) as info:
        stage_model(source, str(cache))
    msg = str(info.value)
    assert source in msg and "unknown scheme" in msg
    assert source.split("://")[0] + "://" in msg
    assert "hf://" in msg and "gs://" in msg  # the fix: the schemes that work
    assert "\n" not in msg
    assert not cache.exists()


def test_unknown_cache_scheme(model):
    with pytest.raises(StageError, match="model cache 's3://b/m': unknown scheme"):
        stage_model(str(model), "s3://b/m")


def test_local_source_rejects_a_revision(model, cache):
    with pytest.raises(StageError, match="local folder has no revisions"):
        stage_model(str(model), str(cache), revision="main")


def test_two_concurrent_local_stagers_leave_one_valid_entry(model, cache):
    import threading

    barrier = threading.Barrier(3)
    results, errors = [], []

    def run():
        barrier.wait()
        try:
            results.append(stage_model(str(model), str(cache), poll_s=0.02))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and len(results) == 3
    assert len({r.entry for r in results}) == 1
    entry = Path(results[0].entry)
    assert verify_entry(entry) == (True, "ok")
    # exactly one stager copied; the others waited on the lock and got a hit
    assert sum(not r.cache_hit for r in results) == 1
    assert sorted(p.name for p in entry.iterdir()) == sorted([MANIFEST] + [p.name for p in model.iterdir()])
    assert not list(entry.parent.glob("*.lock*"))


def test_stale_local_lock_is_taken_over(model, cache):
    entry = Path(stage_model(str(model), str(cache)).entry)
    (entry / MANIFEST).unlink()
    lock = entry.parent / (entry.name + ".lock")
    lock.write_text(json.dumps({"owner": "crashed", "time": 0}))
    os.utime(lock, (0, 0))
    result = stage_model(str(model), str(cache), lock_stale_s=1, poll_s=0.02, lock_wait_s=10)
    assert result.cache_hit is False and verify_entry(entry) == (True, "ok")
    assert not lock.exists()


def test_live_lock_then_gone_without_manifest_stages(model, cache):
    """A stager that waited for a holder that failed stages the entry itself."""
    import threading

    entry = Path(stage_model(str(model), str(cache)).entry)
    (entry / MANIFEST).unlink()
    lock = entry.parent / (entry.name + ".lock")
    lock.write_text(json.dumps({"owner": "other", "time": 0}))
    threading.Timer(0.3, lock.unlink).start()
    result = stage_model(str(model), str(cache), poll_s=0.02)
    assert result.cache_hit is False and result.bytes_copied == 0
    assert verify_entry(entry) == (True, "ok")


def test_stage_model_stages_a_local_folder(model, cache):
    result = stage_model(str(model), str(cache))
    assert result.cache_hit is False
    assert verify_entry(Path(result.entry)) == (True, "ok")
    assert stage_model(str(model), str(cache)).cache_hit is True


# --- allow / ignore patterns -------------------------------------------------------


def test_list_files_default_ignores(model):
    (model / ".git").mkdir()
    (model / ".git" / "HEAD").write_text("ref")
    (model / ".cache" / "huggingface").mkdir(parents=True)
    (model / ".cache" / "huggingface" / "x.lock").write_text("")
    (model / "model.safetensors.partial-abc").write_text("half")
    (model / MANIFEST).write_text("{}")
    (model / "sub").mkdir()
    (model / "sub" / "extra.txt").write_text("x")
    assert list_files(model) == sorted(
        [
            "README.md",
            "config.json",
            "model.safetensors",
            "preprocessor_config.json",
            "sub/extra.txt",
            "tokenizer.json",
            "tokenizer_config.json",
        ]
    )


def test_allow_and_ignore_patterns(model):
    (model / "sub").mkdir()
    (model / "sub" / "extra.txt").write_text("x")
    assert list_files(model, allow=["*.json"]) == [
        "config.json",
        "preprocessor_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert list_files(model, ignore=["*.md", "sub/*"]) == [
        "config.json",
        "model.safetensors",
        "preprocessor_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    # ignore wins over allow
    assert list_files(model, allow=["*.json"], ignore=["tokenizer*"]) == ["config.json", "preprocessor_config.json"]


def test_stage_with_ignore_skips_files(model, cache):
    (model / "original.pt").write_bytes(b"\0" * 100)
    result = stage_local(model, cache, ignore=["*.md", "*.pt"])
    entry = Path(result.entry)
    assert not (entry / "README.md").exists()
    assert not (entry / "original.pt").exists()
    assert "README.md" not in result.manifest["files"]
    assert sorted(result.manifest["files"]) == [
        "config.json",
        "model.safetensors",
        "preprocessor_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    # a different file selection is a different revision
    full = stage_local(model, cache)
    assert full.entry != result.entry
    assert (Path(full.entry) / "original.pt").is_file()


def test_allow_that_drops_required_files_fails(model, cache):
    with pytest.raises(StageError, match="config.json"):
        stage_local(model, cache, allow=["*.safetensors"])


def test_patterns_that_leave_nothing_fail(model, cache):
    with pytest.raises(StageError, match="no files to stage"):
        stage_local(model, cache, allow=["*.gguf"])


# --- copying -----------------------------------------------------------------------


def test_file_changed_while_copying_is_an_error(model, cache, monkeypatch):
    real = transfer.sha256_file
    calls = {"n": 0}

    def sha_then_change(path):
        digest = real(path)
        calls["n"] += 1
        if Path(path).name == "model.safetensors" and Path(path).parent == model.resolve():
            # after the source was hashed, it changes before the copy
            Path(path).write_bytes(Path(path).read_bytes() + b"x")
        return digest

    monkeypatch.setattr(transfer, "sha256_file", sha_then_change)
    with pytest.raises(StageError, match="changed while being copied"):
        stage_local(model, cache)
    assert not list(cache.rglob(MANIFEST))
    assert not [p for p in cache.rglob("*") if ".partial-" in p.name]
