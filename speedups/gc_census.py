"""Python's garbage collection during training, counted: every rank logs at the end of training how many
collections ran and how long they paused the host (`GcCensus`, through `gc.callbacks`), with the speed-ups' other
end-of-training lines (item 16's lookups).

Running the collections at step ends on every rank under several processes (Megatron-LM's `--manual-gc`; item 15
until 2026-11-28) gained nothing beyond the run-to-run spread on two H200s (0.466 / 0.468 s/step without it against
0.467-0.477 with it; 2026-11-28, train_throughput.py auto_liger_autogc_log5) and was deleted; the census
shows whether collections pause a rank in a new setting.

Pure (the `gc` module and a clock); speedups/tests/test_gc_census.py runs it.
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass, field


@dataclass
class GcCensus:
    """Collections seen through `gc.callbacks`: how many per generation, how long the host paused."""

    clock: object = time.perf_counter
    counts: dict[int, int] = field(default_factory=lambda: {0: 0, 1: 0, 2: 0})
    seconds: float = 0.0
    longest: float = 0.0
    longest_generation: int = -1
    _started: float | None = None

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = self.clock()
            return
        if self._started is None:
            return
        pause = self.clock() - self._started
        self._started = None
        generation = int(info.get("generation", 0))
        self.counts[generation] = self.counts.get(generation, 0) + 1
        self.seconds += pause
        if pause > self.longest:
            self.longest, self.longest_generation = pause, generation

    def attach(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def detach(self) -> None:
        while self in gc.callbacks:
            gc.callbacks.remove(self)

    def summary(self) -> str:
        total = sum(self.counts.values())
        if not total:
            return "no garbage collection ran"
        per = ", ".join(f"{self.counts[g]} of generation {g}" for g in sorted(self.counts) if self.counts[g])
        return (
            f"{total} garbage collections ({per}) paused the host {self.seconds * 1e3:.1f} ms in all, "
            f"the longest {self.longest * 1e3:.1f} ms (generation {self.longest_generation})"
        )


# ---- the collection census every trainer gets ------------------------------------------------------------------


def gc_callback(environ=None, batch_facts: bool = False):
    """A TrainerCallback that counts garbage collections during training (every rank logs them at the end); with
    `batch_facts`, item 16's lookups are logged too."""
    from transformers import TrainerCallback

    environ = os.environ if environ is None else environ

    class GcCallback(TrainerCallback):
        def __init__(self) -> None:
            self.census = GcCensus()

        def on_train_begin(self, args, state, control, **kwargs):
            self.census.attach()

        def on_train_end(self, args, state, control, **kwargs):
            rank = environ.get("RANK", "0")
            if batch_facts:  # item 16's lookups, on every rank (one line)
                from speedups.batch_facts import COPIES

                print(f"train-lora plugin: rank {rank}, batch facts: {COPIES.summary()}", flush=True)
            self.census.detach()
            print(f"train-lora plugin: rank {rank}, garbage collection: {self.census.summary()}", flush=True)

    return GcCallback()
