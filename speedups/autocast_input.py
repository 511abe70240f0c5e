"""Item 2: no float32 copies of activations in the LoRA branches under bf16 autocast.

peft casts each LoRA layer's input to the adapter weights' dtype (float32 master weights) before dropout and
lora_A; under autocast, F.linear then casts it straight back to bf16. On the 4B model that is two full activation
copies plus a float32 dropout for each of the 7 adapted linear layers of every decoder layer: 0.6 s of a 3.6 s
window of GPU time on an H100 (2026-11-22, benchmarks/profile_plugin.py; 9.42 -> 10.74 samples/s without it).
With autocast on, the cast is skipped: the bf16 value that
reaches the matmul is the same (bf16 -> fp32 is exact, autocast rounds back), dropout runs in bf16 (same scale, its
own random stream), and the adapter's master weights and optimizer state stay float32. Without autocast nothing
changes. VLM_LORA_PEFT_INPUT_CAST=1 restores peft's behaviour.
"""

from __future__ import annotations

from speedups import patching, registry


def install(ctx) -> registry.Outcome:
    """Wraps peft's `BaseTunerLayer._cast_input_dtype`."""
    import torch
    from peft.tuners.tuners_utils import BaseTunerLayer

    original = getattr(BaseTunerLayer, "_cast_input_dtype", None)
    if original is None:
        return registry.target_missing("peft.tuners.tuners_utils.BaseTunerLayer._cast_input_dtype", version_of="peft")
    if getattr(original, "_vlm_lora_autocast", False):
        return registry.pending()

    def _cast_input_dtype(self, x, dtype):
        if (
            isinstance(x, torch.Tensor)
            and x.is_floating_point()
            and dtype == torch.float32
            and x.dtype in (torch.bfloat16, torch.float16)
            and torch.is_autocast_enabled(x.device.type)
        ):
            return x
        return original(self, x, dtype)

    _cast_input_dtype._vlm_lora_autocast = True
    BaseTunerLayer._cast_input_dtype = _cast_input_dtype
    return registry.pending()


def check(ctx, trainer) -> registry.Outcome:
    changed = patching.not_ours(registry.item(2))
    return registry.target_missing(*changed, version_of="peft") if changed else registry.applied()
