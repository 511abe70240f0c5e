"""One autograd function for a LoRA branch: fewer passes over the activations, less memory.

peft computes a LoRA layer as `result + lora_B(lora_A(dropout(x))) * scaling`: a dropout
kernel that writes a new copy of the input and its mask, two small matmuls, then a scaling
kernel and an add kernel over the full output, each with its own backward. Autograd keeps,
for every adapted layer, the dropped-out input (saved by lora_A for its weight gradient)
and the mask (saved by dropout): q, k and v read the same input yet keep three copies.

`lora_delta` does the same arithmetic with one kernel less per pass and one copy less:
- forward: `native_dropout` (the kernel `nn.Dropout` runs on a GPU, so the same random
  stream and masks), `h = x_d @ A^T`, then `addmm(base, h, B^T, alpha=scaling)`: the
  scaling and the add ride in the second matmul's epilogue;
- it saves the input `x` (one tensor shared by the layers that read it, and often kept by
  its producer anyway), the boolean mask and the rank-r `h`, and re-applies the mask in
  the backward pass (one elementwise kernel) instead of keeping each layer's dropped-out
  copy;
- backward: `gh = scaling * g @ B`, `dB = scaling * g^T @ h`, `dA = gh^T @ x_d`,
  `dx = dropout_backward(gh @ A)`; the base output's gradient passes through.

The matmuls run in the compute dtype (autocast's, else the adapter weights'), the adapter
weights and their gradients stay in their own dtype (float32 master weights), as with peft.
`fused_forward` applies only where the arithmetic is plain LoRA; everything else (DoRA and
other variants, LoRA bias, several active adapters, merged or disabled adapters,
parameters partitioned by DeepSpeed ZeRO-3, hooks on the adapter modules, inference
without gradients) goes through peft's own forward.
"""

from __future__ import annotations

import os

import torch

# without dropout under autocast: autograd's own nodes instead of the Python function (`lean_delta`);
# VLM_LORA_LEAN_LORA=0 keeps `lora_delta` there too
LEAN = os.environ.get("VLM_LORA_LEAN_LORA", "1") != "0"


class _LoraDelta(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, base, weight_a, weight_b, scaling: float, p: float):
        dtype = base.dtype
        a = weight_a.to(dtype)
        b = weight_b.to(dtype)
        x2 = x.reshape(-1, x.shape[-1]).to(dtype)
        if p > 0:
            dropped, mask = torch.native_dropout(x2, p, True)
        else:
            dropped, mask = x2, None
        h = dropped @ a.t()
        out = torch.addmm(base.reshape(-1, base.shape[-1]), h, b.t(), alpha=scaling)
        ctx.save_for_backward(x2, mask, h, a, b)
        ctx.scaling, ctx.p = scaling, p
        ctx.x_shape, ctx.x_dtype, ctx.base_shape = x.shape, x.dtype, base.shape
        ctx.weight_dtypes = (weight_a.dtype, weight_b.dtype)
        return out.view(base.shape)

    @staticmethod
    def backward(ctx, grad_out):
        x2, mask, h, a, b = ctx.saved_tensors
        scaling, p = ctx.scaling, ctx.p
        keep = 1.0 / (1.0 - p) if p > 0 else 1.0
        g = grad_out.reshape(-1, grad_out.shape[-1]).to(h.dtype)
        need_x, need_base, need_a, need_b = ctx.needs_input_grad[:4]
        grad_x = grad_a = grad_b = None
        gh = (g @ b) * scaling if (need_x or need_a) else None
        if need_b:
            grad_b = (g.t() @ h).mul_(scaling).to(ctx.weight_dtypes[1])
        if need_a:
            dropped = x2 if mask is None else torch.ops.aten.native_dropout_backward(x2, mask, keep)
            grad_a = (gh.t() @ dropped).to(ctx.weight_dtypes[0])
        if need_x:
            grad_x = gh @ a
            if mask is not None:
                grad_x = torch.ops.aten.native_dropout_backward(grad_x, mask, keep)
            grad_x = grad_x.view(ctx.x_shape).to(ctx.x_dtype)
        grad_base = grad_out.view(ctx.base_shape) if need_base else None
        return grad_x, grad_base, grad_a, grad_b, None, None


def lora_delta(x, base, weight_a, weight_b, scaling: float, p: float = 0.0):
    """`base + scaling * B(A(dropout_p(x)))` with the memory and kernels described above.

    `base` is the frozen layer's output and sets the compute dtype; under autocast pass
    tensors already in autocast's dtype (`fused_forward` does).
    """
    return _LoraDelta.apply(x, base, weight_a, weight_b, float(scaling), float(p))


def _compute_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return weight.dtype


def _plain_adapter(layer, x, args, kwargs):
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


def _plain_linear(module) -> bool:
    """A torch Linear that nothing hooks: its forward is `F.linear(x, weight, bias)`."""
    return type(module) is torch.nn.Linear and not (module._forward_hooks or module._forward_pre_hooks)


def lean_delta(x, weight, bias, weight_a, weight_b, scaling: float):
    """`x W^T + b + scaling * (x A^T) B^T` without dropout, under autocast, in three aten calls.

    No autograd function of ours: the backward is autograd's own nodes, run by its C++ engine (a
    Python `backward` costs the host more than the three matmuls cost the GPU at LoRA's rank, and
    where the host launches kernels more slowly than the GPU runs them that is the step's time).
    Autocast casts the float32 adapter weights once per forward (its cache holds casts of leaf
    parameters) and `addmm` puts the scaling and the add in the second matmul's epilogue.
    """
    base = torch.nn.functional.linear(x, weight, bias)
    h = torch.nn.functional.linear(x, weight_a)
    out = torch.addmm(base.reshape(-1, base.shape[-1]), h.reshape(-1, h.shape[-1]), weight_b.t(), alpha=scaling)
    return out.view(base.shape)


def fused_forward(layer, x, *args, **kwargs):
    """peft `lora.Linear.forward` with the plain-LoRA case through `lora_delta` (without dropout under
    autocast, over a plain Linear: `lean_delta`); None if not plain."""
    plain = _plain_adapter(layer, x, args, kwargs)
    if plain is None:
        return None
    weight_a, weight_b, scaling, p = plain
    layer._check_forward_args(x)
    base_layer = layer.base_layer
    if p == 0 and LEAN and torch.is_autocast_enabled(x.device.type) and _plain_linear(base_layer):
        return lean_delta(x, base_layer.weight, base_layer.bias, weight_a, weight_b, scaling)
    base = base_layer(x)
    result_dtype = base.dtype
    dtype = _compute_dtype(x, weight_a)
    with torch.autocast(x.device.type, enabled=False):
        out = lora_delta(x.to(dtype), base.to(dtype), weight_a, weight_b, scaling, p)
    return out.to(result_dtype)
