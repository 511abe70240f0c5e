"""Qwen3-VL's deepstack additions without boolean-mask indexing: one host wait per forward instead of ~15.

Qwen3-VL adds the vision tower's intermediate features to the hidden states of its first three decoder
layers at the image tokens' positions (`_deepstack_process`). transformers and ms-swift do it with a
boolean mask, `hidden_states[mask, :] = hidden_states[mask, :] + visual_embeds`: each boolean index
makes the host wait for the GPU to count the mask (two per layer in the forward), and the backward's
index operations wait again (the profile counted 6 waits in the forward and 9 in the backward of each
micro-batch of the 4B). After each wait the GPU runs dry until the host has launched new work.

`deepstack_add` finds the positions once per mask (one `nonzero`, cached on the mask tensor, which the
model passes unchanged to the three layers) and adds with `index_add`: the same values (each position
gets `hidden + visual`, rounded once, as before), no wait in the backward (`index_add`'s gradients are
the incoming gradient and its rows at those positions). Sequence-parallel runs, 3-D masks of other
shapes and deterministic-algorithm mode keep the model's own method.
"""

from __future__ import annotations

import types
from typing import Any

import torch

TEXT_MODEL_CLASSES = frozenset({"Qwen3VLTextModel", "Qwen3VLMoeTextModel"})


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Flat indices of the mask's true entries, computed once per mask (and per in-place change), or found on the
    tensor it is a view of with the same layout, where the model's placeholder mask left them
    (`vision_seqlens.placeholder_from_facts`: found without waiting for the GPU)."""
    base = mask._base
    same_view = (
        base is not None
        and base.shape == mask.shape
        and base.stride() == mask.stride()
        and base.storage_offset() == mask.storage_offset()
    )
    for holder in (mask, base) if same_view else (mask,):
        cached = getattr(holder, "_vlm_lora_positions", None)
        if cached is not None and cached[0] == mask._version:
            return cached[1]
    positions = mask.reshape(-1).nonzero().squeeze(1)
    mask._vlm_lora_positions = (mask._version, positions)
    return positions


def deepstack_add(hidden_states: torch.Tensor, visual_pos_masks: torch.Tensor, visual_embeds: torch.Tensor):
    """`hidden_states` with `visual_embeds` added at the mask's positions, or None where not applicable."""
    mask = visual_pos_masks.to(hidden_states.device)
    if hidden_states.ndim == 3 and mask.ndim == 3:
        mask = mask[..., 0]
    if mask.dtype != torch.bool or tuple(mask.shape) != tuple(hidden_states.shape[:-1]):
        return None
    if torch.are_deterministic_algorithms_enabled():
        return None
    flat = hidden_states.reshape(-1, hidden_states.shape[-1])
    embeds = visual_embeds.to(hidden_states.device, hidden_states.dtype)
    positions = _positions(mask)
    if embeds.dim() != 2 or embeds.shape[0] != positions.shape[0] or embeds.shape[1] != flat.shape[1]:
        return None
    return flat.index_add(0, positions, embeds).view(hidden_states.shape)


def _sequence_parallel() -> bool:
    try:
        from swift.sequence_parallel import sequence_parallel
    except ImportError:
        return False
    return bool(getattr(sequence_parallel, "world_size", None) and sequence_parallel.world_size > 1)


def install(model: torch.nn.Module) -> int:
    """Gives each Qwen3-VL text model in `model` the index-based deepstack addition; returns how many."""
    count = 0
    for module in model.modules():
        if type(module).__name__ not in TEXT_MODEL_CLASSES:
            continue
        original = getattr(module, "_deepstack_process", None)
        if original is None or getattr(original, "_vlm_lora_deepstack", False):
            continue

        def _deepstack_process(self: Any, hidden_states, visual_pos_masks, visual_embeds, _original=original):
            if visual_pos_masks is not None and not _sequence_parallel():
                out = deepstack_add(hidden_states, visual_pos_masks, visual_embeds)
                if out is not None:
                    return out
            return _original(hidden_states, visual_pos_masks, visual_embeds)

        _deepstack_process._vlm_lora_deepstack = True
        module._deepstack_process = types.MethodType(_deepstack_process, module)
        count += 1
    return count


# ---- item 10 of the plugin (items.py) ---------------------------------------------------------------------------------


def check(ctx, trainer) -> Any:
    """Gives the trainer's model the index-based deepstack addition."""
    from speedups import registry

    install(trainer.model)
    count = sum(
        getattr(getattr(m, "_deepstack_process", None), "_vlm_lora_deepstack", False)
        for m in trainer.model.modules()
        if type(m).__name__ in TEXT_MODEL_CLASSES
    )
    if not count:
        return registry.found_nothing("deepstack count 0: no Qwen3-VL text model with _deepstack_process")
    ctx.say(f"index-based deepstack additions in {count} text model(s)")
    return registry.applied(f"{count} text model(s)")
