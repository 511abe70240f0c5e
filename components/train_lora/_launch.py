"""Where and how `swift sft` is launched: nodes, ranks, GPUs per node, DDP / ZeRO choice.

Pure functions of their inputs (environment, GPU count and memory, model size), so the
multi-node and multi-GPU logic is unit-tested on a CPU machine.

Where this node sits (Vertex's `CLUSTER_SPEC` or a JobSet's environment: `launch_plan`) and its GPUs
(`detect_gpus`) are read by `components.common.cluster`, which the preflight shares.

Strategy rule (`choose_strategy`), from 2×H200 measurements of Qwen3-VL LoRA. Issue 5: ZeRO-3,
batch 1: 0.68 samples/s; DDP, batch 1: 2.72 samples/s. ZeRO-3 shards the frozen base weights and
gathers them for every layer of every step, which is what makes it 4-13× slower. With LoRA the
trainable state is tiny (tens of MB), so ZeRO-2's sharding of it frees nothing worth having, and
it costs: 2026-11-26, the 4B with the same plan (8 rows per GPU, no checkpointing), ZeRO-2 0.626
s/step against DDP 0.540 (+16 %); and each checkpoint save of the 30B-A3B under ZeRO-2 took 42 s
(a step: 0.77 s) for a 103 MB checkpoint. The cause, read in the code: for ZeRO-1/2, transformers'
`save_model` takes accelerate's `get_state_dict`, which clones every tensor of the model, the
frozen base included, to host memory (`clone_tensors_for_torch_save`) before the adapter is kept;
DDP saves the adapter alone, as one GPU does (the train-lora plugin now spares a user's ZeRO-1/2 that
copy too: `adapter_save.py`). Hence:

* one GPU in all: no deepspeed;
* the frozen base fits one GPU (weights ≤ FIT_FRACTION of its memory, the rest left for
  activations, LoRA state and the CUDA context): plain DDP (no deepspeed needed);
* only when it does not fit: ZeRO-3;
* when it does not fit even sharded over every GPU of the job: ModelTooLargeError before
  `swift sft`, with the size and the smallest profile that fits (`components.common.model_fit`);
* a `deepspeed` key in the config's `swift` section is the user's choice and always wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.common.cluster import LaunchPlan
from components.common.errors import TrainError
from components.common.model_fit import FIT_FRACTION, ModelTooLarge, check_fits
from components.train_lora._input_checks import expert_count, load_model_config, quantized_weight_bytes

# NCCL / torch.distributed timeout (seconds) set for distributed runs when the config does
# not set swift.ddp_timeout (ms-swift's own default is 18,000,000 s: a hung peer would keep
# every GPU of the job busy for months). Long enough for rank 0's dataset preprocessing.
DEFAULT_DDP_TIMEOUT_S = 3600

_DTYPE_BYTES = {"float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2, "float64": 8}


@dataclass(frozen=True)
class Launch:
    """How this node trains: the launch plan and the GPUs it has."""

    plan: LaunchPlan
    gpu_count: int  # GPUs visible on this node
    gpu_memory: int  # bytes per GPU


class LaunchError(TrainError):
    """The launch environment is wrong (a TrainError, so the component reports it the same way)."""


class ModelTooLargeError(LaunchError):
    """The frozen base does not fit the job's GPUs even sharded with ZeRO-3 (size and a profile that fits named)."""


class GPUCountError(LaunchError):
    """The resources profile asks for more GPUs than this machine has."""


def check_gpu_count(expected: int, present: int) -> None:
    """Refuses a profile that asks for more GPUs than the node has (before any work).

    Args:
        expected: GPUs per node the resources profile asks for (0 = no expectation).
        present: GPUs detected.

    Raises:
        GPUCountError: expected > present.
    """
    if expected and present < expected:
        raise GPUCountError(
            f"the resources profile asks for {expected} GPU(s) per node but {present} are visible "
            "(CUDA_VISIBLE_DEVICES, driver, or a machine type with fewer GPUs): fix resources.accelerator_count"
        )


def distributed_swift_args(
    swift_args: Mapping[str, Any], plan: LaunchPlan, ddp_timeout_s: int | None = None
) -> dict[str, Any]:
    """Returns the swift arguments a distributed run adds (the NCCL timeout).

    Args:
        swift_args: The config's `swift` section; a `ddp_timeout` there wins.
        plan: The launch plan; nothing is added to a single-process run.
        ddp_timeout_s: Timeout in seconds; None = DEFAULT_DDP_TIMEOUT_S.

    Returns:
        {"ddp_timeout": seconds} or {}.
    """
    if not plan.distributed or "ddp_timeout" in swift_args:
        return {}
    return {"ddp_timeout": int(ddp_timeout_s or DEFAULT_DDP_TIMEOUT_S)}


def ddp_unused_args(args: Mapping[str, Any], strategy: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """`{"ddp_find_unused_parameters": False}` where DDP needs no search for unused parameters, else {}.

    transformers asks DDP for the search whenever the model is not a bare PreTrainedModel (peft's wrapper is not):
    a walk of the autograd graph after every forward, 5.6 % of a step on two H200s (0.555 against 0.523 s by median,
    2026-11-26, benchmarks/train_throughput.py auto_liger_nounused). Left on where a trainable parameter may
    miss a step's forward: a config that sets it, a mixture of experts (an expert no token reached on a rank), a
    vision tower or aligner that trains (a batch without images skips them). Otherwise every trainable parameter
    of LoRA gets a gradient every step.

    Args:
        args: The run's swift arguments.
        strategy: The chosen `Strategy.name`.
        config: The base model's config.json.
    """
    if strategy != "ddp" or "ddp_find_unused_parameters" in args or expert_count(config):
        return {}
    if not (_truthy(args.get("freeze_vit", True)) and _truthy(args.get("freeze_aligner", True))):
        return {}
    return {"ddp_find_unused_parameters": False}


def _truthy(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() not in ("false", "0", "no", "off", "")


@dataclass
class Strategy:
    """The parallelism choice.

    Attributes:
        name: "single", "ddp", "zero3" or "user" (a ZeRO-1/2 is only ever the user's choice).
        deepspeed: Value for swift's `deepspeed` argument (None = do not set it).
        reason: One line that says why (printed in the task log).
    """

    name: str
    deepspeed: str | None
    reason: str


def model_weight_bytes(model_dir: str | Path, torch_dtype: str | None = None, quantization: str = "none") -> int:
    """Bytes of the model's weights once loaded in `torch_dtype` (from the safetensors sizes).

    It reads config.json itself; a run derives the figure once, in `_facts.RunFacts`, from the same parts
    (`stored_weight_bytes`, `scaled_weight_bytes`) and the config.json it read already.

    Args:
        model_dir: Model folder (config.json + *.safetensors).
        torch_dtype: The dtype training loads it in (swift.torch_dtype); None = as stored.
        quantization: nf4 / int8: the linear layers as bitsandbytes stores them, the rest in bf16
            (`components.common.quantization`). Default "none".

    Returns:
        Estimated bytes (0 when the folder has no safetensors).
    """
    if quantization != "none":
        return quantized_weight_bytes(model_dir, quantization)
    stored = stored_weight_bytes(model_dir)
    if not torch_dtype or not stored:
        return stored
    return scaled_weight_bytes(stored, load_model_config(model_dir), torch_dtype)


def stored_weight_bytes(model_dir: str | Path) -> int:
    """Bytes of the model folder's safetensors files as stored."""
    return sum(p.stat().st_size for p in Path(model_dir).glob("*.safetensors"))


def scaled_weight_bytes(stored: int, config: Any, torch_dtype: str | None) -> int:
    """`stored` bytes in `torch_dtype`, from the stored dtype config.json names (as stored when either is unknown)."""
    if not torch_dtype or not stored or not isinstance(config, dict):
        return stored
    text_cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    stored_dtype = (
        config.get("torch_dtype") or config.get("dtype") or text_cfg.get("torch_dtype") or text_cfg.get("dtype")
    )
    src, dst = _DTYPE_BYTES.get(str(stored_dtype)), _DTYPE_BYTES.get(str(torch_dtype))
    if not src or not dst:
        return stored
    return stored * dst // src


# What a user who picks ZeRO-1/2 for LoRA is told (module docstring: measured on 2 x H200).
ZERO12_NOTE = (
    "note: with LoRA, ZeRO-1/2 shards only the small adapter state and measured 16 % slower per step than DDP "
    "(2 x H200); without swift.deepspeed the task picks DDP"
)

# `swift.deepspeed` values that mean "no DeepSpeed: plain DDP" (the key is then dropped).
NO_DEEPSPEED = ("none", "ddp", "", None, False)


def choose_strategy(
    weight_bytes: int,
    gpu_count: int,
    gpu_memory_bytes: int,
    swift_args: Mapping[str, Any],
    nnodes: int = 1,
    deepspeed_available: bool = True,
) -> Strategy:
    """Chooses one GPU / DDP / ZeRO-3 (the rule is in the module docstring).

    Args:
        weight_bytes: Frozen base weights in the training dtype (model_weight_bytes).
        gpu_count: GPUs per node.
        gpu_memory_bytes: Memory of one GPU.
        swift_args: The config's `swift` section; a `deepspeed` key is the user's choice.
        nnodes: Number of nodes. Default 1.
        deepspeed_available: Whether deepspeed imports here. Default True.

    Returns:
        The Strategy.

    Raises:
        ModelTooLargeError: No strategy fits (the base does not fit even sharded over every GPU).
    """
    if "deepspeed" in swift_args and swift_args["deepspeed"] in NO_DEEPSPEED:
        if gpu_count * nnodes <= 1:
            return Strategy("single", None, "one GPU (or CPU): no data parallelism")
        return Strategy("ddp", None, "swift.deepspeed: none set in the config: plain DDP (user choice)")
    if "deepspeed" in swift_args:
        reason = f"swift.deepspeed={swift_args['deepspeed']!r} set in the config (user choice)"
        if str(swift_args["deepspeed"]).startswith(("zero1", "zero2")):
            reason += f"; {ZERO12_NOTE}"
        return Strategy("user", None, reason)
    if gpu_memory_bytes > 0 and weight_bytes > 0:
        try:
            where = f"{max(gpu_count, 1)} GPU(s) per node x {max(nnodes, 1)} node(s)"
            check_fits(weight_bytes, gpu_memory_bytes, gpu_count, nnodes, f"the base model on {where}")
        except ModelTooLarge as exc:
            raise ModelTooLargeError(str(exc)) from None
    if gpu_count * nnodes <= 1:
        return Strategy("single", None, "one GPU (or CPU): no data parallelism")
    fits = gpu_memory_bytes > 0 and weight_bytes <= FIT_FRACTION * gpu_memory_bytes
    gib = 1024**3
    size = f"base {weight_bytes / gib:.1f} GiB vs {FIT_FRACTION:.0%} of {gpu_memory_bytes / gib:.1f} GiB per GPU"
    if fits:
        return Strategy("ddp", None, f"{size}: fits one GPU -> DDP (replicated base; LoRA state too small to shard)")
    if not deepspeed_available:
        return Strategy(
            "ddp", None, f"{size}: does not fit one GPU but deepspeed is not installed; DDP will likely OOM"
        )
    return Strategy(
        "zero3", "zero3", f"{size}: does not fit one GPU -> ZeRO-3 (sharded base; slow, 0.68 vs 9.10 samples/s)"
    )


def deepspeed_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("deepspeed") is not None
