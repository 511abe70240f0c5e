"""Moving bytes: hash a prepared folder, copy what an entry lacks in parallel, write the manifest last."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.common.files import sha256_file
from components.common.progress import Progress, tree_bytes
from components.stage_model import _gcs
from components.stage_model.entry import LocalEntry, StageResult, check_entry, entry_result
from components.stage_model.errors import NO_SPACE, StageError, size_text
from components.stage_model.listing import crc32c_file
from components.stage_model.metadata import check_model


def parallel(
    fn, items: list, workers: int, total_bytes: int, progress: bool, desc: str, measure=None, every_s: float = 2.0
) -> list:
    """Runs fn(item) -> bytes on a thread pool; returns results in order.

    With `progress`, logs bytes done / total, the rate and the ETA, at most one line per 5 % or
    30 s, whichever comes later (`components.common.progress`): bytes of finished files, or, with
    `measure` (a function returning the bytes written so far, partial files included), what it
    measures every `every_s` seconds, so one large file shows its progress too.
    """
    bar = Progress(f"stage-model: {desc}", total_bytes, "bytes", enabled=progress and bool(items))
    with bar, bar.watching(measure, every_s), ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(fn, item) for item in items]
        out = []
        try:
            done = 0
            for fut in futures:
                n = fut.result()
                done += n if isinstance(n, int) else 0
                bar.set(done)
                out.append(n)
        except BaseException:
            for fut in futures:  # the first failure stops the rest (a full disk: no more copies)
                fut.cancel()
            raise
        return out


@dataclass
class Prepared:
    """A source ready to publish: complete local files, their checksums and model facts."""

    folder: Path
    files: list[str]
    infos: dict[str, dict[str, Any]]
    meta: dict[str, Any]


def prepare_local(src: Path, files: list[str], workers: int, progress: bool = False) -> Prepared:
    """Checks the model and hashes its files (sha256 and crc32c: two reads of every byte, logged with `progress`)."""
    meta = check_model(src, files)
    sizes = {rel: (src / rel).stat().st_size for rel in files}
    bar = Progress(f"stage-model: checksums of {src}", 2 * sum(sizes.values()), "bytes", enabled=progress)

    def hashed(fn, rel: str) -> str:
        digest = fn(src / rel)
        bar.update(sizes[rel])
        return digest

    with bar, ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        shas = list(pool.map(lambda rel: hashed(sha256_file, rel), files))
        crcs = list(pool.map(lambda rel: hashed(crc32c_file, rel), files))
    infos = {rel: {"size": sizes[rel], "sha256": s, "crc32c": c} for rel, s, c in zip(files, shas, crcs)}
    return Prepared(src, files, infos, meta)


def publish(entry, prepared: Prepared, manifest: dict[str, Any], workers: int, progress: bool) -> StageResult:
    """Copies the missing or bad files into the entry, then writes the manifest last."""
    _, _, old, generation = check_entry(entry)
    if old is not None:  # a manifest that does not verify must not vouch for a repair in progress
        entry.delete_manifest(generation)
    good = entry.good_files(prepared.infos)
    todo = [rel for rel in prepared.files if rel not in good]

    def put(rel: str) -> int:
        try:
            return entry.put(prepared.folder / rel, rel, prepared.infos[rel])
        except _gcs.ChecksumError as exc:
            raise StageError(f"{exc}; stage again") from None
        except OSError as exc:
            if exc.errno not in NO_SPACE:
                raise
            need = sum(prepared.infos[r]["size"] for r in todo)
            free = _free_bytes(entry.path) if isinstance(entry, LocalEntry) else 0
            if need > free:
                fix = f"free {size_text(need - free)} (the entry needs {size_text(need)}, {size_text(free)} is free)"
            else:  # the disk says there is room: a quota or the inodes ran out
                fix = f"free {size_text(need)} (the entry needs that much; a quota or the inodes may be the limit)"
            raise StageError(
                f"no space left on device while copying {prepared.folder / rel} to {entry.uri}/{rel}: "
                f"{fix} or point model.cache elsewhere"
            ) from None

    total = sum(prepared.infos[r]["size"] for r in todo)
    measure = None
    if isinstance(entry, LocalEntry):  # partial copies are written beside their files: count them as they grow
        before = tree_bytes(entry.path)
        measure = lambda: tree_bytes(entry.path) - before  # noqa: E731
    copied = sum(parallel(put, todo, workers, total, progress, f"copy to {entry.uri}", measure=measure))
    if isinstance(entry, LocalEntry):
        check_model(entry.path, prepared.files)
    if not entry.write_manifest(manifest):
        # Another stager finished first. Keep its manifest if it verifies, else replace it.
        valid, _, theirs, generation = check_entry(entry)
        if valid:
            return entry_result(entry, False, copied, theirs)
        entry.write_manifest(manifest, replace_generation=generation)
    valid, reason, final, _ = check_entry(entry)
    if not valid:
        entry.delete_manifest()
        raise StageError(f"cache entry {entry.uri}: does not verify after copying ({reason}); stage again")
    return entry_result(entry, False, copied, final)


def _free_bytes(path: Path) -> int:
    """Free bytes on the file system of a path (of its nearest existing folder); 0 if unknown."""
    for folder in (path, *path.parents):
        try:
            return shutil.disk_usage(folder).free
        except OSError:
            continue
    return 0
