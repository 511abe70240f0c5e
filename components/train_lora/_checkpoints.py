"""Durable, verified copies of swift's checkpoints, and finding one to resume from.

`swift sft` writes `checkpoint-N/` folders to local disk. `copy_checkpoint` copies one to
a durable folder (on Vertex a `/gcs/...` path), verifies every file (size and sha256 read
back from the copy) and only then writes the marker `COMPLETE.json` (the manifest of the
files) — last, so a copy cut short by preemption or SIGTERM has no marker and is never
resumed from. No directory renames are used (they are not atomic on Cloud Storage FUSE).

`CheckpointSync` runs the copy in a background thread while training runs, so a killed
job loses at most the steps since the last checkpoint; `newest_complete_checkpoint`
picks the newest copy whose marker is present and whose files match it.

Multi-node jobs (DeepSpeed): each node's local `checkpoint-N/` holds only its own ranks'
per-rank files (`*zero_pp_rank_<R>_*` optimizer/model shards, `*_optim_states.pt`,
`rng_state_<R>.pth`), so every node syncs into the same durable folder. The rule that
keeps nodes from clobbering each other: the chief copies all of its files, a worker copies
only its per-rank files (whose names carry global ranks, so they are unique). Each node
writes `NODE_<rank>.json` (its verified file manifest) after its copies; a worker copies
checkpoint N only once the chief's `NODE_0.json` is there (swift points the chief's
`last-checkpoint` at N after a barrier of all ranks, so every node's files of N are
finished). The chief writes `COMPLETE.json` (all nodes' files, `"nodes": nnodes`) once
every node's marker is present and no two nodes list the same file; a checkpoint whose
markers do not all arrive within `node_timeout_s` is left incomplete (a warning; training
goes on) and is never resumed from.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from components.common.errors import TrainError
from components.common.files import CopyMismatch, copy_verified, sha256_file, write_json_atomic

MARKER = "COMPLETE.json"
_CKPT = re.compile(r"checkpoint-(\d+)")
_NODE_MARKER = re.compile(r"NODE_(\d+)\.json")
# Files each rank writes for itself (DeepSpeed ZeRO shards, per-rank RNG state).
_PER_RANK = re.compile(r".*zero_pp_rank_\d+_.*|.*_optim_states\.pt|rng_state_\d+\.pth")


class CheckpointError(TrainError):
    """A checkpoint copy did not verify."""


def checkpoint_step(path: str | Path) -> int | None:
    """Returns N of a `checkpoint-N` folder name, else None."""
    m = _CKPT.fullmatch(Path(path).name)
    return int(m.group(1)) if m else None


def node_marker(folder: str | Path, node_rank: int) -> Path:
    """The per-node marker `NODE_<rank>.json` of a durable checkpoint folder."""
    return Path(folder) / f"NODE_{node_rank}.json"


def is_per_rank_file(rel: str) -> bool:
    """Whether a checkpoint file is written by one rank for itself (a worker node copies only these)."""
    return bool(_PER_RANK.fullmatch(Path(rel).name))


def _is_marker(folder: Path, p: Path) -> bool:
    return p.parent == folder and (p.name == MARKER or bool(_NODE_MARKER.fullmatch(p.name)))


def _files(folder: Path) -> list[str]:
    """Relative paths of the regular files under folder (symlinks and markers skipped), sorted."""
    out = []
    for root, _dirs, names in os.walk(folder):
        for name in names:
            p = Path(root, name)
            if p.is_file() and not p.is_symlink() and not _is_marker(folder, p):
                out.append(p.relative_to(folder).as_posix())
    return sorted(out)


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _files_match(base: Path, files: dict, deep: bool) -> bool:
    for rel, want in files.items():
        p = base / rel
        try:
            if p.stat().st_size != want["size"]:
                return False
        except (OSError, KeyError, TypeError):
            return False
        if deep and sha256_file(p) != want["sha256"]:
            return False
    return True


def manifest_of(folder: str | Path) -> dict[str, dict[str, object]]:
    """{relative path: {"size", "sha256"}} of a folder's files."""
    base = Path(folder)
    return {rel: {"size": (base / rel).stat().st_size, "sha256": sha256_file(base / rel)} for rel in _files(base)}


def verify_checkpoint(folder: str | Path, deep: bool = True) -> bool:
    """Whether a durable checkpoint copy is complete: marker present, every file matches it.

    Args:
        folder: The durable `checkpoint-N` folder.
        deep: Also compare sha256 (else sizes only). Default True.

    A multi-node copy (`"nodes"` > 1 in the marker) also needs every node's `NODE_<rank>.json`.
    """
    base = Path(folder)
    marker = _read_json(base / MARKER)
    files = marker.get("files") if marker else None
    if not files or not isinstance(files, dict):
        return False
    nodes = marker.get("nodes", 1)
    if not isinstance(nodes, int) or nodes < 1:
        return False
    if nodes > 1 and not all(node_marker(base, r).is_file() for r in range(nodes)):
        return False
    return _files_match(base, files, deep)


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
    _copy_verified(src, dest, manifest)
    marker = {"step": checkpoint_step(src), "source": str(src), "files": manifest}
    _write_marker(dest / MARKER, marker)
    return dest


def _copy_verified(src: Path, dest: Path, manifest: dict[str, dict[str, Any]]) -> None:
    """Copies the manifest's files from src to dest, each read back and checked against it."""
    for rel, want in manifest.items():
        try:
            copy_verified(src / rel, dest / rel, want["sha256"], want["size"])
        except CopyMismatch as exc:
            message = f"{dest / rel}: copy does not match the source (size {exc.size} vs {want['size']})"
            raise CheckpointError(message) from None


def _write_marker(path: Path, data: dict) -> None:
    """Writes a marker so that a reader sees either no file or the whole file.

    Its temporary file lies beside the checkpoint folder, never inside it (where it could
    be taken for a checkpoint file).
    """
    write_json_atomic(path, data, tmp_dir=path.parent.parent)


def copy_node_files(src: str | Path, dest_root: str | Path, node_rank: int) -> Path:
    """Copies one node's part of a multi-node checkpoint, verifies it, writes `NODE_<rank>.json` last.

    The chief (rank 0) copies all of its files; a worker only its per-rank files
    (`is_per_rank_file`), possibly none (its marker then lists no files). A part whose
    marker is present and whose files match it (sizes) is left as it is.

    Args:
        src: This node's local `checkpoint-N` folder (finished).
        dest_root: Durable folder shared by all nodes.
        node_rank: This node's rank (0 = chief).

    Returns:
        The durable `checkpoint-N` folder.

    Raises:
        CheckpointError: A copy differs from the source, or the chief's folder is empty.
        FileNotFoundError: The source vanished meanwhile.
    """
    src, dest = Path(src), Path(dest_root) / Path(src).name
    marker_path = node_marker(dest, node_rank)
    old = _read_json(marker_path)
    if old and isinstance(old.get("files"), dict) and _files_match(dest, old["files"], deep=False):
        return dest
    marker_path.unlink(missing_ok=True)
    manifest = manifest_of(src)
    if node_rank != 0:
        manifest = {rel: v for rel, v in manifest.items() if is_per_rank_file(rel)}
    elif not manifest:
        raise CheckpointError(f"{src}: empty checkpoint folder")
    dest.mkdir(parents=True, exist_ok=True)
    _copy_verified(src, dest, manifest)
    _write_marker(
        marker_path, {"step": checkpoint_step(src), "node_rank": node_rank, "source": str(src), "files": manifest}
    )
    return dest


def missing_nodes(folder: str | Path, nnodes: int) -> list[int]:
    """Ranks (of `nnodes`) whose `NODE_<rank>.json` is not in a durable checkpoint folder yet."""
    return [r for r in range(nnodes) if not node_marker(folder, r).is_file()]


def complete_multinode(folder: str | Path, nnodes: int) -> bool:
    """Writes `COMPLETE.json` of a multi-node checkpoint once every node's part is there and verifies.

    Every node verified its own copies (sha256) before writing its marker; here the sizes
    of all listed files are checked again, and no file may be listed by two nodes.

    Args:
        folder: The durable `checkpoint-N` folder.
        nnodes: Number of nodes of the job.

    Returns:
        True once the checkpoint is complete (marker written now or before); False while a
        node's marker is missing or not readable yet.

    Raises:
        CheckpointError: Two nodes list the same file, or a listed file is missing or has
            another size.
    """
    base = Path(folder)
    if verify_checkpoint(base, deep=False):
        return True
    if missing_nodes(base, nnodes):
        return False
    union: dict[str, dict[str, object]] = {}
    owner: dict[str, int] = {}
    for rank in range(nnodes):
        part = _read_json(node_marker(base, rank))
        if not part or not isinstance(part.get("files"), dict):
            return False  # still being written (or broken): waited for until the node timeout
        for rel, want in part["files"].items():
            if rel in union:
                raise CheckpointError(
                    f"{base / rel}: written by node {owner[rel]} and node {rank}; "
                    "nodes must not write the same checkpoint file"
                )
            union[rel], owner[rel] = want, rank
    if not union:
        raise CheckpointError(f"{base}: no node copied any file")
    if not _files_match(base, union, deep=False):
        raise CheckpointError(f"{base}: a file listed in a node marker is missing or has another size")
    _write_marker(base / MARKER, {"step": checkpoint_step(base), "nodes": nnodes, "files": union})
    return True


def checkpoint_folders(root: str | Path) -> list[Path]:
    """The `checkpoint-N` folders directly under root (swift's output_dir or a durable folder), oldest step first.

    Finished or not, complete or not; [] when root does not exist.
    """
    found = [
        (checkpoint_step(p), p)
        for p in Path(root).glob("checkpoint-*")
        if p.is_dir() and checkpoint_step(p) is not None
    ]
    return [p for _, p in sorted(found)]


def durable_checkpoints(root: str | Path) -> list[Path]:
    """`checkpoint-N` folders under root, newest step first (complete or not)."""
    return checkpoint_folders(root)[::-1]


def newest_complete_checkpoint(root: str | Path, deep: bool = True) -> Path | None:
    """The newest durable checkpoint whose marker is present and whose files verify.

    Args:
        root: Durable folder.
        deep: Compare sha256 (else sizes only). Default True.
    """
    for path in durable_checkpoints(root):
        if verify_checkpoint(path, deep=deep):
            return path
        print(f"train-lora: {path} is incomplete or corrupt (no valid {MARKER}); not resuming from it", flush=True)
    return None


def discard_incomplete(root: str | Path) -> list[Path]:
    """Deletes the durable checkpoint folders without a valid `COMPLETE.json` (sizes checked).

    A multi-node chief runs this before training starts, so node markers left by an
    earlier attempt can never be mixed with this attempt's files.

    Returns:
        The deleted folders.
    """
    deleted = []
    for path in durable_checkpoints(root):
        if not verify_checkpoint(path, deep=False):
            shutil.rmtree(path, ignore_errors=True)
            deleted.append(path)
    return deleted


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
    ckpts = [(checkpoint_step(p), p) for p in checkpoint_folders(base)]
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

    Single node: each finished checkpoint is copied whole and marked `COMPLETE.json`.
    Multi-node (`nnodes` > 1, every node runs one): the chief copies its files and writes
    `NODE_0.json`, then writes `COMPLETE.json` once every node's marker is there (or warns
    after `node_timeout_s` and leaves it incomplete); a worker copies its per-rank files of
    each checkpoint the chief has marked and writes `NODE_<rank>.json`. Only the chief prunes.

    Args:
        output_dir: swift's output_dir (local).
        dest_root: Durable folder (shared by all nodes).
        interval_s: Seconds between polls. Default 5.
        keep: Complete durable checkpoints to keep (0 = all). Default 2.
        node_rank: This node's rank (0 = chief). Default 0.
        nnodes: Number of nodes. Default 1.
        node_timeout_s: Seconds the chief waits for the other nodes' markers of a
            checkpoint before giving up on it. Default 900.
    """

    def __init__(
        self,
        output_dir: str | Path,
        dest_root: str | Path,
        interval_s: float = 5.0,
        keep: int = 2,
        node_rank: int = 0,
        nnodes: int = 1,
        node_timeout_s: float = 900.0,
    ):
        self.output_dir, self.dest_root = Path(output_dir), Path(dest_root)
        self.interval_s, self.keep = interval_s, keep
        self.node_rank, self.nnodes, self.node_timeout_s = node_rank, max(int(nnodes), 1), node_timeout_s
        self.synced: dict[int, Path] = {}
        self.pending: dict[int, float] = {}  # chief: step -> when its own part was written
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def multinode(self) -> bool:
        return self.nnodes > 1

    def _warn(self, message: str) -> None:
        self.errors.append(message)
        print(f"train-lora: WARNING: {message}", flush=True)

    def sync_once(self, final: bool = False) -> list[Path]:
        """Copies the finished checkpoints not copied yet.

        Returns:
            The durable folders this node wrote a marker into (COMPLETE.json or its
            NODE_<rank>.json) in this call.
        """
        with self._lock:
            if not self.multinode:
                return self._sync_single(final)
            if self.node_rank == 0:
                return self._sync_chief(final)
            return self._sync_worker()

    def _copy_finished(self, final: bool, copy: Any) -> list[tuple[Path, Path]]:
        """Copies swift's finished local checkpoints not copied yet with `copy(src, dest_root)`.

        Returns:
            (local checkpoint, durable copy) of each one copied in this call. A checkpoint
            rotated away meanwhile is skipped; a failed copy is a warning (retried next time).
        """
        copied = []
        for src in locally_complete(self.output_dir, final=final):
            step = checkpoint_step(src)
            if step in self.synced:
                continue
            try:
                dest = copy(src, self.dest_root)
            except FileNotFoundError:
                continue  # rotated away by save_total_limit; a newer one exists
            except (OSError, CheckpointError) as exc:
                self._warn(f"durable copy of {src} failed: {exc}")
                continue
            self.synced[step] = dest
            copied.append((src, dest))
        return copied

    def _sync_single(self, final: bool) -> list[Path]:
        new = []
        for src, dest in self._copy_finished(final, copy_checkpoint):
            new.append(dest)
            print(f"train-lora: checkpoint {src.name} copied to {dest} (verified)", flush=True)
            prune_checkpoints(self.dest_root, self.keep)
        return new

    def _sync_chief(self, final: bool) -> list[Path]:
        new = []
        for src, dest in self._copy_finished(final, lambda src, root: copy_node_files(src, root, 0)):
            self.pending[checkpoint_step(src)] = time.monotonic()
            new.append(dest)
            print(
                f"train-lora: checkpoint {src.name}: node 0's files copied to {dest} (verified); "
                f"waiting for the other {self.nnodes - 1} node(s)",
                flush=True,
            )
        for step, since in sorted(self.pending.items()):
            dest = self.dest_root / f"checkpoint-{step}"
            if not dest.is_dir():  # pruned meanwhile
                del self.pending[step]
                continue
            try:
                done = complete_multinode(dest, self.nnodes)
            except (OSError, CheckpointError) as exc:
                del self.pending[step]
                self._warn(f"{dest} not marked complete: {exc}")
                continue
            if done:
                del self.pending[step]
                new.append(dest)
                print(f"train-lora: checkpoint {dest.name} complete on all {self.nnodes} nodes (verified)", flush=True)
                prune_checkpoints(self.dest_root, self.keep)
            elif time.monotonic() - since > self.node_timeout_s:
                del self.pending[step]
                self._warn(
                    f"{dest}: no marker from node(s) {missing_nodes(dest, self.nnodes)} within "
                    f"{self.node_timeout_s:g} s; not marked complete (a restart will not resume from it)"
                )
        return list(dict.fromkeys(new))

    def _sync_worker(self) -> list[Path]:
        new = []
        for src in checkpoint_folders(self.output_dir):
            step = checkpoint_step(src)
            dest = self.dest_root / src.name
            if step in self.synced:
                continue
            if verify_checkpoint(dest, deep=False):
                self.synced[step] = dest
                continue
            if not node_marker(dest, 0).is_file():
                continue  # the chief has not finished this one (or pruned it)
            try:
                copy_node_files(src, self.dest_root, self.node_rank)
            except FileNotFoundError:
                continue
            except (OSError, CheckpointError) as exc:
                self._warn(f"durable copy of node {self.node_rank}'s files of {src} failed: {exc}")
                continue
            self.synced[step] = dest
            new.append(dest)
            print(
                f"train-lora: checkpoint {src.name}: node {self.node_rank}'s files copied to {dest} (verified)",
                flush=True,
            )
        return new

    def outstanding(self) -> list[int]:
        """Steps that still wait on another node: on the chief, checkpoints without every
        node's marker; on a worker, its newest local checkpoint while the chief has not
        marked it. Always [] on a single node."""
        if not self.multinode:
            return []
        if self.node_rank == 0:
            return sorted(self.pending)
        local = checkpoint_folders(self.output_dir)
        if not local:
            return []
        step = checkpoint_step(local[-1])
        if step in self.synced or verify_checkpoint(self.dest_root / local[-1].name, deep=False):
            return []
        return [step]

    def drain(self, timeout_s: float, final: bool = False) -> bool:
        """Syncs, then (multi-node) keeps syncing until no checkpoint waits on another node.

        Args:
            timeout_s: Seconds to wait at most.
            final: Training has ended (see `locally_complete`). Default False.

        Returns:
            True when nothing is outstanding.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            self.sync_once(final=final)
            left = deadline - time.monotonic()
            if not self.outstanding():
                return True
            if left <= 0:
                return False
            time.sleep(min(self.interval_s, 0.2, left))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sync_once()

    def start(self) -> CheckpointSync:
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
