"""Item 1: the token count without padding, read without waiting for the GPU.

transformers counts the tokens a model saw (`num_input_tokens_seen`, and from it `train_tokens_per_second`) either
with padding or without, but its command-line parser only accepts true/false for `include_num_input_tokens_seen`,
and true counts padding. With batches of more than one sample that inflates tokens/s by the padding. The count here
excludes padding whenever the batch has an attention mask: the task's tokens/s is then the language-model tokens
(text + image tokens) actually trained on. Each micro-step's count reaches the state without making the host wait
for the GPU (`PendingCounts`); logging and checkpoints wait for the counts still in flight, so what they record is
complete. VLM_LORA_ASYNC_TOKENS=0 reads each count at once (transformers' way).
"""

from __future__ import annotations

import functools

from speedups import patching, registry

ASYNC_TOKENS = registry.option_on("VLM_LORA_ASYNC_TOKENS")
# transformers' methods that read the count (they wait for the counts in flight first)
READERS = ("log", "_save_checkpoint")


def install(ctx) -> registry.Outcome:
    """Wraps `Trainer._track_num_input_tokens` (and the readers of the count)."""
    global ASYNC_TOKENS
    import torch
    from transformers import Trainer

    ASYNC_TOKENS = registry.option_on("VLM_LORA_ASYNC_TOKENS", ctx.environ)
    original = getattr(Trainer, "_track_num_input_tokens", None)
    missing = [name for name in ("_track_num_input_tokens", *READERS) if getattr(Trainer, name, None) is None]
    if missing:
        return registry.target_missing(*(f"transformers.Trainer.{n}" for n in missing), version_of="transformers")
    if not getattr(original, "_vlm_lora_non_padding", False):

        def _track_num_input_tokens(self, inputs):
            mask = inputs.get("attention_mask") if hasattr(inputs, "get") else None
            if self.args.include_num_input_tokens_seen == "no" or mask is None or mask.dim() != 2:
                return original(self, inputs)
            count = torch.as_tensor(mask.sum(), device=self.args.device, dtype=torch.int64)
            count = self.accelerator.gather(count).sum()
            if count.is_cuda and ASYNC_TOKENS:  # read later, not making the host wait for this micro-step's backward
                pending = self.__dict__.get("_vlm_lora_tokens")
                if pending is None:
                    pending = self._vlm_lora_tokens = PendingCounts(torch)
                pending.add(count)
                pending.drain(self.state, wait=False)
            else:
                self.state.num_input_tokens_seen += int(count)
            return None

        _track_num_input_tokens._vlm_lora_non_padding = True
        Trainer._track_num_input_tokens = _track_num_input_tokens
    # the count is read when logging and when a checkpoint saves the trainer state: complete it there
    for name in READERS:
        patching.wrap_once(Trainer, name, _counts_drained, "_vlm_lora_counts_drained")
    return registry.pending("padding excluded" + (", read without waiting" if ASYNC_TOKENS else ""))


def check(ctx, trainer) -> registry.Outcome:
    """Applied while transformers' methods still hold the wrappers."""
    changed = patching.not_ours(registry.item(1))
    if changed:
        return registry.target_missing(*changed, version_of="transformers")
    return registry.applied("padding excluded" + (", read without waiting" if ASYNC_TOKENS else ""))


def _counts_drained(method):
    """`method`, after the token counts still in flight have reached the trainer's state."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        pending = self.__dict__.get("_vlm_lora_tokens")
        if pending is not None:
            pending.drain(self.state, wait=True)
        return method(self, *args, **kwargs)

    wrapper._vlm_lora_counts_drained = True
    return wrapper


class PendingCounts:
    """Token counts on the GPU, copied to pinned host memory without waiting; added to the state once there.

    transformers adds each micro-step's count with `.item()`, which makes the host wait for the GPU to
    finish that micro-step's backward before it prepares the next one: the GPU then idles while the
    host works. Here the copy is queued behind the backward and read when done (`drain(wait=False)`
    at the next micro-steps) or, where the count is read (logging, checkpoints), after waiting for it.
    """

    def __init__(self, torch_module):
        self.torch = torch_module
        self.queue: list = []

    def add(self, count) -> None:
        host = self.torch.empty((), dtype=count.dtype, pin_memory=True)
        host.copy_(count, non_blocking=True)
        event = self.torch.cuda.Event()
        event.record()
        self.queue.append((event, host))

    def drain(self, state, wait: bool) -> None:
        while self.queue:
            event, host = self.queue[0]
            if not wait and not event.query():
                return
            event.synchronize()
            state.num_input_tokens_seen += int(host.item())
            self.queue.pop(0)
