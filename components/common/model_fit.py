"""Whether a base model's frozen weights fit a GPU profile, and the smallest profile that does.

Shared by the config check (before anything is submitted: the size from the model's name,
`KNOWN_MODELS`) and train-lora (before `swift sft`: the size from the staged safetensors).

Rule, as train-lora's strategy choice applies it (`components.train_lora._launch`): the
frozen base weights fit one GPU when they take at most `FIT_FRACTION` of its memory (the
rest holds activations, LoRA state and the CUDA context): then every GPU keeps a copy
(DDP). Otherwise ZeRO-3 shards them over all GPUs of all nodes, which holds when
weights / GPUs take at most `FIT_FRACTION` of one GPU (ZeRO-3 also gathers one layer at a
time, inside the same margin). Beyond that no strategy of this pipeline trains the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GIB = 1024**3
FIT_FRACTION = 0.7

# Memory of one GPU as torch reports it (total_memory), GiB, by Vertex accelerator type.
GPU_MEMORY_GIB: dict[str, float] = {
    "NVIDIA_L4": 22.0,
    "NVIDIA_TESLA_T4": 14.6,
    "NVIDIA_TESLA_V100": 15.8,
    "NVIDIA_TESLA_P100": 15.9,
    "NVIDIA_TESLA_P4": 7.4,
    "NVIDIA_TESLA_A100": 39.4,
    "NVIDIA_A100_80GB": 79.2,
    "NVIDIA_H100_80GB": 79.2,
    "NVIDIA_H100_MEGA_80GB": 79.2,
    "NVIDIA_H200_141GB": 139.8,
    "NVIDIA_B200": 178.4,
}

# Machine shapes offered as profiles, smallest total GPU memory first within a family.
PROFILES: tuple[tuple[str, str, int], ...] = (
    ("g2-standard-8", "NVIDIA_L4", 1),
    ("a2-highgpu-1g", "NVIDIA_TESLA_A100", 1),
    ("a2-ultragpu-1g", "NVIDIA_A100_80GB", 1),
    ("a3-highgpu-1g", "NVIDIA_H100_80GB", 1),
    ("a2-ultragpu-2g", "NVIDIA_A100_80GB", 2),
    ("a3-highgpu-2g", "NVIDIA_H100_80GB", 2),
    ("a2-ultragpu-4g", "NVIDIA_A100_80GB", 4),
    ("a3-highgpu-4g", "NVIDIA_H100_80GB", 4),
    ("a2-ultragpu-8g", "NVIDIA_A100_80GB", 8),
    ("a3-highgpu-8g", "NVIDIA_H100_80GB", 8),
    ("a3-ultragpu-8g", "NVIDIA_H200_141GB", 8),
    ("a4-highgpu-8g", "NVIDIA_B200", 8),
)

# Total parameters (billions) of released Qwen-VL models, by the name's size part; bf16 = 2 bytes each.
KNOWN_MODELS: dict[str, float] = {
    "qwen3-vl-2b": 2.13,
    "qwen3-vl-4b": 4.44,
    "qwen3-vl-8b": 8.77,
    "qwen3-vl-32b": 33.4,
    "qwen3-vl-30b-a3b": 31.1,
    "qwen3-vl-235b-a22b": 236.0,
    "qwen2.5-vl-3b": 3.75,
    "qwen2.5-vl-7b": 8.29,
    "qwen2.5-vl-32b": 33.5,
    "qwen2.5-vl-72b": 73.4,
}


# LoRA on parameters (peft's ParamWrapper) next to Liger's fused MoE kernels: refused by the config and train-lora.
LIGER_WITH_PARAMETERS = (
    "swift.target_parameters with swift.use_liger_kernel: true fails in the first step (Liger's fused experts read "
    "attributes of the experts module that peft's ParamWrapper hides: \"'ParamWrapper' object has no attribute "
    "'hidden_dim'\", seen on an H200 with ms-swift 4.6 and liger-kernel 0.8.5): set swift.use_liger_kernel: false, "
    "or drop target_parameters (LoRA on attention only)"
)


class ModelTooLarge(ValueError):
    """The frozen base does not fit the GPUs even with ZeRO-3; the message names the size and a profile that fits."""


@dataclass(frozen=True)
class Fit:
    """How a model fits a profile.

    Attributes:
        weight_bytes: Frozen base weights in the training dtype.
        gpu_bytes: Memory of one GPU.
        gpus: GPUs in all (per node × nodes).
        one_gpu: The base fits one GPU (replicated: DDP).
        zero3: The base fits when sharded over all GPUs (ZeRO-3).
    """

    weight_bytes: int
    gpu_bytes: int
    gpus: int
    one_gpu: bool
    zero3: bool


def fit(weight_bytes: int, gpu_bytes: int, gpus: int) -> Fit:
    """Whether `weight_bytes` fit one GPU of `gpu_bytes`, or `gpus` of them with ZeRO-3."""
    gpus = max(int(gpus), 1)
    one = weight_bytes <= FIT_FRACTION * gpu_bytes
    return Fit(weight_bytes, gpu_bytes, gpus, one, one or weight_bytes / gpus <= FIT_FRACTION * gpu_bytes)


def known_model_bytes(source: str) -> int:
    """bf16 bytes of a released Qwen-VL model named in `source` (hf://Qwen/Qwen3-VL-8B-Instruct@..., a path); 0 = unknown."""
    name = source.split("@", 1)[0].rstrip("/").rsplit("/", 1)[-1].lower()
    for prefix, billions in sorted(KNOWN_MODELS.items(), key=lambda kv: -len(kv[0])):
        if name == prefix or re.match(re.escape(prefix) + r"[-_]", name):
            return int(billions * 1e9 * 2)
    return 0


def smallest_fitting_profile(weight_bytes: int) -> str:
    """The first of PROFILES the base fits (one replica, else 2 / 4 / 8 replicas), as text; '' = none."""
    for nodes in (1, 2, 4, 8):
        for machine, gpu, count in PROFILES:
            f = fit(weight_bytes, int(GPU_MEMORY_GIB[gpu] * GIB), count * nodes)
            if not f.zero3:
                continue
            how = "one GPU" if f.gpus == 1 else "replicated, DDP" if f.one_gpu else "sharded, ZeRO-3"
            replicas = f" x {nodes} replicas (resources.replica_count: {nodes})" if nodes > 1 else ""
            return f"{machine}{replicas} ({count} x {gpu} each, {how})"
    return ""


def check_fits(weight_bytes: int, gpu_bytes: int, gpus_per_node: int, nodes: int, what: str) -> Fit:
    """Raises ModelTooLarge when the base does not fit even sharded over every GPU of the job.

    Args:
        weight_bytes: Frozen base weights in the training dtype.
        gpu_bytes: Memory of one GPU.
        gpus_per_node: GPUs per node.
        nodes: Nodes (replicas).
        what: How the caller names the model and profile in the message.

    Returns:
        The Fit.
    """
    f = fit(weight_bytes, gpu_bytes, max(gpus_per_node, 1) * max(nodes, 1))
    if f.zero3:
        return f
    need = weight_bytes / (FIT_FRACTION * gpu_bytes)
    fits = smallest_fitting_profile(weight_bytes)
    raise ModelTooLarge(
        f"{what}: the frozen base is {weight_bytes / GIB:.1f} GiB and does not fit {f.gpus} GPU(s) of "
        f"{gpu_bytes / GIB:.1f} GiB even sharded with ZeRO-3 (at most {FIT_FRACTION:.0%} of each GPU for weights: "
        f"at least {need:.0f} such GPUs); "
        + (f"smallest profile that fits: {fits}" if fits else "no profile of up to 8 replicas fits")
    )
