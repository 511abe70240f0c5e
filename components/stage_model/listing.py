"""Which files of a source are staged (allow / ignore globs), and their content checksums."""

from __future__ import annotations

import base64
import fnmatch
import hashlib
from pathlib import Path

from components.stage_model.entry import MANIFEST

_CHUNK = 8 * 1024 * 1024


# Never staged: VCS and cache folders, and partial files of other stagers.
DEFAULT_IGNORE = (".git/*", ".cache/*", "*.partial-*", MANIFEST)


def list_files(folder: Path, allow: list[str] | None = None, ignore: list[str] | None = None) -> list[str]:
    """Lists a folder's files as sorted POSIX relative paths, filtered by glob patterns.

    Args:
        folder: The model folder.
        allow: Keep only paths matching one of these globs; None keeps all. Default None.
        ignore: Drop paths matching one of these globs (added to DEFAULT_IGNORE). Default None.

    Returns:
        Relative file paths, sorted.
    """
    names = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    return select_files(names, allow, ignore)


def local_revision(folder: Path, files: list[str], hashes: dict[str, str]) -> str:
    """Returns a content fingerprint of a local folder: 'sha256-' + 16 hex digits."""
    digest = hashlib.sha256()
    for rel in files:
        digest.update(f"{rel}\0{hashes[rel]}\n".encode())
    return "sha256-" + digest.hexdigest()[:16]


def crc32c_file(path: Path) -> str:
    """Returns the base64 crc32c of a file (the form GCS reports), read in 8 MiB chunks."""
    import google_crc32c

    checksum = google_crc32c.Checksum()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            checksum.update(chunk)
    return base64.b64encode(checksum.digest()).decode()


def select_files(names: list[str], allow: list[str] | None, ignore: list[str] | None) -> list[str]:
    """Filters relative names by allow/ignore globs (DEFAULT_IGNORE always applies); sorted."""
    patterns = list(DEFAULT_IGNORE) + list(ignore or [])
    return sorted(
        n
        for n in names
        if not any(fnmatch.fnmatch(n, p) for p in patterns) and (not allow or any(fnmatch.fnmatch(n, p) for p in allow))
    )
