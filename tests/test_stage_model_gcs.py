"""stage-model against a real Cloud Storage emulator (gcp-storage-emulator on 127.0.0.1)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from components.common.files import sha256_file
from components.stage_model import _gcs
from components.stage_model.core import result_summary, stage_model
from components.stage_model.entry import MANIFEST, verify_entry
from components.stage_model.errors import StageError
from components.stage_model.listing import crc32c_file
from tests.test_stage_model import make_model


@pytest.fixture
def model(tmp_path) -> Path:
    return make_model(tmp_path / "src" / "tiny-qwen3-vl")


def objects(client, bucket: str, prefix: str = "") -> dict[str, bytes]:
    return {b.name: b.download_as_bytes() for b in client.list_blobs(bucket, prefix=prefix)}


def upload_folder(client, folder: Path, bucket: str, prefix: str) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            client.bucket(bucket).blob(f"{prefix}/{path.relative_to(folder).as_posix()}").upload_from_filename(
                str(path)
            )


def test_fuse_path_mapping():
    assert _gcs.to_fuse_path("gs://b/models/hf/Qwen/x/abc") == "/gcs/b/models/hf/Qwen/x/abc"
    assert _gcs.to_fuse_path("gs://b/") == "/gcs/b"
    assert _gcs.from_fuse_path("/gcs/b/models/x") == "gs://b/models/x"
    assert _gcs.from_fuse_path(_gcs.to_fuse_path("gs://b/p/q")) == "gs://b/p/q"
    assert _gcs.to_fuse_path("/local/dir") == "/local/dir"
    assert _gcs.from_fuse_path("/gcsx/b") == "/gcsx/b"


def test_stage_local_folder_into_gcs_then_hit(model, gcs_client, gcs_bucket):
    cache = f"gs://{gcs_bucket}/models"
    first = stage_model(str(model), cache)
    assert first.cache_hit is False
    assert first.entry.startswith(f"gs://{gcs_bucket}/models/local/tiny-qwen3-vl/sha256-")
    total = sum(p.stat().st_size for p in model.iterdir())
    assert first.bytes_copied == total == first.manifest["total_bytes"]
    prefix = first.entry[len(f"gs://{gcs_bucket}/") :]
    stored = objects(gcs_client, gcs_bucket, prefix + "/")
    for path in model.iterdir():
        assert stored[f"{prefix}/{path.name}"] == path.read_bytes()
    manifest = json.loads(stored[f"{prefix}/{MANIFEST}"])
    assert manifest == first.manifest
    for rel, info in manifest["files"].items():
        assert info["crc32c"] == crc32c_file(model / rel)
        assert info["sha256"] == sha256_file(model / rel)
    assert verify_entry(first.entry) == (True, "ok")
    # no lock or temporary objects are left behind
    assert sorted(objects(gcs_client, gcs_bucket)) == sorted(stored)
    assert result_summary(first)["fuse_path"] == "/gcs/" + first.entry[len("gs://") :]

    second = stage_model(str(model), cache)
    assert second.cache_hit is True and second.bytes_copied == 0
    assert second.entry == first.entry and second.manifest == first.manifest


def test_stage_from_gcs_source(model, gcs_client, gcs_bucket, tmp_path):
    upload_folder(gcs_client, model, gcs_bucket, "upstream/tiny")
    gcs_client.bucket(gcs_bucket).blob("upstream/tiny/original/consolidated.pth").upload_from_string(b"x" * 50)
    source = f"gs://{gcs_bucket}/upstream/tiny"
    for cache in (f"gs://{gcs_bucket}/cache", str(tmp_path / "cache")):
        result = stage_model(source, cache, ignore=["original/*"])
        assert result.cache_hit is False
        assert result.manifest["source"] == source and result.manifest["scheme"] == "gs"
        assert "original/consolidated.pth" not in result.manifest["files"]
        assert result.metadata["model_type"] == "qwen3_vl"
        assert verify_entry(result.entry) == (True, "ok")
        assert "/gs/" + gcs_bucket + "/upstream/tiny/sha256-" in result.entry
        again = stage_model(source, cache, ignore=["original/*"])
        assert again.cache_hit is True and again.bytes_copied == 0
    local_entry = Path(result.entry)
    assert (local_entry / "model.safetensors").read_bytes() == (model / "model.safetensors").read_bytes()


def test_truncated_object_is_detected_and_repaired(model, gcs_client, gcs_bucket):
    cache = f"gs://{gcs_bucket}/models"
    entry = stage_model(str(model), cache).entry
    prefix = entry[len(f"gs://{gcs_bucket}/") :]
    good = (model / "model.safetensors").read_bytes()
    gcs_client.bucket(gcs_bucket).blob(f"{prefix}/model.safetensors").upload_from_string(good[:-10])
    valid, reason = verify_entry(entry)
    assert valid is False and "model.safetensors" in reason and "size" in reason
    again = stage_model(str(model), cache)
    assert again.cache_hit is False and again.bytes_copied == len(good)  # only the bad file
    assert gcs_client.bucket(gcs_bucket).blob(f"{prefix}/model.safetensors").download_as_bytes() == good
    assert verify_entry(entry) == (True, "ok")


def test_same_size_corruption_is_detected_by_crc32c(model, gcs_client, gcs_bucket):
    entry = stage_model(str(model), f"gs://{gcs_bucket}/m").entry
    name = entry[len(f"gs://{gcs_bucket}/") :] + "/tokenizer.json"
    data = bytearray(gcs_client.bucket(gcs_bucket).blob(name).download_as_bytes())
    data[-2] ^= 1
    gcs_client.bucket(gcs_bucket).blob(name).upload_from_string(bytes(data))
    assert verify_entry(entry) == (False, "tokenizer.json: crc32c mismatch")
    assert stage_model(str(model), f"gs://{gcs_bucket}/m").bytes_copied == len(data)
    assert verify_entry(entry) == (True, "ok")


def test_missing_manifest_is_repaired_without_copying(model, gcs_client, gcs_bucket):
    cache = f"gs://{gcs_bucket}/models"
    entry = stage_model(str(model), cache).entry
    prefix = entry[len(f"gs://{gcs_bucket}/") :]
    gcs_client.bucket(gcs_bucket).blob(f"{prefix}/{MANIFEST}").delete()
    assert verify_entry(entry) == (False, "no manifest (incomplete entry)")
    again = stage_model(str(model), cache)
    assert again.cache_hit is False and again.bytes_copied == 0
    assert verify_entry(entry) == (True, "ok")
    assert stage_model(str(model), cache).cache_hit is True


def test_two_concurrent_stagers_leave_one_valid_entry(model, gcs_client, gcs_bucket):
    cache = f"gs://{gcs_bucket}/models"
    barrier = threading.Barrier(2)
    results, errors = [], []

    def run():
        barrier.wait()
        try:
            results.append(stage_model(str(model), cache, workers=2, poll_s=0.05))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and len(results) == 2
    assert results[0].entry == results[1].entry
    entry = results[0].entry
    assert verify_entry(entry) == (True, "ok")
    # one entry, its files equal to the source, no lock and no stray objects
    names = sorted(objects(gcs_client, gcs_bucket))
    prefix = entry[len(f"gs://{gcs_bucket}/") :]
    assert names == sorted([f"{prefix}/{MANIFEST}"] + [f"{prefix}/{p.name}" for p in model.iterdir()])
    for path in model.iterdir():
        assert gcs_client.bucket(gcs_bucket).blob(f"{prefix}/{path.name}").download_as_bytes() == path.read_bytes()


def test_waiting_stager_returns_the_other_ones_entry(model, gcs_client, gcs_bucket):
    """A live lock makes the second stager wait, then report a cache hit with 0 bytes copied."""
    cache = f"gs://{gcs_bucket}/models"
    entry = stage_model(str(model), cache).entry
    prefix = entry[len(f"gs://{gcs_bucket}/") :]
    bucket = gcs_client.bucket(gcs_bucket)
    manifest = bucket.blob(f"{prefix}/{MANIFEST}").download_as_bytes()
    bucket.blob(f"{prefix}/{MANIFEST}").delete()
    held = _gcs.GcsEntry(entry)
    assert held.try_lock("other-run", stale_s=60)
    timer = threading.Timer(0.5, lambda: bucket.blob(f"{prefix}/{MANIFEST}").upload_from_string(manifest))
    timer.start()
    result = stage_model(str(model), cache, poll_s=0.05)
    timer.join()
    assert result.cache_hit is True and result.bytes_copied == 0
    held.unlock("other-run")
    assert bucket.get_blob(prefix + ".lock") is None


def test_stale_lock_is_taken_over(model, gcs_bucket):
    cache = f"gs://{gcs_bucket}/models"
    entry = stage_model(str(model), cache).entry
    _gcs.GcsEntry(entry).bucket.blob(entry.split("/", 3)[3] + "/" + MANIFEST).delete()
    assert _gcs.GcsEntry(entry).try_lock("crashed-run", stale_s=60)
    result = stage_model(str(model), cache, lock_stale_s=0.2, poll_s=0.05, lock_wait_s=10)
    assert result.cache_hit is False and verify_entry(entry) == (True, "ok")


def test_missing_cache_bucket_is_a_named_error(model, gcs_emulator):
    with pytest.raises(StageError) as info:
        stage_model(str(model), "gs://no-such-bucket-xyz/models")
    msg = str(info.value)
    assert "gs://no-such-bucket-xyz/models" in msg and "bucket not found" in msg and "\n" not in msg


def test_missing_source_bucket_and_empty_prefix(gcs_bucket, tmp_path):
    with pytest.raises(StageError, match="gs://no-such-bucket-xyz/m.*not found"):
        stage_model("gs://no-such-bucket-xyz/m", str(tmp_path / "c"))
    with pytest.raises(StageError, match=f"gs://{gcs_bucket}/nothing: no objects"):
        stage_model(f"gs://{gcs_bucket}/nothing", str(tmp_path / "c"))
    assert not (tmp_path / "c").exists()


def test_gcs_source_without_safetensors(model, gcs_client, gcs_bucket, tmp_path):
    (model / "model.safetensors").unlink()
    (model / "pytorch_model.bin").write_bytes(b"\0" * 16)
    upload_folder(gcs_client, model, gcs_bucket, "up/bin-only")
    with pytest.raises(StageError) as info:
        stage_model(f"gs://{gcs_bucket}/up/bin-only", f"gs://{gcs_bucket}/cache")
    assert f"gs://{gcs_bucket}/up/bin-only" in str(info.value) and "safetensors" in str(info.value)
    assert not [n for n in objects(gcs_client, gcs_bucket) if n.startswith("cache/")]


def test_unsupported_architecture_from_gcs_leaves_no_entry(tmp_path, gcs_client, gcs_bucket):
    upload_folder(gcs_client, make_model(tmp_path / "llama", arch="LlamaForCausalLM"), gcs_bucket, "up/llama")
    with pytest.raises(StageError, match="'LlamaForCausalLM'.*not supported"):
        stage_model(f"gs://{gcs_bucket}/up/llama", f"gs://{gcs_bucket}/cache")
    assert not [n for n in objects(gcs_client, gcs_bucket) if n.startswith("cache/")]
