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

Four refinements, each measured on an H100 (2026-11-25/26, train_throughput.py) and with its switch below: over
a frozen plain Linear the layer's own matmul runs inside the function (`_LoraLinear`: one node, the
input gradient in one buffer); without dropout under autocast the branch is three aten calls with
autograd's own backward (`lean_delta`), where q/k/v and gate/up share one rank-r matmul
(`SharedInput`); the product is added into the layer's fresh output in place (no copy first); and
on a GPU the backward's two masked passes (the input gradient, A's gradient) are Triton kernels
that apply the mask while reading (`lora_triton.py`). Two more save memory: on a GPU the dropout masks
come from a seed and are computed again where needed (`SEEDED`; nothing kept per layer), and an MLP's
down projection computes `silu(gate) * up` itself and again in its backward (`_SiluMulLoraLinear`).

Two take kernel launches out of each adapted layer, where an 8-row micro-step's host launches kernels more
slowly than the GPU runs them: the adapters' compute-dtype copies are kept from one forward to the next and
refreshed for all adapters together after the weights change (`CastCache`: one `_foreach_copy_` per optimizer
step instead of two cast kernels per layer per forward), and the backward folds LoRA's scaling into the kernels
that already scale (the Triton kernels' dropout scale, a float32-output matmul's multiply) instead of a
multiply of its own, and computes B's float32 gradient without a bfloat16 copy first (`FOLD`).

The matmuls run in the compute dtype (autocast's, else the adapter weights'), the adapter
weights and their gradients stay in their own dtype (float32 master weights), as with peft.
`fused_forward` applies only where the arithmetic is plain LoRA; everything else (DoRA and
other variants, LoRA bias, several active adapters, merged or disabled adapters,
parameters partitioned by DeepSpeed ZeRO-3, hooks on the adapter modules, inference
without gradients) goes through peft's own forward.
"""

from __future__ import annotations

import importlib
import os
import weakref

import torch

from speedups import quantized_lora

# without dropout under autocast: autograd's own nodes instead of the Python function (`lean_delta`);
# VLM_LORA_LEAN_LORA=0 keeps `lora_delta` there too
LEAN = os.environ.get("VLM_LORA_LEAN_LORA", "1") != "0"
# the LoRA product added into the frozen layer's fresh output in place (`addmm_`): an out-of-place `addmm`
# first copies that output (a device-to-device copy of the whole activation per adapted layer);
# VLM_LORA_INPLACE_ADD=0 keeps the out-of-place `addmm` where the layer runs outside the LoRA function
# (`lean_delta`, `lora_delta`; `_LoraLinear` adds into its own output)
INPLACE = os.environ.get("VLM_LORA_INPLACE_ADD", "1") != "0"
# with dropout (or off the lean path), the frozen layer's own matmuls inside the LoRA function (`_LoraLinear`):
# its input gradient and LoRA's are summed in one buffer (a matmul epilogue, or one multiply-add with the
# dropout mask) instead of autograd adding two; VLM_LORA_FUSED_BASE=0 keeps the frozen layer outside
FUSED_BASE = os.environ.get("VLM_LORA_FUSED_BASE", "1") != "0"
# on the lean path, sibling LoRA layers that read one input compute their A projections in one matmul
# (`SharedInput`); VLM_LORA_GROUP_LORA=0 keeps one matmul per layer
GROUP = os.environ.get("VLM_LORA_GROUP_LORA", "1") != "0"
# with dropout on a GPU, the backward's two masked passes as Triton kernels (`lora_triton.py`: the mask applied
# while reading, no full-size product or dropped-out copy written); VLM_LORA_TRITON_LORA=0 keeps PyTorch's kernels
TRITON = os.environ.get("VLM_LORA_TRITON_LORA", "1") != "0"
# an MLP's down projection with LoRA reads silu(gate) * up without keeping it (`_SiluMulLoraLinear`: computed
# again in the backward from gate and up); VLM_LORA_SILU_MUL_DOWN=0 keeps the product for the backward
SILU_MUL_DOWN = os.environ.get("VLM_LORA_SILU_MUL_DOWN", "1") != "0"
# with dropout on a GPU, VLM_LORA_SEEDED_DROPOUT=1: the masks given by a seed and computed in the Triton kernels
# wherever needed (`lora_triton`: `Seeded`) instead of a boolean mask per adapted layer kept until the backward
# (less memory: −18 GiB at 16 x 1; −2.7 to +3.4 % time per step at the same plan, 2 x H200, 2026-11-26,
# benchmarks/train_throughput.py: the train-lora planner sets it where it lets a faster plan fit); unset or 0:
# PyTorch's dropout kernel and its masks
SEEDED = os.environ.get("VLM_LORA_SEEDED_DROPOUT", "0") == "1"
# sibling projections that read the same input in the attention and MLP blocks of the models we train
SHARED_INPUT_NAMES = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
# the adapter weights' compute-dtype copies kept between forwards of the LoRA functions (`CastCache`) instead of
# two cast kernels per adapted layer per forward (504 for the 4B); VLM_LORA_CAST_CACHE=0 casts in every forward
CAST_CACHE = os.environ.get("VLM_LORA_CAST_CACHE", "1") != "0"
# in the backward with dropout on a GPU, LoRA's scaling applied by the Triton kernels (with the dropout scale) and
# B's gradient by one float32-output matmul and its multiply, instead of a multiply of the rank-r gradient, and a
# bfloat16 matmul, multiply and cast; VLM_LORA_FOLD_SCALING=0 keeps the separate kernels
FOLD = os.environ.get("VLM_LORA_FOLD_SCALING", "1") != "0"


def _rank_r(x2: torch.Tensor, a: torch.Tensor, p: float):
    """`h = dropout_p(x2) A^T` and the dropout mask: None without dropout; with the seeded kernels (`SEEDED`, on a
    GPU) a `lora_triton.Seeded`; else nn.Dropout's kernel and its boolean mask."""
    if p <= 0:
        return x2 @ a.t(), None
    if SEEDED and (kernels := _masked_kernels(x2, a)) is not None:
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
    if not TRITON or torch.compiler.is_compiling():
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
    if FOLD and g.is_cuda and dtype == torch.float32 and g.dtype in (torch.bfloat16, torch.float16):
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
    if not FOLD or mask is None:
        return None
    return _kernels_for(mask, g, x2, a)


def _keep(p: float) -> float:
    return 1.0 / (1.0 - p) if p > 0 else 1.0


class CastCache:
    """Each adapter weight's copy in a compute dtype, reused while the weight is unchanged.

    A copy is current while its weight is the same live tensor at the same address and version and no `torch.optim`
    optimizer has stepped since it was made (a global step hook counts the steps: an optimizer that writes through
    `.data` leaves the version alone). When a copy is found stale every stale copy is refreshed, one
    `_foreach_copy_` per (device, dtype) pair: after an optimizer step that is one launch where the forwards
    would cast each adapter. The copies are read by the LoRA functions' forward and backward only (they compute
    the adapters' gradients themselves, so no autograd graph runs through the cast).
    """

    def __init__(self) -> None:
        # (id of the weight, dtype) -> [weak reference to the weight, copy, version, address, optimizer steps]
        self.entries: dict[tuple[int, torch.dtype], list] = {}
        self.steps = 0
        self.hooked = False

    def optimizer_stepped(self, *_args) -> None:
        self.steps += 1

    def _current(self, entry: list, weight: torch.Tensor) -> bool:
        return entry[2] == weight._version and entry[3] == weight.data_ptr() and entry[4] == self.steps

    def get(self, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """`weight.to(dtype)`, from the cache where the switch is on and outside tracing."""
        if weight.dtype == dtype or not CAST_CACHE or torch.compiler.is_compiling() or torch.jit.is_tracing():
            return weight.to(dtype)
        if not self.hooked:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            register_optimizer_step_post_hook(self.optimizer_stepped)
            self.hooked = True
        key = (id(weight), dtype)
        entry = self.entries.get(key)
        if entry is None or entry[0]() is not weight or entry[1].shape != weight.shape:
            copy = weight.detach().to(dtype)
            self.entries[key] = [weakref.ref(weight), copy, weight._version, weight.data_ptr(), self.steps]
            return copy
        if not self._current(entry, weight):
            self.refresh()
        return entry[1]

    def refresh(self) -> int:
        """Brings every stale copy up to date (drops those of freed or reshaped weights); how many it copied."""
        groups: dict[tuple, tuple[list, list, list]] = {}
        for key, entry in list(self.entries.items()):
            weight = entry[0]()
            if weight is None or entry[1].shape != weight.shape or entry[1].device != weight.device:
                del self.entries[key]
                continue
            if self._current(entry, weight):
                continue
            dsts, srcs, stale = groups.setdefault((weight.device, weight.dtype, entry[1].dtype), ([], [], []))
            dsts.append(entry[1])
            srcs.append(weight.detach())
            stale.append((entry, weight))
        copied = 0
        for dsts, srcs, stale in groups.values():
            torch._foreach_copy_(dsts, srcs)
            for entry, weight in stale:
                entry[2], entry[3], entry[4] = weight._version, weight.data_ptr(), self.steps
            copied += len(dsts)
        return copied


CASTS = CastCache()


class _LoraDelta(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, base, weight_a, weight_b, scaling: float, p: float, inplace: bool):
        dtype = base.dtype
        a, b = CASTS.get(weight_a, dtype), CASTS.get(weight_b, dtype)
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
        a, b = CASTS.get(weight_a, dtype), CASTS.get(weight_b, dtype)
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
        a, b = CASTS.get(weight_a, dtype), CASTS.get(weight_b, dtype)
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


def silu_mul_lora(layer, gate, up, silu_mul):
    """`layer(silu(gate) * up)` for a peft LoRA layer whose adapter is plain LoRA over a frozen plain Linear,
    through `_SiluMulLoraLinear` (the product not kept for the backward); None where it does not apply."""
    if not SILU_MUL_DOWN or gate.shape != up.shape or not hasattr(layer, "lora_A") or not hasattr(layer, "base_layer"):
        return None  # no LoRA on the down projection (not a target): the product as before
    plain = _plain_adapter(layer, gate, (), {})
    if plain is None:
        return None
    weight_a, weight_b, scaling, p = plain
    dtype = _compute_dtype(gate, weight_a)
    base_layer = layer.base_layer
    weight = _frozen_weight(base_layer, dtype, torch.is_autocast_enabled(gate.device.type))
    if weight is None or weight.shape[1] != gate.shape[-1] or up.dtype != gate.dtype:
        return None
    with torch.autocast(gate.device.type, enabled=False):
        return _SiluMulLoraLinear.apply(
            gate, up, weight, base_layer.bias, weight_a, weight_b, float(scaling), float(p), dtype, silu_mul
        )


def _frozen_weight(base_layer, dtype: torch.dtype, autocast: bool):
    """What `_LoraLinear` / `_SiluMulLoraLinear` take as the frozen weight: a frozen plain Linear's weight, a frozen
    bitsandbytes layer's `Dequantized` (`quantized_lora.py`), else None (peft's layer runs itself)."""
    if _frozen_linear_in(base_layer, dtype, autocast):
        return base_layer.weight
    return quantized_lora.frozen(base_layer)


def _frozen_linear_in(base_layer, dtype: torch.dtype, autocast: bool) -> bool:
    """A plain Linear whose weights get no gradient and that computes in `dtype` (autocast's, which casts
    its weights each call, or its own): `_LoraLinear` can run it."""
    if not _plain_linear(base_layer):
        return False
    weight, bias = base_layer.weight, base_layer.bias
    params = [weight] if bias is None else [weight, bias]
    return (
        (weight.dtype == dtype or (autocast and weight.is_floating_point()))
        and weight.dim() == 2
        and not any(t.requires_grad or hasattr(t, "ds_id") for t in params)
    )


def lora_delta(x, base, weight_a, weight_b, scaling: float, p: float = 0.0, inplace: bool = False):
    """`base + scaling * B(A(dropout_p(x)))` with the memory and kernels described above.

    `base` is the frozen layer's output and sets the compute dtype; under autocast pass
    tensors already in autocast's dtype (`fused_forward` does). `inplace`: the product is added
    into `base` itself (returned; no copy of it first), for a `base` nothing else holds or saved
    for its backward, such as a plain Linear's fresh output.
    """
    return _LoraDelta.apply(x, base, weight_a, weight_b, float(scaling), float(p), bool(inplace))


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


class SharedInput:
    """LoRA layers of one block that read the same input: their rank-r projections in one matmul.

    q, k and v (gate and up) each compute `x A^T` from the same `x`: three narrow matmuls that each
    read the whole input forward, and three more (input gradient, A's gradient) backward, plus the
    adds of three input gradients. The first member called with an input computes `x [A_q; A_k; A_v]^T`
    for every member on the lean path and keeps the other members' column slices; a member called with
    the very same tensor (same object, same version) takes its slice. Backward, autograd then runs one
    matmul for the input's gradient and one for the stacked A's gradient. A member called with another
    input computes alone, and the group turns itself off (the block does not feed them one input).
    """

    def __init__(self, layers) -> None:
        self.layers = tuple(layers)
        self.enabled = True
        self._clear()

    def _clear(self) -> None:
        self.x: torch.Tensor | None = None
        self.version = -1
        self.slices: dict[int, torch.Tensor] = {}

    def rank_input(self, layer, x: torch.Tensor, weight_a: torch.Tensor) -> torch.Tensor:
        """`x A^T` for `layer` (its `weight_a`), from the group's one matmul where it can."""
        if self.enabled and self.x is x and self.version == x._version:
            h = self.slices.pop(id(layer), None)
            if h is not None:
                if not self.slices:
                    self._clear()
                return h
        if self.slices:  # a member did not get the input the others got: not one input here
            self.enabled = False
        self._clear()
        members = self._members(layer, x, weight_a) if self.enabled else []
        if len(members) < 2:
            return torch.nn.functional.linear(x, weight_a)
        weights = [w for _, w in members]
        h_all = torch.nn.functional.linear(x, torch.cat(weights))
        mine = None
        for (member, _), h in zip(members, h_all.split([w.shape[0] for w in weights], dim=-1)):
            if member is layer:
                mine = h
            else:
                self.slices[id(member)] = h
        self.x, self.version = x, x._version
        return mine

    def _members(self, layer, x, weight_a) -> list[tuple[object, torch.Tensor]]:
        """(layer, A) of the members the lean path would take for this input, the caller among them."""
        members = []
        for member in self.layers:
            if member is layer:
                members.append((layer, weight_a))
                continue
            plain = _plain_adapter(member, x, (), {})
            if plain is None or plain[3] != 0 or not _plain_linear(member.base_layer):
                continue
            other_a = plain[0]
            if other_a.dtype == weight_a.dtype and other_a.shape[1] == weight_a.shape[1]:
                members.append((member, other_a))
        return members


def group_shared_inputs(model: torch.nn.Module) -> int:
    """Gives sibling LoRA layers that read one input (`SHARED_INPUT_NAMES`) a `SharedInput`; how many groups."""
    count = 0
    for module in model.modules():
        for names in SHARED_INPUT_NAMES:
            layers = [getattr(module, n, None) for n in names]
            layers = [m for m in layers if m is not None and hasattr(m, "lora_A") and hasattr(m, "base_layer")]
            if len(layers) < 2 or any(getattr(m, "_vlm_lora_shared_input", None) for m in layers):
                continue
            group = SharedInput(layers)
            for member in layers:
                member._vlm_lora_shared_input = group
            count += 1
    return count


def lean_delta(x, weight, bias, weight_a, weight_b, scaling: float, h: torch.Tensor | None = None):
    """`x W^T + b + scaling * (x A^T) B^T` without dropout, under autocast, in three aten calls.

    No autograd function of ours: the backward is autograd's own nodes, run by its C++ engine (a
    Python `backward` costs the host more than the three matmuls cost the GPU at LoRA's rank, and
    where the host launches kernels more slowly than the GPU runs them that is the step's time).
    `addmm_` puts the scaling and the add in the second matmul's epilogue, in place on the frozen
    layer's output (no copy of it first; `INPLACE`).
    """
    x2 = x.reshape(-1, x.shape[-1])
    base = torch.nn.functional.linear(x2, weight, bias)  # 2-D: a fresh tensor, not a view of one
    h = torch.nn.functional.linear(x2, weight_a) if h is None else h.reshape(-1, h.shape[-1])
    if INPLACE and base.dtype == h.dtype:
        # F.linear's backward does not keep its output, so adding into it in place is safe for autograd
        # and saves the copy an out-of-place addmm makes first; autocast does not cast for in-place ops,
        # so B (rank r: a small kernel) is cast here
        out = base.addmm_(h, weight_b.to(h.dtype).t(), alpha=scaling)
    else:
        out = torch.addmm(base, h, weight_b.t(), alpha=scaling)
    return out.view(*x.shape[:-1], out.shape[-1])


def fused_forward(layer, x, *args, **kwargs):
    """peft `lora.Linear.forward` for plain LoRA (None if not plain): without dropout under autocast over a
    plain Linear `lean_delta` (its rank-r product from the layer's `SharedInput` group where it has one);
    else over a frozen plain Linear `_LoraLinear` (the layer and its branch as one node); else the layer,
    then `lora_delta`."""
    plain = _plain_adapter(layer, x, args, kwargs)
    if plain is None:
        return None
    weight_a, weight_b, scaling, p = plain
    layer._check_forward_args(x)
    base_layer = layer.base_layer
    if p == 0 and LEAN and torch.is_autocast_enabled(x.device.type) and _plain_linear(base_layer):
        group = getattr(layer, "_vlm_lora_shared_input", None) if GROUP else None
        h = group.rank_input(layer, x, weight_a) if group is not None else None
        return lean_delta(x, base_layer.weight, base_layer.bias, weight_a, weight_b, scaling, h)
    dtype = _compute_dtype(x, weight_a)
    weight = _frozen_weight(base_layer, dtype, torch.is_autocast_enabled(x.device.type)) if FUSED_BASE else None
    if weight is not None:
        with torch.autocast(x.device.type, enabled=False):
            return _LoraLinear.apply(x, weight, base_layer.bias, weight_a, weight_b, float(scaling), float(p), dtype)
    base = base_layer(x)
    result_dtype = base.dtype
    with torch.autocast(x.device.type, enabled=False):
        inplace = INPLACE and _plain_linear(base_layer)  # its output: fresh, not kept by its backward or hooks
        out = lora_delta(x.to(dtype), base.to(dtype), weight_a, weight_b, scaling, p, inplace)
    return out.to(result_dtype)


# ---- item 3 of the plugin (items.py): peft's LoRA Linear through `fused_forward` ----------------------------------

# what `fused_forward` reads of a peft LoRA Linear (`_plain_adapter`, `fused_forward`)
FORWARD_READS = (
    "disable_adapters",
    "merged",
    "active_adapters",
    "lora_A",
    "lora_B",
    "lora_dropout",
    "lora_variant",
    "scaling",
    "base_layer",
    "_check_forward_args",
)


def _route(cls) -> None:
    """`cls.forward` through `fused_forward` (its own forward where that returns None), once."""
    original = cls.forward
    if getattr(original, "_vlm_lora_fused", False):
        return

    def forward(self, x, *args, **kwargs):
        out = fused_forward(self, x, *args, **kwargs)
        return original(self, x, *args, **kwargs) if out is None else out

    forward._vlm_lora_fused = True
    forward._vlm_lora_original = original
    cls.forward = forward


def lora_classes() -> list[type]:
    """peft's LoRA Linear and, where bitsandbytes is installed, its LoRA classes over 4-bit / 8-bit layers."""
    from peft.tuners.lora.layer import Linear

    return [Linear, *quantized_lora.peft_classes().values()]


def install(ctx):
    """Routes peft's `lora.Linear.forward` (and `lora.bnb.Linear4bit` / `Linear8bitLt`'s) through `fused_forward`
    (peft's own forward where that returns None)."""
    from peft.tuners.lora.layer import Linear

    from speedups import registry

    if getattr(Linear, "forward", None) is None:
        return registry.target_missing("peft.tuners.lora.layer.Linear.forward", version_of="peft")
    for cls in lora_classes():
        _route(cls)
    return registry.pending()


def check(ctx, trainer):
    """Applied where the model's peft LoRA Linear layers have what `fused_forward` reads (else peft's forward is put
    back and the names are said); groups the layers that read one input (`SharedInput`)."""
    from peft.tuners.lora.layer import Linear

    from speedups import patching, registry

    if not patching.ours(Linear.forward):
        return registry.target_missing("peft.tuners.lora.layer.Linear.forward", version_of="peft")
    classes = tuple(cls for cls in lora_classes() if patching.ours(cls.forward))
    layers = [m for m in trainer.model.modules() if isinstance(m, classes)]
    if not layers:
        quantized = quantized_lora.quantization_of_model(trainer.model)
        if quantized != "none":
            return registry.found_nothing(f"no peft LoRA layer over a Linear or a {quantized} bitsandbytes layer")
        return registry.found_nothing("no peft LoRA Linear layer")
    missing = sorted({name for layer in layers for name in FORWARD_READS if not hasattr(layer, name)})
    if missing:
        patching.restore(registry.item(3))  # peft's own forward for every layer
        return registry.target_missing(
            *(f"peft.tuners.lora.layer.Linear.{name}" for name in missing), version_of="peft"
        )
    detail = f"{len(layers)} LoRA layers"
    over_bnb = sum(1 for m in layers if quantized_lora.frozen(m.base_layer) is not None)
    if over_bnb:
        detail += f" ({over_bnb} over bitsandbytes layers, their weights dequantised per use)"
    if GROUP and LEAN:
        groups = group_shared_inputs(trainer.model)
        if groups:
            detail += f", {groups} groups of one input"
            ctx.say(
                f"one rank-r matmul for each of {groups} groups of LoRA layers that read one input (q/k/v, gate/up; "
                "without dropout)"
            )
    if TRITON and SEEDED and torch.cuda.is_available():
        detail += ", dropout masks from seeds"
        ctx.say(
            "LoRA's dropout masks from seeds in the Triton kernels, none kept for the backward "
            "(VLM_LORA_SEEDED_DROPOUT=1)"
        )
    return registry.applied(detail)
