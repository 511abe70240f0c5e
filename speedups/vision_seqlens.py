"""The vision tower's sequence boundaries computed on the host, not once per block on the GPU.

Qwen3-VL's vision attention without flash-attn (sdpa, eager) splits q, k and v per image with
`torch.split(t, lengths.tolist())`, where `lengths` comes from `cu_seqlens`, a GPU tensor built
from `grid_thw`. Each `.tolist()` makes the host wait for the GPU: 3 per block, 72 per forward of
the 4B's 24 blocks (counted with torch's sync debug mode on an H100, 2026-11-25, train_throughput _prof), each
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

The model's forward reads more from its inputs on the host, each time waiting for the GPU: transformers' check
that the image tokens match the image features (its message formats a GPU count), the plugin's right-padding
check (`right_padding.py`) and the deepstack positions (`deepstack.py`). These come after the vision tower is
queued, so each waits for the whole tower (tens of ms of GPU work on a micro-batch of drawings), and the GPU then
runs dry while the host launches the language model's first layers, which with 8 rows per GPU it launches
barely faster than the GPU runs them. `facts_call` wraps the model's forward: at its start, where the GPU has
little queued, one host copy brings the image and video token counts, whether the 2-D attention mask is
right-aligned and the grids (`Facts`, held in `FACTS` during the forward). `get_placeholder_mask` then checks the
counts on the host (`placeholder_from_facts`: the same masks and the same ValueError) and tags the image mask
with its token positions (`nonzero_static` with the known count: no wait), which the deepstack additions take;
the right-padding check takes the alignment (`known_right_aligned`) and the grid calls the host grid. The
forward thus waits once, at its start, and the host queues the tower and the language model's forward without
waiting until the loss. Where the batch's host copies are known (`install_grid(..., host_of=...)`, plugin item
16) the facts come from those, with no copy and no wait at all. VLM_LORA_FORWARD_FACTS=0 leaves the forward and
the mask to transformers.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import inspect
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

HOST_SPLIT_IMPLEMENTATIONS = ("sdpa", "eager")
# the device the results of a forward running with a host copy of its grid belong on (None: no such forward)
TARGET: contextvars.ContextVar = contextvars.ContextVar("vlm_lora_vision_target", default=None)
TOWER_CLASSES = frozenset({"Qwen3VLVisionModel", "Qwen3VLMoeVisionModel"})
MODEL_CLASSES = frozenset({"Qwen3VLModel", "Qwen3VLMoeModel"})
# what a Qwen3-VL model's forward reads from its inputs on the host, copied once at its start (None: no such forward)
FACTS: contextvars.ContextVar = contextvars.ContextVar("vlm_lora_forward_facts", default=None)
# the tag `placeholder_from_facts` puts on an image mask: (its version, the flat positions of its true entries)
POSITIONS_TAG = "_vlm_lora_positions"
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


def _holding(var: contextvars.ContextVar, value: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` with `var` set to `value` meanwhile (reset after an error too)."""
    token = var.set(value)
    try:
        return fn(*args, **kwargs)
    finally:
        var.reset(token)


def host_grid_call(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """`fn(self, first, <name>, ...)` run with a host copy of a device grid `<name>` (the second argument after
    `self`, by position or by name) and `TARGET` set to the grid's device."""

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        grid = kwargs.get(name) if name in kwargs else (args[1] if len(args) > 1 else None)
        if not on_device(grid):
            return fn(self, *args, **kwargs)
        facts = FACTS.get()
        host = facts.host_grid(grid) if facts is not None else None
        if host is None:
            host = grid.detach().to("cpu")  # the forward's one wait for the GPU
        if name in kwargs:
            kwargs[name] = host
        else:
            args = (args[0], host, *args[2:])
        return _holding(TARGET, grid.device, fn, self, *args, **kwargs)

    wrapper._vlm_lora_host_grid = True
    return wrapper


@dataclasses.dataclass(frozen=True)
class Facts:
    """A forward's inputs as the host needs them: copied from the GPU together, once."""

    input_ids: torch.Tensor
    tokens: dict[int, int]  # image / video token id -> how many input_ids hold it
    mask_shape: tuple[int, ...] | None  # the 2-D attention mask's shape (None: no such mask)
    right_aligned: bool | None  # every row of that mask ones, then zeros
    grids: tuple[tuple[torch.Tensor, torch.Tensor], ...]  # (the device grid, its host copy)

    def host_grid(self, grid: Any) -> torch.Tensor | None:
        return next((host for device, host in self.grids if device is grid), None)


def _fact_values(token_ids: list[int], input_ids: Any, mask: Any, grids: list[Any]) -> torch.Tensor:
    """The token counts, the mask's alignment (if a mask) and the grids' entries, as one int64 vector."""
    parts = [(input_ids == t).sum().reshape(1) for t in token_ids]
    if mask is not None:
        mask = mask.bool()
        aligned = (mask[:, :-1] | ~mask[:, 1:]).all() if mask.shape[-1] > 1 else torch.ones((), dtype=torch.bool)
        parts.append(aligned.reshape(1).to(mask.device))
    parts += [g.reshape(-1) for g in grids]
    return torch.cat([p.to(torch.int64) for p in parts])


def _host_copies(host_of: Callable[[Any], Any] | None, tensors: list[Any]) -> list[Any] | None:
    """Each tensor's host copy from `host_of` (None entries stay None); None unless every tensor has one."""
    if host_of is None:
        return None
    copies = [None if t is None else host_of(t) for t in tensors]
    return None if any(c is None for t, c in zip(tensors, copies, strict=True) if t is not None) else copies


def gather_facts(
    config: Any, input_ids: Any, attention_mask: Any, grids: list[Any], host_of: Callable[[Any], Any] | None = None
) -> Facts | None:
    """The token counts, the mask's alignment and the grids of a forward on the GPU, in one copy to the host, or
    with none where `host_of` gives the host copies these device tensors were made from (`batch_facts.py`); None
    where there is nothing to gather (input_ids on the host or missing, tracing)."""
    if not on_device(input_ids) or input_ids.dim() != 2:
        return None
    token_ids = [t for t in (getattr(config, "image_token_id", None), getattr(config, "video_token_id", None))]
    token_ids = [t for t in dict.fromkeys(token_ids) if isinstance(t, int)]
    mask_2d = isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2
    mask = attention_mask if mask_2d else None
    device_grids = [g for g in grids if isinstance(g, torch.Tensor) and g.device == input_ids.device and g.dim() == 2]
    copies = _host_copies(host_of, [input_ids, mask, *device_grids])
    if copies is not None:  # the batch's host copies: no wait
        host = _fact_values(token_ids, copies[0], copies[1], copies[2:]).tolist()
    else:
        host = _fact_values(token_ids, input_ids, mask, device_grids).to("cpu").tolist()  # the forward's one wait
    tokens = dict(zip(token_ids, host[: len(token_ids)], strict=True))
    at = len(token_ids)
    right_aligned = None
    if mask_2d:
        right_aligned, at = bool(host[at]), at + 1
    grid_copies = []
    for grid in device_grids:
        size = grid.numel()
        grid_copies.append((grid, torch.tensor(host[at : at + size], dtype=grid.dtype).view(grid.shape)))
        at += size
    shape = tuple(attention_mask.shape) if mask_2d else None
    return Facts(input_ids, tokens, shape, right_aligned, tuple(grid_copies))


def facts_call(fn: Callable[..., Any], host_of: Callable[[Any], Any] | None = None) -> Callable[..., Any]:
    """A Qwen3-VL model's `forward` run with its `Facts` in `FACTS` (training on the GPU; else as it is); with
    `host_of`, from the batch's host copies where it has them."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled() or FACTS.get() is not None:
            return fn(self, *args, **kwargs)
        try:
            given = signature.bind_partial(self, *args, **kwargs).arguments
        except TypeError:
            return fn(self, *args, **kwargs)
        grids = [given.get("image_grid_thw"), given.get("video_grid_thw")]
        facts = gather_facts(self.config, given.get("input_ids"), given.get("attention_mask"), grids, host_of)
        if facts is None:
            return fn(self, *args, **kwargs)
        return _holding(FACTS, facts, fn, self, *args, **kwargs)

    wrapper._vlm_lora_host_grid = True
    return wrapper


def _tagged(mask: torch.Tensor, count: int) -> torch.Tensor:
    """`mask` with the flat positions of its `count` true entries in `POSITIONS_TAG` (found without a wait)."""
    positions = mask.reshape(-1).nonzero_static(size=count).squeeze(1)
    setattr(mask, POSITIONS_TAG, (mask._version, positions))
    return mask


def placeholder_from_facts(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`get_placeholder_mask(input_ids, inputs_embeds, image_features, video_features)` checking the token counts
    on the host from `FACTS` (the same masks and ValueError as transformers, without its wait for the GPU)."""

    @functools.wraps(fn)
    def wrapper(
        self: Any,
        input_ids: Any,
        inputs_embeds: Any,
        image_features: Any = None,
        video_features: Any = None,
        *args: Any,
        **kwargs: Any,
    ):
        facts = FACTS.get()
        ids = (getattr(self.config, "image_token_id", None), getattr(self.config, "video_token_id", None))
        if (
            args
            or kwargs  # a transformers with more to this method than this wrapper knows: its own
            or facts is None
            or input_ids is None
            or input_ids is not facts.input_ids
            or not all(i in facts.tokens for i in ids)
        ):
            return fn(self, input_ids, inputs_embeds, image_features, video_features, *args, **kwargs)
        masks = []
        for kind, token_id, features in (("Image", ids[0], image_features), ("Video", ids[1], video_features)):
            count = facts.tokens[token_id]
            if features is not None and count * inputs_embeds.shape[-1] != features.numel():
                raise ValueError(
                    f"{kind} features and {kind.lower()} tokens do not match, tokens: {count}, "
                    f"features: {features.shape[0]}"
                )
            mask = _tagged(input_ids == token_id, count)
            masks.append(mask.unsqueeze(-1).to(inputs_embeds.device))
        return masks[0], masks[1]

    wrapper._vlm_lora_host_grid = True
    return wrapper


def known_right_aligned(mask: Any) -> bool | None:
    """Whether a 2-D padding mask of the running forward is right-aligned, from `FACTS` (None: not known)."""
    facts = FACTS.get()
    if facts is None or facts.right_aligned is None or not isinstance(mask, torch.Tensor):
        return None
    return facts.right_aligned if tuple(mask.shape) == facts.mask_shape else None


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


# the model methods `facts_call` / `placeholder_from_facts` wrap (`install_grid` with facts)
FACT_CALLS = {"forward": facts_call, "get_placeholder_mask": placeholder_from_facts}


def install_grid(modules: list[Any], facts: bool = True, host_of: Callable[[Any], Any] | None = None) -> dict[str, int]:
    """Wraps the index functions each module holds by name, the grid calls of its Qwen3-VL tower and model
    classes and, with `facts`, the model's forward (reading the batch's host copies from `host_of` where given)
    and placeholder mask (`FACT_CALLS`); how many of each were wrapped (a module or class already wrapped
    counts 0)."""
    counts = {"functions": 0, "calls": 0, "facts": 0}
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
            for method, wrap in FACT_CALLS.items() if facts and kind == "model" else ():
                original = cls.__dict__.get(method)
                if callable(original) and not getattr(original, "_vlm_lora_host_grid", False):
                    setattr(cls, method, wrap(original, host_of) if method == "forward" else wrap(original))
                    counts["facts"] += 1
    return counts


# ---- item 7 of the plugin (items.py) ----------------------------------------------------------------------------------

QWEN3_VL_MODELING = (
    "transformers.models.qwen3_vl.modeling_qwen3_vl",
    "transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe",
)


def install_item(ctx):
    """The vision boundaries from a host copy of the grid (vision_utils and every loaded modeling file that imported
    the function) and, unless VLM_LORA_HOST_VISION_GRID=0, the rest of the tower's grid work and (unless
    VLM_LORA_FORWARD_FACTS=0) the forward's facts from that copy; what was wrapped goes to `ctx.state`."""
    import importlib
    import sys

    from speedups import registry

    try:
        from transformers import vision_utils
    except ImportError:
        return registry.target_missing("transformers.vision_utils", version_of="transformers")
    if not callable(getattr(vision_utils, "get_vision_attention_seqlens", None)):
        return registry.target_missing(
            "transformers.vision_utils.get_vision_attention_seqlens", version_of="transformers"
        )
    loaded = [m for name, m in list(sys.modules.items()) if name.startswith("transformers.models.") and m is not None]
    seqlens = install([vision_utils, *loaded])
    ctx.state["host_vision"] = (seqlens, {})
    if not registry.option_on("VLM_LORA_HOST_VISION_GRID", ctx.environ):
        return registry.pending("the boundaries only (VLM_LORA_HOST_VISION_GRID=0)")
    qwen3_vl = []
    for name in QWEN3_VL_MODELING:
        try:
            qwen3_vl.append(importlib.import_module(name))
        except ImportError:  # an older transformers without it
            continue
    facts = registry.option_on("VLM_LORA_FORWARD_FACTS", ctx.environ)
    host_of = None
    if registry.option_on("VLM_LORA_BATCH_FACTS", ctx.environ):  # item 16 keeps the host copies
        from speedups.batch_facts import COPIES

        host_of = COPIES.host_of
    grid = install_grid([vision_utils, *qwen3_vl], facts=facts, host_of=host_of)
    ctx.state["host_vision"] = (seqlens, grid)
    return registry.pending("boundaries, grid work" + (" and the forward's facts" if facts else ""))


def check(ctx, trainer):
    from transformers import vision_utils

    from speedups import patching, registry

    if not patching.ours(getattr(vision_utils, "get_vision_attention_seqlens", None)):
        return registry.target_missing(
            "transformers.vision_utils.get_vision_attention_seqlens", version_of="transformers"
        )
    return registry.applied(ctx.loaded[7].detail)
