"""How DDP moves LoRA's gradients: one bucket, no broadcast of derived buffers (item 14 of items.py).

transformers hands DDP `bucket_cap_mb` 25 by default, so the 66 MB of float32 LoRA gradients of the 4B
travel in three all-reduces that start during the backward. Their bytes take about 0.3 ms at the 232-298 GB/s
two H200s measure (preflight_gpu.sh, 2026-11-24), so overlapping them saves almost nothing, while each
NCCL kernel sits on the GPU beside the backward's kernels until the other rank reaches the same bucket.
`ddp_settings` sizes the bucket to hold every trainable gradient: DDP then reduces them in one all-reduce after
the backward (an explicit cap also sizes DDP's first bucket: speedups/tests/test_ddp_comm.py counts one). And DDP
broadcasts every buffer from rank 0 before each forward (`broadcast_buffers`), a collective that waits for both
ranks; a model whose buffers are all
non-persistent (not in its state dict: values it derives from its config when built, such as Qwen-VL's
rotary tables) has nothing to broadcast that the ranks do not already share.

And DDP keeps each gradient apart from its bucket unless told otherwise: after the backward computes a gradient
it copies it into the bucket, and after the all-reduce back out, two copy kernels per trainable tensor (about
500 for the 4B's LoRA) launched by the host while the backward of an 8-row micro-step already keeps it busy.
`ddp_settings` makes the gradients views of the bucket (`gradient_as_bucket_view`, which transformers' arguments
cannot set): no copies, and the gradients' memory once instead of twice.

Pure (a torch module and the arguments' values in, settings out); the plugin applies them to accelerate's DDP
arguments (`DistributedDataParallelKwargs`) that transformers builds from the TrainingArguments (`apply`). A value
the config sets is kept.
"""

from __future__ import annotations

import math
from typing import Any

MIB = 1024 * 1024


def trainable_grad_bytes(model) -> int:
    """Bytes of the gradients DDP reduces: every parameter that requires a gradient, in its own dtype."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def persistent_buffers(model) -> list[str]:
    """Names of the buffers that are in the model's state dict (a running statistic, a learned table)."""
    names = []
    for prefix, module in model.named_modules():
        skipped = getattr(module, "_non_persistent_buffers_set", set())
        for name, buf in module._buffers.items():
            if buf is not None and name not in skipped:
                names.append(f"{prefix}.{name}" if prefix else name)
    return names


def ddp_settings(
    model, *, world_size: int, deepspeed: Any, bucket_cap_mb: Any, broadcast_buffers: Any, bucket_view: bool = True
) -> tuple[dict[str, Any], list[str]]:
    """accelerate's DDP arguments for DDP over `model`, and one log line per value set.

    Args:
        model: The model the trainer wraps (peft's, with the adapters trainable).
        world_size: Training processes in all.
        deepspeed: The run's `deepspeed` argument (set: DeepSpeed, not DDP, moves the gradients).
        bucket_cap_mb: The run's `ddp_bucket_cap_mb` (None: not set by the config).
        broadcast_buffers: The run's `ddp_broadcast_buffers` (None: not set by the config).
        bucket_view: Whether the gradients become views of the bucket. Default True.

    Returns:
        ({"bucket_cap_mb": int, "broadcast_buffers": False, "gradient_as_bucket_view": True} or the part of it
        that applies, lines).
    """
    if world_size <= 1 or deepspeed:
        return {}, []
    settings: dict[str, Any] = {}
    lines: list[str] = []
    if bucket_cap_mb is None:
        grad_bytes = trainable_grad_bytes(model)
        if grad_bytes:
            settings["bucket_cap_mb"] = math.ceil(grad_bytes / MIB) + 1
            lines.append(
                f"DDP reduces the {grad_bytes / MIB:.1f} MiB of trainable gradients in one bucket after the backward "
                f"(ddp_bucket_cap_mb {settings['bucket_cap_mb']}; set it in swift to overlap them)"
            )
    if broadcast_buffers is None:
        kept = persistent_buffers(model)
        if not kept:
            settings["broadcast_buffers"] = False
            lines.append(
                "DDP does not broadcast buffers before each forward (ddp_broadcast_buffers false: every buffer is "
                "non-persistent, derived from the config on each rank)"
            )
    if bucket_view:
        settings["gradient_as_bucket_view"] = True
        lines.append(
            "DDP keeps the gradients as views of its all-reduce bucket (gradient_as_bucket_view: no copy of each "
            "gradient into the bucket and back)"
        )
    return settings, lines


def apply(handlers: list[Any], settings: dict[str, Any]) -> int:
    """Sets `settings` on each of accelerate's DDP argument handlers among `handlers`; how many it changed."""
    if not settings:
        return 0
    changed = 0
    for handler in handlers:
        if type(handler).__name__ != "DistributedDataParallelKwargs":
            continue
        for key, value in settings.items():
            setattr(handler, key, value)
        changed += 1
    return changed


# ---- item 14 of the plugin (items.py) ---------------------------------------------------------------------------------


def with_ddp_comm(original, environ=None):
    """transformers' `Trainer._build_accelerator_args`, then item 14's settings on the DDP arguments it built: one
    bucket, no broadcast of derived buffers, the gradients as views of the bucket. What was set is kept on the
    trainer (`_vlm_lora_ddp_comm`) for the start-up table."""
    import functools
    import os

    from speedups import registry

    environ = os.environ if environ is None else environ

    @functools.wraps(original)
    def _build_accelerator_args(self, **kwargs):
        built = original(self, **kwargs)
        training_args = getattr(self, "args", None)
        model = getattr(self, "model", None)
        if environ.get("VLM_LORA_DDP_COMM") == "0" or model is None or training_args is None:
            return built
        settings, lines = ddp_settings(
            model,
            world_size=registry.world_size(environ),
            deepspeed=getattr(training_args, "deepspeed", None),
            bucket_cap_mb=getattr(training_args, "ddp_bucket_cap_mb", None),
            broadcast_buffers=getattr(training_args, "ddp_broadcast_buffers", None),
            bucket_view=environ.get("VLM_LORA_DDP_BUCKET_VIEW") != "0",
        )
        if apply(built.get("kwargs_handlers") or [], settings):
            self.__dict__["_vlm_lora_ddp_comm"] = sorted(settings)
            for line in lines:
                print(f"train-lora plugin: {line}", flush=True)
        else:
            self.__dict__["_vlm_lora_ddp_comm"] = []
        return built

    _build_accelerator_args._vlm_lora_ddp_comm = True
    return _build_accelerator_args


def install(ctx):
    from transformers import Trainer

    from speedups import patching, registry

    def wrap(original):
        return with_ddp_comm(original, ctx.environ)

    if not patching.wrap_once(Trainer, "_build_accelerator_args", wrap, "_vlm_lora_ddp_comm"):
        return registry.target_missing("transformers.Trainer._build_accelerator_args", version_of="transformers")
    return registry.pending()


def check(ctx, trainer):
    from speedups import patching, registry

    changed = patching.not_ours(registry.item(14))
    if changed:
        return registry.target_missing(*changed, version_of="transformers")
    if ctx.world <= 1:
        return registry.not_applicable("one process")
    if getattr(getattr(trainer, "args", None), "deepspeed", None):
        return registry.not_applicable("DeepSpeed moves the gradients")
    settings = trainer.__dict__.get("_vlm_lora_ddp_comm")
    if settings is None:
        return registry.target_missing(
            "transformers.Trainer._build_accelerator_args (not called while the trainer was built)",
            version_of="transformers",
        )
    if not settings:
        return registry.not_applicable("no DDP argument handler, or every value set by the config")
    return registry.applied(", ".join(settings))
