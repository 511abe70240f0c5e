"""merge-export's disk check before `swift export` and the peak it reports (components/merge_export/_disk.py).

The sizes come from real files on real file systems; where a test needs a full disk, it passes
`plan_disk` / `DiskPeak` another `disk_usage` (the only thing replaced).
"""

from __future__ import annotations

import os
from collections import namedtuple
from pathlib import Path

import pytest

from components.merge_export._disk import GIB, HEADROOM_BYTES, DiskPeak, MergeDiskError, plan_disk

Usage = namedtuple("Usage", "total used free")


def _base(folder: Path, sizes: tuple[int, ...] = (3_000_000, 5_000_000)) -> Path:
    folder.mkdir(parents=True)
    for i, size in enumerate(sizes):
        (folder / f"model-{i:05d}-of-{len(sizes):05d}.safetensors").write_bytes(b"\0" * size)
    (folder / "config.json").write_text("{}")
    return folder


def _free(n: int):
    return lambda path: Usage(10 * n, 9 * n, n)


def test_the_plan_on_one_file_system_needs_the_merged_size_plus_headroom(tmp_path):
    base = _base(tmp_path / "base")
    plan = plan_disk(base, tmp_path / "work", tmp_path / "out" / "merged")  # neither exists yet
    weights = 8_000_000
    assert (plan.weights_bytes, plan.largest_shard_bytes) == (weights, 5_000_000)
    assert plan.need_work_bytes == weights + HEADROOM_BYTES + int(0.02 * weights)
    assert (plan.need_out_bytes, plan.free_out_bytes) == (0, 0)  # renamed there, not copied
    assert plan.free_work_bytes == os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    assert plan.metadata() == {"disk_need_bytes": plan.need_work_bytes, "disk_free_before_bytes": plan.free_work_bytes}


def test_a_work_folder_without_room_is_refused_before_the_export_with_sizes_and_fix(tmp_path):
    base = _base(tmp_path / "base", (60 * GIB // 1000,))  # 64 MB stands for the 30B's shards
    with pytest.raises(MergeDiskError) as err:
        plan_disk(base, tmp_path / "work", tmp_path / "out", disk_usage=_free(GIB))
    msg = str(err.value)  # 64.4 MB + 1 GiB + 2 % needed; 1 GiB free
    assert f"needs 1.14 GB free in {tmp_path} " in msg and "it has 1.07 GB" in msg  # the nearest existing folder
    assert "1 safetensors file(s)" in msg and str(base) in msg and "Fix: free 0.07 GB there" in msg


def test_another_file_system_for_the_output_needs_a_shard_more_here_and_the_model_there(tmp_path):
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a file system of its own")
    base = _base(tmp_path / "base")
    out = shm / f"merge-disk-test-{os.getpid()}" / "merged"
    plan = plan_disk(base, tmp_path / "work", out)
    headroom = HEADROOM_BYTES + int(0.02 * 8_000_000)
    assert plan.need_work_bytes == 8_000_000 + headroom + 5_000_000
    assert plan.need_out_bytes == 8_000_000 + headroom and plan.free_out_bytes > 0

    def full_there(path):
        return Usage(GIB, GIB, 1000) if path.startswith("/dev/shm") else Usage(100 * GIB, 0, 100 * GIB)

    with pytest.raises(MergeDiskError, match=r"needs 1\.08 GB free in /dev/shm for the merged model.*it has 0\.00 GB"):
        plan_disk(base, tmp_path / "work", out, disk_usage=full_there)


def test_the_peak_is_the_most_above_the_start_not_the_last_reading():
    readings = iter([100, 100, 350, 900, 400, 120])  # start, then samples
    peak = DiskPeak("/", interval_s=3600, disk_usage=lambda path: Usage(0, next(readings), 0))
    with peak:
        for _ in range(4):
            peak.sample()
    assert peak.peak_bytes == 800  # 900 - 100; the exit's reading (120) does not lower it
