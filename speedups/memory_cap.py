"""Item 11: a memory cap. With VLM_LORA_GPU_MEMORY_GIB set (the train-lora task sets it when the job's environment
asks for a cap, e.g. to stand in for a 40 GB card on a larger one), each training process may allocate at most that
much of its GPU (`torch.cuda.set_per_process_memory_fraction`): the planner and the run see the same card.
"""

from __future__ import annotations

from speedups import registry

FRACTION = 0.0  # the fraction set (0 = none)


def install(ctx) -> registry.Outcome:
    """Caps this process's GPU memory at VLM_LORA_GPU_MEMORY_GIB."""
    global FRACTION
    import torch

    if not torch.cuda.is_available():
        return registry.not_applicable("no GPU")
    text = str(ctx.environ.get("VLM_LORA_GPU_MEMORY_GIB", ""))
    device = int(ctx.environ.get("LOCAL_RANK", "0") or 0)
    total = torch.cuda.get_device_properties(device).total_memory
    FRACTION = min(1.0, float(text) * 1024**3 / total)
    torch.cuda.set_per_process_memory_fraction(FRACTION, device)
    return registry.applied(f"{text} GiB, {FRACTION:.3f} of GPU {device}")


def check(ctx, trainer) -> registry.Outcome:
    return ctx.loaded[11]
