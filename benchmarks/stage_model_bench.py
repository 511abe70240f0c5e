"""Benchmark (not a test): stage-model throughput and the cache-hit path against the GCS emulator.

    python -m benchmarks.stage_model_bench [--size-mb 1024] [--shards 4] [--workers 8]

Builds a fake Qwen3-VL folder of about --size-mb MiB (random safetensors shards, so no
compression helps), starts gcp-storage-emulator in memory on 127.0.0.1, then times:
  1. cold stage local folder -> gs:// cache (hashing + upload + manifest),
  2. cache hit (revision fingerprint of the source + listing check; 0 bytes copied),
  3. repair after one shard is truncated (only that shard is uploaded),
  4. cold stage gs:// -> local cache (download + hashing + copy).
Prints one JSON line per step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build_model(folder: Path, size_mb: int, shards: int) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(
        json.dumps({"architectures": ["Qwen3VLForConditionalGeneration"], "torch_dtype": "bfloat16"})
    )
    (folder / "tokenizer_config.json").write_text("{}")
    (folder / "tokenizer.json").write_text("{}")
    (folder / "preprocessor_config.json").write_text("{}")
    per = size_mb * 1024 * 1024 // shards // 2 * 2
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        tensor = f"layer.{i}.weight"
        header = json.dumps({tensor: {"dtype": "BF16", "shape": [per // 2], "data_offsets": [0, per]}}).encode()
        header += b" " * (-len(header) % 8)
        with open(folder / name, "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header)
            left = per
            while left:
                n = min(left, 16 * 1024 * 1024)
                f.write(os.urandom(n))
                left -= n
        weight_map[tensor] = name
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return sum(p.stat().st_size for p in folder.iterdir())


def start_emulator() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = shutil.which("gcp-storage-emulator") or str(Path(sys.executable).parent / "gcp-storage-emulator")
    proc = subprocess.Popen(
        [exe, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(400):
        try:
            urllib.request.urlopen(url + "/storage/v1/b", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("emulator did not start")


def timed(label: str, total: int, fn) -> None:
    t0 = time.perf_counter()
    result = fn()
    dt = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "step": label,
                "seconds": round(dt, 2),
                "bytes_copied": result.bytes_copied,
                "MiB_per_s": round(total / dt / 2**20, 1),
                "cache_hit": result.cache_hit,
            }
        ),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    proc, url = start_emulator()
    os.environ["STORAGE_EMULATOR_HOST"] = url
    from components.stage_model import _gcs
    from components.stage_model.core import stage_model

    work = Path(tempfile.mkdtemp(prefix="stage-bench-"))
    try:
        t0 = time.perf_counter()
        total = build_model(work / "model", args.size_mb, args.shards)
        print(
            json.dumps(
                {"step": "build", "bytes": total, "seconds": round(time.perf_counter() - t0, 2), "cpus": os.cpu_count()}
            ),
            flush=True,
        )
        client = _gcs.client()
        client.create_bucket("bench")
        cache = "gs://bench/models"
        src = str(work / "model")
        timed("cold local->gs", total, lambda: stage_model(src, cache, workers=args.workers))
        timed("hit local->gs", total, lambda: stage_model(src, cache, workers=args.workers))
        entry = stage_model(src, cache).entry
        shard = sorted(p.name for p in (work / "model").glob("*.safetensors"))[0]
        blob = client.bucket("bench").blob(entry[len("gs://bench/") :] + "/" + shard)
        blob.upload_from_string(b"truncated")
        timed("repair 1 shard local->gs", total, lambda: stage_model(src, cache, workers=args.workers))
        timed("cold gs->local", total, lambda: stage_model(entry, str(work / "cache"), workers=args.workers))
        timed("hit gs->local", total, lambda: stage_model(entry, str(work / "cache"), workers=args.workers))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
