"""merge-export's disk: the space the merge needs, checked before `swift export`, and the peak it used.

`swift export` writes the merged model (as large as the bf16 base: same tensors, same dtype) into
merge-export's work folder; after both checks each file is moved into the output folder. So
the work folder's file system needs the merged model's bytes free, plus headroom for the
processor files and the model card. When the output lies on another file system (Vertex: the
artifact under `/gcs/`, whose gcsfuse stages each written file on local disk until it is
closed), each file is copied and then removed, one at a time: the largest shard is needed once
more. A merge that cannot fit is refused before the export starts (`MergeDiskError`), not
tens of minutes later with a half-written shard.

`DiskPeak` samples the work folder's file system while the merge runs, so the Metrics say how
much disk the merge really took above what was in use when it started (other writers on the
same disk count too: read it as an upper bound).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 1024**3
HEADROOM_BYTES = GIB  # processor and tokenizer files, the card, ms-swift's own small files
HEADROOM_FRACTION = 0.02  # safetensors headers and metadata beyond the tensors' bytes


class MergeDiskError(RuntimeError):
    """The work folder (or the output's file system) has less free space than the merge needs."""


@dataclass(frozen=True)
class DiskPlan:
    """The space the merge needs and what the disks have.

    Attributes:
        weights_bytes: The base's safetensors files, bytes (the merged model's size).
        largest_shard_bytes: Its largest safetensors file, bytes.
        need_work_bytes: Free space the work folder's file system needs, bytes.
        free_work_bytes: Free space there before the merge, bytes.
        need_out_bytes: Free space the output's file system needs (0 when it is the work
            folder's: the files are renamed, not copied), bytes.
        free_out_bytes: Free space there before the merge (0 when same), bytes.
    """

    weights_bytes: int
    largest_shard_bytes: int
    need_work_bytes: int
    free_work_bytes: int
    need_out_bytes: int
    free_out_bytes: int

    def metadata(self) -> dict[str, int]:
        """The figures for Metrics and the merged model's artifact metadata."""
        return {
            "disk_need_bytes": self.need_work_bytes,
            "disk_free_before_bytes": self.free_work_bytes,
        }


def _existing(path: Path) -> Path:
    """The nearest folder that exists at or above `path` (the output may not exist yet)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def plan_disk(
    base_model_dir: str | Path,
    work_dir: str | Path,
    merged_out: str | Path,
    disk_usage: Callable[[str], Any] = shutil.disk_usage,
) -> DiskPlan:
    """Checks that the merge fits the disks, before it starts.

    Args:
        base_model_dir: Staged base model folder (its `*.safetensors` give the merged size).
        work_dir: merge-export's scratch folder (`swift export` writes there).
        merged_out: The output folder.
        disk_usage: The file-system query (`shutil.disk_usage`); tests pass another.
            Default shutil.disk_usage.

    Returns:
        The DiskPlan.

    Raises:
        MergeDiskError: The work folder's or the output's file system has less free space than
            needed; the message names the folder, both sizes and the fix.
    """
    shards = [p.stat().st_size for p in Path(base_model_dir).glob("*.safetensors")]
    weights = sum(shards)
    largest = max(shards, default=0)
    headroom = HEADROOM_BYTES + int(HEADROOM_FRACTION * weights)
    work, out = _existing(Path(work_dir)), _existing(Path(merged_out))
    free_work = int(disk_usage(str(work)).free)
    same = os.stat(work).st_dev == os.stat(out).st_dev
    need_out = 0 if same else weights + headroom
    free_out = 0 if same else int(disk_usage(str(out)).free)
    need_work = weights + headroom + (0 if same else largest)
    why = (
        f"the merged model is as large as the base's {len(shards)} safetensors file(s) in {base_model_dir} "
        f"({_gb(weights)}), plus {_gb(headroom)} headroom"
    )
    if free_work < need_work:
        extra = "" if same else f" and, moving to another file system, its largest shard again ({_gb(largest)})"
        raise MergeDiskError(
            f"merge-export needs {_gb(need_work)} free in {work} for `swift export`'s output: {why}{extra}; "
            f"it has {_gb(free_work)}. Fix: free {_gb(need_work - free_work)} there, or run merge-export on a "
            "machine with a larger disk (locally: a work folder on a larger file system, e.g. TMPDIR)."
        )
    if not same and free_out < need_out:
        raise MergeDiskError(
            f"merge-export needs {_gb(need_out)} free in {out} for the merged model: {why}; it has "
            f"{_gb(free_out)}. Fix: free {_gb(need_out - free_out)} there, or write the output elsewhere."
        )
    return DiskPlan(weights, largest, need_work, free_work, need_out, free_out)


class DiskPeak:
    """Samples a file system's used bytes in a thread; `peak_bytes` is the most above the start.

    Use as a context manager around the merge: `with DiskPeak(work_dir) as peak: ...`. A peak
    shorter than the interval can be missed (a merge's files only grow until they are moved).
    disk_usage: the file-system query (`shutil.disk_usage`); tests pass another.
    """

    def __init__(self, path: str | Path, interval_s: float = 0.5, disk_usage: Callable[[str], Any] = shutil.disk_usage):
        self._path = str(_existing(Path(path)))
        self._interval = interval_s
        self._disk_usage = disk_usage
        self._stop = threading.Event()
        self._start = self._used()
        self.peak_bytes = 0
        self._thread = threading.Thread(target=self._run, name="merge-disk-peak", daemon=True)

    def _used(self) -> int:
        return int(self._disk_usage(self._path).used)

    def sample(self) -> None:
        """Takes one reading now (the thread takes one every interval)."""
        self.peak_bytes = max(self.peak_bytes, self._used() - self._start)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()

    def __enter__(self) -> DiskPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
