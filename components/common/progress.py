"""Progress of long steps as rate-limited log lines (not a progress bar).

A bar in a log file (Vertex, kfp.local) writes a line per refresh. `Progress` writes one
line when the work starts, then one whenever at least `every_fraction` of the total (5 %)
*and* at least `every_s` seconds (30 s) have passed since the last line, whichever comes
later, then one when it ends: a 90 s evaluation logs about five lines, a ten-hour copy at
most one per 5 %. Each line has done / total, the percentage, the rate and the ETA:

    stage-model: download gs://b/m: 1.2 GB / 8.0 GB (15 %), 48.3 MB/s, ETA 2 min 21 s
    evaluate: tuned model: 16 / 32 rows (50 %), 0.8 rows/s, ETA 20 s

The clock and the line writer are injectable (tests pass a fake clock and a list).
`update` (n more done) and `set` (this much done in all: a measured size) may be called from
several threads; `watching(measure)` calls `set(measure())` every few seconds from its own
thread while a block runs (bytes on disk of a download in progress, partial files included).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

EVERY_FRACTION = 0.05
EVERY_S = 30.0


def format_bytes(n: float) -> str:
    """Returns a byte count in decimal units: '512 B', '1.2 MB', '8.0 GB'."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


def format_seconds(s: float) -> str:
    """Returns a duration as '7 s', '2 min 21 s' or '3 h 05 min'."""
    s = max(0, int(round(s)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def tree_bytes(folder: str | Path) -> int:
    """Bytes of every file under a folder (partial files included): a `watching` measure; 0 when missing."""
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Progress:
    """Rate-limited progress lines of one step (see the module docstring).

    Args:
        label: What is being done, the start of each line (e.g. "evaluate: tuned model").
        total: Units of work in all (bytes or rows); 0 = unknown (then lines follow the time rule
            only, without percentage or ETA).
        unit: "bytes" (sizes in B / kB / MB / GB, rate per second) or a noun for counted items,
            e.g. "rows" or "files". Default "rows".
        every_fraction: Least share of the total between two lines. Default 0.05 (5 %).
        every_s: Least seconds between two lines. Default 30.
        clock: Monotonic clock in seconds. Default `time.monotonic`.
        emit: Writes one line. Default: print to stderr, flushed.
        enabled: False writes nothing (a `--quiet` command line). Default true.
    """

    def __init__(
        self,
        label: str,
        total: int,
        unit: str = "rows",
        *,
        every_fraction: float = EVERY_FRACTION,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        emit: Callable[[str], None] | None = None,
        enabled: bool = True,
    ):
        self.label, self.total, self.unit = label, max(0, int(total)), unit
        self.every_fraction, self.every_s = every_fraction, every_s
        self.clock, self.emit = clock, emit or _stderr_line
        self.enabled = enabled
        self.done = 0
        self.lines = 0
        self._lock = threading.Lock()
        self._start = self._last_t = clock()
        self._last_done = 0
        self._finished = False
        if enabled:
            self._write(self._start)

    def update(self, n: int = 1) -> None:
        """Counts n more units done; writes a line when both the share and the time since the last one allow."""
        with self._lock:
            self._advance(self.done + int(n))

    def set(self, done: int) -> None:
        """Sets the units done in all (e.g. bytes measured on disk); never goes back."""
        with self._lock:
            self._advance(max(self.done, int(done)))

    @contextlib.contextmanager
    def watching(self, measure: Callable[[], int] | None, every_s: float = 2.0) -> Iterator[None]:
        """While the block runs, sets the units done to `measure()` every `every_s` seconds (capped at
        the total when it is known); `measure` None or a disabled Progress: nothing is watched.

        An OSError from `measure` (a file renamed while it was measured) skips that look.
        """
        if measure is None or not self.enabled:
            yield
            return
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(every_s):
                try:
                    value = measure()
                except OSError:
                    continue
                self.set(min(value, self.total) if self.total else value)

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def _advance(self, done: int) -> None:
        self.done = done
        if not self.enabled or self._finished:
            return
        now = self.clock()
        if now - self._last_t < self.every_s:
            return
        if self.total and (self.done - self._last_done) < self.every_fraction * self.total:
            return
        if self.total and self.done >= self.total:
            return  # the end line says it
        self._write(now)

    def finish(self) -> None:
        """Writes the end line (done, total time, mean rate) once; later calls do nothing."""
        with self._lock:
            if self._finished:
                return
            self._finished = True
            if self.enabled:
                self._write(self.clock(), end=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish()
        else:
            self._finished = True  # the error says what happened; no "done" line

    def _amount(self, n: float) -> str:
        return format_bytes(n) if self.unit == "bytes" else f"{int(n)}"

    def line(self, now: float, end: bool = False) -> str:
        """Returns the progress line for the state at `now` (pure: the rate-limit is not applied)."""
        elapsed = max(now - self._start, 0.0)
        unit = "" if self.unit == "bytes" else f" {self.unit}"
        amount = self._amount(self.done) + (f" / {self._amount(self.total)}" if self.total else "") + unit
        parts = [amount]
        if self.total:
            parts[0] += f" ({100 * min(self.done, self.total) // self.total} %)"
        rate = self.done / elapsed if elapsed > 0 else 0.0
        if self.done and elapsed > 0:
            parts.append(f"{format_bytes(rate)}/s" if self.unit == "bytes" else f"{rate:.3g} {self.unit}/s")
        if end:
            parts.append(f"done in {format_seconds(elapsed)}")
        elif self.total and self.done and rate > 0:
            parts.append(f"ETA {format_seconds((self.total - self.done) / rate)}")
        return f"{self.label}: {', '.join(parts)}"

    def _write(self, now: float, end: bool = False) -> None:
        self.emit(self.line(now, end))
        self.lines += 1
        self._last_t, self._last_done = now, self.done
