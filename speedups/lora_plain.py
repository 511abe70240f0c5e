"""Where item 3's fused branch applies: which peft LoRA layers are plain LoRA, and over which frozen layer.

Plain LoRA: one active adapter, no variant (DoRA, ...), no LoRA bias, no hooks on the adapter modules, weights not
partitioned by DeepSpeed ZeRO-3, gradients on; the frozen layer a plain Linear or a bitsandbytes layer
(`quantized_lora.py`). Everything else goes through peft's own forward.
"""

from __future__ import annotations

import torch

from speedups import quantized_lora


def compute_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype the LoRA matmuls run in: autocast's where it is on for `x`'s device, else the adapter weight's."""
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return weight.dtype


def plain_adapter(layer, x, args, kwargs):
    """The one active adapter's (A, B, scaling, p) if peft's forward is plain LoRA, else None."""
    if args or kwargs or not torch.is_grad_enabled() or layer.disable_adapters or layer.merged:
        return None
    active = [name for name in layer.active_adapters if name in layer.lora_A]
    if len(active) != 1 or active[0] in layer.lora_variant:
        return None
    name = active[0]
    lora_a, lora_b, dropout = layer.lora_A[name], layer.lora_B[name], layer.lora_dropout[name]
    if type(lora_a) is not torch.nn.Linear or type(lora_b) is not torch.nn.Linear:
        return None
    if lora_a.bias is not None or lora_b.bias is not None:
        return None
    for module in (lora_a, lora_b, dropout):
        if module._forward_hooks or module._forward_pre_hooks:
            return None
    if any(hasattr(w, "ds_id") or w.dim() != 2 for w in (lora_a.weight, lora_b.weight)):
        return None  # partitioned by ZeRO-3: only the module's own hooks gather it
    if isinstance(dropout, torch.nn.Identity):
        p = 0.0
    elif type(dropout) is torch.nn.Dropout:
        p = float(dropout.p) if dropout.training else 0.0
    else:
        return None
    if not x.is_floating_point():
        return None
    return lora_a.weight, lora_b.weight, layer.scaling[name], p


def plain_linear(module) -> bool:
    """A torch Linear that nothing hooks: its forward is `F.linear(x, weight, bias)`."""
    return type(module) is torch.nn.Linear and not (module._forward_hooks or module._forward_pre_hooks)


def frozen_weight(base_layer, dtype: torch.dtype, autocast: bool):
    """What `_LoraLinear` / `_SiluMulLoraLinear` take as the frozen weight: a frozen plain Linear's weight, a frozen
    bitsandbytes layer's `Dequantized` (`quantized_lora.py`), else None (peft's layer runs itself)."""
    if _frozen_linear_in(base_layer, dtype, autocast):
        return base_layer.weight
    return quantized_lora.frozen(base_layer)


def _frozen_linear_in(base_layer, dtype: torch.dtype, autocast: bool) -> bool:
    """A plain Linear whose weights get no gradient and that computes in `dtype` (autocast's, which casts
    its weights each call, or its own): `_LoraLinear` can run it."""
    if not plain_linear(base_layer):
        return False
    weight, bias = base_layer.weight, base_layer.bias
    params = [weight] if bias is None else [weight, bias]
    return (
        (weight.dtype == dtype or (autocast and weight.is_floating_point()))
        and weight.dim() == 2
        and not any(t.requires_grad or hasattr(t, "ds_id") for t in params)
    )
