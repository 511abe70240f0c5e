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

The rest of the tower's grid work (`install_grid`): from the same device `grid_thw` the tower
derives the position embedding's interpolation indices and weights and the rotary position ids
(`get_vision_interpolation_indices_and_weights`, `get_vision_position_ids`: `.tolist()`,
`repeat_interleave` and `arange(sum)` on the GPU, 10 host waits per forward), and
`get_image_features` splits the image embeddings by sizes read from it (one more). `host_grid_call`
wraps the tower's forward and the model's `get_image_features` / `get_video_features`: a device grid
becomes one host copy, the call runs with it, and the device its results belong on is held in
`TARGET` meanwhile. Under `TARGET` the two index functions compute each image's part on the host
once per image size and keep it on the device (`DeviceParts`, a cache of the 64 sizes last used: the same
integers and weights for every drawing of that size, so a run of one image size computes them once; 64 bytes
per patch, at most 48 MiB of GPU memory for 64 sizes of the largest image 3,000 tokens allow), then
concatenate the parts on the device; `host_seqlens` moves the boundaries to the device where the
attention reads them there (flash attention). A forward thus waits for the GPU once, for the copy of
`grid_thw`, instead of 12 times, and does no index arithmetic on the host after the first batch of
each size (about 3 ms for 8 drawings of 1024², 9 ms for 16, on one CPU thread).
"""

from __future__ import annotations

import contextvars
import functools
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

HOST_SPLIT_IMPLEMENTATIONS = ("sdpa", "eager")
# the device the results of a forward running with a host copy of its grid belong on (None: no such forward)
TARGET: contextvars.ContextVar = contextvars.ContextVar("vlm_lora_vision_target", default=None)
TOWER_CLASSES = frozenset({"Qwen3VLVisionModel", "Qwen3VLMoeVisionModel"})
MODEL_CLASSES = frozenset({"Qwen3VLModel", "Qwen3VLMoeModel"})
# (method, the grid's argument name) of the calls that get a host copy of their grid
GRID_CALLS = {
    "tower": (("forward", "grid_thw"),),
    "model": (("get_image_features", "image_grid_thw"), ("get_video_features", "video_grid_thw")),
}


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
        cu_seqlens, max_seqlen = fn(grid_thw, config, *args, **kwargs)
        target = TARGET.get()
        if (
            target is not None
            and isinstance(cu_seqlens, torch.Tensor)
            and cu_seqlens.device.type == "cpu"
            and getattr(config, "_attn_implementation", None) not in HOST_SPLIT_IMPLEMENTATIONS
        ):  # a forward on a host copy of its grid whose attention reads the boundaries on the device
            cu_seqlens = to_device(cu_seqlens, target)
        return cu_seqlens, max_seqlen

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


def on_device(grid: Any) -> bool:
    """A grid tensor off the host, outside tracing and compilation: worth one host copy for the forward."""
    return (
        isinstance(grid, torch.Tensor)
        and grid.device.type != "cpu"
        and not torch.jit.is_tracing()
        and not torch.compiler.is_compiling()
    )


def to_device(tensor: torch.Tensor, device: Any) -> torch.Tensor:
    """A host tensor's copy on `device`, from pinned memory without waiting where `device` is a GPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def host_grid_call(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """`fn(self, first, <name>, ...)` run with a host copy of a device grid `<name>` (the second argument after
    `self`, by position or by name) and `TARGET` set to the grid's device."""

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        grid = kwargs.get(name) if name in kwargs else (args[1] if len(args) > 1 else None)
        if not on_device(grid):
            return fn(self, *args, **kwargs)
        host = grid.detach().to("cpu")  # the forward's one wait for the GPU
        if name in kwargs:
            kwargs[name] = host
        else:
            args = (args[0], host, *args[2:])
        token = TARGET.set(grid.device)
        try:
            return fn(self, *args, **kwargs)
        finally:
            TARGET.reset(token)

    wrapper._vlm_lora_host_grid = True
    return wrapper


class DeviceParts:
    """Per-image results of the index functions, computed on the host once and kept on their device (LRU)."""

    def __init__(self, entries: int = 64) -> None:
        if entries < 1:
            raise ValueError(f"DeviceParts(entries={entries}): keep at least one image size")
        self.entries = entries
        self.parts: OrderedDict = OrderedDict()
        self.computed = 0

    def get(self, key: tuple, device: Any, compute: Callable[[], Any]) -> Any:
        """The cached device copy for `key` (an image's (t, h, w) and the function's arguments) on `device`."""
        key = (*key, str(device))
        found = self.parts.get(key)
        if found is not None:
            self.parts.move_to_end(key)
            return found
        value = compute()
        value = tuple(to_device(v, device) for v in value) if isinstance(value, tuple) else to_device(value, device)
        self.computed += 1
        self.parts[key] = value
        if len(self.parts) > self.entries:
            self.parts.popitem(last=False)
        return value


PARTS = DeviceParts()


def _host_rows(grid_thw: Any) -> list[tuple[int, ...]] | None:
    """The grid's rows as tuples when it is a host tensor under `TARGET`, else None (the function runs as it is)."""
    if TARGET.get() is None or not isinstance(grid_thw, torch.Tensor) or grid_thw.device.type != "cpu":
        return None
    return [tuple(row) for row in grid_thw.tolist()]


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def cached_position_ids(fn: Callable[..., Any], parts: DeviceParts = PARTS) -> Callable[..., Any]:
    """`get_vision_position_ids` that, under `TARGET`, returns device ids built from cached per-image parts."""

    @functools.wraps(fn)
    def wrapper(grid_thw: Any, spatial_merge_size: Any, include_temporal: bool = False, kwargs: Any = None) -> Any:
        rows = _host_rows(grid_thw)
        given = kwargs is not None and kwargs.get("position_ids") is not None
        if rows is None or not isinstance(spatial_merge_size, int) or given:
            return fn(grid_thw, spatial_merge_size, include_temporal=include_temporal, kwargs=kwargs)
        if kwargs is not None:
            kwargs.pop("position_ids", None)  # as the function itself does with a None there
        target = TARGET.get()
        return _cat(
            [
                parts.get(
                    ("position_ids", row, spatial_merge_size, include_temporal),
                    target,
                    lambda row=row: fn(torch.tensor([row]), spatial_merge_size, include_temporal=include_temporal),
                )
                for row in rows
            ]
        )

    wrapper._vlm_lora_host_grid = True
    return wrapper


def cached_interpolation(fn: Callable[..., Any], parts: DeviceParts = PARTS) -> Callable[..., Any]:
    """`get_vision_interpolation_indices_and_weights` that, under `TARGET`, returns device indices and weights
    built from cached per-image parts."""

    @functools.wraps(fn)
    def wrapper(grid_thw: Any, num_grid_per_side: int, *args: Any, kwargs: Any = None, **options: Any) -> Any:
        rows = _host_rows(grid_thw)
        given = kwargs is not None and all(kwargs.get(k) is not None for k in ("interp_indices", "interp_weights"))
        if rows is None or given:
            return fn(grid_thw, num_grid_per_side, *args, kwargs=kwargs, **options)
        if kwargs is not None:  # as the function itself does with one of them missing
            kwargs.pop("interp_indices", None)
            kwargs.pop("interp_weights", None)
        target = TARGET.get()
        settings = (num_grid_per_side, *args, *sorted(options.items()))
        found = [
            parts.get(
                ("interpolation", row, settings),
                target,
                lambda row=row: fn(torch.tensor([row]), num_grid_per_side, *args, **options),
            )
            for row in rows
        ]
        return _cat([f[0] for f in found]), _cat([f[1] for f in found])

    wrapper._vlm_lora_host_grid = True
    return wrapper


INDEX_FUNCTIONS = {
    "get_vision_position_ids": cached_position_ids,
    "get_vision_interpolation_indices_and_weights": cached_interpolation,
}


def install_grid(modules: list[Any]) -> dict[str, int]:
    """Wraps the index functions each module holds by name and the grid calls of its Qwen3-VL tower and model
    classes; how many of each were wrapped (a module or class already wrapped counts 0)."""
    counts = {"functions": 0, "calls": 0}
    for module in modules:
        for name, wrap in INDEX_FUNCTIONS.items():
            original = getattr(module, name, None)
            if callable(original) and not getattr(original, "_vlm_lora_host_grid", False):
                setattr(module, name, wrap(original))
                counts["functions"] += 1
        for cls in vars(module).values():
            if not isinstance(cls, type):
                continue
            kind = "tower" if cls.__name__ in TOWER_CLASSES else "model" if cls.__name__ in MODEL_CLASSES else None
            for method, grid_name in GRID_CALLS.get(kind, ()):
                original = cls.__dict__.get(method)
                if callable(original) and not getattr(original, "_vlm_lora_host_grid", False):
                    setattr(cls, method, host_grid_call(original, grid_name))
                    counts["calls"] += 1
    return counts
