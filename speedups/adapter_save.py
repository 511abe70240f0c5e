"""A LoRA checkpoint under DeepSpeed ZeRO-1/2 without a host copy of the frozen base.

Item 12 of the train-lora plugin (items.py). transformers'
`Trainer.save_model` under DeepSpeed below ZeRO-3 takes accelerate's `Accelerator.get_state_dict`,
which clones every tensor of the model to host memory (`clone_tensors_for_torch_save`), the frozen
base included, and then saves a PEFT model's adapter only. On 2 x H200 with the Qwen3-VL-30B-A3B
each save took 42 s (a training step: 0.77 s) for a 103 MB checkpoint, and the copy is the whole 62 GB
base on every rank (2026-11-26, 2 x H200, benchmarks/large_models.py --model 30b-a3b --phase train).

While the trainer saves a LoRA model, `adapter_entries` hands that save only the entries of the
state dict that peft's adapter save keeps. It asks peft itself which those are, for every adapter,
and checks that peft keeps exactly the same from the smaller dict; where it cannot tell (peft made
new tensors, a different selection) it returns None and the full copy is made as before. The saved
adapter is the same file either way (speedups/tests/test_adapter_save.py).
"""

from __future__ import annotations

import contextvars
import functools
from typing import Any


def adapter_entries(model: Any) -> dict[str, Any] | None:
    """The entries of `model.state_dict()` (not copied) that peft's adapter save of every adapter keeps.

    Args:
        model: The unwrapped model the trainer saves.

    Returns:
        {key: tensor} of the model's own state dict, or None when `model` is not a PEFT model or
        peft's selection cannot be matched to the dict's entries (then save from the full dict).
    """
    try:
        from peft import PeftModel
        from peft.utils import get_peft_model_state_dict
    except ImportError:
        return None
    if not isinstance(model, PeftModel):
        return None
    full = model.state_dict()
    keys_of: dict[int, list[str]] = {}
    for key, value in full.items():
        keys_of.setdefault(id(value), []).append(key)
    kept: dict[str, Any] = {}
    chosen: dict[str, dict[str, Any]] = {}
    for name in model.peft_config:
        chosen[name] = get_peft_model_state_dict(model, state_dict=full, adapter_name=name)
        for value in chosen[name].values():
            if id(value) not in keys_of:  # a tensor peft made: it needs more than the dict's entries
                return None
            kept.update((k, full[k]) for k in keys_of[id(value)])
    for name, selection in chosen.items():
        again = get_peft_model_state_dict(model, state_dict=kept, adapter_name=name)
        if again.keys() != selection.keys() or any(again[k] is not selection[k] for k in selection):
            return None
    return kept


def saves_lora_only(trainer: Any) -> bool:
    """Whether `trainer.save_model` writes a PEFT adapter (ms-swift's plain LoRA tuner, a PeftModel)."""
    tuner = getattr(getattr(trainer, "args", None), "tuner_type", "lora")
    if tuner not in ("lora", None) or hasattr(getattr(trainer, "template", None), "save_callback"):
        return False
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(getattr(trainer, "model", None), PeftModel)


def zero_below_3(accelerator: Any) -> bool:
    """Whether `accelerator` runs DeepSpeed ZeRO-0/1/2 (where get_state_dict copies the whole model)."""
    from accelerate.utils import DistributedType

    if getattr(accelerator, "distributed_type", None) != DistributedType.DEEPSPEED:
        return False
    config = getattr(accelerator, "deepspeed_config", None) or {}
    stage = (config.get("zero_optimization") or {}).get("stage", 0)
    tensor_parallel = (config.get("tensor_parallel") or {}).get("autotp_size", 0) or 0
    return stage != 3 and tensor_parallel <= 1


# ---- item 12 of the plugin (items.py) ---------------------------------------------------------------------------------

# True while a trainer's save_model saves a LoRA adapter.
_SAVING_ADAPTER: contextvars.ContextVar = contextvars.ContextVar("vlm_lora_saving_adapter", default=False)


def install(ctx):
    """Wraps `Trainer.save_model` and `Accelerator.get_state_dict`: under ZeRO-1/2 a LoRA save copies only the
    adapter's tensors."""
    from accelerate import Accelerator
    from transformers import Trainer

    from speedups import registry

    saving = _SAVING_ADAPTER
    original_save, original_state = getattr(Trainer, "save_model", None), getattr(Accelerator, "get_state_dict", None)
    missing = [n for n, f in (("transformers.Trainer.save_model", original_save),
                              ("accelerate.Accelerator.get_state_dict", original_state)) if f is None]  # fmt: skip
    if missing:
        return registry.target_missing(*missing)
    if getattr(original_save, "_vlm_lora_adapter_save", False):
        return registry.pending()

    @functools.wraps(original_save)
    def save_model(self, *args, **kwargs):
        token = saving.set(saves_lora_only(self))
        try:
            return original_save(self, *args, **kwargs)
        finally:
            saving.reset(token)

    @functools.wraps(original_state)
    def get_state_dict(self, model, unwrap=True):
        if saving.get() and zero_below_3(self):
            inner = self.unwrap_model(model)
            kept = adapter_entries(inner)
            if kept is not None:
                from deepspeed.checkpoint.utils import clone_tensors_for_torch_save

                total = len(inner.state_dict())
                print(f"train-lora plugin: save under ZeRO-1/2: {len(kept)} of {total} tensors copied (adapter)")
                return clone_tensors_for_torch_save(kept)
        return original_state(self, model, unwrap=unwrap)

    save_model._vlm_lora_adapter_save = True
    get_state_dict._vlm_lora_adapter_save = True
    Trainer.save_model = save_model
    Accelerator.get_state_dict = get_state_dict
    return registry.pending()


def check(ctx, trainer):
    from speedups import patching, registry

    changed = patching.not_ours(registry.item(12))
    if changed:
        return registry.target_missing(*changed)
    accelerator = getattr(trainer, "accelerator", None)
    if accelerator is None or not zero_below_3(accelerator):
        return registry.not_applicable("no DeepSpeed ZeRO-1/2")
    return registry.applied("saves copy the adapter only")
