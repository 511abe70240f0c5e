"""File plumbing shared by the components: hashing, atomic writes and verified copies.

Everything here works on local paths (a `/gcs/...` fuse path counts as local).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import IO, Any, BinaryIO

CHUNK = 8 * 1024 * 1024  # bytes read at a time when hashing


class CopyMismatch(RuntimeError):
    """A copy does not hold the expected bytes (the source changed, or the write was torn).

    Attributes:
        path: The copy that was checked (the destination).
        size: Its size in bytes.
        sha256: Its hex sha256.
    """

    def __init__(self, path: Path, size: int, sha256: str):
        super().__init__(f"{path}: copy does not match the expected bytes (size {size}, sha256 {sha256})")
        self.path, self.size, self.sha256 = path, size, sha256


def _sha256_of(f: BinaryIO, chunk: int = CHUNK) -> str:
    digest = hashlib.sha256()
    while block := f.read(chunk):
        digest.update(block)
    return digest.hexdigest()


def sha256_file(path: str | Path, chunk: int = CHUNK) -> str:
    """Returns the hex sha256 of a file's bytes.

    Args:
        path: The file.
        chunk: Bytes read at a time. Default 8 MiB.

    Returns:
        The lower-case hex digest.
    """
    with open(path, "rb") as f:
        return _sha256_of(f, chunk)


_WRITE_FLAGS = {"w": os.O_TRUNC, "x": os.O_EXCL}


def open_nofollow(path: str | Path, mode: str = "w", *, encoding: str | None = "utf-8") -> IO[Any]:
    """Opens a file the project creates or truncates, never through a symbolic link at `path`.

    `open(path, "w")` follows a link planted where an output, a lock or a temporary file
    goes, and truncates whatever it points to (outside the output folder). Here the file
    is opened with O_NOFOLLOW (and O_CREAT, O_CLOEXEC; O_TRUNC for "w", O_EXCL for "x"): a
    link at `path` is refused, its target untouched. A link in a parent folder is still
    followed (the folder is the user's choice).

    Args:
        path: The file.
        mode: "w" / "x" (text) or "wb" / "xb" (binary). Default "w".
        encoding: Text encoding. Default "utf-8" (ignored for binary modes).

    Returns:
        The open file object.

    Raises:
        SymlinkRefused: `path` is a symbolic link (the message names it and its target).
        OSError: As `open` (FileExistsError for "x" on an existing file).
    """
    kind = mode[0]
    if kind not in _WRITE_FLAGS or mode.lstrip("wx") not in ("", "b"):
        raise ValueError(f"open_nofollow: mode {mode!r} is not w, x, wb or xb")
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | _WRITE_FLAGS[kind]
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (kind == "x" and os.path.islink(path)):
            raise SymlinkRefused(path) from None
        raise
    if "b" in mode:
        return os.fdopen(fd, "wb")
    return os.fdopen(fd, "w", encoding=encoding)


class SymlinkRefused(OSError):
    """A file the project writes is a symbolic link where it should be created: refused, its target untouched."""

    def __init__(self, path: str | Path):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        super().__init__(
            errno.ELOOP,
            f"{path} is a symbolic link (to {target}) where this program writes a file; it is not followed: "
            "remove the link",
        )
        self.path = str(path)

    def __str__(self) -> str:
        return str(self.strerror)


def copy_nofollow(src: str | Path, dst: str | Path) -> None:
    """Copies a file's bytes to `dst`, created or truncated without following a link there (`open_nofollow`)."""
    with open(src, "rb") as f, open_nofollow(dst, "wb") as out:
        shutil.copyfileobj(f, out, CHUNK)


def write_text_atomic(path: str | Path, text: str, tmp_dir: str | Path | None = None) -> None:
    """Writes a text file so that a reader sees either no file, the old one, or the whole new one.

    The text goes to a uniquely named temporary file (`.<folder>.<name>.partial-<random>`,
    unique across processes and hosts sharing a file system), is fsynced, then renamed into
    place. A failed write leaves no temporary file behind.

    Args:
        path: The file to write.
        text: Its content (UTF-8).
        tmp_dir: Folder of the temporary file, on the same file system as `path`.
            Default: `path`'s own folder. Give another one where a stray temporary file
            inside that folder could be mistaken for content (a checkpoint folder).
    """
    path = Path(path)
    folder = Path(tmp_dir) if tmp_dir is not None else path.parent
    tmp = folder / f".{path.parent.name}.{path.name}.partial-{uuid.uuid4().hex}"
    try:
        with open(tmp, "x", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(path: str | Path, data: Any, tmp_dir: str | Path | None = None, *, indent: int = 1) -> None:
    """Writes JSON (sorted keys) atomically; see `write_text_atomic`.

    Args:
        path: The file to write.
        data: The JSON-able value.
        tmp_dir: Folder of the temporary file (see `write_text_atomic`). Default: `path`'s folder.
        indent: JSON indent in spaces. Default 1.
    """
    write_text_atomic(path, json.dumps(data, indent=indent, sort_keys=True), tmp_dir=tmp_dir)


def copy_atomic(src: str | Path, dst: str | Path) -> None:
    """Copies a file so that a reader of `dst` sees either no file, the old one, or the whole copy.

    The bytes go to a uniquely named temporary file beside `dst` (named as in
    `write_text_atomic`), are fsynced, then renamed into place. A failed copy leaves `dst` as
    it was and no temporary file behind.

    Args:
        src: The file to copy.
        dst: The copy (its folder must exist).
    """
    dst = Path(dst)
    tmp = dst.parent / f".{dst.parent.name}.{dst.name}.partial-{uuid.uuid4().hex}"
    try:
        with open(src, "rb") as f, open(tmp, "xb") as out:
            shutil.copyfileobj(f, out, CHUNK)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def copy_verified(
    src: str | Path,
    dst: str | Path,
    sha256: str,
    size: int | None = None,
    *,
    atomic: bool = False,
    tmp_tag: str = "",
) -> int:
    """Copies a file, then reads the copy back and checks it holds the expected bytes.

    Args:
        src: The file to copy.
        dst: The copy (parent folders are created).
        sha256: Expected hex sha256 (of the source when it was listed).
        size: Expected size in bytes. Default None (not checked apart from the sha256).
        atomic: Write through a temporary file beside `dst` (`<name>.partial-<random>`),
            fsynced and renamed into place only once it verifies, so a reader never sees a
            torn or wrong `dst`. Default False: written in place, for callers that publish
            a marker only after every copy verified (checkpoint copies).

    Returns:
        Bytes written.

    Raises:
        CopyMismatch: The copy's size or sha256 differs (the source changed since it was
            hashed, or the write was torn). With `atomic`, `dst` is left as it was.
    """
    src, dst = Path(src), Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    target = dst
    if atomic:
        prefix = f"{dst.name}.partial-{tmp_tag}-" if tmp_tag else f"{dst.name}.partial-"
        fd, name = tempfile.mkstemp(dir=dst.parent, prefix=prefix)
        os.close(fd)
        target = Path(name)
    try:
        shutil.copyfile(src, target)  # atomic: a temporary file mkstemp just created (O_EXCL, a random name)
        with open(target, "rb") as f:
            got_sha = _sha256_of(f)
            if atomic:
                os.fsync(f.fileno())
        got_size = target.stat().st_size
        if got_sha != sha256 or (size is not None and got_size != size):
            raise CopyMismatch(dst, got_size, got_sha)
        if atomic:
            os.replace(target, dst)
    finally:
        if atomic:
            target.unlink(missing_ok=True)
    return got_size
