"""Stops a command's processes once the task process that started it is gone (see `swift.run_command`).

    python -I -S _watchdog.py PARENT_PID COMMAND_PID GRACE_S

`run_command` starts this script beside each command, in a session of its own, so that a
`kill -9` of the task's process group (or of the task alone) does not reach it. It knows
the parent is gone when its stdin (a pipe whose other end only the parent holds) reaches
end-of-file without "done", or when its parent process id changes (it was re-parented).

While the command runs it keeps the process ids (with start times, so that a reused id is
never signalled) of the command's process group and of every descendant: torchrun starts
its workers in sessions of their own, so the group alone would miss them, and a worker
whose torchrun died is no longer anyone's descendant. When the parent is gone it sends
SIGTERM to all of them, waits up to GRACE_S seconds, and sends SIGKILL to what is left.
After "done" (the command exited) it stops any of them still alive the same way: a
command's processes do not outlive it.

Standard library only, started with -I -S: it imports nothing of the project.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

POLL_S = 1.0  # how often the process tree is read (and the parent id checked); an EOF wakes it at once


def _stat(pid: int) -> tuple[int, int, int] | None:
    """Returns (parent pid, process group, start time) of a live process; None when gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[1]), int(fields[2]), int(fields[19])


def _table() -> dict[int, tuple[int, int, int]]:
    """Returns {pid: (ppid, pgid, start time)} of every live process."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = _stat(int(name))
            if info is not None:
                out[int(name)] = info
    return out


def track(known: dict[int, int], pgid: int) -> None:
    """Adds to `known` ({pid: start time}) the group's members and every descendant of a known process."""
    table = _table()
    table.pop(os.getpid(), None)  # never itself: it is a descendant of a parent that guards its own children
    grew = True
    while grew:
        grew = False
        for pid, (ppid, group, start) in table.items():
            if pid in known:
                continue
            parent_known = ppid in known and known[ppid] == table.get(ppid, (0, 0, -1))[2]
            if group == pgid or parent_known:
                known[pid] = start
                grew = True


def alive(known: dict[int, int]) -> list[int]:
    """Returns the known pids still running (same start time: not a reused id)."""
    out = []
    for pid, start in known.items():
        info = _stat(pid)
        if info is not None and info[2] == start:
            out.append(pid)
    return out


def _signal_all(pids: list[int], pgid: int, sig: int) -> None:
    if any((_stat(pid) or (0, -1, 0))[1] == pgid for pid in pids):  # the group still exists: not a reused id
        try:
            os.killpg(pgid, sig)
        except OSError:
            pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def stop(known: dict[int, int], pgid: int, grace_s: float) -> int:
    """SIGTERM to every known process, SIGKILL after `grace_s` to those left; returns how many were running."""
    track(known, pgid)
    running = alive(known)
    if not running:
        return 0
    _signal_all(running, pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    signalled = set(running)
    while time.monotonic() < deadline:
        track(known, pgid)
        left = alive(known)
        if not left:
            return len(signalled)
        new = [pid for pid in left if pid not in signalled]  # started while stopping
        _signal_all(new, pgid, signal.SIGTERM)
        signalled.update(new)
        time.sleep(0.05)
    _signal_all(alive(known), pgid, signal.SIGKILL)
    return len(signalled)


def _say(text: str) -> None:
    try:
        os.write(2, f"watchdog: {text}\n".encode())
    except OSError:
        pass  # nobody reads the task's output any more


def main(argv: list[str]) -> int:
    parent, command, grace_s = int(argv[0]), int(argv[1]), float(argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the parent's to handle
    known: dict[int, int] = {}
    first = _stat(command)
    if first is not None:
        known[command] = first[2]
    done = False
    while os.getppid() == parent:
        track(known, command)
        ready, _, _ = select.select([0], [], [], POLL_S)
        if ready:
            data = os.read(0, 64)
            if not data:
                break
            if b"done" in data:
                done = True
                break
    if done:
        n = stop(known, command, grace_s)
        if n:
            _say(f"{n} process(es) of the command outlived it; stopped")
        return 0
    _say(f"the task process {parent} is gone; stopping its command's processes (group {command})")
    n = stop(known, command, grace_s)
    _say(f"stopped {n} process(es)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
