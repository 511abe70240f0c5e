"""The speed-up items as declared records, and what decides, for each, whether it applies.

Each `Item` says what it patches (module and attribute names, as data), the library versions it was measured on
(PEP 440 ranges), its switches (`VLM_LORA_*` environment variables), its effect on the micro-batch planner's memory
model (a named planner flag, or None), and where its code is: an `install` function run when `swift sft` loads the
plugin (None: nothing to do then) and a `check` function run once a trainer has been built, which finishes what
needs the model and says whether the item took hold (both in the item's module beside this file, by name, so that
this module stays standard-library only: the job-environment check and the planner read it without torch).

`gate` decides what can be decided before any code runs: switch, versions, the items it needs. `planned` is the
planner's view of the same decisions (plus what the run's arguments and model config say); the plugin's walk
(`plugin.py`) adds what only the running process can know (a target renamed, nothing found in the model, an
exception) and writes the start-up table (`Table`), which train-lora reads back after the run.

Version ranges. "Verified" means measured on a GPU (benchmarks/README.md): torch 2.11.0, Triton 3.6.0, transformers
5.17.0 (and 5.19.0 for one run), accelerate 1.15.0, peft 0.20.0, ms-swift 4.6.0, liger-kernel 0.8.5. A range starts
at the oldest measured version and stops before the next minor release (the patch releases in between are taken
as measured); transformers spans the two measured releases. torch and Triton gate only the items whose GPU kernels
they compile or run (`Item.gpu_verified`, checked where a GPU is), and only 2.11.x / 3.6.x were measured. A
version outside its range skips the item with a line that names the package, the version and the range.
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PACKAGE = "speedups"
# The environment variable naming the file the plugin writes the start-up table to (train-lora sets it).
TABLE_ENV = "VLM_LORA_SPEEDUPS_TABLE"
TABLE_VERSION = 1

# What was measured (see the module docstring); each item names the packages it depends on.
TRANSFORMERS = ">=5.17,<5.20"
PEFT = ">=0.20,<0.21"
ACCELERATE = ">=1.15,<1.16"
MS_SWIFT = ">=4.6,<4.7"
LIGER = ">=0.8.5,<0.9"
TORCH = ">=2.11,<2.12"
TRITON = ">=3.6,<3.7"

# Why an item did not apply: the table's `kind` and its words.
SWITCH_OFF = "switch off"
VERSION = "version outside the verified range"
TARGET = "target missing or changed"
NOTHING = "found nothing in the model"
NOT_APPLICABLE = "not applicable"
ERROR = "error while installing"
KINDS = (SWITCH_OFF, VERSION, TARGET, NOTHING, NOT_APPLICABLE, ERROR)
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


@dataclass(frozen=True)
class Outcome:
    """Whether an item applied: state "applied", "skipped" or "pending" (installed when the plugin loaded, decided
    once a trainer is built); `kind` one of KINDS when skipped; `detail` the words after it (or what applied)."""

    state: str
    kind: str = ""
    detail: str = ""

    @property
    def applied(self) -> bool:
        return self.state == "applied"

    @property
    def skipped(self) -> bool:
        return self.state == "skipped"

    def line(self) -> str:
        if self.skipped:
            return f"skipped: {self.kind}" + (f" ({self.detail})" if self.detail else "")
        return self.state + (f": {self.detail}" if self.detail else "")


def applied(detail: str = "") -> Outcome:
    return Outcome("applied", detail=detail)


def pending(detail: str = "") -> Outcome:
    return Outcome("pending", detail=detail)


def skipped(kind: str, detail: str = "") -> Outcome:
    assert kind in KINDS, kind
    return Outcome("skipped", kind, detail)


def target_missing(*symbols: object, version_of: str = "") -> Outcome:
    """Skipped: the symbols it patches are not there (or not what it knows), with the installed version."""
    names = ", ".join(str(s) for s in symbols)
    version = installed_version(version_of) if version_of else None
    return skipped(TARGET, names + (f"; {version_of} {version}" if version else ""))


def found_nothing(detail: str) -> Outcome:
    return skipped(NOTHING, detail)


def not_applicable(detail: str) -> Outcome:
    return skipped(NOT_APPLICABLE, detail)


def error(exc: BaseException) -> Outcome:
    """Skipped: an exception while installing, as its one-line text."""
    text = str(exc).strip().splitlines()
    return skipped(ERROR, f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__)


# ---- versions -----------------------------------------------------------------------------------------------------


def installed_version(distribution: str) -> str | None:
    """The installed version of `distribution` (None: not installed). The one source of versions: tests replace it."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def in_range(version: str, spec: str) -> bool:
    """Whether `version` satisfies the PEP 440 `spec` (a local label such as +cu130 is ignored)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return Version(Version(version).public) in SpecifierSet(spec)
    except InvalidVersion:
        return False


def version_problem(item: Item, gpu: bool) -> Outcome | None:
    """Skipped when a package the item depends on is missing (not applicable) or outside its range; else None."""
    ranges = {**item.verified, **(item.gpu_verified if gpu else {})}
    for distribution, spec in ranges.items():
        version = installed_version(distribution)
        if version is None:
            return not_applicable(f"{distribution} not installed")
        if not in_range(version, spec):
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


# ---- the items ------------------------------------------------------------------------------------------------------

QWEN3_VL = "transformers.models.qwen3_vl.modeling_qwen3_vl"
QWEN3_VL_MOE = "transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe"
LIGER_FLCE = "liger_kernel.ops.fused_linear_cross_entropy"

ITEMS: tuple[Item, ...] = (
    Item(
        1, "token_count", "token count without padding (num_input_tokens_seen), read without waiting for the GPU",
        patches=(
            Target("transformers.trainer", "Trainer._track_num_input_tokens"),
            Target("transformers.trainer", "Trainer.log"),
            Target("transformers.trainer", "Trainer._save_checkpoint"),
        ),
        verified={"transformers": TRANSFORMERS},
        switches=(),
        options=(
            Switch("VLM_LORA_ASYNC_TOKENS", "0 (each micro-step's token count read at once) or 1 (read without "
                   "waiting, the default)"),
        ),
        module="token_count", install="install", check="check",
    ),
    Item(
        2, "autocast_input", "no float32 copy of each LoRA input under bf16 autocast (peft's input cast skipped)",
        patches=(Target("peft.tuners.tuners_utils", "BaseTunerLayer._cast_input_dtype"),),
        verified={"peft": PEFT},
        switches=(Switch("VLM_LORA_PEFT_INPUT_CAST", "1 (peft's float32 input casts) or 0 (the default)",
                         default="0", off="1"),),
        module="autocast_input", install="install", check="check",
    ),
    Item(
        3, "fused_lora", "each plain LoRA layer as one autograd function (peft's lora.Linear.forward)",
        patches=(
            Target("peft.tuners.lora.layer", "Linear.forward"),
            # where bitsandbytes is installed: LoRA over its layers, the weight dequantised per use (quantized_lora.py)
            Target("peft.tuners.lora.bnb", "Linear4bit.forward"),
            Target("peft.tuners.lora.bnb", "Linear8bitLt.forward"),
        ),
        verified={"peft": PEFT},
        gpu_verified={"torch": TORCH, "triton": TRITON},
        switches=(Switch("VLM_LORA_FUSED_LORA", "0 (peft's own LoRA forward) or 1 (the fused branch, the default)"),),
        options=(
            Switch("VLM_LORA_LEAN_LORA", "0 (the LoRA function without dropout too) or 1 (autograd's own nodes "
                   "there, the default)"),
            Switch("VLM_LORA_GROUP_LORA", "0 (one rank-r matmul per LoRA layer) or 1 (one per group that reads one "
                   "input, the default)"),
            Switch("VLM_LORA_INPLACE_ADD", "0 (LoRA's product added out of place where the layer runs outside the "
                   "LoRA function) or 1 (into the layer's output in place, the default)"),
            Switch("VLM_LORA_FUSED_BASE", "0 (the frozen layer before the LoRA function) or 1 (inside it, one input "
                   "gradient, the default)"),
            Switch("VLM_LORA_TRITON_LORA", "0 (PyTorch's kernels for LoRA's backward with dropout) or 1 (Triton's, "
                   "on a GPU, the default)"),
            Switch("VLM_LORA_SEEDED_DROPOUT", "1 (LoRA's dropout masks computed from seeds in the Triton kernels on a "
                   "GPU, none kept) or 0 (PyTorch's dropout kernel, a mask kept per adapted layer); unset: the planner "
                   "decides with auto, else 0", default="0"),
            Switch("VLM_LORA_CAST_CACHE", "0 (the adapters cast to the compute dtype in every forward) or 1 (their "
                   "copies kept and refreshed together after each optimizer step, the default)"),
            Switch("VLM_LORA_FOLD_SCALING", "0 (LoRA's scaling as kernels of its own in the backward) or 1 (in the "
                   "kernels that already scale, B's float32 gradient from one matmul, on a GPU, the default)"),
        ),
        memory="fused_lora",
        module="fused_lora", install="install", check="check",
    ),
    Item(
        5, "label_rows", "Liger's fused loss on the labelled rows only",
        patches=(Target("liger_kernel.transformers.model.loss_utils", "fixed_fused_linear_cross_entropy"),),
        verified={"liger-kernel": LIGER},
        switches=(Switch("VLM_LORA_LABEL_ROWS_LOSS", "0 (Liger's loss over every position) or 1 (labelled positions "
                         "only, the default)"),),
        requires=("liger",),
        module="label_rows", install="install", check="check",
    ),
    Item(
        6, "right_padding", "sdpa's causal flag instead of a padding mask for right-padded training batches",
        patches=(Target("transformers.masking_utils", "_ignore_causal_mask_sdpa"),),
        verified={"transformers": TRANSFORMERS},
        switches=(Switch("VLM_LORA_RIGHT_PAD_CAUSAL", "0 (transformers' padding mask) or 1 (causal flag for right "
                         "padding, the default)"),),
        memory="padding_mask",
        requires=("sdpa",),
        module="right_padding", install="install", check="check",
    ),
    Item(
        7, "host_vision", "the vision tower's grid work and the forward's facts from host copies",
        patches=(
            Target("transformers.vision_utils", "get_vision_attention_seqlens"),
            Target("transformers.models.*", "get_vision_attention_seqlens", scope="loaded"),
            *(
                Target(m, a)
                for m in (QWEN3_VL, QWEN3_VL_MOE)
                for a in ("get_vision_position_ids", "get_vision_interpolation_indices_and_weights")
            ),
            Target(QWEN3_VL, "Qwen3VLVisionModel.forward"),
            Target(QWEN3_VL, "Qwen3VLModel.get_image_features"),
            Target(QWEN3_VL, "Qwen3VLModel.get_video_features"),
            Target(QWEN3_VL, "Qwen3VLModel.forward"),
            Target(QWEN3_VL, "Qwen3VLModel.get_placeholder_mask"),
        ),
        verified={"transformers": TRANSFORMERS},
        switches=(Switch("VLM_LORA_HOST_VISION_SEQLENS", "0 (the vision tower's grid work on the GPU: boundaries, "
                         "indices, position ids) or 1 (on the host, the default)"),),
        options=(
            Switch("VLM_LORA_HOST_VISION_GRID", "0 (only the vision boundaries on the host) or 1 (the interpolation "
                   "indices and position ids too, cached per image size on the GPU, the default)"),
            Switch("VLM_LORA_FORWARD_FACTS", "0 (the forward reads its token counts, padding and deepstack positions "
                   "from the GPU where it needs them) or 1 (copied to the host once at its start, the default)"),
        ),
        module="vision_seqlens", install="install_item", check="check",
    ),
    Item(
        8, "liger_swiglu", "Liger's fused SiLU-multiply in Qwen3-VL's MLPs",
        patches=(Target(QWEN3_VL, "Qwen3VLTextMLP.forward", scope="instances"),),
        verified={"transformers": TRANSFORMERS, "liger-kernel": LIGER},
        switches=(Switch("VLM_LORA_LIGER_SWIGLU", "0 (PyTorch's SiLU and multiply) or 1 (Liger's fused kernel with "
                         "Liger on, the default)"),),
        options=(
            Switch("VLM_LORA_SILU_MUL_DOWN", "0 (the MLP's SiLU-multiply output kept for the down projection's LoRA "
                   "backward) or 1 (computed again there from gate and up, the default)"),
        ),
        memory="fused_silu_mul",
        requires=("liger", "qwen3_vl_mlp"),
        module="swiglu", check="check",
    ),
    Item(
        9, "torch_rms_norm", "torch's fused RMSNorm in place of Liger's (CUDA)",
        patches=(Target("transformers.trainer", "apply_liger_kernel"),),
        verified={"transformers": TRANSFORMERS, "liger-kernel": LIGER},
        gpu_verified={"torch": TORCH},
        switches=(Switch("VLM_LORA_TORCH_RMS_NORM", "1 (torch's fused RMSNorm in place of Liger's, on CUDA) or 0 "
                         "(Liger's); unset: torch's with more than one process", default="0",
                         multi_process_default="1"),),
        requires=("liger", "gpu"),
        module="rms_norm", install="install", check="check",
    ),
    Item(
        10, "deepstack", "Qwen3-VL's deepstack additions by position instead of by boolean mask",
        patches=(
            Target(QWEN3_VL, "Qwen3VLTextModel._deepstack_process", scope="instances"),
            Target(QWEN3_VL_MOE, "Qwen3VLMoeTextModel._deepstack_process", scope="instances"),
        ),
        verified={"transformers": TRANSFORMERS},
        switches=(Switch("VLM_LORA_INDEX_DEEPSTACK", "0 (deepstack additions by boolean mask) or 1 (by position, the "
                         "default)"),),
        module="deepstack", check="check",
    ),
    Item(
        11, "memory_cap", "each process's GPU memory capped at VLM_LORA_GPU_MEMORY_GIB",
        patches=(),  # torch.cuda.set_per_process_memory_fraction
        verified={},
        switches=(Switch("VLM_LORA_GPU_MEMORY_GIB", "GiB per GPU, a positive number (e.g. 39.4 for a 40 GB card)",
                         default="", flag=False),),
        requires=("gpu",),
        module="memory_cap", install="install", check="check",
    ),
    Item(
        12, "adapter_save", "ZeRO-1/2 checkpoint saves without a host copy of the frozen base",
        patches=(
            Target("transformers.trainer", "Trainer.save_model"),
            Target("accelerate.accelerator", "Accelerator.get_state_dict"),
        ),
        verified={"transformers": TRANSFORMERS, "accelerate": ACCELERATE, "peft": PEFT},
        switches=(Switch("VLM_LORA_ADAPTER_ONLY_SAVE", "0 (ZeRO-1/2 saves copy the whole model to host memory) or 1 "
                         "(only what the adapter save keeps, the default)"),),
        requires=("zero12",),
        module="adapter_save", install="install", check="check",
    ),
    Item(
        13, "fast_vision", "the frozen vision tower in fewer kernels (matmul patch embedding, Triton rotary, 16-bit "
        "norms)",
        patches=(
            Target(QWEN3_VL, "Qwen3VLVisionPatchEmbed.forward", scope="instances"),
            Target(QWEN3_VL, "Qwen3VLVisionBlock.norm1.forward", scope="instances"),
            Target(QWEN3_VL, "Qwen3VLVisionBlock.norm2.forward", scope="instances"),
            Target(QWEN3_VL, "Qwen3VLVisionPatchMerger.norm.forward", scope="instances"),
            Target("transformers.models.qwen3_vl*", "apply_rotary_pos_emb_vision", scope="loaded"),
        ),
        verified={"transformers": TRANSFORMERS},
        gpu_verified={"torch": TORCH, "triton": TRITON},
        switches=(Switch("VLM_LORA_FAST_VISION", "0 (the vision tower's own Conv3d patch embedding, float32 rotary and "
                         "norms) or 1 (one matmul, one Triton rotary kernel, 16-bit norms: the same values, the "
                         "default)"),),
        module="vision_tower", check="check",
    ),
    Item(
        14, "ddp_comm", "DDP for LoRA: one gradient bucket, no buffer broadcast, gradients as views of the bucket",
        patches=(Target("transformers.trainer", "Trainer._build_accelerator_args"),),
        verified={"transformers": TRANSFORMERS, "accelerate": ACCELERATE},
        switches=(Switch("VLM_LORA_DDP_COMM", "0 (transformers' DDP defaults: 25 MB gradient buckets, buffers "
                         "broadcast every forward, each gradient copied into its bucket and back) or 1 (one bucket for "
                         "the trainable gradients, no broadcast of non-persistent buffers, the gradients views of the "
                         "bucket, the default)"),),
        options=(
            Switch("VLM_LORA_DDP_BUCKET_VIEW", "0 (DDP copies each gradient into its bucket and back) or 1 (the "
                   "gradients are views of the bucket, the default)"),
        ),
        requires=("ddp",),
        module="ddp_comm", install="install", check="check",
    ),
    Item(
        16, "batch_facts", "batch copies queued without waiting; logits_to_keep and the forward's facts from host "
        "copies",
        patches=(
            Target("swift.dataloader.shard", "to_device", scope="loaded"),
            Target("swift.dataloader.dispatcher", "to_device", scope="loaded"),
            Target("swift.trainers.mixin", "SwiftMixin.prepare_logits_to_keep", scope="loaded"),
        ),
        verified={"ms-swift": MS_SWIFT},
        switches=(Switch("VLM_LORA_BATCH_FACTS", "0 (each batch's copy to the GPU waits, and logits_to_keep and the "
                         "forward's facts are read from the GPU) or 1 (read from the batch's host copies, the copies "
                         "queued without waiting, the default)"),),
        module="batch_facts", install="install", check="check",
    ),
    Item(
        17, "grad_nan", "ms-swift's NaN-gradient skip decided on the GPU (fused Adam's found_inf)",
        patches=(Target("swift.trainers.mixin", "SwiftMixin._fix_grad_norm_nan", scope="loaded"),),
        verified={"ms-swift": MS_SWIFT, "accelerate": ACCELERATE},
        gpu_verified={"torch": TORCH},
        switches=(Switch("VLM_LORA_GRAD_NAN_ON_GPU", "0 (ms-swift reads the gradient norm on the host at every "
                         "optimizer step) or 1 (a NaN norm skips the fused optimizer's step on the GPU, the default)"),),
        module="grad_nan", check="check",
    ),
    Item(
        18, "loss_no_wait", "the loss without waiting for the GPU (labelled rows from the host, Liger's count and "
        "gradient check)",
        patches=(
            Target(LIGER_FLCE, "fused_linear_cross_entropy_forward"),
            Target(LIGER_FLCE, "fused_linear_cross_entropy_backward"),
            Target("liger_kernel.transformers.model.loss_utils", "LigerForCausalLMLoss"),
            Target("liger_kernel.transformers.model.*", "LigerForCausalLMLoss", scope="loaded"),
        ),
        verified={"liger-kernel": LIGER},
        switches=(Switch("VLM_LORA_LOSS_NO_WAIT", "0 (the loss reads the GPU: the labelled rows, Liger's count of them "
                         "and its gradient check) or 1 (from the labels' host copy, without waiting, the default)"),),
        needs=(5,),
        requires=("liger",),
        module="liger_waits", install="install", check="check",
    ),
    Item(
        19, "checkpoint_layers", "gradient checkpointing of the first k decoder layers only (the planner's k), the "
        "checkpointed inputs in pinned host memory on request",
        patches=(Target("transformers.modeling_utils", "PreTrainedModel.gradient_checkpointing_enable"),),
        verified={"transformers": TRANSFORMERS},
        switches=(Switch("VLM_LORA_CHECKPOINT_LAYERS", "k, the decoder layers checkpointed from the first (the "
                         "planner sets it with gradient_checkpointing auto); unset: every layer", default="",
                         flag=False),),
        options=(Switch("VLM_LORA_CHECKPOINT_OFFLOAD", "1 (the checkpointed layers' inputs in pinned host memory, "
                        "transformers' offload) or 0 (on the GPU, the default)", default="0"),),
        module="checkpoint_layers", install="install", check="check",
    ),
)  # fmt: skip

BY_NUMBER: dict[int, Item] = {item.number: item for item in ITEMS}
SWITCHES: dict[str, Switch] = {s.name: s for item in ITEMS for s in (*item.switches, *item.options)}
# Switches of deleted items: refused by name with why (a config written for an older release says what to remove).
REMOVED_SWITCHES: dict[str, str] = {
    name: f"item {why}; remove it from the environment section"
    for why, names in (
        (
            "15 (garbage collection at step ends) was deleted on 2026-11-28: no gain beyond the spread on two GPUs",
            ("VLM_LORA_ALIGNED_GC",),
        ),
        (
            "4 (regional torch.compile of the layers) was deleted on 2026-11-28: with the other items on it gained "
            "nothing beyond the spread on two GPUs and ran 3 % slower on one H200",
            ("VLM_LORA_COMPILE_LAYERS", "VLM_LORA_COMPILE_VISION"),
        ),
    )
    for name in names
}


def item(number: int) -> Item:
    return BY_NUMBER[number]


# ---- the planner's view ---------------------------------------------------------------------------------------------


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
        from speedups.swiglu import covers

        return covers(dict(self.model_config))


def quantization_problem(it: Item, quantization: str) -> Outcome | None:
    """Not applicable where the base is quantised by bitsandbytes in a way the item does not serve."""
    if quantization in ("", "none") or quantization in it.quantized:
        return None
    return not_applicable(f"a {quantization} bitsandbytes base (it serves {', '.join(it.quantized) or 'none'})")


def _run_problem(it: Item, run: _Run) -> Outcome | None:
    """Not applicable where the run lacks what the item requires (`Item.requires`), or its base is quantised in a
    way the item does not serve (`Item.quantized`)."""
    from components.common.quantization import quantization_of

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
        """The `_plan.plan_for_run` arguments the memory-relevant items decide."""
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


# ---- the start-up table -----------------------------------------------------------------------------------------------


@dataclass
class Table:
    """The start-up table: each item's outcome, in item order, and the versions the process ran."""

    outcomes: dict[int, Outcome] = field(default_factory=dict)
    versions: dict[str, str | None] = field(default_factory=dict)

    def counts(self) -> tuple[int, int]:
        done = [o for o in self.outcomes.values() if o.state != "pending"]
        return sum(o.applied for o in done), sum(o.skipped for o in done)

    def lines(self) -> list[str]:
        """The table as log lines: a header, then one line per item."""
        got, missed = self.counts()
        out = [f"speed-ups: {got} of {len(ITEMS)} applied, {missed} skipped"]
        for it in ITEMS:
            outcome = self.outcomes.get(it.number, skipped(NOT_APPLICABLE, "not reached"))
            out.append(f"{it.number:>2} {it.name:<15} {outcome.line()}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "version": TABLE_VERSION,
            "items": [
                {"number": it.number, "name": it.name, "memory": it.memory, **asdict(self.outcomes[it.number])}
                for it in ITEMS
                if it.number in self.outcomes
            ],
            "versions": dict(self.versions),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Table:
        outcomes = {
            int(row["number"]): Outcome(str(row["state"]), str(row.get("kind", "")), str(row.get("detail", "")))
            for row in data.get("items", [])
            if int(row.get("number", 0)) in BY_NUMBER
        }
        return cls(outcomes, dict(data.get("versions", {})))

    def write(self, path: str | Path) -> None:
        """Writes the table as JSON, whole: a temporary file beside it, then a rename."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.partial-{os.getpid()}-", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.to_json(), f, indent=1)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def rows(self) -> list[dict[str, Any]]:
        """One row per item for a report: number, name, applied (bool), and the outcome's words."""
        return [
            {"number": it.number, "name": it.name, "applied": self.outcomes[it.number].applied,
             "outcome": self.outcomes[it.number].line()}
            for it in ITEMS
            if it.number in self.outcomes
        ]  # fmt: skip

    def metrics(self) -> dict[str, int]:
        """`speedups_applied`, `speedups_skipped` and one 0 / 1 per item (`speedup_<number>_<name>`)."""
        got, missed = self.counts()
        out = {"speedups_applied": got, "speedups_skipped": missed}
        out.update({it.key: int(self.outcomes.get(it.number, Outcome("skipped")).applied) for it in ITEMS})
        return out


def read_table(path: str | Path) -> Table | None:
    """The table a run wrote (None: no file, or not one this version reads)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != TABLE_VERSION:
        return None
    return Table.from_json(data)


def disagreements(plan: Planned, table: Table) -> list[str]:
    """One line per memory-relevant item whose outcome in the run differs from what the planner assumed."""
    lines = []
    for it in ITEMS:
        if it.memory is None or it.number not in table.outcomes:
            continue
        expected, got = plan.outcomes[it.number], table.outcomes[it.number]
        if expected.applied != got.applied:
            lines.append(
                f"item {it.number} ({it.name}, planner flag {it.memory}): the plan assumed it "
                f"{'applies' if expected.applied else 'does not apply'}, the run says {got.line()}; "
                "the memory plan was made for the other case"
            )
    return lines


def versions_in_use() -> dict[str, str | None]:
    """The installed versions of every package an item names."""
    names = sorted({d for it in ITEMS for d in (*it.verified, *it.gpu_verified)})
    return {name: installed_version(name) for name in names}


def loaded_modules(pattern: str) -> list[Any]:
    """The loaded modules whose name matches `pattern` (a Target's module)."""
    return [m for name, m in list(sys.modules.items()) if m is not None and fnmatch.fnmatchcase(name, pattern)]
