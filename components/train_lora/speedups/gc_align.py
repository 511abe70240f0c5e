"""Python's garbage collection during training: counted, and under several processes run at step ends (item 15 of
registry.py).

CPython collects whenever enough objects have been allocated, so each training process pauses at moments of
its own, in the middle of a forward whose kernels the host launches one by one. With DDP the other process
then waits for it at the next all-reduce: every rank's pauses add up to every rank's step. Megatron-LM's
`--manual-gc` answers the same straggling: automatic collection off, collections at fixed iterations on all
ranks. `AlignedGc` does that for the Trainer: at the start of training it collects once and freezes what
exists then (the model, the dataset, the libraries: `gc.freeze`, so no later collection walks them), turns the
automatic collector off, and at the end of every optimizer step collects the young generations (objects of
that step: cheap, and cyclic garbage that holds a GPU tensor is freed within a step as before), the oldest
every `full_every` steps, and the young ones after each micro-step that accumulates gradients and after each
evaluation batch (so cyclic garbage lives no longer than one micro-step, as the memory plan assumes). At the end
of training it turns everything back as it was.

Processes forked while it is on (the data loader's workers) get the automatic collector back at once: they decode
images for the whole run and have no step ends (`os.register_at_fork`; what was frozen stays frozen there too,
which spares their copies of the parent's pages).

`GcCensus` counts every collection and how long it paused the host (`gc.callbacks`), automatic or not; the
plugin logs it at the end of training on every rank.

Pure (the `gc` module and a clock, no torch); tests/test_gc_align.py runs it.
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass, field

# the oldest generation's collection, every so many optimizer steps (objects that lived through a step's
# young collection; the frozen ones are not walked)
FULL_EVERY = 50

# True while an AlignedGc has turned off a collector that was on: a forked child turns it on again
_ENABLE_IN_CHILD = False
_HOOKED = False


def _child_after_fork() -> None:
    if _ENABLE_IN_CHILD:
        gc.enable()


def _enable_in_children(on: bool) -> None:
    global _ENABLE_IN_CHILD, _HOOKED
    _ENABLE_IN_CHILD = on
    if on and not _HOOKED and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_child_after_fork)
        _HOOKED = True


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


class AlignedGc:
    """Automatic collection off during training; young generations collected at each step's end, all of them every
    `full_every` steps, so every process pauses at the same point of the same step."""

    def __init__(self, full_every: int = FULL_EVERY) -> None:
        if full_every < 1:
            raise ValueError(f"full_every must be a positive number of steps, not {full_every}")
        self.full_every = full_every
        self.active = False
        self._was_enabled = True
        self.collections = 0

    def start(self) -> None:
        """Collect once, freeze what survives, turn the automatic collector off."""
        if self.active:
            return
        self._was_enabled = gc.isenabled()
        gc.collect()
        gc.freeze()
        gc.disable()
        _enable_in_children(self._was_enabled)
        self.active = True

    def step_end(self, step: int) -> int:
        """At the end of optimizer step `step`: the generation collected (1, or 2 every `full_every` steps)."""
        if not self.active:
            return -1
        generation = 2 if step % self.full_every == 0 else 1
        gc.collect(generation)
        self.collections += 1
        return generation

    def young(self) -> None:
        """The young generations only: after each micro-step that accumulates and each evaluation batch, so that
        neither keeps its cyclic garbage until the step ends (all ranks run the same number of both)."""
        if self.active:
            gc.collect(1)
            self.collections += 1

    def stop(self) -> None:
        """Collector back as it was before `start` (frozen objects back under its watch)."""
        if not self.active:
            return
        self.active = False
        _enable_in_children(False)
        gc.unfreeze()
        if self._was_enabled:
            gc.enable()


# ---- item 15 of the plugin (registry.py), and the collection census every trainer gets ---------------------------------


def gc_callback(environ=None, aligned: bool = False, batch_facts: bool = False):
    """A TrainerCallback that counts garbage collections during training (every rank logs them at the end) and, with
    `aligned` (item 15), runs them at step ends only; with `batch_facts`, item 16's lookups are logged too."""
    from transformers import TrainerCallback

    environ = os.environ if environ is None else environ

    class GcCallback(TrainerCallback):
        def __init__(self) -> None:
            self.census = GcCensus()
            self.aligner = AlignedGc() if aligned else None

        def on_train_begin(self, args, state, control, **kwargs):
            if self.aligner is not None:
                self.aligner.start()
                print(
                    "train-lora plugin: garbage collection at step ends on every rank (automatic collection off; "
                    f"all generations every {self.aligner.full_every} steps)",
                    flush=True,
                )
            self.census.attach()

        def on_step_end(self, args, state, control, **kwargs):
            if self.aligner is not None:
                self.aligner.step_end(state.global_step)

        def on_substep_end(self, args, state, control, **kwargs):  # a micro-step that accumulates
            if self.aligner is not None:
                self.aligner.young()

        on_prediction_step = on_substep_end  # an evaluation batch: the same

        def on_train_end(self, args, state, control, **kwargs):
            rank = environ.get("RANK", "0")
            if batch_facts:  # item 16's lookups, on every rank (one line)
                from components.train_lora.speedups.batch_facts import COPIES

                print(f"train-lora plugin: rank {rank}, batch facts: {COPIES.summary()}", flush=True)
            self.census.detach()
            if self.aligner is not None:
                self.aligner.stop()
            how = "at step ends" if self.aligner is not None else "automatic"
            print(f"train-lora plugin: rank {rank}, collection {how}: {self.census.summary()}", flush=True)

    return GcCallback()


def check(ctx, trainer):
    """Item 15 applies to every trainer built while its switch is on (the plugin adds the callback)."""
    from components.train_lora.speedups import registry

    return registry.applied(f"collections at step ends, all generations every {FULL_EVERY} steps")
