"""The vision tower's sequence boundaries computed on the host, not once per block on the GPU.

Qwen3-VL's vision attention without flash-attn (sdpa, eager) splits q, k and v per image with
`torch.split(t, lengths.tolist())`, where `lengths` comes from `cu_seqlens`, a GPU tensor built
from `grid_thw`. Each `.tolist()` makes the host wait for the GPU: 3 per block, 72 per forward of
the 4B's 24 blocks (counted with torch's sync debug mode on an H100, benchmarks/README.md), each
a point where the GPU runs dry until the host has queued the next kernels.

`host_seqlens(fn)` wraps transformers' `get_vision_attention_seqlens(grid_thw, config, ...)` so
that for those attention implementations it computes the boundaries from a host copy of
`grid_thw` (one copy per forward): the same integers, on the CPU, so every `.tolist()` after it
is free. With flash attention (which reads `cu_seqlens` on the GPU) or a `grid_thw` already on
the host nothing changes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

HOST_SPLIT_IMPLEMENTATIONS = ("sdpa", "eager")


def wants_host_copy(grid_thw: Any, config: Any) -> bool:
    """A device `grid_thw` read only by `.tolist()` (sdpa / eager attention), outside tracing."""
    return (
        isinstance(grid_thw, torch.Tensor)
        and grid_thw.device.type != "cpu"
        and getattr(config, "_attn_implementation", None) in HOST_SPLIT_IMPLEMENTATIONS
        and not torch.jit.is_tracing()
        and not torch.compiler.is_compiling()
    )


def host_seqlens(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`get_vision_attention_seqlens` computing from a host copy of `grid_thw` where only `.tolist()` reads it."""

    @functools.wraps(fn)
    def wrapper(grid_thw: Any, config: Any, *args: Any, **kwargs: Any) -> Any:
        if wants_host_copy(grid_thw, config):
            grid_thw = grid_thw.detach().to("cpu")
        return fn(grid_thw, config, *args, **kwargs)

    wrapper._vlm_lora_host_seqlens = True
    return wrapper


def install(modules: list[Any]) -> int:
    """Wraps `get_vision_attention_seqlens` in each module that has it (vision_utils and the modeling
    files that imported it by name); returns how many were wrapped."""
    count = 0
    for module in modules:
        original = getattr(module, "get_vision_attention_seqlens", None)
        if original is None or getattr(original, "_vlm_lora_host_seqlens", False):
            continue
        module.get_vision_attention_seqlens = host_seqlens(original)
        count += 1
    return count
