"""One stager per cache entry: take the entry's lock, or wait for the stager that holds it.

The lock is an optimisation, not what makes staging correct (see `core`): a stager that
waited longer than `Locking.wait_s` goes on without it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from components.stage_model.entry import check_entry

log = logging.getLogger("stage_model")


class Heartbeat:
    """Holds the entry lock: refreshes it every `every_s` seconds until stopped."""

    def __init__(self, entry, owner: str, every_s: float):
        self._entry, self._owner, self._every = entry, owner, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self._entry.refresh_lock(self._owner)
            except Exception:  # noqa: BLE001 - a missed refresh only risks duplicate work
                log.warning("stage-model: could not refresh the lock of %s", self._entry.uri)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._entry.unlock(self._owner)


def acquire(entry, owner: str, wait_s: float, stale_s: float, poll_s: float):
    """Takes the entry's lock, or waits while another live stager holds it.

    Returns:
        ("hit", manifest) when the other stager finished a valid entry meanwhile,
        ("locked", None) when this stager holds the lock, ("unlocked", None) after
        `wait_s` (staging then goes on without the lock; it stays correct, see module doc).
    """
    deadline = time.monotonic() + wait_s
    waited = False
    while True:
        if entry.try_lock(owner, stale_s):
            # Double-checked: another stager may have finished between our first check and the lock.
            valid, _, manifest, _ = check_entry(entry)
            if valid:
                entry.unlock(owner)
                return "hit", manifest
            return "locked", None
        if not waited:
            log.info("stage-model: %s is being staged by another run; waiting", entry.uri)
        waited = True
        valid, _, manifest, _ = check_entry(entry)
        if valid:
            return "hit", manifest
        if time.monotonic() > deadline:
            log.warning("stage-model: lock of %s still held after %.0f s; staging without it", entry.uri, wait_s)
            return "unlocked", None
        time.sleep(poll_s)


@dataclass(frozen=True)
class Locking:
    """How a stager waits for another one of the same entry (see `stage_model`'s lock_* arguments)."""

    wait_s: float = 4 * 3600.0
    stale_s: float = 300.0
    poll_s: float = 2.0
