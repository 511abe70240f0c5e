"""PyTorch's fused RMSNorm in place of Liger's in the language model's layers: less host time per call.

Liger's RMSNorm is one Triton kernel each way, but launching it goes through Liger's wrappers and
Triton's Python launcher: about 0.3 ms of host time per call on the H100 machine, eight calls per
decoder layer of the 4B (input and post-attention norms, q and k norms; forward and backward), of a
layer's 8-10 ms of host time against its 11 ms of GPU time at the tuned plan's micro-batch
(1 x H100, 2026-11-25, `speedups/benchmarks/layer_host_time.py`). `torch.nn.functional.rms_norm` on a CUDA
tensor runs one fused kernel each way (`aten::_fused_rms_norm`) launched through the dispatcher in
tens of microseconds.

The arithmetic is RMSNorm's: `x * rsqrt(mean(x^2) + eps) * weight` accumulated in float32, rounded
once to the input's dtype (Liger's "llama" mode, like transformers' Qwen3 RMSNorm, rounds the
normalised value before multiplying by the weight: the two differ by bf16 rounding). Applied only to
modules Liger patched with offset 0 and "llama" casting (Qwen3-VL's), only on CUDA where torch's op
is the fused kernel, never where Liger is off. On the H100 it cut a layer's host time by 18 % but not the
training step of one GPU at 8 x 2 (the layer is GPU-bound there), so with one process it is opt-in
(VLM_LORA_TORCH_RMS_NORM=1); with more than one, where each GPU's micro-step holds half the rows and the
host falls behind its GPU, it is on unless VLM_LORA_TORCH_RMS_NORM=0 (its switch's multi-process default, registry.py):
off, two H200s ran 0.535 s/step against 0.467-0.477 on (2026-11-28, benchmarks/train_throughput.py).
"""

from __future__ import annotations

import types
from typing import Any

import torch

MARK = "_vlm_lora_torch_rms_norm"


def _forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.rms_norm(hidden_states, self.weight.shape, self.weight, self.variance_epsilon)


_forward.__dict__[MARK] = True


def liger_llama_norm(module: torch.nn.Module) -> bool:
    """A module running Liger's RMSNorm forward as Qwen3's RMSNorm: weight, no offset, "llama" casting."""
    forward = getattr(module, "forward", None)
    owner = getattr(getattr(forward, "__func__", None), "__qualname__", "")
    return (
        owner.startswith("LigerRMSNorm.")
        and getattr(module, "offset", None) == 0.0
        and getattr(module, "casting_mode", None) == "llama"
        and isinstance(getattr(module, "weight", None), torch.Tensor)
        and module.weight.dim() == 1
        and isinstance(getattr(module, "variance_epsilon", None), float)
    )


def fused_op_on(device: torch.device | str) -> bool:
    """Whether `F.rms_norm` runs torch's fused kernel on `device` (its backward node says so)."""
    x = torch.ones(2, 8, device=device, requires_grad=True)
    y = torch.nn.functional.rms_norm(x, (8,), torch.ones(8, device=device), 1e-6)
    return "FusedRmsNorm" in type(y.grad_fn).__name__


def use_torch_rms_norm(model: torch.nn.Module) -> int:
    """Gives every Liger-patched Qwen3-style RMSNorm of `model` torch's fused forward; returns how many."""
    count = 0
    for module in model.modules():
        if getattr(module.forward, MARK, False) or not liger_llama_norm(module):
            continue
        module.forward = types.MethodType(_forward, module)
        count += 1
    return count


# ---- item 9 of the plugin (items.py) ----------------------------------------------------------------------------------


def _after_liger(original):
    """transformers' `apply_liger_kernel` (called when training starts), then torch's fused RMSNorm."""
    import functools

    @functools.wraps(original)
    def apply_liger_kernel(model, kernel_config=None, *args, **kwargs):
        out = original(model, kernel_config, *args, **kwargs)
        first = next(model.parameters(), None)
        if first is not None and first.is_cuda and fused_op_on(first.device):
            count = use_torch_rms_norm(model)
            print(f"train-lora plugin: torch's fused RMSNorm in {count} of Liger's norms", flush=True)
        return out

    apply_liger_kernel._vlm_lora_torch_rms_norm = True
    return apply_liger_kernel


def install(ctx):
    """Wraps `transformers.trainer.apply_liger_kernel`: torch's fused RMSNorm right after Liger's is applied."""
    from transformers import trainer

    from speedups import patching, registry

    if not patching.wrap_once(trainer, "apply_liger_kernel", _after_liger, "_vlm_lora_torch_rms_norm"):
        return registry.target_missing("transformers.trainer.apply_liger_kernel", version_of="transformers")
    return registry.pending()


def check(ctx, trainer):
    from speedups import patching, registry

    changed = patching.not_ours(registry.item(9))
    if changed:
        return registry.target_missing(*changed, version_of="transformers")
    if not getattr(getattr(trainer, "args", None), "use_liger_kernel", False):
        return registry.not_applicable("use_liger_kernel off")
    if not torch.cuda.is_available():
        return registry.not_applicable("no GPU")
    return registry.applied("when training starts, in Liger's norms")
