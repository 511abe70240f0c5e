"""Causal attention without a mask for right-padded training batches.

ms-swift pads a training batch on the right: each row is its tokens, then padding. For sdpa
transformers builds a 4-D boolean mask (causal and "not padding") whenever any row is padded;
with a mask, torch's sdpa cannot use its causal flash / cuDNN kernels without a mask and the
grouped-query heads are expanded (`repeat_kv`: k and v copied 4× for Qwen3-VL-4B, and their
gradients summed back). On an H100 the 4B model's decoder attention then ran at about 90
TFLOP/s (1 x H100, 2026-11-25, benchmarks/train_throughput.py _prof; the causal flag: -13.7 % per step).

With right padding the padding is in every real token's future: the causal mask alone hides
it from every real query. So for those queries `is_causal=True` without a mask computes the
same attention; only the pad positions' own outputs change, and nothing reads them (their
labels are ignored and no real position attends to them), so the loss and every gradient are
the same. `right_padded_causal_skip(fn)` wraps transformers' `_ignore_causal_mask_sdpa` so
that, while gradients are being recorded (training), a batch whose padding mask is right-
aligned (each row: ones, then zeros) with queries and keys the same span (no cache offset,
no sliding window) skips the mask as an unpadded batch does. Anything else (left padding,
decoding, inference without gradients, tracing) gets transformers' own answer.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch


def right_aligned(padding_mask: torch.Tensor) -> bool:
    """True if every row of a 2-D keep-mask is ones then zeros (no token after padding)."""
    mask = padding_mask.bool()
    if mask.dim() != 2 or mask.shape[-1] < 2:
        return mask.dim() == 2
    return bool((mask[:, :-1] | ~mask[:, 1:]).all())


def _tracing(tensor: torch.Tensor) -> bool:
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and (compiler.is_compiling() or compiler.is_exporting()):
        return True
    return torch.jit.is_tracing() or isinstance(tensor, torch.fx.Proxy)


def _skippable(arguments: dict[str, Any], known: Callable[[torch.Tensor], bool | None] | None = None) -> bool:
    mask = arguments.get("padding_mask")
    q_length = arguments.get("q_length", arguments.get("query_length"))
    kv_length = arguments.get("kv_length")
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or not isinstance(q_length, int):
        return False
    if q_length <= 1 or q_length != kv_length or mask.shape[-1] != kv_length:
        return False
    for offset in (arguments.get("q_offset", 0), arguments.get("kv_offset", 0)):
        if not isinstance(offset, int) or offset != 0:  # a cache (a tensor offset for static caches)
            return False
    if arguments.get("local_attention_size") is not None or _tracing(mask):
        return False
    aligned = known(mask) if known is not None else None
    return right_aligned(mask) if aligned is None else aligned


def right_padded_causal_skip(
    fn: Callable[..., bool], known: Callable[[torch.Tensor], bool | None] | None = None
) -> Callable[..., bool]:
    """transformers' `_ignore_causal_mask_sdpa`, also True for right-padded training batches.

    `known(mask)`: the mask's alignment where the host already knows it (the forward's facts copied at its start,
    `vision_seqlens.known_right_aligned`), else None: then `right_aligned` reads the mask (a wait for the GPU).
    """
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> bool:
        if torch.is_grad_enabled():
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError:
                bound = None
            if bound is not None and _skippable(bound.arguments, known):
                return True
        return fn(*args, **kwargs)

    wrapper._vlm_lora_right_padding = True
    return wrapper


# ---- item 6 of the plugin (items.py) ----------------------------------------------------------------------------------


def install(ctx):
    """Wraps transformers' `masking_utils._ignore_causal_mask_sdpa` (the forward's facts tell the alignment where
    item 7 gathered them)."""
    from transformers import masking_utils

    from speedups import patching, registry
    from speedups.vision_seqlens import known_right_aligned

    def wrap(original):
        return right_padded_causal_skip(original, known_right_aligned)

    if not patching.wrap_once(masking_utils, "_ignore_causal_mask_sdpa", wrap, "_vlm_lora_right_padding"):
        return registry.target_missing("transformers.masking_utils._ignore_causal_mask_sdpa", version_of="transformers")
    return registry.pending()


def check(ctx, trainer):
    from speedups import patching, registry

    changed = patching.not_ours(registry.item(6))
    if changed:
        return registry.target_missing(*changed, version_of="transformers")
    attn = getattr(getattr(getattr(trainer, "model", None), "config", None), "_attn_implementation", None)
    if isinstance(attn, str) and attn != "sdpa":
        return registry.not_applicable(f"attention {attn}")
    return registry.applied()
