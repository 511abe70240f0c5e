"""The records the items are declared with: a switch, a patched symbol, an item (`items.py` holds the items)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from speedups.outcome import Outcome

PACKAGE = "speedups"
# the bitsandbytes bases an item can serve (`Item.quantized`; components/common/quantization.py's settings)
QUANTIZED = ("nf4", "int8")


@dataclass(frozen=True)
class Switch:
    """One `VLM_LORA_*` environment variable.

    Attributes:
        name: The variable.
        values: What each value does (the job-environment check's message and the docs).
        default: The value when unset. Default "1".
        off: The value that turns the item (or option) off. Default "0".
        multi_process_default: The value when unset with more than one process (item 9). Default None
            (`default` either way).
        flag: A 0 / 1 switch (True), or a value such as a size (False: on when set). Default True.
    """

    name: str
    values: str
    default: str = "1"
    off: str = "0"
    multi_process_default: str | None = None
    flag: bool = True

    def value(self, environ: Mapping[str, str], world_size: int = 1) -> str:
        """The value in effect: the environment's, else the default (the multi-process one with several)."""
        text = str(environ.get(self.name, "") or "").strip()
        if text:
            return text
        if self.multi_process_default is not None and world_size > 1:
            return self.multi_process_default
        return self.default

    def on(self, environ: Mapping[str, str], world_size: int = 1) -> bool:
        value = self.value(environ, world_size)
        return bool(value) if not self.flag else value != self.off

    def said(self, environ: Mapping[str, str], world_size: int = 1) -> str:
        """`NAME=value` as set, or `NAME unset: default v[ with one process]`."""
        text = str(environ.get(self.name, "") or "").strip()
        if text:
            return f"{self.name}={text}"
        if not self.flag:
            return f"{self.name} unset"
        which = ""
        if self.multi_process_default is not None:
            which = " with more than one process" if world_size > 1 else " with one process"
        return f"{self.name} unset: default {self.value(environ, world_size)}{which}"


@dataclass(frozen=True)
class Target:
    """A third-party symbol an item replaces or wraps: `attribute` (dotted below the module: `Class.method`) of
    `module` (an fnmatch pattern such as `transformers.models.*` where every loaded module that holds it is
    wrapped). `scope`: "module" (the item imports the module and replaces the attribute), "loaded" (only where
    something else loaded the module: the item never imports it) or "instances" (on each instance the item finds
    in the model: the class is left as it is)."""

    module: str
    attribute: str
    scope: str = "module"

    def __str__(self) -> str:
        return f"{self.module}.{self.attribute}"


@dataclass(frozen=True)
class Item:
    """One speed-up (see the module docstring).

    Attributes:
        number: Its number (docs/speedups.md; the plugin's lines and the tests use it).
        name: A short identifier (the Metrics key `speedup_<number>_<name>`).
        summary: One line: what it does.
        patches: The third-party symbols it replaces or wraps.
        verified: {distribution: PEP 440 range} it was measured on (checked wherever it runs).
        gpu_verified: {distribution: range} checked only where a GPU runs the item's kernels (torch, Triton).
        switches: Its switches; it applies while any of them is on (none: always on).
        options: Switches that tune it without turning it off (reported, not gated).
        memory: The planner flag its effect on memory sets (`Planned.memory_flags`), or None.
        module: Its module in this package.
        install: The function of `module` run when the plugin loads: `install(ctx) -> Outcome`; None = none.
        check: The function of `module` run once a trainer is built: `check(ctx, trainer) -> Outcome`.
        needs: Items that must have applied for this one to apply.
        requires: What it needs of the run, by name (`REQUIREMENTS`: Liger on, sdpa, a GPU, DDP, ...): the
            planner's view; the item's own code checks the same where it runs.
        quantized: The bitsandbytes bases (`model.quantization`: nf4, int8) it serves; on another it is not
            applicable (the planner's view, and the plugin's once it sees the model). Default both.
    """

    number: int
    name: str
    summary: str
    patches: tuple[Target, ...]
    verified: Mapping[str, str]
    switches: tuple[Switch, ...]
    module: str
    check: str
    install: str | None = None
    gpu_verified: Mapping[str, str] = field(default_factory=dict)
    options: tuple[Switch, ...] = ()
    memory: str | None = None
    needs: tuple[int, ...] = ()
    requires: tuple[str, ...] = ()
    quantized: tuple[str, ...] = QUANTIZED

    @property
    def key(self) -> str:
        return f"speedup_{self.number:02d}_{self.name}"

    def function(self, which: str) -> Callable[..., Outcome]:
        module = importlib.import_module(f"{PACKAGE}.{self.module}")
        return getattr(module, getattr(self, which))
