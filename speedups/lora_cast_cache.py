"""Item 3's adapters in the compute dtype, kept from one forward to the next (`CastCache`, `VLM_LORA_CAST_CACHE`).

Where an 8-row micro-step's host launches kernels more slowly than the GPU runs them, the two cast kernels per
adapted layer per forward (504 for the 4B) are host time: the copies are kept and refreshed for all adapters together
after the weights change, one `_foreach_copy_` per optimizer step. `CASTS` is the one cache the LoRA functions
(`lora_functions.py`) read.
"""

from __future__ import annotations

import weakref

import torch

from speedups import lora_switches


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
        if (
            weight.dtype == dtype
            or not lora_switches.CAST_CACHE
            or torch.compiler.is_compiling()
            or torch.jit.is_tracing()
        ):
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
