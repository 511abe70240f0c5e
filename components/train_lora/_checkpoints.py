"""Durable, verified copies of swift's checkpoints, and finding one to resume from.

`swift sft` writes `checkpoint-N/` folders to local disk. `copy_checkpoint` copies one to
a durable folder (on Vertex a `/gcs/...` path), verifies every file (size and sha256 read
back from the copy) and only then writes the marker `COMPLETE.json` (the manifest of the
files) — last, so a copy cut short by preemption or SIGTERM has no marker and is never
resumed from. No directory renames are used (they are not atomic on Cloud Storage FUSE).

`CheckpointSync` runs the copy in a background thread while training runs, so a killed
job loses at most the steps since the last checkpoint; `newest_complete_checkpoint`
picks the newest copy whose marker is present and whose files match it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
from pathlib import Path

from components.train_lora._errors import TrainError

MARKER = "COMPLETE.json"
_CKPT = re.compile(r"checkpoint-(\d+)")


class CheckpointError(TrainError):
    """A checkpoint copy did not verify."""


def checkpoint_step(path: str | Path) -> int | None:
    """Returns N of a `checkpoint-N` folder name, else None."""
    m = _CKPT.fullmatch(Path(path).name)
    return int(m.group(1)) if m else None


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _files(folder: Path) -> list[str]:
    """Relative paths of the regular files under folder (symlinks skipped), sorted."""
    out = []
    for root, _dirs, names in os.walk(folder):
        for name in names:
            p = Path(root, name)
            if p.is_file() and not p.is_symlink() and name != MARKER:
                out.append(p.relative_to(folder).as_posix())
    return sorted(out)


def manifest_of(folder: str | Path) -> dict[str, dict[str, object]]:
    """{relative path: {"size", "sha256"}} of a folder's files."""
    base = Path(folder)
    return {rel: {"size": (base / rel).stat().st_size, "sha256": sha256_file(base / rel)} for rel in _files(base)}


def verify_checkpoint(folder: str | Path, deep: bool = True) -> bool:
    """Whether a durable checkpoint copy is complete: marker present, every file matches it.

    Args:
        folder: The durable `checkpoint-N` folder.
        deep: Also compare sha256 (else sizes only). Default True.
    """
    base = Path(folder)
    try:
        marker = json.loads((base / MARKER).read_text(encoding="utf-8"))
        files = marker["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if not files:
        return False
    for rel, want in files.items():
        p = base / rel
        try:
            if p.stat().st_size != want["size"]:
                return False
        except OSError:
            return False
        if deep and sha256_file(p) != want["sha256"]:
            return False
    return True


def copy_checkpoint(src: str | Path, dest_root: str | Path) -> Path:
    """Copies a local checkpoint folder to `dest_root/<name>`, verifies it, writes the marker last.

    A destination that already verifies is left as it is. A destination without a valid
    marker (an earlier copy cut short) is overwritten.

    Args:
        src: Local `checkpoint-N` folder (complete: swift finished writing it).
        dest_root: Durable folder.

    Returns:
        The durable copy.

    Raises:
        CheckpointError: The copy's size or sha256 differs from the source.
        FileNotFoundError: The source vanished meanwhile (e.g. save_total_limit rotation).
    """
    src, dest = Path(src), Path(dest_root) / Path(src).name
    if verify_checkpoint(dest, deep=False):
        return dest
    (dest / MARKER).unlink(missing_ok=True)
    manifest = manifest_of(src)
    if not manifest:
        raise CheckpointError(f"{src}: empty checkpoint folder")
    for rel in manifest:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, dest / rel)
    for rel, want in manifest.items():
        size, digest = (dest / rel).stat().st_size, sha256_file(dest / rel)
        if size != want["size"] or digest != want["sha256"]:
            raise CheckpointError(f"{dest / rel}: copy does not match the source (size {size} vs {want['size']})")
    marker = {"step": checkpoint_step(src), "source": str(src), "files": manifest}
    (dest / MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True), encoding="utf-8")
    return dest


def durable_checkpoints(root: str | Path) -> list[Path]:
    """`checkpoint-N` folders under root, newest step first (complete or not)."""
    base = Path(root)
    if not base.is_dir():
        return []
    found = [(checkpoint_step(p), p) for p in base.iterdir() if p.is_dir() and checkpoint_step(p) is not None]
    return [p for _, p in sorted(found, reverse=True)]


def newest_complete_checkpoint(root: str | Path) -> Path | None:
    """The newest durable checkpoint whose marker is present and whose files verify (sha256)."""
    for path in durable_checkpoints(root):
        if verify_checkpoint(path, deep=True):
            return path
        print(f"train-lora: {path} is incomplete or corrupt (no valid {MARKER}); not resuming from it", flush=True)
    return None


def prune_checkpoints(root: str | Path, keep: int) -> list[Path]:
    """Deletes all but the newest `keep` complete checkpoints, and incomplete ones older than those.

    Returns:
        The deleted folders.
    """
    if keep <= 0:
        return []
    deleted, complete = [], 0
    for path in durable_checkpoints(root):
        if complete >= keep:
            shutil.rmtree(path, ignore_errors=True)
            deleted.append(path)
        elif verify_checkpoint(path, deep=False):
            complete += 1
    return deleted


def locally_complete(output_dir: str | Path, final: bool = False) -> list[Path]:
    """swift's local checkpoints that it has finished writing, oldest first.

    swift points `output_dir/last-checkpoint` at a checkpoint after saving it completely;
    a checkpoint older than the newest one is complete too. `final` (training has ended)
    takes every checkpoint holding trainer_state.json.
    """
    base = Path(output_dir)
    ckpts = sorted((checkpoint_step(p), p) for p in base.glob("checkpoint-*") if checkpoint_step(p) is not None)
    if not ckpts:
        return []
    done_step = ckpts[-2][0] if len(ckpts) > 1 else -1
    link = base / "last-checkpoint"
    if final:
        done_step = ckpts[-1][0]
    elif link.is_symlink() or link.is_dir():
        step = checkpoint_step(Path(os.path.realpath(link)))
        if step is not None:
            done_step = max(done_step, step)
    return [p for step, p in ckpts if step <= done_step and (p / "trainer_state.json").is_file()]


class CheckpointSync:
    """Copies swift's finished local checkpoints to a durable folder, in a background thread.

    Args:
        output_dir: swift's output_dir (local).
        dest_root: Durable folder.
        interval_s: Seconds between polls. Default 5.
        keep: Complete durable checkpoints to keep (0 = all). Default 2.
    """

    def __init__(self, output_dir: str | Path, dest_root: str | Path, interval_s: float = 5.0, keep: int = 2):
        self.output_dir, self.dest_root = Path(output_dir), Path(dest_root)
        self.interval_s, self.keep = interval_s, keep
        self.synced: dict[int, Path] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sync_once(self, final: bool = False) -> list[Path]:
        """Copies the finished checkpoints not copied yet; returns the new durable copies."""
        new = []
        for src in locally_complete(self.output_dir, final=final):
            step = checkpoint_step(src)
            if step in self.synced:
                continue
            try:
                dest = copy_checkpoint(src, self.dest_root)
            except FileNotFoundError:
                continue  # rotated away by save_total_limit; a newer one exists
            except (OSError, CheckpointError) as exc:
                self.errors.append(f"{src}: {exc}")
                print(f"train-lora: WARNING: durable copy of {src} failed: {exc}", flush=True)
                continue
            self.synced[step] = dest
            new.append(dest)
            print(f"train-lora: checkpoint {src.name} copied to {dest} (verified)", flush=True)
            prune_checkpoints(self.dest_root, self.keep)
        return new

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sync_once()

    def start(self) -> "CheckpointSync":
        self.dest_root.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="checkpoint-sync", daemon=True)
        self._thread.start()
        return self

    def stop(self, final: bool = True) -> list[Path]:
        """Stops the thread; with `final`, copies what is left (training has ended)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.sync_once(final=final) if final else []
