"""What a training step reads of its batch on the host, taken from the batch's host copy before it goes to the GPU.

ms-swift's data loaders (`swift.dataloader`: `DataLoaderShard`, `DataLoaderDispatcher`) copy each batch to the GPU
with ms-swift's `to_device`, one blocking copy per tensor (8 for a Qwen3-VL batch, counted with torch's sync debug
mode on an H200). After that, two readers each made the host wait for the GPU again:
- ms-swift's `prepare_logits_to_keep` (`labels ... .min().item()`, for batches of more than one row);
- the model forward's facts (`vision_seqlens.facts_call`: image token counts, padding alignment, grids).

Each of these waits for everything queued before it (the previous step's backward and optimizer step), so at every
step boundary the GPU ran dry while the host prepared the next step: a fixed cost per optimizer step, which weighs
most where a step holds few rows per GPU (two GPUs sharing 16 rows). With the host copies kept (`remembering`, which
wraps the loaders' `to_device`) the two readers compute the same integers from the host tensors (`host_of`), and the
copies are queued without waiting (`non_blocking`, from the pinned memory the loaders already use with
`dataloader_pin_memory`; PyTorch's host allocator keeps a pinned block until its copy has run).

A host copy is found only for the very device tensor made from it, unchanged since (same object, same version);
anything else (a tensor a template built, a batch another loader copied) gets the reader's own device path.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch

# the small integer tensors whose host copies the readers use (pixel values are never kept)
KEPT = ("input_ids", "attention_mask", "labels", "image_grid_thw", "video_grid_thw")


class HostCopies:
    """Host copies of a batch's small tensors, found by the device tensor copied from each."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[weakref.ref, int, torch.Tensor]] = {}
        self.remembered = 0
        self.reads = {"found": 0, "unknown": 0, "changed": 0}  # host_of's answers for device tensors

    def __len__(self) -> int:
        return len(self._by_id)

    def remember(self, host_batch: Any, device_batch: Any) -> int:
        """Keeps `host_batch[name]` for `device_batch[name]` (names in `KEPT`, host → non-host copies of the same
        shape and dtype); how many were kept. The entry goes when the device tensor does."""
        if not isinstance(host_batch, Mapping) or not isinstance(device_batch, Mapping):
            return 0
        kept = 0
        for name in KEPT:
            host, device = host_batch.get(name), device_batch.get(name)
            if not (isinstance(host, torch.Tensor) and isinstance(device, torch.Tensor)):
                continue
            if host.device.type != "cpu" or device.device.type == "cpu" or host is device:
                continue
            if host.shape != device.shape or host.dtype != device.dtype:
                continue
            key = id(device)
            ref = weakref.ref(device, functools.partial(self._forget, key))
            self._by_id[key] = (ref, device._version, host)
            kept += 1
        self.remembered += kept
        return kept

    def _forget(self, key: int, ref: weakref.ref) -> None:
        entry = self._by_id.get(key)
        if entry is not None and entry[0] is ref:
            del self._by_id[key]

    def host_of(self, device_tensor: Any) -> torch.Tensor | None:
        """The host copy `device_tensor` was made from, if it is that very tensor and unchanged since; else None."""
        if not isinstance(device_tensor, torch.Tensor):
            return None
        entry = self._by_id.get(id(device_tensor))
        if entry is None or entry[0]() is not device_tensor:
            self.reads["unknown"] += device_tensor.device.type != "cpu"
            return None
        if device_tensor._version != entry[1]:
            self.reads["changed"] += 1
            return None
        self.reads["found"] += 1
        return entry[2]

    def summary(self) -> str:
        """What was kept and how the readers fared, for the log at the end of training."""
        reads = ", ".join(f"{k} {v}" for k, v in self.reads.items())
        return f"{self.remembered} host copies kept; device tensors looked up: {reads}"


COPIES = HostCopies()


def remembering(send: Callable[..., Any], copies: HostCopies = COPIES) -> Callable[..., Any]:
    """ms-swift's `to_device(data, device, non_blocking=False)` as its data loaders call it: the copy queued without
    waiting, and the host copies of a batch it copies kept."""

    @functools.wraps(send)
    def to_device(data: Any, device: Any, non_blocking: bool = False) -> Any:
        out = send(data, device, non_blocking=True)
        copies.remember(data, out)
        return out

    to_device._vlm_lora_batch_facts = True
    return to_device


def logits_to_keep_from_host(prepare: Callable[..., Any], copies: HostCopies = COPIES) -> Callable[[Any, dict], Any]:
    """ms-swift's `prepare_logits_to_keep(self, inputs)` reading the labels' host copy where it would read the GPU.

    For labels of more than one row ms-swift computes `labels.shape[-1] - (labels != -100).int().argmax(-1).min()
    .item() + 1` and keeps that suffix of the labels (and of `loss_scale`). Here ms-swift's own method runs on the
    host copy of the labels, so the integer needs no wait; the device labels then get the same suffix, whose host
    copy is kept in turn. One row
    (ms-swift builds a mask, no wait), no host copy, or a result this wrapper does not know: ms-swift's method on the
    device labels, as before.
    """

    @functools.wraps(prepare)
    def prepare_logits_to_keep(self: Any, inputs: dict) -> Any:
        labels = inputs.get("labels") if isinstance(inputs, dict) else None
        host = copies.host_of(labels)
        if host is None or labels.dim() != 2 or labels.shape[0] < 2:
            return prepare(self, inputs)
        trial = dict(inputs, labels=host)
        result = prepare(self, trial)
        keep = trial.get("logits_to_keep")
        sliced = trial.get("labels")
        if (
            not isinstance(keep, int)
            or isinstance(keep, bool)
            or not isinstance(sliced, torch.Tensor)
            or not torch.equal(sliced, host[:, -keep:])
        ):
            return prepare(self, inputs)
        trial["labels"] = labels[:, -keep:]
        copies.remember({"labels": sliced}, trial)  # the loss finds the suffix's host copy (item 18)
        inputs.clear()
        inputs.update(trial)
        return result

    prepare_logits_to_keep._vlm_lora_batch_facts = True
    return prepare_logits_to_keep


# ---- item 16 of the plugin (items.py) ---------------------------------------------------------------------------------

SWIFT_LOADERS = ("swift.dataloader.shard", "swift.dataloader.dispatcher")
SWIFT_MIXIN = "swift.trainers.mixin"


def swift_mixin():
    """ms-swift's `SwiftMixin` where its trainers are loaded already (None otherwise: the plugin does not load them,
    as they replace transformers' default callbacks)."""
    import sys

    return getattr(sys.modules.get(SWIFT_MIXIN), "SwiftMixin", None)


def install_readers() -> int:
    """The wrappers in ms-swift (the loaders' `to_device`, `SwiftMixin.prepare_logits_to_keep`) where its modules
    are loaded: the plugin does not load them itself (ms-swift's trainers replace transformers' default callbacks),
    so a trainer's creation tries again; how many are wrapped."""
    import sys

    from speedups.patching import wrap_once

    marker = "_vlm_lora_batch_facts"
    wrapped = sum(
        wrap_once(sys.modules[name], "to_device", remembering, marker) for name in SWIFT_LOADERS if name in sys.modules
    )
    mixin = swift_mixin()
    if mixin is not None:
        wrapped += wrap_once(mixin, "prepare_logits_to_keep", logits_to_keep_from_host, marker)
    return wrapped


def install(ctx):
    from speedups import registry

    return registry.pending(f"{install_readers()} readers wrapped so far")


def check(ctx, trainer):
    import sys

    from speedups import registry

    wrapped = install_readers()
    if swift_mixin() is None:
        return registry.not_applicable("ms-swift's trainers not loaded")
    loaders = [name for name in SWIFT_LOADERS if name in sys.modules]
    if wrapped < len(loaders) + 1:
        return registry.target_missing(
            *(f"{n}.to_device" for n in loaders), f"{SWIFT_MIXIN}.SwiftMixin.prepare_logits_to_keep",
            version_of="ms-swift",
        )  # fmt: skip
    return registry.applied(f"{wrapped} of ms-swift's readers")
