"""What decides, for each item, whether it applies: `gate` before any of its code runs (switch, the items it needs,
versions), and `planned`, the micro-batch planner's view of the same decisions plus what the run's arguments and
model config say. The plugin's walk (`plugin.py`) adds what only the running process can know.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from speedups import versions
from speedups.items import BY_NUMBER, ITEMS, SWITCHES
from speedups.model_config import covers, quantization_of
from speedups.outcome import (
    SWITCH_OFF,
    VERSION,
    Outcome,
    applied,
    not_applicable,
    skipped,
    target_missing,
)
from speedups.records import Item


def version_problem(item: Item, gpu: bool) -> Outcome | None:
    """Skipped when a package the item depends on is missing (not applicable) or outside its range; else None."""
    ranges = {**item.verified, **(item.gpu_verified if gpu else {})}
    for distribution, spec in ranges.items():
        version = versions.installed_version(distribution)
        if version is None:
            return not_applicable(f"{distribution} not installed")
        if not versions.in_range(version, spec):
            return skipped(VERSION, f"{distribution} {version}, verified {spec}")
    return None


# ---- the decision before any code runs ----------------------------------------------------------------------------


def switches_off(item: Item, environ: Mapping[str, str], world_size: int) -> Outcome | None:
    if not item.switches or any(s.on(environ, world_size) for s in item.switches):
        return None
    return skipped(SWITCH_OFF, ", ".join(s.said(environ, world_size) for s in item.switches))


def gate(
    item: Item, environ: Mapping[str, str], world_size: int, gpu: bool, outcomes: Mapping[int, Outcome]
) -> Outcome | None:
    """Why the item cannot apply before any of its code runs (switch, the items it needs, versions); None: try it."""
    off = switches_off(item, environ, world_size)
    if off is not None:
        return off
    for number in item.needs:
        if number in outcomes and outcomes[number].skipped:
            return not_applicable(f"needs item {number}, {outcomes[number].line()}")
    return version_problem(item, gpu)


def world_size(environ: Mapping[str, str]) -> int:
    """Training processes in all, as torchrun sets WORLD_SIZE (1 without it)."""
    try:
        return max(int(environ.get("WORLD_SIZE", "1") or 1), 1)
    except ValueError:
        return 1


def option_on(name: str, environ: Mapping[str, str] = os.environ, world: int = 1) -> bool:
    """Whether the switch or option `name` of any item is on (its declared default where unset)."""
    return SWITCHES[name].on(environ, world)


def _lora_targets(swift_args: Mapping[str, Any]) -> list[str]:
    targets = swift_args.get("target_modules") or "all-linear"  # ms-swift's default
    return [targets] if isinstance(targets, str) else [str(t) for t in targets]


def _target_problem(item: Item) -> Outcome | None:
    """Target missing where its module cannot be found (the modules it never imports itself are not asked)."""
    for target in item.patches:
        if target.scope != "module" or any(c in target.module for c in "*?["):
            continue
        try:
            found = importlib.util.find_spec(target.module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return target_missing(target)
    return None


# What an item needs of the run (`Item.requires`), each a check of the run's arguments, model config and GPUs:
# (the words of the skip, the check).
REQUIREMENTS: dict[str, tuple[str, Callable[..., bool]]] = {
    "liger": ("use_liger_kernel off", lambda run: bool(run.swift_args.get("use_liger_kernel"))),
    "sdpa": ("attention is not sdpa", lambda run: run.attn == "sdpa"),
    "gpu": ("no GPU", lambda run: run.gpu),
    "ddp": ("one process, or DeepSpeed moves the gradients", lambda run: run.world > 1 and not run.deepspeed),
    "qwen3_vl_mlp": ("no MLP of the classes it knows in this model type", lambda run: run.swiglu_model),
    "zero12": (
        "no DeepSpeed ZeRO-1/2",
        lambda run: run.deepspeed and "zero3" not in str(run.swift_args.get("deepspeed")).lower(),
    ),
}


@dataclass(frozen=True)
class _Run:
    """What `planned` knows of the training job."""

    environ: Mapping[str, str]
    world: int
    swift_args: Mapping[str, Any]
    model_config: Mapping[str, Any]
    gpu: bool

    @property
    def attn(self) -> str:
        return str(self.swift_args.get("attn_impl") or "sdpa")

    @property
    def deepspeed(self) -> bool:
        return bool(self.swift_args.get("deepspeed"))

    @property
    def swiglu_model(self) -> bool:
        return covers(dict(self.model_config))


def quantization_problem(it: Item, quantization: str) -> Outcome | None:
    """Not applicable where the base is quantised by bitsandbytes in a way the item does not serve."""
    if quantization in ("", "none") or quantization in it.quantized:
        return None
    return not_applicable(f"a {quantization} bitsandbytes base (it serves {', '.join(it.quantized) or 'none'})")


def _run_problem(it: Item, run: _Run) -> Outcome | None:
    """Not applicable where the run lacks what the item requires (`Item.requires`), or its base is quantised in a
    way the item does not serve (`Item.quantized`)."""
    problem = quantization_problem(it, quantization_of(dict(run.swift_args)))
    if problem is not None:
        return problem
    for name in it.requires:
        words, holds = REQUIREMENTS[name]
        if not holds(run):
            return not_applicable(words)
    return None


@dataclass(frozen=True)
class Planned:
    """Which items the planner expects to apply ({number: Outcome}), and the planner's memory flags."""

    outcomes: Mapping[int, Outcome]
    seeded_dropout: str = "off"
    silu_mul_down: bool = False
    attn: str = "sdpa"
    partial_checkpointing: bool = False  # item 19 can run where the plan sets its switch (version, target)

    def applies(self, number: int) -> bool:
        return self.outcomes[number].applied

    def memory_flags(self) -> dict[str, Any]:
        """The `_plan_run.plan_for_run` arguments the memory-relevant items decide."""
        flags: dict[str, Any] = {}
        for it in ITEMS:
            if it.memory == "fused_lora":
                flags["fused_lora"] = self.applies(it.number)
            elif it.memory == "padding_mask":  # the causal flag applied: no mask (eager always has one)
                flags["padding_mask"] = self.attn == "eager" or (self.attn == "sdpa" and not self.applies(it.number))
            elif it.memory == "fused_silu_mul":
                flags["fused_silu_mul"] = self.applies(it.number)
        flags["silu_mul_down"] = self.silu_mul_down and flags.get("fused_silu_mul", False)
        flags["seeded_dropout"] = self.seeded_dropout if flags.get("fused_lora") else "off"
        flags["partial_checkpointing"] = self.partial_checkpointing
        return flags


def planned(
    environ: Mapping[str, str],
    world: int,
    swift_args: Mapping[str, Any],
    model_config: Mapping[str, Any],
    gpu: bool = True,
) -> Planned:
    """Which items will apply in the training job, as far as the job environment, the world size, the run's
    arguments and the model config tell (switch, versions, target importable, Liger / attention / GPU); what only
    the running process knows (nothing found in the model, an exception) is in its table (`Table`).

    Args:
        environ: The training job's environment (the config's section over this process's).
        world: Training processes in all.
        swift_args: The run's `swift sft` arguments.
        model_config: The base model's config.json.
        gpu: Whether the job runs on GPUs. Default True.

    Returns:
        The Planned outcomes and memory flags.
    """
    outcomes: dict[int, Outcome] = {}
    for it in ITEMS:
        run = _Run(environ, world, swift_args, model_config, gpu)
        outcome = gate(it, environ, world, gpu, outcomes) or _run_problem(it, run) or _target_problem(it)
        outcomes[it.number] = outcome or applied()
    targets = _lora_targets(swift_args)
    seeded = SWITCHES["VLM_LORA_SEEDED_DROPOUT"]
    text = str(environ.get(seeded.name, "") or "").strip()
    if text == "0" or not option_on("VLM_LORA_TRITON_LORA", environ) or "all-linear" not in targets:
        seeded_dropout = "off"  # the planner's mask figure assumes LoRA on every linear layer
    else:
        seeded_dropout = "on" if text == "1" else "auto"
    down = option_on("VLM_LORA_SILU_MUL_DOWN", environ) and any(
        t == "all-linear" or t.endswith("down_proj") for t in targets
    )
    attn = str(swift_args.get("attn_impl") or "sdpa")
    layers = BY_NUMBER[19]  # the plan sets its switch: only what else decides it counts here
    run = _Run(environ, world, swift_args, model_config, gpu)
    partial = not (version_problem(layers, gpu) or _run_problem(layers, run) or _target_problem(layers))
    return Planned(
        outcomes, seeded_dropout=seeded_dropout, silu_mul_down=down, attn=attn, partial_checkpointing=partial
    )
