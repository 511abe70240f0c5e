"""Item 3 over a bitsandbytes base: the frozen 4-bit / 8-bit weight made dense only while a matmul needs it.

peft's `lora.bnb.Linear4bit` / `Linear8bitLt` run the frozen layer (bitsandbytes' matmul), clone its output (4-bit:
"defensively", peft's comment), then `lora_B(lora_A(dropout(x))) * scaling` and an add: for every adapted layer the
dropped-out input, its mask and, for the down projection, the SiLU-multiply's output are kept until the backward,
as on peft's bf16 path. On one H200 (2026-12-01, 4B, 16 rows x 1,207 tokens, no checkpointing) that made nf4 peak
113.6 GiB against 90.2 GiB in bf16 at the same plan: QLoRA cost memory.

Here such a layer goes through the fused branch's own functions (`lora_functions._LoraLinear`,
`_SiluMulLoraLinear`) with a `Dequantized` weight in place of the frozen tensor: the forward asks it for the dense
[out, in] matrix in the compute dtype (bitsandbytes' own dequantisation kernel), uses it and drops it; the backward
asks again for the input gradient. So a quantised layer keeps what a bf16 one keeps (the shared input, the masks or
their seeds, the rank-r product) and nothing of its weight; one layer's dense weight is alive at a time (gate /
up of the 4B: 50 MB in bf16). bitsandbytes' own training path dequantises the same way for more than 1,536 rows
(its fused kernel is for fewer), so the matmuls are the bf16 path's.

Int8 (`Linear8bitLt`, `has_fp16_weights=False`): the weight is `CB * SCB / 127` per row, as bitsandbytes'
`int8_vectorwise_dequant` computes it; the matmul then takes the input in the compute dtype, where bitsandbytes'
LLM.int8() matmul also rounds the input to int8 (outside its outlier columns): the output is nearer the bf16
layer's, and differs from bitsandbytes' own by that rounding.
"""

from __future__ import annotations

import torch

# peft's LoRA classes over bitsandbytes layers and the bitsandbytes layer each wraps
PEFT_BNB = "peft.tuners.lora.bnb"
CLASSES = {"Linear4bit": "Linear4bit", "Linear8bitLt": "Linear8bitLt"}


def _bnb():
    try:
        import bitsandbytes
    except ImportError:
        return None
    return bitsandbytes


class Dequantized:
    """A bitsandbytes layer's frozen weight, made dense in a dtype when asked (`dense`), never kept."""

    __slots__ = ("layer", "kind")

    def __init__(self, layer: torch.nn.Module, kind: str) -> None:
        self.layer, self.kind = layer, kind

    @property
    def shape(self) -> tuple[int, int]:
        return (self.layer.out_features, self.layer.in_features)

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        """The [out, in] weight in `dtype` (bitsandbytes' dequantisation)."""
        bnb = _bnb()
        weight = self.layer.weight
        if self.kind == "nf4":
            from bitsandbytes.nn.modules import fix_4bit_weight_quant_state_from_module

            fix_4bit_weight_quant_state_from_module(self.layer)
            return bnb.functional.dequantize_4bit(weight.data, weight.quant_state).to(dtype)
        state = self.layer.state
        cb = state.CB if state.CB is not None else getattr(weight, "CB", None)
        scb = state.SCB if state.SCB is not None else getattr(weight, "SCB", None)
        if cb is None:
            cb = weight.data
        return bnb.functional.int8_vectorwise_dequant(cb, scb).to(dtype)


def frozen(base_layer: torch.nn.Module) -> Dequantized | None:
    """A `Dequantized` for a frozen bitsandbytes Linear4bit / Linear8bitLt (int8 without fp16 weights) that nothing
    hooks, whose bias (if any) gets no gradient; None for anything else."""
    bnb = _bnb()
    if bnb is None or base_layer._forward_hooks or base_layer._forward_pre_hooks:
        return None
    kind = ""
    if type(base_layer) is bnb.nn.Linear4bit:
        if getattr(base_layer.weight, "quant_state", None) is not None or hasattr(base_layer, "quant_state"):
            kind = "nf4"
    elif type(base_layer) is bnb.nn.Linear8bitLt and not base_layer.state.has_fp16_weights:
        kind = "int8"
    if not kind:
        return None
    bias = base_layer.bias
    if base_layer.weight.requires_grad or (bias is not None and bias.requires_grad):
        return None
    return Dequantized(base_layer, kind)


def dense(weight, dtype: torch.dtype) -> torch.Tensor:
    """A frozen weight in `dtype`: a tensor's cast (autocast's, which F.linear would keep too), or the dense matrix
    of a `Dequantized`."""
    return weight.dense(dtype) if isinstance(weight, Dequantized) else weight.to(dtype)


def peft_classes() -> dict[str, type]:
    """peft's LoRA classes over bitsandbytes layers that this peft defines ({} without bitsandbytes)."""
    if _bnb() is None:
        return {}
    try:
        import importlib

        module = importlib.import_module(PEFT_BNB)
    except Exception:  # noqa: BLE001 - peft without its bitsandbytes layers: nothing to route
        return {}
    return {name: cls for name in CLASSES if (cls := getattr(module, name, None)) is not None}


def quantization_of_model(model: torch.nn.Module) -> str:
    """ "nf4" / "int8" where the model holds bitsandbytes layers of that kind, else "none"."""
    bnb = _bnb()
    if bnb is None:
        return "none"
    for module in model.modules():
        if type(module) is bnb.nn.Linear4bit:
            return "nf4"
        if type(module) is bnb.nn.Linear8bitLt:
            return "int8"
    return "none"
