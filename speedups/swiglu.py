"""Qwen3-VL's language-model MLP with Liger's fused SiLU-multiply.

Liger has no SwiGLU patch for Qwen3-VL (`apply_liger_kernel_to_qwen3_vl` takes `swiglu=False`
and ignores it), so with `use_liger_kernel` the MLP still runs `down(silu(gate(x)) * up(x))` as
three PyTorch kernels forward and three backward over the 9,728-wide intermediate of the 4B, and
autograd keeps `silu(gate(x))` for every layer besides gate(x) and up(x): 7.6 bytes per token ×
layer × hidden (6.8 GiB at the tuned plan). Liger's `LigerSiLUMulFunction` computes the product in
one kernel, keeps only gate(x) and up(x) and recomputes the SiLU in its backward kernel.

`fuse_silu_mul(model, silu_mul)` gives each MLP of a known class whose activation is SiLU a forward
`down(silu_mul(gate(x), up(x)))`; the projections (and their LoRA layers) are untouched. With
`down` (the train-lora plugin passes `fused_lora.silu_mul_lora`), a down projection that `down`
takes computes the product itself and does not keep it for its backward (`down(layer, gate, up)`,
None where it does not apply: then the product as above).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

# MLP classes whose forward is exactly `down_proj(act_fn(gate_proj(x)) * up_proj(x))` (the model types made of
# them: `model_config.SWIGLU_MODEL_TYPES`)
SWIGLU_MLP_CLASSES = frozenset({"Qwen3VLTextMLP"})
# `act_fn` classes that compute F.silu (transformers' ACT2FN["silu"] is its own SiLUActivation)
SILU_CLASSES = frozenset({"SiLU", "SiLUActivation"})


SiluMul = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Down = Callable[[Any, torch.Tensor, torch.Tensor], "torch.Tensor | None"]


def _forward(silu_mul: SiluMul, down: Down | None) -> Callable[..., torch.Tensor]:
    def forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        if down is not None and (out := down(self.down_proj, gate, up)) is not None:
            return out
        return self.down_proj(silu_mul(gate, up))

    forward._vlm_lora_silu_mul = True
    return forward


def fuse_silu_mul(model: torch.nn.Module, silu_mul: SiluMul, down: Down | None = None) -> int:
    """Gives the SiLU MLPs of `model` the fused forward (in place); returns how many."""
    forward = _forward(silu_mul, down)
    count = 0
    for module in model.modules():
        if type(module).__name__ not in SWIGLU_MLP_CLASSES:
            continue
        if type(getattr(module, "act_fn", None)).__name__ not in SILU_CLASSES:
            continue
        if getattr(module.forward, "_vlm_lora_silu_mul", False):
            continue
        module.forward = types.MethodType(forward, module)
        count += 1
    return count


# ---- item 8 of the plugin (items.py) ----------------------------------------------------------------------------------


class _LigerSiluMul:
    """Liger's SiLU-multiply kernels as `forward(gate, up) -> c` and `backward(gate, up, dc) -> (dgate, dup)`
    (the backward writes into gate and up), for the down projection that keeps no product."""

    def __init__(self, ops) -> None:
        self._ops = ops

    def forward(self, gate, up):
        return self._ops.swiglu_forward(gate, up)[2]

    def backward(self, gate, up, grad_c):
        return self._ops.swiglu_backward(gate, up, grad_c)


def liger_silu_mul():
    """Liger's fused SiLU-multiply as f(gate, up) and its kernels (`_LigerSiluMul`), or None without Liger."""
    try:
        from liger_kernel.ops import LigerSiLUMulFunction
        from liger_kernel.ops import swiglu as ops
    except ImportError:
        return None
    return (lambda gate, up: LigerSiLUMulFunction.apply(gate, up)), _LigerSiluMul(ops)


def wants_liger_swiglu(training_args) -> bool:
    """Liger on, its SwiGLU not turned off in `liger_kernel_config`, the switch not 0."""
    import os

    if training_args is None or not getattr(training_args, "use_liger_kernel", False):
        return False
    if os.environ.get("VLM_LORA_LIGER_SWIGLU") == "0":
        return False
    return (getattr(training_args, "liger_kernel_config", None) or {}).get("swiglu", True) is not False


def check(ctx, trainer):
    """Gives the model's Qwen3-VL MLPs Liger's fused SiLU-multiply (and, with item 3, the down projections that keep
    no product)."""
    import functools

    from speedups import fused_lora, lora_switches, registry

    training_args = getattr(trainer, "args", None)
    if not getattr(training_args, "use_liger_kernel", False):
        return registry.not_applicable("use_liger_kernel off")
    if not wants_liger_swiglu(training_args):
        return registry.not_applicable("liger_kernel_config swiglu false")
    liger = liger_silu_mul()
    if liger is None:
        return registry.target_missing("liger_kernel.ops.LigerSiLUMulFunction", version_of="liger-kernel")
    silu_mul, kernels = liger
    down = None
    if ctx.on(3) and lora_switches.SILU_MUL_DOWN:
        down = functools.partial(fused_lora.silu_mul_lora, silu_mul=kernels)
    count = fuse_silu_mul(trainer.model, silu_mul, down)
    if not count:
        return registry.found_nothing("no Qwen3VLTextMLP with a SiLU activation")
    kept = "; down projections with LoRA keep no product for the backward" if down else ""
    ctx.say(f"Liger's fused SiLU-multiply in {count} MLPs{kept}")
    return registry.applied(f"{count} MLPs" + (", down projections keep no product" if down else ""))
