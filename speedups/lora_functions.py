"""Item 3's autograd functions: a LoRA branch's forward and backward arithmetic (fused_lora.py says why).

- `lora_delta` (`_LoraDelta`): `base + scaling * B(A(dropout_p(x)))` after a frozen layer that ran on its own;
- `lora_linear` (`_LoraLinear`): a frozen Linear and its LoRA branch as one node, one input gradient buffer;
- `silu_mul_lora_linear` (`_SiluMulLoraLinear`): a down projection that computes `silu(gate) * up` itself and again
  in its backward instead of keeping it (`TorchSiluMul`: that product in PyTorch).

Dropout is nn.Dropout's kernel and its boolean mask, or a seed (`lora_switches.SEEDED`); on a GPU the backward's
masked passes are `lora_triton.py`'s kernels (`TRITON`), which also apply LoRA's scaling (`FOLD`). The adapters'
compute-dtype copies come from `lora_cast_cache.CASTS`.
"""

from __future__ import annotations

import importlib

import torch

from speedups import lora_cast_cache, lora_switches, quantized_lora


def _rank_r(x2: torch.Tensor, a: torch.Tensor, p: float):
    """`h = dropout_p(x2) A^T` and the dropout mask: None without dropout; with the seeded kernels (`SEEDED`, on a
    GPU) a `lora_triton.Seeded`; else nn.Dropout's kernel and its boolean mask."""
    if p <= 0:
        return x2 @ a.t(), None
    if lora_switches.SEEDED and (kernels := _masked_kernels(x2, a)) is not None:
        mask = kernels.seeded(p)
        return kernels.dropped_rank_product(x2, a, mask), mask
    dropped, mask = torch.native_dropout(x2, p, True)
    return dropped @ a.t(), mask


def _saved_mask(ctx, mask):
    """The mask for `save_for_backward` (a tensor or None); a seed is kept on `ctx` instead."""
    ctx.seeded_mask = None if mask is None or isinstance(mask, torch.Tensor) else mask
    return mask if ctx.seeded_mask is None else None


def _mask_of(ctx, saved):
    return saved if ctx.seeded_mask is None else ctx.seeded_mask


_kernels = None  # lora_triton, loaded at first use (False where Triton is missing)


def _load_kernels():
    """`lora_triton` of this package, or False where Triton is missing."""
    global _kernels
    if _kernels is None:
        try:
            _kernels = importlib.import_module(".lora_triton", __package__)
        except ImportError:
            _kernels = False
    return _kernels


def _masked_kernels(*tensors: torch.Tensor):
    """`lora_triton` where its kernels take these operands (switch on, a GPU, eager code), else None."""
    if not lora_switches.TRITON or torch.compiler.is_compiling():
        return None
    kernels = _load_kernels()
    return kernels if kernels and kernels.usable(*tensors) else None


def _kernels_for(mask, *tensors: torch.Tensor):
    """The kernels for a backward pass with `mask`: always for a seed (only they know its mask), else
    `_masked_kernels` (None: PyTorch's kernels with the boolean mask)."""
    if mask is None:
        return None
    if isinstance(mask, torch.Tensor):
        return _masked_kernels(*tensors, mask)
    return _load_kernels()


def _mask_keep(ctx, mask) -> float:
    """The scale of a kept element: from the seed's rounded p, else 1 / (1 - p)."""
    return _keep(ctx.p) if mask is None or isinstance(mask, torch.Tensor) else mask.keep


def _weight_grad_b(g: torch.Tensor, h: torch.Tensor, scaling: float, dtype: torch.dtype) -> torch.Tensor:
    """B's gradient `scaling * g^T h` in B's dtype: on a GPU, for a float32 B from 16-bit operands, one matmul that
    writes float32 and a multiply (`FOLD`), else a matmul in the operands' dtype, a multiply and a cast."""
    if lora_switches.FOLD and g.is_cuda and dtype == torch.float32 and g.dtype in (torch.bfloat16, torch.float16):
        return torch.mm(g.t(), h, out_dtype=torch.float32).mul_(scaling)
    return (g.t() @ h).mul_(scaling).to(dtype)


def _adapter_grads(ctx, g, x2, mask, h, a, b, need_x: bool, need_a: bool, need_b: bool, kernels=None):
    """The rank-r gradient `gh` (None unless needed), A's and B's gradients (in the adapters' dtypes).

    `kernels`: the Triton kernels that apply the mask wherever `gh` is used (`_folding_kernels`); `gh` is then
    returned without LoRA's scaling, which those kernels apply with the dropout scale.
    """
    scaling, keep = ctx.scaling, _mask_keep(ctx, mask)
    gh = None
    if need_x or need_a:
        gh = g @ b if kernels is not None else (g @ b) * scaling
    grad_a = grad_b = None
    if need_b:
        grad_b = _weight_grad_b(g, h, scaling, ctx.weight_dtypes[1])
    if need_a:
        if kernels is not None:
            grad_a = kernels.dropped_weight_grad(gh, x2, mask, keep * scaling).to(ctx.weight_dtypes[0])
        elif (masked := _kernels_for(mask, gh, x2)) is not None:
            grad_a = masked.dropped_weight_grad(gh, x2, mask, keep).to(ctx.weight_dtypes[0])
        else:
            dropped = x2 if mask is None else torch.ops.aten.native_dropout_backward(x2, mask, keep)
            grad_a = (gh.t() @ dropped).to(ctx.weight_dtypes[0])
    return gh, grad_a, grad_b


def _folding_kernels(mask, g, x2, a):
    """The Triton kernels where they apply the mask for every use of `gh` (so they can apply the scaling too):
    with dropout, `FOLD` on and the kernels usable for these operands; else None."""
    if not lora_switches.FOLD or mask is None:
        return None
    return _kernels_for(mask, g, x2, a)


def _keep(p: float) -> float:
    return 1.0 / (1.0 - p) if p > 0 else 1.0


class _LoraDelta(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, base, weight_a, weight_b, scaling: float, p: float, inplace: bool):
        dtype = base.dtype
        a, b = lora_cast_cache.CASTS.get(weight_a, dtype), lora_cast_cache.CASTS.get(weight_b, dtype)
        x2 = x.reshape(-1, x.shape[-1]).to(dtype)
        h, mask = _rank_r(x2, a, p)
        ctx.save_for_backward(x2, _saved_mask(ctx, mask), h, a, b)
        ctx.scaling, ctx.p = scaling, p
        ctx.x_shape, ctx.x_dtype, ctx.base_shape = x.shape, x.dtype, base.shape
        ctx.weight_dtypes = (weight_a.dtype, weight_b.dtype)
        if inplace and base.is_contiguous() and base._base is None:
            base.view(-1, base.shape[-1]).addmm_(h, b.t(), alpha=scaling)
            ctx.mark_dirty(base)
            return base
        out = torch.addmm(base.reshape(-1, base.shape[-1]), h, b.t(), alpha=scaling)
        return out.view(base.shape)

    @staticmethod
    def backward(ctx, grad_out):
        x2, mask, h, a, b = ctx.saved_tensors
        mask = _mask_of(ctx, mask)
        g = grad_out.reshape(-1, grad_out.shape[-1]).to(h.dtype)
        need_x, need_base, need_a, need_b = ctx.needs_input_grad[:4]
        gh, grad_a, grad_b = _adapter_grads(ctx, g, x2, mask, h, a, b, need_x, need_a, need_b)
        grad_x = None
        if need_x:
            if mask is None:
                grad_x = gh @ a
            elif isinstance(mask, torch.Tensor):
                grad_x = torch.ops.aten.native_dropout_backward(gh @ a, mask, _keep(ctx.p))
            else:
                grad_x = _load_kernels().add_dropped_product(torch.zeros_like(x2), gh, a, mask, mask.keep)
            grad_x = grad_x.view(ctx.x_shape).to(ctx.x_dtype)
        grad_base = grad_out.view(ctx.base_shape) if need_base else None
        return grad_x, grad_base, grad_a, grad_b, None, None, None


def _linear_lora_forward(x2, w, bias, a, b, scaling: float, p: float):
    """`x2 W^T + bias + scaling * B(A(dropout_p(x2)))` (2-D, compute dtype); the output, `h` and the mask."""
    out = x2 @ w.t() if bias is None else torch.addmm(bias.to(x2.dtype), x2, w.t())
    h, mask = _rank_r(x2, a, p)
    out.addmm_(h, b.t(), alpha=scaling)
    return out, h, mask


def _linear_lora_backward(ctx, g, x2, mask, h, a, b, weight, need_x: bool, need_a: bool, need_b: bool):
    """The input gradient built in one buffer (None unless `need_x`), A's and B's gradients."""
    folding = _folding_kernels(mask, g, x2, a)
    gh, grad_a, grad_b = _adapter_grads(ctx, g, x2, mask, h, a, b, need_x, need_a, need_b, folding)
    grad_x = None
    if need_x:
        grad_x = g @ weight
        if mask is None:
            grad_x.addmm_(gh, a)
        elif folding is not None:
            folding.add_dropped_product(grad_x, gh, a, mask, _mask_keep(ctx, mask) * ctx.scaling)
        elif (kernels := _kernels_for(mask, grad_x, gh, a)) is not None:
            kernels.add_dropped_product(grad_x, gh, a, mask, _mask_keep(ctx, mask))
        else:
            grad_x.addcmul_(gh @ a, mask, value=_keep(ctx.p))
    return grad_x, grad_a, grad_b


def _saved_weight(ctx, weight, w: torch.Tensor):
    """The frozen weight for `save_for_backward`: the dense tensor of a plain layer (the parameter itself, or
    autocast's cast that F.linear keeps too), None for a bitsandbytes weight, which is kept on `ctx` as its
    `Dequantized` and made dense again in the backward."""
    ctx.dequantized = weight if isinstance(weight, quantized_lora.Dequantized) else None
    return None if ctx.dequantized is not None else w


def _weight_of(ctx, saved, dtype: torch.dtype, needed: bool):
    """The frozen weight in the backward: the saved tensor, or a bitsandbytes weight made dense where `needed`."""
    if ctx.dequantized is None:
        return saved
    return ctx.dequantized.dense(dtype) if needed else None


class _LoraLinear(torch.autograd.Function):
    """A frozen Linear and its LoRA branch as one node: `x W^T + b + scaling * B(A(dropout_p(x)))`.

    The same arithmetic as the frozen layer followed by `_LoraDelta` (the same dropout kernel and
    masks), with the backward's input gradient built in one buffer: `g W`, then LoRA's part added in
    the second matmul's epilogue (`addmm_`) or, with dropout, masked and scaled as it is added (on a
    GPU one Triton kernel that computes the rank-r product in registers; else `addcmul_`) instead of
    a masked-scale kernel and autograd's add of two full gradients.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, weight_a, weight_b, scaling: float, p: float, dtype: torch.dtype):
        # autocast's cast of the frozen weight, which F.linear would keep as well; a bitsandbytes weight made dense
        w = quantized_lora.dense(weight, dtype)
        a, b = lora_cast_cache.CASTS.get(weight_a, dtype), lora_cast_cache.CASTS.get(weight_b, dtype)
        x2 = x.reshape(-1, x.shape[-1]).to(dtype)
        out, h, mask = _linear_lora_forward(x2, w, bias, a, b, scaling, p)
        ctx.save_for_backward(x2, _saved_mask(ctx, mask), h, a, b, _saved_weight(ctx, weight, w))
        ctx.scaling, ctx.p = scaling, p
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        ctx.weight_dtypes = (weight_a.dtype, weight_b.dtype)
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, grad_out):
        x2, mask, h, a, b, weight = ctx.saved_tensors
        mask = _mask_of(ctx, mask)
        g = grad_out.reshape(-1, grad_out.shape[-1]).to(h.dtype)
        need_x, _, _, need_a, need_b = ctx.needs_input_grad[:5]
        weight = _weight_of(ctx, weight, h.dtype, need_x)
        grad_x, grad_a, grad_b = _linear_lora_backward(ctx, g, x2, mask, h, a, b, weight, need_x, need_a, need_b)
        if grad_x is not None:
            grad_x = grad_x.view(ctx.x_shape).to(ctx.x_dtype)
        return grad_x, None, None, grad_a, grad_b, None, None, None


class _SiluMulLoraLinear(torch.autograd.Function):
    """`down(silu(gate) * up)` for a frozen down projection with LoRA, without keeping `silu(gate) * up`.

    An MLP's down projection reads the SiLU-multiply's output `c` (the intermediate width: 9,728 for
    the 4B, 3.8 times the hidden size), and LoRA's A gradient needs `c`, so autograd keeps it for every
    layer next to `gate` and `up`, which the SiLU-multiply's own backward keeps anyway. This node keeps
    `gate` and `up` only and computes `c` again in its backward (one elementwise pass): 2 bytes ×
    intermediate per token × layer less. `silu_mul` gives the product's forward `f(gate, up) -> c` and
    backward `b(gate, up, dc) -> (dgate, dup)`, which may write into `gate` and `up` (Liger's kernels do).
    """

    @staticmethod
    def forward(ctx, gate, up, weight, bias, weight_a, weight_b, scaling: float, p: float, dtype, silu_mul):
        w = quantized_lora.dense(weight, dtype)
        a, b = lora_cast_cache.CASTS.get(weight_a, dtype), lora_cast_cache.CASTS.get(weight_b, dtype)
        gate2 = gate.reshape(-1, gate.shape[-1]).to(dtype)
        up2 = up.reshape(-1, up.shape[-1]).to(dtype)
        c = silu_mul.forward(gate2, up2)
        out, h, mask = _linear_lora_forward(c, w, bias, a, b, scaling, p)
        del c
        ctx.save_for_backward(gate2, up2, _saved_mask(ctx, mask), h, a, b, _saved_weight(ctx, weight, w))
        ctx.scaling, ctx.p, ctx.silu_mul = scaling, p, silu_mul
        ctx.shapes, ctx.dtypes = (gate.shape, up.shape), (gate.dtype, up.dtype)
        ctx.weight_dtypes = (weight_a.dtype, weight_b.dtype)
        return out.view(*gate.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, grad_out):
        gate2, up2, mask, h, a, b, weight = ctx.saved_tensors
        mask = _mask_of(ctx, mask)
        g = grad_out.reshape(-1, grad_out.shape[-1]).to(h.dtype)
        need_gate, need_up, _, _, need_a, need_b = ctx.needs_input_grad[:6]
        need_c = need_gate or need_up
        weight = _weight_of(ctx, weight, h.dtype, need_c)
        c = ctx.silu_mul.forward(gate2, up2) if (need_a or need_c) else None
        grad_c, grad_a, grad_b = _linear_lora_backward(ctx, g, c, mask, h, a, b, weight, need_c, need_a, need_b)
        del c
        grad_gate = grad_up = None
        if need_c:
            grad_gate, grad_up = ctx.silu_mul.backward(gate2, up2, grad_c)
            grad_gate = grad_gate.view(ctx.shapes[0]).to(ctx.dtypes[0]) if need_gate else None
            grad_up = grad_up.view(ctx.shapes[1]).to(ctx.dtypes[1]) if need_up else None
        return grad_gate, grad_up, None, None, grad_a, grad_b, None, None, None, None


class TorchSiluMul:
    """The SiLU-multiply's forward and backward in PyTorch (SiLU in float32, as Liger's kernels compute it)."""

    @staticmethod
    def forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(gate.float()).to(up.dtype) * up

    @staticmethod
    def backward(gate: torch.Tensor, up: torch.Tensor, grad_c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = gate.float()
        sig = torch.sigmoid(a)
        silu = a * sig
        grad = grad_c.float()
        grad_up = (grad * silu).to(up.dtype)
        grad_gate = (grad * (silu * (1 - sig) + sig) * up.float()).to(gate.dtype)
        return grad_gate, grad_up


def lora_delta(x, base, weight_a, weight_b, scaling: float, p: float = 0.0, inplace: bool = False):
    """`base + scaling * B(A(dropout_p(x)))` with the memory and kernels fused_lora.py describes.

    `base` is the frozen layer's output and sets the compute dtype; under autocast pass
    tensors already in autocast's dtype (`fused_forward` does). `inplace`: the product is added
    into `base` itself (returned; no copy of it first), for a `base` nothing else holds or saved
    for its backward, such as a plain Linear's fresh output.
    """
    return _LoraDelta.apply(x, base, weight_a, weight_b, float(scaling), float(p), bool(inplace))


def lora_linear(x, weight, bias, weight_a, weight_b, scaling: float, p: float, dtype: torch.dtype):
    """`x W^T + bias + scaling * B(A(dropout_p(x)))` as one node (`_LoraLinear`), computed in `dtype`.

    `weight`: a frozen plain Linear's weight or a bitsandbytes layer's `quantized_lora.Dequantized`
    (`lora_plain.frozen_weight`); call it with autocast off (`fused_forward` does).
    """
    return _LoraLinear.apply(x, weight, bias, weight_a, weight_b, scaling, p, dtype)


def silu_mul_lora_linear(gate, up, weight, bias, weight_a, weight_b, scaling: float, p: float, dtype, silu_mul):
    """`lora_linear` of `silu_mul.forward(gate, up)` without keeping that product (`_SiluMulLoraLinear`); call it
    with autocast off (`fused_lora.silu_mul_lora` does)."""
    return _SiluMulLoraLinear.apply(gate, up, weight, bias, weight_a, weight_b, scaling, p, dtype, silu_mul)
