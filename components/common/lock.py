"""One writer per output folder: a lock that dies with its holder.

    with hold_folder(out, "validate-data", fix="...") as taken:
        ...  # taken.previous: the record of a holder that died holding it ({} if none)

The lock is an advisory `flock` on `<folder>/.<who>.lock`: the kernel releases it when its
holder exits, however it exits (`kill -9` included), so a dead holder's lock is taken over
at once and no stale-lock timeout is needed. The file holds the holder's record (pid,
host, place, start time) so a refused writer can name it; the holder empties it on a clean
release, so a record found by the next holder is that of one that died while writing, and
its leftovers (tagged `<pid>.<place>`: `components.common.manifest`) can go.

A second writer is refused at once (`FolderInUse`), not queued: two runs into one output
folder are a mistake to fix, and waiting would hide it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import socket
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _place() -> str:
    """8 hex digits naming this host, boot and pid namespace (pids compare only within one)."""
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = ""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return hashlib.sha256("\0".join([socket.gethostname(), boot, pidns]).encode()).hexdigest()[:8]


PLACE = _place()


class LockError(RuntimeError):
    """The folder's lock cannot be taken; the message says why and what to do."""


class FolderInUse(LockError):
    """Another live process holds the folder's lock.

    Attributes:
        folder: The folder.
        holder: The holder's record (pid, host, started), {} when it had not written it yet.
    """

    def __init__(self, folder: Path, who: str, holder: dict[str, Any], fix: str):
        since = holder.get("started")
        by = (
            f"pid {holder.get('pid')} on {holder.get('host')}"
            + (f", since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))}" if since else "")
            if holder
            else "a process that is starting"
        )
        super().__init__(f"{folder} is in use by another {who} ({by}): {fix}")
        self.folder, self.holder = folder, holder


class LockUnsupported(LockError):
    """The folder's file system has no file locks (some network file systems)."""


@dataclass
class Taken:
    """A held lock: `path` its file; `previous` the record of a holder that died holding it ({} if none)."""

    path: Path
    previous: dict[str, Any] = field(default_factory=dict)


def _record_of(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


@contextmanager
def hold_folder(folder: str | Path, who: str, *, fix: str) -> Iterator[Taken]:
    """Holds `folder`'s writer lock for the block (the folder is created).

    Args:
        folder: The output folder.
        who: The writer's name, in the lock file's name and the messages (e.g. "validate-data").
        fix: What the refused user should do, ending the message of `FolderInUse`.

    Yields:
        The `Taken` lock.

    Raises:
        FolderInUse: A live process holds it; the message names its pid, host and start.
        LockUnsupported: The file system does not support `flock`.
        LockError: The lock file cannot be created (a read-only folder).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f".{who}.lock"
    try:  # never through a planted symbolic link: ftruncate below would empty its target
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LockError(
                f"{path}: the lock file is a symbolic link (to {_link_target(path)}); it is not followed: "
                "remove the link"
            ) from None
        raise LockError(
            f"{path}: cannot create the lock file ({exc.strerror}); write to a folder you can write"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LockError(f"{path}: the lock file is not a regular file (a FIFO or device); remove it")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise LockUnsupported(f"{path}: the file system does not support file locks ({exc}); "
                                      "write to a local folder") from None  # fmt: skip
            holder = {}
            for _ in range(20):  # the holder writes its record right after it locks
                holder = _record_of(os.pread(fd, 65536, 0).decode("utf-8", "replace"))
                if holder:
                    break
                time.sleep(0.05)
            raise FolderInUse(folder, who, holder, fix) from None
        previous = _record_of(os.pread(fd, 65536, 0).decode("utf-8", "replace"))
        now = time.time()
        mine = {"pid": os.getpid(), "host": socket.gethostname(), "place": PLACE, "started": now}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(mine).encode(), 0)
        os.fsync(fd)
        try:
            yield Taken(path, previous)
        finally:
            os.ftruncate(fd, 0)  # a clean release: the next holder finds no dead holder's record
    finally:
        os.close(fd)  # releases the flock


def _link_target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def leftovers_of_dead_writers(folder: str | Path) -> list[Path]:
    """Staging and swapped-out folders and temporary files directly in `folder` (call with its lock held).

    Under the lock no other writer is active, so every such name is a dead writer's.
    """
    names = (".staging-", ".old-", ".partial-", ".tmp")
    return sorted(p for p in Path(folder).iterdir() if p.name.startswith(".") and any(n in p.name for n in names))
