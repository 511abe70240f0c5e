"""Who holds a stage-model lock, and whether that stager is gone.

A lock records its owner: `owner` (a unique token), `host` (hostname), `place` (this
host, boot and pid namespace, hashed: two processes can compare pids only where their
places are equal), `pid`, `proc_start` (the process's start time in clock ticks since
boot, so a reused pid is not mistaken for the owner), `started` and `time` (wall clock
seconds; `time` is the heartbeat on Cloud Storage, the file's mtime locally).

A lock is abandoned when its owner ran in this place and that process is gone (taken over
at once, whatever the stale bound), or when its heartbeat is older than the stale bound
(the only test across hosts).

Partial files carry their writer's `<pid>.<place>` tag in their names
(`<name>.partial-<pid>.<place>-<random>`), so a new lock holder can remove a dead stager's
half-written files without touching a live one's.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import time
from pathlib import Path
from typing import Any


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _place() -> str:
    """8 hex digits naming this host, boot and pid namespace (pids compare only within one)."""
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = ""
    key = "\0".join([socket.gethostname(), _read("/proc/sys/kernel/random/boot_id"), pidns])
    return hashlib.sha256(key.encode()).hexdigest()[:8]


PLACE = _place()
# '<pid>.<place>-' after '.partial-' (partial files) or at the start of 'stage-model-' (download folders)
_TAG_RE = re.compile(r"(?:\.partial-|^stage-model-)(\d+)\.([0-9a-f]{8})-")


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) of a process from /proc; None where there is no /proc."""
    raw = _read(f"/proc/{pid}/stat")
    if not raw:
        return None
    fields = raw.rsplit(")", 1)[-1].split()  # the command name may hold spaces and ')'
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def process_start(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot; None where unknown."""
    stat = _proc_stat(pid)
    return stat[1] if stat else None


def running(pid: Any, proc_start: Any = None) -> bool:
    """True unless process `pid` of this place is known to be gone (absent, a zombie, or reused).

    Args:
        pid: The process id (from a lock file: anything). Not a positive int: True (unknown).
        proc_start: Its start time in clock ticks; None: not compared.
    """
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    except (OverflowError, OSError):
        return True
    stat = _proc_stat(pid)
    if stat is None:
        return True
    state, start = stat
    if state in ("Z", "X"):  # dead, not yet reaped
        return False
    return not isinstance(proc_start, int) or start == proc_start


def record(owner: str) -> dict[str, Any]:
    """The lock body of this process for owner token `owner`."""
    now = time.time()
    pid = os.getpid()
    return {
        "owner": owner,
        "host": socket.gethostname(),
        "place": PLACE,
        "pid": pid,
        "proc_start": process_start(pid),
        "started": now,
        "time": now,
    }


def abandoned(held: dict[str, Any], age_s: float, stale_s: float) -> str:
    """Why a lock is abandoned ('' when it is not).

    Args:
        held: The lock body (possibly empty or from an older version).
        age_s: Seconds since its last heartbeat.
        stale_s: The stale bound, in seconds.
    """
    if held.get("place") == PLACE and not running(held.get("pid"), held.get("proc_start")):
        return f"its stager (pid {held.get('pid')} on {held.get('host')}) is gone"
    if age_s > stale_s:
        return f"no heartbeat for {age_s:.0f} s"
    return ""


def tag() -> str:
    """This process's tag for partial file names: '<pid>.<place>'."""
    return f"{os.getpid()}.{PLACE}"


def _tag_of(name: str) -> tuple[int, str] | None:
    match = _TAG_RE.search(name)
    return (int(match.group(1)), match.group(2)) if match else None


def tagged_by_gone_process(name: str) -> bool:
    """True when a tagged file or folder name (see `tag`) is of a process of this place that is gone."""
    tagged = _tag_of(name)
    return tagged is not None and tagged[1] == PLACE and not running(tagged[0])


def partial_is_abandoned(path: Path, dead: dict[str, Any], stale_s: float) -> bool:
    """True when a `*.partial-*` file belongs to a gone stager.

    Args:
        path: The partial file.
        dead: The body of the lock just taken over ({} if none): its owner's files go.
        stale_s: Other partials (untagged, or of another host) go when not modified for
            this many seconds.
    """
    tagged = _tag_of(path.name)
    if tagged is not None and (tagged == (dead.get("pid"), dead.get("place")) or tagged_by_gone_process(path.name)):
        return True
    try:
        return time.time() - path.stat().st_mtime > stale_s
    except FileNotFoundError:
        return False
