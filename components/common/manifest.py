"""Completion markers: a multi-file output is written whole, and a reader can tell.

A finished output folder holds `MANIFEST_FILE` (`complete.json`), written last: every
file's relative path, size in bytes and sha256. A folder without it was interrupted (or
written by a version without markers); a folder whose files differ from it changed after
it was written (a truncated `data.jsonl`, a replaced image). `verify_manifest` tells which
file and what differs. Each entry also records the file's inode, mtime_ns and ctime_ns: a
quick check (`quick=True`, for large folders checked on every reuse) hashes only files whose
figures changed since (ctime cannot be set from user space: any rewrite, `cp -p` or `touch`
included, changes it) and checks the size of the others.

`staging_folder` + `publish` write a folder whole: the files go into a staging folder beside
the final one (`.<name>.staging-<pid>.<place>-<random>`: unique per process, and the tag says
which process left it), the marker is written into it last, and it is renamed into place (an
existing folder is swapped out atomically where Linux's `renameat2` allows it, then
removed). A reader sees the old folder or the whole new one, never a mix.

On Cloud Storage FUSE (`/gcs/...`) a folder rename is a copy of every object, and refused
by default, so there the files are written in place and the marker alone tells complete
from interrupted (an output path of a Vertex task is new for each task run anyway).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import shutil
import socket
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from components.common.files import sha256_file, write_json_atomic

MANIFEST_FILE = "complete.json"
FORMAT = "vlm-lora-manifest-v1"
STAGING_TAG = ".staging-"  # in the name of a staging folder
OLD_TAG = ".old-"  # in the name of a folder swapped out by `publish`, removed right after


class ManifestError(RuntimeError):
    """A folder's files do not match its completion marker, or it has none.

    Attributes:
        folder: The output folder.
        file: The file that differs, relative to `folder` (the marker itself when it is missing).
        problem: What differs, e.g. "size 120 bytes, the marker says 4,096".
    """

    def __init__(self, folder: str | Path, file: str, problem: str, fix: str):
        super().__init__(f"{Path(folder) / file}: {problem}; {fix}")
        self.folder, self.file, self.problem = str(folder), file, problem


def _is_fuse(path: Path) -> bool:
    return str(path.resolve()).startswith("/gcs/")


def _tag() -> str:
    from components.common.lock import PLACE  # the same tag the folder lock cleans up by

    return f"{os.getpid()}.{PLACE}-{uuid.uuid4().hex[:8]}"


def _listed(folder: Path, files: Iterable[str] | None) -> list[str]:
    if files is not None:
        return sorted(files)
    names = []
    for path in folder.rglob("*"):
        rel = path.relative_to(folder).as_posix()
        if path.is_file() and rel != MANIFEST_FILE and ".partial-" not in path.name:
            names.append(rel)
    return sorted(names)


def write_manifest(folder: str | Path, files: Iterable[str] | None = None, *, producer: str = "") -> str:
    """Writes the folder's completion marker (last: call it once every file is in place).

    Args:
        folder: The finished output folder.
        files: The files to list, relative to `folder`. Default None: every file under it
            (recursively) except the marker and `*.partial-*` temporaries.
        producer: Who wrote the folder (e.g. "validate-data"), recorded. Default "".

    Returns:
        The marker's own sha256 (record it elsewhere, e.g. in the artifact's metadata, and
        `verify_manifest(expected_sha256=...)` catches an edited marker too).
    """
    folder = Path(folder)
    entries = {}
    for rel in _listed(folder, files):
        path = folder / rel
        st = path.stat()
        entries[rel] = {"size": st.st_size, "sha256": sha256_file(path), "stat": _stat_key(st)}
    body = {
        "format": FORMAT,
        "producer": producer,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "written": time.time(),
        "files": entries,
    }
    write_json_atomic(folder / MANIFEST_FILE, body, tmp_dir=folder.parent)
    return sha256_file(folder / MANIFEST_FILE)


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_ino, st.st_mtime_ns, st.st_ctime_ns]


def total_bytes(body: dict[str, Any]) -> int:
    """The bytes a marker's files add up to (0 for entries without a size)."""
    return sum(int(e.get("size") or 0) for e in body.get("files", {}).values() if isinstance(e, dict))


def read_marker(folder: str | Path) -> dict[str, Any] | None:
    """A folder's completion marker, or None when it has none or it is not one (nothing is checked)."""
    try:
        body = json.loads((Path(folder) / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) and isinstance(body.get("files"), dict) else None


def _read_marker(folder: Path, expected_sha256: str, fix: str) -> dict[str, Any]:
    marker = folder / MANIFEST_FILE
    if not marker.is_file():
        raise ManifestError(folder, MANIFEST_FILE, "no completion marker: the output is incomplete "
                            "(its writer was interrupted) or older than completion markers", fix)  # fmt: skip
    if expected_sha256:
        got = sha256_file(marker)
        if got != expected_sha256:
            raise ManifestError(folder, MANIFEST_FILE, f"the marker changed since it was written (sha256 {got[:12]}, "
                                f"its producer recorded {expected_sha256[:12]})", fix)  # fmt: skip
    try:
        body = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ManifestError(folder, MANIFEST_FILE, f"the marker is not readable JSON ({exc})", fix) from None
    if not isinstance(body, dict) or body.get("format") != FORMAT or not isinstance(body.get("files"), dict):
        raise ManifestError(folder, MANIFEST_FILE, f"not a completion marker of format {FORMAT}", fix)
    return body


def verify_manifest(
    folder: str | Path, *, expected_sha256: str = "", fix: str = "write the output again", quick: bool = False
) -> dict[str, Any]:
    """Checks every file the folder's marker lists: present, same size, same sha256.

    Files the marker does not list are not looked at (they were not part of the output).

    Args:
        folder: The output folder.
        expected_sha256: The marker's own sha256 as its producer recorded it ("" = not
            checked). Default "".
        fix: How to fix a mismatch, appended to the message. Default "write the output again".
        quick: Hash only the files whose inode, mtime or ctime differ from the marker's
            record (the others by size). Default False: every file hashed.

    Returns:
        The marker's content.

    Raises:
        ManifestError: The marker is missing, unreadable or changed, or a listed file is
            missing or differs in size or sha256; the message names the file and the figures.
    """
    folder = Path(folder)
    body = _read_marker(folder, expected_sha256, fix)
    for rel, want in sorted(body["files"].items()):
        path = folder / rel
        if not path.is_file():
            raise ManifestError(folder, rel, "listed in the completion marker but missing", fix)
        if not isinstance(want, dict):
            raise ManifestError(folder, MANIFEST_FILE, f"its entry for {rel} is not {{size, sha256}}", fix)
        st = path.stat()
        if st.st_size != want.get("size"):
            raise ManifestError(
                folder, rel, f"size {st.st_size} bytes, the completion marker says {want.get('size')}", fix
            )
        if quick and want.get("stat") == _stat_key(st):
            continue
        sha = sha256_file(path)
        if sha != want.get("sha256"):
            raise ManifestError(
                folder, rel, f"sha256 {sha[:12]}, the completion marker says {str(want.get('sha256'))[:12]} "
                "(same size, other bytes)", fix,
            )  # fmt: skip
    return body


def staging_folder(final: str | Path) -> Path:
    """Creates the folder to write an output into before `publish` puts it at `final`.

    Args:
        final: Where the output goes.

    Returns:
        A new empty folder beside `final` (`.<name>.staging-<pid>.<place>-<random>`); on
        Cloud Storage FUSE, `final` itself (created, its old marker removed: see the module doc).
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    if _is_fuse(final):
        final.mkdir(exist_ok=True)
        (final / MANIFEST_FILE).unlink(missing_ok=True)
        return final
    staging = final.parent / f".{final.name}{STAGING_TAG}{_tag()}"
    staging.mkdir()
    return staging


def _exchange(a: Path, b: Path) -> bool:
    """Swaps two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def publish(staging: str | Path, final: str | Path, *, producer: str = "") -> str:
    """Writes the marker into a finished staging folder, then puts it at `final`.

    Args:
        staging: The folder from `staging_folder(final)`, every file written.
        final: Where the output goes; an existing folder there is replaced whole.
        producer: Recorded in the marker. Default "".

    Returns:
        The marker's sha256 (see `write_manifest`).
    """
    staging, final = Path(staging), Path(final)
    digest = write_manifest(staging, producer=producer)
    if staging == final:
        return digest
    if final.is_dir() and not final.is_symlink() and _exchange(staging, final):
        shutil.rmtree(staging, ignore_errors=True)  # the old output, now under the staging name
        return digest
    if final.exists() or final.is_symlink():
        old = final.parent / f".{final.name}{OLD_TAG}{_tag()}"
        os.rename(final, old)
        os.rename(staging, final)
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
    else:
        os.rename(staging, final)
    return digest


def discard(staging: str | Path, final: str | Path) -> None:
    """Removes a staging folder after a failed write (nothing where it is `final` itself)."""
    if Path(staging) != Path(final):
        shutil.rmtree(staging, ignore_errors=True)


def verify_if_marked(
    folder: str | Path, *, expected_sha256: str = "", fix: str = "write the output again", quick: bool = False
) -> bool:
    """Checks a folder's marker when it has one, or when its producer recorded one (readers of older outputs).

    Args:
        folder: The output folder.
        expected_sha256: The marker's sha256 as its producer recorded it ("" = none recorded:
            a folder without a marker passes unchecked). Default "".
        fix: How to fix a mismatch. Default "write the output again".
        quick: As `verify_manifest`. Default False.

    Returns:
        True when a marker was checked, False when the folder has none and none was recorded.

    Raises:
        ManifestError: As `verify_manifest`; also a missing marker that was recorded.
    """
    if not expected_sha256 and not (Path(folder) / MANIFEST_FILE).is_file():
        return False
    verify_manifest(folder, expected_sha256=expected_sha256, fix=fix, quick=quick)
    return True
