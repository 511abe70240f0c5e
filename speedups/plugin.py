"""The plugin's walk over the registry (`registry.ITEMS`): once when `swift sft` loads it, once per trainer built.

When the plugin loads, each item whose switch is on, whose packages are in their verified range and whose needs
applied runs its `install` (in item order); an exception, or a target it does not find, skips it with a line and
puts back what it replaced (`patching.restore`). A wrapped `Trainer.__init__` then runs, once the trainer holds its
model, each item's `check`: what needs the model (compilation, deepstack, the vision tower, grouped LoRA layers,
Liger's SiLU-multiply, ms-swift's readers, ...) and whether the item took hold. At that point every item has
either taken hold or not: one table is logged (`registry.Table.lines`), and rank 0 writes it as JSON where
`VLM_LORA_SPEEDUPS_TABLE` names a file (train-lora reads it into its Metrics).

Nothing here crashes training for an item: whatever an item raises skips it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from speedups import patching, registry
from speedups.registry import ITEMS, Item, Outcome, Table

PREFIX = "train-lora plugin: "


def say(line: str) -> None:
    print(PREFIX + line, flush=True)


@dataclass
class Context:
    """What the items see: the environment, whether a GPU is there, the outcomes so far, and what items hand on to
    each other (`state`: e.g. what item 7 wrapped)."""

    environ: Mapping[str, str]
    gpu: bool
    loaded: dict[int, Outcome] = field(default_factory=dict)  # decided when the plugin loaded
    outcomes: dict[int, Outcome] = field(default_factory=dict)  # the last trainer's
    state: dict[str, Any] = field(default_factory=dict)
    tables: list[Table] = field(default_factory=list)  # one per trainer built

    @property
    def world(self) -> int:
        return registry.world_size(self.environ)

    def outcome(self, number: int) -> Outcome | None:
        return self.outcomes.get(number) or self.loaded.get(number)

    def on(self, number: int) -> bool:
        """Whether the item applied or is installed and waiting for a trainer."""
        outcome = self.outcome(number)
        return outcome is not None and not outcome.skipped

    def say(self, line: str) -> None:
        say(line)


_CONTEXT: Context | None = None


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _attempt(item: Item, ctx: Context, which: str, *args: Any) -> Outcome:
    """The item's `install` or `check`; an exception skips it, and what it replaced is put back."""
    patching.remember(item)
    try:
        outcome = item.function(which)(ctx, *args)
    except ImportError as exc:
        patching.restore(item)
        return registry.target_missing(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    except Exception as exc:  # noqa: BLE001 - an item never stops training
        patching.restore(item)
        return registry.error(exc)
    if outcome.skipped and outcome.kind in (registry.TARGET, registry.ERROR):
        patching.restore(item)
    return outcome


def install(environ: Mapping[str, str] = os.environ) -> Context:
    """Runs the items' `install` once per process (later calls return the same context) and wraps
    `Trainer.__init__`, which runs their `check` for each trainer built."""
    global _CONTEXT
    if _CONTEXT is not None:
        return _CONTEXT
    ctx = Context(environ, _cuda())
    for item in ITEMS:
        if item.install is None:  # decided when a trainer is built
            continue
        outcome = registry.gate(item, environ, ctx.world, ctx.gpu, ctx.loaded)
        ctx.loaded[item.number] = outcome or _attempt(item, ctx, "install")
        if ctx.loaded[item.number].skipped and outcome is None:
            say(f"item {item.number} ({item.name}) {ctx.loaded[item.number].line()}")
    _wrap_trainer_init(ctx)
    _CONTEXT = ctx
    return ctx


def loaded(number: int) -> Outcome | None:
    """An item's outcome when the plugin loaded (None: not loaded, or decided when a trainer is built)."""
    return None if _CONTEXT is None else _CONTEXT.loaded.get(number)


def context() -> Context | None:
    return _CONTEXT


def trainer_built(ctx: Context, trainer: Any) -> Table:
    """Each item's `check` on a built trainer, then the start-up table: logged and written by rank 0 (the other ranks
    log how many applied on them)."""
    ctx.outcomes = {}
    quantized = _quantization(trainer)
    for item in ITEMS:
        before = ctx.loaded.get(item.number)
        unserved = registry.quantization_problem(item, quantized)
        if before is not None and before.skipped:
            outcome = before
        elif unserved is not None:  # installed, but the base is quantised in a way it does not serve
            patching.restore(item)
            outcome = unserved
        elif before is None:  # decided now: its switch as set now
            outcome = registry.gate(item, ctx.environ, ctx.world, ctx.gpu, ctx.outcomes)
            outcome = outcome or _attempt(item, ctx, "check", trainer)
        else:
            outcome = _attempt(item, ctx, "check", trainer)
            if outcome.skipped and outcome.kind in (registry.TARGET, registry.ERROR):
                ctx.loaded[item.number] = outcome  # put back: it stays off for later trainers too
        ctx.outcomes[item.number] = outcome
    _add_census(ctx, trainer)
    table = Table(dict(ctx.outcomes), registry.versions_in_use())
    rank = str(ctx.environ.get("RANK", "0") or "0")
    lines = table.lines()
    if rank == "0":  # the table once per job; every other rank its header, which names how many applied there
        for line in lines:
            say(line)
    else:
        say(f"rank {rank}, {lines[0]}")
    path = ctx.environ.get(registry.TABLE_ENV, "")
    if path and rank == "0":
        table.write(path)
    ctx.tables.append(table)
    trainer.__dict__["_vlm_lora_speedups"] = table
    return table


def _quantization(trainer: Any) -> str:
    """The bitsandbytes quantisation of the trainer's model (nf4, int8 or none)."""
    model = getattr(trainer, "model", None)
    if model is None:
        return "none"
    from speedups.quantized_lora import quantization_of_model

    return quantization_of_model(model)


def check_model(model: Any, training_args: Any = None) -> dict[int, Outcome]:
    """The trainer-time walk on `model` alone (a stand-in trainer holding it): what each item did to it. For tests
    and benchmarks; the plugin is installed first where it is not."""
    import types

    stand_in = types.SimpleNamespace(model=model, args=training_args, accelerator=None)
    return dict(trainer_built(install(), stand_in).outcomes)


def _add_census(ctx: Context, trainer: Any) -> None:
    """The garbage-collection census every rank logs at the end of training (item 16's lookups with it)."""
    from speedups.gc_census import gc_callback

    if hasattr(trainer, "add_callback"):
        trainer.add_callback(gc_callback(ctx.environ, batch_facts=ctx.on(16)))


def _wrap_trainer_init(ctx: Context) -> None:
    """Wraps `Trainer.__init__`: the items' checks and the start-up table after it."""
    try:
        from transformers import Trainer
    except ImportError:
        return
    original = Trainer.__init__
    if getattr(original, "_vlm_lora_init", False):
        return
    patching.remember_attribute(Trainer, "__init__")

    @functools.wraps(original)  # ms-swift reads the signature (tokenizer vs processing_class)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        trainer_built(ctx, self)

    __init__._vlm_lora_init = True
    Trainer.__init__ = __init__


def reset() -> int:
    """Puts back every symbol the items and the plugin replaced and forgets the walk, so that the next
    `install` starts afresh (tests: no test sees another's patches); how many symbols changed back."""
    global _CONTEXT
    import sys

    changed = patching.restore()
    _CONTEXT = None
    entry = f"{registry.PACKAGE}.swift_plugin"
    sys.modules.pop(entry, None)
    package = sys.modules.get(registry.PACKAGE)
    if package is not None and "swift_plugin" in vars(package):
        delattr(package, "swift_plugin")
    return changed
