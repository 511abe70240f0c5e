"""Listing local data sources for snapshot-data: files, folders and globs, without following
directory symlinks, with named errors for links that lead nowhere and for files that change
while they are listed.

A walk never follows a symlink to a directory (`..` loops would list the tree 2^depth times,
and a link out of the tree would add data nobody named): such a link is skipped with a note;
name its target as a source to include it. A symlink to a file is followed. A symlink that
leads nowhere (dangling, or a loop) is an error when it would be data (a JSONL file the
source covers) and a note otherwise. A file that disappears or changes while it is listed
raises `Changed`: the caller lists again, and names it after a few tries.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.common.files import sha256_file
from components.common.manifest import FORMAT as MANIFEST_FORMAT
from components.common.manifest import MANIFEST_FILE
from components.common.snapshot import SnapshotError
from components.snapshot_data import _hashes

DATA_SUFFIX = ".jsonl"
MAX_NOTED_LINKS = 20  # skipped symlinks noted one by one; more are counted


class Changed(Exception):
    """A file or folder disappeared or changed while it was listed (list again)."""

    def __init__(self, path: str | Path, what: str = "changed while it was listed"):
        super().__init__(f"{path}: {what}")
        self.path = str(path)


@dataclass
class Listing:
    """Files found under a folder.

    Attributes:
        files: Regular files (symlinks to files included), in name order.
        broken: (path, why) of symlinks that lead nowhere: "dangling: ..." or "a symlink loop".
        dir_links: Symlinks to directories that were not followed.
        outputs: Folders skipped because the project wrote them (`project_output`): a
            validated dataset, validate-data's `--out` folder (its quarantine and both splits).
    """

    files: list[Path] = field(default_factory=list)
    broken: list[tuple[Path, str]] = field(default_factory=list)
    dir_links: list[Path] = field(default_factory=list)
    outputs: list[Path] = field(default_factory=list)


OUTPUT_LOCKS = (".validate-data.lock",)  # a folder holding one is being (or was) written by the project


def project_output(folder: Path, names: set[str]) -> bool:
    """Whether a folder is one of the project's own outputs: it holds our completion marker or writer lock."""
    if any(lock in names for lock in OUTPUT_LOCKS):
        return True
    if MANIFEST_FILE not in names:
        return False
    try:
        with open(folder / MANIFEST_FILE, encoding="utf-8") as f:
            body = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(body, dict) and body.get("format") == MANIFEST_FORMAT


def _link_problem(path: Path, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symlink loop (it points back at itself)"
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return f"a dangling symlink (its target {target} does not exist)"


def walk(root: Path, max_depth: int | None = None, hidden: bool = False) -> Listing:
    """Lists the files under a folder without following directory symlinks.

    Args:
        root: The folder (itself may be a symlink: it is what the user named).
        max_depth: Deepest folder level to enter below root (0 = root's own files only).
            Default None: no limit.
        hidden: Whether names starting with "." are listed. Default False.

    Returns:
        The Listing.

    Raises:
        Changed: A folder disappeared while it was listed.
        SnapshotError: A folder cannot be read (permissions).
    """
    out = Listing()
    stack: list[tuple[Path, int]] = [(root, 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            raise Changed(folder, "disappeared while it was listed") from None
        except OSError as exc:
            raise SnapshotError(
                f"{folder}: cannot be listed ({exc.strerror or exc}); give the pipeline read access or name "
                "the files to use"
            ) from None
        if project_output(folder, {e.name for e in entries}):
            out.outputs.append(folder)  # its quarantine and splits are not data (name its data.jsonl to use it)
            continue
        for entry in entries:
            if entry.name.startswith(".") and not hidden:
                continue
            path = Path(entry.path)
            if entry.is_symlink():
                try:
                    mode = os.stat(path).st_mode
                except OSError as exc:
                    if not os.path.lexists(path):
                        raise Changed(path, "disappeared while it was listed") from None
                    out.broken.append((path, _link_problem(path, exc)))
                    continue
                if stat.S_ISDIR(mode):
                    out.dir_links.append(path)
                elif stat.S_ISREG(mode):
                    out.files.append(path)
            elif entry.is_dir(follow_symlinks=False):
                if max_depth is None or depth < max_depth:
                    stack.append((path, depth + 1))
            elif entry.is_file(follow_symlinks=False):
                out.files.append(path)
    out.files.sort()
    return out


def glob_base(pattern: str) -> tuple[Path, str]:
    """Splits a glob into its literal folder and the pattern relative to it: ('data', '**/*.jsonl')."""
    parts = pattern.split("/")
    first = next(i for i, part in enumerate(parts) if any(ch in part for ch in "*?["))
    base = "/".join(parts[:first]) or ("/" if pattern.startswith("/") else ".")
    return Path(base), "/".join(parts[first:])


def dir_link_notes(links: list[Path]) -> list[str]:
    """Returns the notes for directory symlinks that were not followed (the first few named, the rest counted)."""
    notes = [
        f"{link}: a symlink to a folder, not followed (loops and links out of the tree are not data); "
        "name the folder it points to as a source to include it"
        for link in links[:MAX_NOTED_LINKS]
    ]
    if len(links) > MAX_NOTED_LINKS:
        notes.append(f"... and {len(links) - MAX_NOTED_LINKS} more symlinks to folders, not followed")
    return notes


def output_notes(folders: list[Path]) -> list[str]:
    """Returns the notes for folders skipped as the project's own outputs (the first few named, the rest counted)."""
    notes = [
        f"{folder}: an output of this project (a validated dataset or validate-data's --out), not data: skipped; "
        "name its data.jsonl as a source to use a validated set"
        for folder in folders[:MAX_NOTED_LINKS]
    ]
    if len(folders) > MAX_NOTED_LINKS:
        notes.append(f"... and {len(folders) - MAX_NOTED_LINKS} more output folders, skipped")
    return notes


def broken_error(path: Path, why: str) -> SnapshotError:
    return SnapshotError(f"{path}: {why}; point the link at the data file, or remove it")


def entry(path: Path, assets: dict[str, Any]) -> dict[str, Any]:
    """Returns a local file's snapshot entry; raises Changed when it changes while it is hashed."""
    try:
        before = os.stat(path)
        digest = sha256_file(path)
        after = os.stat(path)
    except FileNotFoundError:
        raise Changed(path, "disappeared while it was listed") from None
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot be read ({exc.strerror or exc}); check its permissions") from None
    if (before.st_size, before.st_mtime_ns, before.st_ino) != (after.st_size, after.st_mtime_ns, after.st_ino):
        raise Changed(path, "changed while it was hashed")
    return {"uri": str(path), "size": after.st_size, "sha256": digest, "assets": assets}


def assets(folder: Path, max_assets: int, notes: list[str]) -> dict[str, Any]:
    """Returns {count, digest} of the non-JSONL files under a JSONL file's folder (names, sizes, contents).

    Each file counts by its content hash (`_hashes`: blake2b, skipped for a file whose inode,
    size, mtime and ctime are as last seen), so an image rewritten with the same size and
    modification time changes the digest; a note names each file whose content changed since
    the last listing.

    Raises:
        Changed: A file disappeared or changed while it was listed.
    """
    listing = walk(folder)
    notes.extend(f"{path}: {why}; skipped" for path, why in listing.broken)
    files = [path for path in listing.files if not path.name.endswith(DATA_SUFFIX)]
    if len(files) > max_assets:
        notes.append(f"{folder}: more than {max_assets} files: images there are not part of the snapshot")
        return {"count": len(files), "digest": "not-tracked"}
    cache = _hashes.HashCache.load(folder)
    lines = []
    for path in files:
        rel = path.relative_to(folder).as_posix()
        try:
            st = path.stat()
            digest = cache.hash_of(rel, st)
            after = path.stat()
        except FileNotFoundError:
            raise Changed(path, "disappeared while it was listed") from None
        except OSError as exc:
            raise SnapshotError(f"{path}: cannot be read ({exc.strerror or exc}); check its permissions") from None
        if (st.st_size, st.st_mtime_ns, st.st_ctime_ns) != (after.st_size, after.st_mtime_ns, after.st_ctime_ns):
            raise Changed(path, "changed while it was hashed")
        lines.append(f"{rel}\0{st.st_size}\0{digest}")
    cache.save()
    notes.extend(_changed_notes(folder, cache.changed))
    lines.sort()
    return {"count": len(lines), "digest": hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]}


def _changed_notes(folder: Path, changed: list[tuple[str, bool]]) -> list[str]:
    notes = [
        f"{folder / rel}: content changed since the last snapshot"
        + (" (other bytes, same size and modification time)" if same_meta else "")
        for rel, same_meta in changed[:MAX_NOTED_LINKS]
    ]
    if len(changed) > MAX_NOTED_LINKS:
        notes.append(f"{folder}: ... and {len(changed) - MAX_NOTED_LINKS} more files whose content changed")
    return notes
