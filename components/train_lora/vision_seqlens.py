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

The tower's two other index helpers wait for the GPU too: `get_vision_position_ids` (`.tolist()`
of the grid, 3 waits per forward) and `get_vision_interpolation_indices_and_weights`
(`repeat_interleave` by GPU counts and an `arange` of their sum: 7 waits). `host_position_ids` and
`host_interpolation` compute them from the same host copy of the grid (integer index arithmetic and
float32 weights from the same elementwise operations) and send the results to the grid's device from
pinned memory without waiting. All three share one host copy per grid tensor (`host_copy`): one
wait per forward instead of 11 (with sdpa; the boundaries' 72 were gone already).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch

HOST_SPLIT_IMPLEMENTATIONS = ("sdpa", "eager")


# the last grid copied to the host: (a weak reference to the device tensor, its version, the copy)
_last_copy: list[Any] = [None, -1, None]


def device_grid(grid_thw: Any) -> bool:
    """A `grid_thw` on an accelerator, outside tracing and compilation (where host copies are not wanted)."""
    return (
        isinstance(grid_thw, torch.Tensor)
        and grid_thw.device.type != "cpu"
        and not torch.jit.is_tracing()
        and not torch.compiler.is_compiling()
    )


def wants_host_copy(grid_thw: Any, config: Any) -> bool:
    """A device `grid_thw` read only by `.tolist()` (sdpa / eager attention), outside tracing."""
    return device_grid(grid_thw) and getattr(config, "_attn_implementation", None) in HOST_SPLIT_IMPLEMENTATIONS


def host_copy(grid_thw: torch.Tensor) -> torch.Tensor:
    """`grid_thw` on the host, copied once per tensor (and per in-place change of it): one wait for the GPU."""
    ref, version, copy = _last_copy
    try:
        current = grid_thw._version
    except RuntimeError:  # an inference tensor has no version counter: not cached
        return grid_thw.detach().to("cpu")
    if ref is not None and ref() is grid_thw and version == current:
        return copy
    copy = grid_thw.detach().to("cpu")
    _last_copy[:] = [weakref.ref(grid_thw), current, copy]
    return copy


def _to_device(out: Any, device: torch.device) -> Any:
    """Tensors (or a tuple of them) sent to `device` from pinned memory, without waiting."""
    if isinstance(out, tuple):
        return tuple(_to_device(t, device) for t in out)
    if device.type == "cuda":
        out = out.pin_memory()
    return out.to(device, non_blocking=True)


def host_seqlens(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`get_vision_attention_seqlens` computing from a host copy of `grid_thw` where only `.tolist()` reads it."""

    @functools.wraps(fn)
    def wrapper(grid_thw: Any, config: Any, *args: Any, **kwargs: Any) -> Any:
        if wants_host_copy(grid_thw, config):
            grid_thw = host_copy(grid_thw)
        return fn(grid_thw, config, *args, **kwargs)

    wrapper._vlm_lora_host_seqlens = True
    return wrapper


def _precomputed(kwargs: dict[str, Any], names: tuple[str, ...]) -> bool:
    """The caller passed any of `names` in the helper's `kwargs` dict (the helper then pops and returns them)."""
    given = kwargs.get("kwargs")
    return isinstance(given, dict) and any(name in given for name in names)


def _host_helper(fn: Callable[..., Any], precomputed: tuple[str, ...], marker: str) -> Callable[..., Any]:
    """`fn(grid_thw, ...)` computed from the host copy of a device grid, its results sent back to the grid's device;
    anything else (a host grid, a per-image merge-size tensor, precomputed results) goes to `fn` unchanged."""

    @functools.wraps(fn)
    def wrapper(grid_thw: Any, *args: Any, **kwargs: Any) -> Any:
        plain = all(not isinstance(a, torch.Tensor) for a in (*args, *kwargs.values()))
        if not device_grid(grid_thw) or not plain or _precomputed(kwargs, precomputed):
            return fn(grid_thw, *args, **kwargs)
        return _to_device(fn(host_copy(grid_thw), *args, **kwargs), grid_thw.device)

    setattr(wrapper, marker, True)
    return wrapper


def host_position_ids(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`get_vision_position_ids` from the host copy of the grid (see the module's docstring)."""
    return _host_helper(fn, ("position_ids",), "_vlm_lora_host_position_ids")


def host_interpolation(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`get_vision_interpolation_indices_and_weights` from the host copy of the grid."""
    return _host_helper(fn, ("interp_indices", "interp_weights"), "_vlm_lora_host_interpolation")


WRAPPERS = {
    "get_vision_attention_seqlens": (host_seqlens, "_vlm_lora_host_seqlens"),
    "get_vision_position_ids": (host_position_ids, "_vlm_lora_host_position_ids"),
    "get_vision_interpolation_indices_and_weights": (host_interpolation, "_vlm_lora_host_interpolation"),
}


def install(modules: list[Any], names: tuple[str, ...] = ("get_vision_attention_seqlens",)) -> int:
    """Wraps each of `names` (keys of `WRAPPERS`) in each module that has it (vision_utils and the modeling
    files that imported it by name), once; returns how many were wrapped."""
    count = 0
    for module in modules:
        for name in names:
            wrap, marker = WRAPPERS[name]
            original = getattr(module, name, None)
            if original is None or getattr(original, marker, False):
                continue
            setattr(module, name, wrap(original))
            count += 1
    return count
