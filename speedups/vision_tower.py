"""The frozen vision tower's forward in fewer, larger kernels: same arithmetic, less launch and copy work.

Qwen3-VL's vision tower runs once per micro-step for every image (the 4B: 24 blocks over 4,096 patches
per 1024² drawing) and is frozen, so its forward is pure cost to a LoRA run. Three of its pieces run in
a shape the GPU handles badly:

1. The patch embedding is a `Conv3d` whose kernel equals its stride (no overlap): the same products as
   one matrix multiply of the flattened patches with the flattened weight. cuDNN takes a convolution
   algorithm for it (on some GPU / cuDNN / dtype combinations a very slow one; transformers' own opt-in
   `fusion_config={"patch_embeddings": True}` makes the same change at load time, renaming the weight).
   `linear_patch_embed` gives the module a forward that calls `F.linear` on views of the same input and
   the same weight: the checkpoint, the parameter names and saving are untouched. A weight partitioned by
   DeepSpeed ZeRO-3 (gathered only when the convolution module itself is called) keeps the convolution.
2. The rotary embedding (`apply_rotary_pos_emb_vision`) casts q and k to float32, concatenates halves and
   multiplies and adds in separate kernels: about 70 ms of a 250 ms forward for 16 drawings on an H100.
   `fused_rotary` runs it as one Triton kernel (`vision_triton.py`) with the same float32 operations and
   one rounding: the same numbers. Where q or k wants a gradient (a vision tower being trained) or the
   kernel cannot take the tensors, the function it wraps runs. With Liger (`use_liger_kernel`) transformers
   puts Liger's vision rotary in place when training starts (float32 copies of q and k, its rope kernel,
   copies back to bf16: 20-25 ms per step of 16 drawings), after the plugin has patched the model; so the
   wrapper is put back, over whatever function is there, before each forward of the tower.
3. Under bf16 autocast every LayerNorm of the tower (two per block, one per patch merger) runs in float32:
   a float32 copy of its input, a float32 output, then a cast back to bf16 by the linear layer that reads
   it. Each of those norms feeds only a linear layer, so `bf16_layer_norms` runs it on the bf16 input
   with autocast off: PyTorch's kernel computes in float32 all the same and rounds once on writing, which
   is the value the linear layer would have cast it to.

Measured on an H100 (`speedups/benchmarks/vision_forward.py`, 16 drawings of 1024², bf16 autocast): 249 ms per
forward; the matmul patch embedding −8 ms, the rotary kernel −58 ms, the 16-bit norms −18 ms, all three 161 ms;
the rotary and the norms give bit-equal outputs. (PyTorch's variable-length flash attention, one call per block for
all images, was slower than cuDNN's per-image sdpa there: 85 against 57 ms of attention kernels.)

They apply to Qwen3-VL's vision classes by name (`PATCH_EMBED_CLASSES`, `BLOCK_CLASSES`, `MERGER_CLASSES`,
`TOWER_CLASSES`) and to the modeling files' `apply_rotary_pos_emb_vision`; the train-lora plugin installs
them when the trainer holds the model (`install`; switch `VLM_LORA_FAST_VISION=0` turns them off).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

PATCH_EMBED_CLASSES = frozenset({"Qwen3VLVisionPatchEmbed", "Qwen3VLMoeVisionPatchEmbed"})
BLOCK_CLASSES = frozenset({"Qwen3VLVisionBlock", "Qwen3VLMoeVisionBlock"})
TOWER_CLASSES = frozenset({"Qwen3VLVisionModel", "Qwen3VLMoeVisionModel"})
MERGER_CLASSES = frozenset({"Qwen3VLVisionPatchMerger", "Qwen3VLMoeVisionPatchMerger"})
# the norms of those classes, each read by a linear layer only
NORMS = {"block": ("norm1", "norm2"), "merger": ("norm",)}


def _is_patchwise(proj: Any) -> bool:
    """A Conv3d that reads each patch once: kernel = stride, no padding, dilation or groups."""
    return (
        isinstance(proj, torch.nn.Conv3d)
        and tuple(proj.stride) == tuple(proj.kernel_size)
        and tuple(proj.padding) == (0, 0, 0)
        and tuple(proj.dilation) == (1, 1, 1)
        and proj.groups == 1
        and proj.padding_mode == "zeros"
    )


def patch_embed_linear(proj: torch.nn.Conv3d, hidden_states: torch.Tensor) -> torch.Tensor:
    """The patch-wise Conv3d as one matmul: (patches, C·T·P·P) @ weight(out, C·T·P·P)ᵀ + bias."""
    weight = proj.weight
    flat = hidden_states.reshape(-1, weight[0].numel()).to(weight.dtype)
    return F.linear(flat, weight.reshape(weight.shape[0], -1), proj.bias)


def linear_patch_embed(model: torch.nn.Module) -> int:
    """Gives each Qwen3-VL patch embedding with a patch-wise Conv3d the matmul forward; returns how many."""
    count = 0
    for module in model.modules():
        if type(module).__name__ not in PATCH_EMBED_CLASSES or not _is_patchwise(getattr(module, "proj", None)):
            continue
        if getattr(module.forward, "_vlm_lora_linear_patch", False):
            continue

        def forward(self: Any, hidden_states: torch.Tensor, _original: Any = module.forward) -> torch.Tensor:
            if hasattr(self.proj.weight, "ds_id"):  # partitioned by ZeRO-3: only proj's own call gathers it
                return _original(hidden_states)
            return patch_embed_linear(self.proj, hidden_states).view(-1, self.proj.out_channels)

        forward._vlm_lora_linear_patch = True
        module.forward = types.MethodType(forward, module)
        count += 1
    return count


def fused_rotary(fn: Callable[..., Any], kernels: Any) -> Callable[..., Any]:
    """`apply_rotary_pos_emb_vision` through the Triton kernel (`vision_triton`) where it takes the tensors."""

    @functools.wraps(fn)
    def apply_rotary_pos_emb_vision(q, k, cos, sin):
        if not torch.compiler.is_compiling() and kernels.usable(q, k, cos, sin):
            return kernels.rotary(q, k, cos, sin)
        return fn(q, k, cos, sin)

    apply_rotary_pos_emb_vision._vlm_lora_fused_rotary = True
    return apply_rotary_pos_emb_vision


def install_fused_rotary(modules: list[Any], kernels: Any) -> int:
    """Wraps `apply_rotary_pos_emb_vision` in each modeling module that has it; returns how many."""
    count = 0
    for module in modules:
        original = getattr(module, "apply_rotary_pos_emb_vision", None)
        if original is None or getattr(original, "_vlm_lora_fused_rotary", False):
            continue
        module.apply_rotary_pos_emb_vision = fused_rotary(original, kernels)
        count += 1
    return count


def rotary_before_each_forward(model: torch.nn.Module, modules: list[Any], kernels: Any) -> int:
    """Wraps the rotary now and again before each forward of every Qwen3-VL vision tower in `model` (transformers
    puts Liger's vision rotary in place when training starts, replacing an earlier wrapper); how many towers."""
    install_fused_rotary(modules, kernels)

    def before_forward(_module: Any, _args: Any) -> None:  # returns None: the forward's arguments stay as they are
        install_fused_rotary(modules, kernels)

    count = 0
    for module in model.modules():
        if type(module).__name__ not in TOWER_CLASSES or getattr(module, "_vlm_lora_rotary_hook", False):
            continue
        module.register_forward_pre_hook(before_forward)
        module._vlm_lora_rotary_hook = True
        count += 1
    return count


def bf16_layer_norm(norm: torch.nn.LayerNorm, x: torch.Tensor) -> torch.Tensor | None:
    """The norm of a 16-bit `x` in x's dtype with autocast off, where autocast would run it in float32 for a
    linear layer to cast back: the same value. None where that does not hold (no autocast, other dtypes)."""
    device = x.device.type
    if not torch.is_autocast_enabled(device) or x.dtype not in (torch.bfloat16, torch.float16):
        return None
    if x.dtype != torch.get_autocast_dtype(device) or any(
        p is not None and p.dtype != x.dtype for p in (norm.weight, norm.bias)
    ):
        return None
    with torch.autocast(device, enabled=False):
        return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def bf16_layer_norms(model: torch.nn.Module) -> int:
    """Gives the vision blocks' and patch mergers' LayerNorms the 16-bit path (`bf16_layer_norm`); how many."""
    count = 0
    for module in model.modules():
        kind = "block" if type(module).__name__ in BLOCK_CLASSES else "merger"
        if type(module).__name__ not in BLOCK_CLASSES | MERGER_CLASSES:
            continue
        for name in NORMS[kind]:
            norm = getattr(module, name, None)
            if type(norm) is not torch.nn.LayerNorm or getattr(norm.forward, "_vlm_lora_bf16_norm", False):
                continue
            original = norm.forward

            def forward(self: Any, x: torch.Tensor, _original: Any = original) -> torch.Tensor:
                out = bf16_layer_norm(self, x)
                return _original(x) if out is None else out

            forward._vlm_lora_bf16_norm = True
            norm.forward = types.MethodType(forward, norm)
            count += 1
    return count


def install(model: torch.nn.Module, modeling_modules: list[Any], kernels: Any = None) -> dict[str, int]:
    """The three changes where `model` has a Qwen3-VL vision tower (the rotary in `modeling_modules`, with
    `kernels` = vision_triton, or None without Triton / a GPU); how many modules each reached, zeros left out."""
    counts = {"patch_embed": linear_patch_embed(model), "layer_norm": bf16_layer_norms(model)}
    if kernels is not None and any(counts.values()):
        counts["rotary"] = rotary_before_each_forward(model, modeling_modules, kernels)
    return {k: v for k, v in counts.items() if v}


# ---- item 13 of the plugin (items.py) ---------------------------------------------------------------------------------


def check(ctx, trainer) -> Any:
    """The three changes on the trainer's model (the rotary kernel only with Triton and a GPU)."""
    import importlib
    import sys

    from speedups import registry

    kernels = None
    if torch.cuda.is_available():
        try:
            kernels = importlib.import_module(".vision_triton", __package__)
        except ImportError:
            kernels = None
    modeling = [
        m for name, m in list(sys.modules.items()) if name.startswith("transformers.models.qwen3_vl") and m is not None
    ]
    fast = install(trainer.model, modeling, kernels)
    ctx.state["fast_vision"] = fast
    if not fast:
        return registry.found_nothing("no Qwen3-VL vision tower")
    done = ", ".join(f"{k} {v}" for k, v in fast.items())
    ctx.say(f"vision tower in fewer kernels ({done}; rotary = modeling files)")
    return registry.applied(done)
