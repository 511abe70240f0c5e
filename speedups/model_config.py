"""What the speed-ups read of a model's config.json and the run's swift arguments, without torch: the planner and the gate read it before any model
is loaded (`swiglu.py` holds the code that runs on the model).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The model types (config.json `model_type`) whose language model is made of `swiglu.SWIGLU_MLP_CLASSES`.
SWIGLU_MODEL_TYPES = frozenset({"qwen3_vl", "qwen3_vl_text"})


def covers(model_config: dict[str, Any]) -> bool:
    """Whether `fuse_silu_mul` finds MLPs to fuse in a model of this config (its `model_type`)."""
    text = model_config.get("text_config") if isinstance(model_config.get("text_config"), dict) else model_config
    return model_config.get("model_type", text.get("model_type")) in SWIGLU_MODEL_TYPES


def silu_mul_bytes(model_config: dict[str, Any]) -> float:
    """Bytes per token x layer x hidden the fused product saves (the bf16 SiLU output autograd would keep)."""
    text = model_config.get("text_config") if isinstance(model_config.get("text_config"), dict) else model_config
    inter, hidden = text.get("intermediate_size"), text.get("hidden_size")
    if text.get("hidden_act") not in (None, "silu") or not all(isinstance(v, int) and v > 0 for v in (inter, hidden)):
        return 0.0
    return 2.0 * inter / hidden


def quantization_of(args: Mapping[str, Any]) -> str:
    """The setting the swift arguments stand for: nf4, int8 or none (another method counts as none)."""
    if str(args.get("quant_method") or "").lower() != "bnb":
        return "none"
    bits = str(args.get("quant_bits") or "")
    if bits == "8":
        return "int8"
    return "nf4" if bits == "4" else "none"
