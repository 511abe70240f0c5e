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

Where each part is, beside this file: the switches (`lora_switches.py`), which layers are plain LoRA
(`lora_plain.py`), the autograd functions (`lora_functions.py`: `lora_delta`, `_LoraLinear`, `_SiluMulLoraLinear`),
the lean path and `SharedInput` (`lora_lean.py`), the cast copies (`lora_cast_cache.py`), the Triton kernels
(`lora_triton.py`), bitsandbytes weights (`quantized_lora.py`). Here: `fused_forward` and `silu_mul_lora`, which
choose the path for a layer, and item 3's `install` / `check`.
"""

from __future__ import annotations

import torch

from speedups import lora_switches, quantized_lora
from speedups.lora_functions import lora_delta, lora_linear, silu_mul_lora_linear
from speedups.lora_lean import group_shared_inputs, lean_delta
from speedups.lora_plain import compute_dtype, frozen_weight, plain_adapter, plain_linear


def fused_forward(layer, x, *args, **kwargs):
    """peft `lora.Linear.forward` for plain LoRA (None if not plain): without dropout under autocast over a
    plain Linear `lean_delta` (its rank-r product from the layer's `SharedInput` group where it has one);
    else over a frozen plain Linear `lora_linear` (the layer and its branch as one node); else the layer,
    then `lora_delta`."""
    plain = plain_adapter(layer, x, args, kwargs)
    if plain is None:
        return None
    weight_a, weight_b, scaling, p = plain
    layer._check_forward_args(x)
    base_layer = layer.base_layer
    if p == 0 and lora_switches.LEAN and torch.is_autocast_enabled(x.device.type) and plain_linear(base_layer):
        group = getattr(layer, "_vlm_lora_shared_input", None) if lora_switches.GROUP else None
        h = group.rank_input(layer, x, weight_a) if group is not None else None
        return lean_delta(x, base_layer.weight, base_layer.bias, weight_a, weight_b, scaling, h)
    dtype = compute_dtype(x, weight_a)
    weight = None
    if lora_switches.FUSED_BASE:
        weight = frozen_weight(base_layer, dtype, torch.is_autocast_enabled(x.device.type))
    if weight is not None:
        with torch.autocast(x.device.type, enabled=False):
            return lora_linear(x, weight, base_layer.bias, weight_a, weight_b, float(scaling), float(p), dtype)
    base = base_layer(x)
    result_dtype = base.dtype
    with torch.autocast(x.device.type, enabled=False):
        # a plain Linear's output: fresh, not kept by its backward or hooks
        inplace = lora_switches.INPLACE and plain_linear(base_layer)
        out = lora_delta(x.to(dtype), base.to(dtype), weight_a, weight_b, scaling, p, inplace)
    return out.to(result_dtype)


def silu_mul_lora(layer, gate, up, silu_mul):
    """`layer(silu(gate) * up)` for a peft LoRA layer whose adapter is plain LoRA over a frozen plain Linear,
    through `silu_mul_lora_linear` (the product not kept for the backward); None where it does not apply."""
    if not lora_switches.SILU_MUL_DOWN or gate.shape != up.shape:
        return None
    if not hasattr(layer, "lora_A") or not hasattr(layer, "base_layer"):
        return None  # no LoRA on the down projection (not a target): the product as before
    plain = plain_adapter(layer, gate, (), {})
    if plain is None:
        return None
    weight_a, weight_b, scaling, p = plain
    dtype = compute_dtype(gate, weight_a)
    base_layer = layer.base_layer
    weight = frozen_weight(base_layer, dtype, torch.is_autocast_enabled(gate.device.type))
    if weight is None or weight.shape[1] != gate.shape[-1] or up.dtype != gate.dtype:
        return None
    with torch.autocast(gate.device.type, enabled=False):
        return silu_mul_lora_linear(
            gate, up, weight, base_layer.bias, weight_a, weight_b, float(scaling), float(p), dtype, silu_mul
        )


# ---- item 3 of the plugin (items.py): peft's LoRA Linear through `fused_forward` ----------------------------------

# what `fused_forward` reads of a peft LoRA Linear (`lora_plain.plain_adapter`, `fused_forward`)
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
    if lora_switches.GROUP and lora_switches.LEAN:
        groups = group_shared_inputs(trainer.model)
        if groups:
            detail += f", {groups} groups of one input"
            ctx.say(
                f"one rank-r matmul for each of {groups} groups of LoRA layers that read one input (q/k/v, gate/up; "
                "without dropout)"
            )
    if lora_switches.TRITON and lora_switches.SEEDED and torch.cuda.is_available():
        detail += ", dropout masks from seeds"
        ctx.say(
            "LoRA's dropout masks from seeds in the Triton kernels, none kept for the backward "
            "(VLM_LORA_SEEDED_DROPOUT=1)"
        )
    return registry.applied(detail)
