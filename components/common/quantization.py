"""QLoRA: LoRA on a bitsandbytes-quantised base (`model.quantization: none | nf4 | int8`).

One place for what the config, train-lora, the planner, the cost estimate and merge-export
need to agree on:

* `swift_quant_args`: the `swift sft` arguments a setting stands for (ms-swift's names);
  `swift_conflict` names a user-given `quant_*` / `bnb_*` argument that contradicts it.
* `quantized_weight_bytes`: the frozen base's size in memory once quantised, by `is_quantized_tensor`:
  a stored 2-D `*.weight` counts as quantised unless it is an embedding, the head, in the vision
  tower (`model.visual.*`) or a MoE router (`mlp.gate`); 1-D and 3-D+ tensors stay bf16. Measured on the
  tiny MoE on a CPU (bitsandbytes 0.50.2, transformers 5.19, ms-swift 4.6, 2026-11-28;
  tests/test_quantization_moe.py, benchmarks/quantized_sizes.py): with
  the `BitsAndBytesConfig` ms-swift builds from `swift_quant_args`, only the language model's
  `nn.Linear` layers become `Linear4bit` (attention q/k/v/o; the dense tiny Qwen3-VL's MLP too). The fused 3-D
  experts of transformers-5's Qwen3-VL-MoE (`mlp.experts.gate_up_proj` / `down_proj`) are plain
  parameters and stay bf16; so does the router (not an `nn.Linear`), and the vision tower and mergers,
  which ms-swift puts in `llm_int8_skip_modules` (a bare `BitsAndBytesConfig` would quantise their
  linear layers). nf4 stores 0.5 byte a parameter plus one absmax per 64 weights (8-bit with double
  quantisation, plus an fp32 per 256 blocks); left out: about 1.1 KB of code tables per tensor. int8
  stores 1 byte plus an fp32 scale per row (left out: < 0.1 %).
* `STEP_COST_FACTOR`: how much slower a step is (dequantising each weight before its
  matmul): both measured on one H200 at one plan (nf4 1.01x, int8 1.06x).
* `check_runnable`: bitsandbytes quantises and runs one layer on this machine, else a named
  error before training (and before evaluate loads models quantised, `eval.quantization`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# read by the speed-up gate too, so defined with the speed-ups; re-exported: the quantisation of swift arguments
from speedups.model_config import quantization_of as quantization_of

QUANTIZATIONS = ("none", "nf4", "int8")

# Bytes a quantised parameter takes (weights + quantisation constants), by setting.
_NF4_BLOCK = 64
BYTES_PER_PARAM = {
    "nf4": 0.5 + 1 / _NF4_BLOCK + 4 / (_NF4_BLOCK * 256),  # double quantisation (the swift args below turn it on)
    "int8": 1.0,
}
# Step time relative to bf16 LoRA at the same plan, measured in one call on one H200 (4B, 16 x 1 without
# checkpointing, no cap, 2026-12-02, benchmarks/results/2026-12-02_project_b16_nogc_liger_log5_*.json): bf16 0.881,
# nf4 0.891 (1.01x), int8 0.932 s/step (1.06x). The fused branch dequantises each weight per use and runs the bf16
# matmuls (speedups/quantized_lora.py); int8's dequantisation reads twice nf4's bytes. Under a 22 GiB cap nf4
# measured 1.230 against 1.209 s/step with 2 layers fewer recomputed (2026-12-01), ~1.04 at one plan.
STEP_COST_FACTOR = {"none": 1.0, "nf4": 1.01, "int8": 1.06}

# 2-D weights left in the training dtype under `swift sft` (measured, module docstring): embeddings and the
# head; the vision tower and its mergers (`model.visual.*`, in ms-swift's llm_int8_skip_modules for Qwen3-VL);
# a MoE's router `mlp.gate` (a top-k router module, not an nn.Linear).
_KEPT = re.compile(r"(embed|lm_head|wte|wpe|(^|\.)visual\.|\.mlp\.gate\.weight$)", re.IGNORECASE)

# Shares of the parameters `is_quantized_tensor` leaves in bf16, over the published architectures'
# stored tensors (python -m benchmarks.quantized_sizes, 2026-11-28): Qwen3-VL-4B 0.181, 8B 0.208
# (embeddings, head and vision tower); 30B-A3B 0.971 (its 3-D experts are 93.3 % of the parameters;
# only attention, 2.9 %, is quantised). Dense: the larger of 4B and 8B, so the check does not under-size them.
DENSE_KEPT_FRACTION = 0.21
MOE_KEPT_FRACTION = 0.971


class QuantizationUnavailable(RuntimeError):
    """bitsandbytes is missing or cannot quantise / run a layer on this machine."""


def swift_quant_args(quantization: str) -> dict[str, Any]:
    """The `swift sft` arguments of a `model.quantization` setting ({} for none).

    Args:
        quantization: One of QUANTIZATIONS.

    Returns:
        ms-swift's quant_method / quant_bits / bnb_4bit_* arguments.
    """
    if quantization == "nf4":
        return {
            "quant_method": "bnb",
            "quant_bits": 4,
            "bnb_4bit_quant_type": "nf4",
            "bnb_4bit_compute_dtype": "bfloat16",
            "bnb_4bit_use_double_quant": True,
        }
    if quantization == "int8":
        return {"quant_method": "bnb", "quant_bits": 8}
    return {}


def _is_quant_key(name: str) -> bool:
    return name.startswith(("quant_", "bnb_", "hqq_"))


def swift_conflict(swift: Mapping[str, Any], quantization: str) -> tuple[str, Any, Any] | None:
    """A swift `quant_*` / `bnb_*` argument that contradicts `quantization`, else None.

    Returns:
        (argument name, the user's value, what the setting needs: a value, or None when the
        setting wants no such argument).
    """
    wanted = swift_quant_args(quantization)
    for name, value in swift.items():
        if not _is_quant_key(str(name)) or value in (None, "", "none"):
            continue
        need = wanted.get(name)
        if name not in wanted or str(value).lower() != str(need).lower():
            return name, value, need
    return None


def is_quantized_tensor(name: str, ndim: int) -> bool:
    """Whether bitsandbytes quantises this stored tensor (a linear layer's weight; see module docstring)."""
    return ndim == 2 and name.endswith(".weight") and not _KEPT.search(name)


def quantized_weight_bytes(tensors: Mapping[str, tuple[int, int]], quantization: str, dtype_bytes: int = 2) -> int:
    """Bytes of the frozen base in memory once quantised.

    Args:
        tensors: {name: (number of elements, ndim)} of the stored weights.
        quantization: One of QUANTIZATIONS ("none": every tensor in the training dtype).
        dtype_bytes: Bytes a kept parameter takes (bf16: 2). Default 2.

    Returns:
        The estimate, bytes.
    """
    rate = BYTES_PER_PARAM.get(quantization)
    total = 0.0
    for name, (numel, ndim) in tensors.items():
        total += numel * (rate if rate and is_quantized_tensor(name, ndim) else dtype_bytes)
    return int(total)


def known_quantized_bytes(
    bf16_bytes: int, quantization: str, kept_fraction: float | None = None, moe: bool = False
) -> int:
    """A released model's quantised size from its bf16 size alone (the config check, before staging).

    Args:
        bf16_bytes: The model's size in bf16, bytes.
        quantization: One of QUANTIZATIONS.
        kept_fraction: Share of the parameters left in bf16; the rest takes BYTES_PER_PARAM. Default
            None: MOE_KEPT_FRACTION for a mixture of experts (`moe`), else DENSE_KEPT_FRACTION.
        moe: The model is a mixture of experts. Default False.

    Returns:
        The estimate, bytes. train-lora recomputes it from the staged tensors (`quantized_weight_bytes`).
    """
    rate = BYTES_PER_PARAM.get(quantization)
    if not rate:
        return bf16_bytes
    if kept_fraction is None:
        kept_fraction = MOE_KEPT_FRACTION if moe else DENSE_KEPT_FRACTION
    params = bf16_bytes / 2
    return int(params * kept_fraction * 2 + params * (1 - kept_fraction) * rate)


def check_runnable(
    quantization: str, setting: str = "model.quantization", gpu_setting: str = "resources.accelerator_type"
) -> str:
    """Quantises one small linear layer with bitsandbytes on this machine and runs it.

    Args:
        quantization: nf4 or int8 ("none" checks nothing).
        setting: The config key the message names (train-lora's `model.quantization`, evaluate's
            `eval.quantization`). Default "model.quantization".
        gpu_setting: The config key that gives the task a CUDA GPU, named in the fix. Default
            "resources.accelerator_type".

    Returns:
        The device it ran on ("cuda", "cpu", or "" for none).

    Raises:
        QuantizationUnavailable: bitsandbytes is not installed, or it cannot quantise or run the
            layer here (e.g. a build without this machine's backend); the message names the fix.
    """
    if quantization == "none":
        return ""
    try:
        import bitsandbytes as bnb
        import torch
    except ImportError as exc:
        raise QuantizationUnavailable(
            f"{setting}: {quantization} needs bitsandbytes ({exc}); install the train extra "
            f"(requirements.lock pins bitsandbytes) or set {setting}: none"
        ) from None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        with torch.no_grad():
            weight = torch.randn(64, 64, dtype=torch.bfloat16)
            if quantization == "nf4":
                layer = bnb.nn.Linear4bit(64, 64, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4")
                layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type="nf4")
            else:
                layer = bnb.nn.Linear8bitLt(64, 64, bias=False, has_fp16_weights=False)
                layer.weight = bnb.nn.Int8Params(weight.half(), requires_grad=False, has_fp16_weights=False)
            layer = layer.to(device)
            out = layer(torch.randn(2, 64, dtype=torch.bfloat16 if quantization == "nf4" else torch.float16).to(device))
        if not bool(torch.isfinite(out).all()):
            raise RuntimeError("the quantised layer's output is not finite")
    except Exception as exc:  # noqa: BLE001 - any failure of the library here is the named error
        gpu = "this machine's CUDA GPU" if device == "cuda" else "this machine (no CUDA GPU)"
        raise QuantizationUnavailable(
            f"{setting}: {quantization}: bitsandbytes {getattr(bnb, '__version__', '?')} cannot quantise "
            f"and run a layer on {gpu} ({type(exc).__name__}: {str(exc)[:200]}); run on a CUDA GPU machine "
            f"({gpu_setting}) or set {setting}: none"
        ) from None
    return device
