"""Item 4: regional compilation, opt-in (VLM_LORA_COMPILE_LAYERS=1).

`torch.compile` on each of the language model's decoder layers once the trainer holds the model (one region per
layer, the same graph for all of them), so that inductor fuses the normalisation, rotary embedding, MLP and LoRA
elementwise work; the vision tower, the LM head and its loss stay as they are. Liger's kernels inside the layers
(RMSNorm, rotary) are not traceable: with `use_liger_kernel` only its fused loss is applied then. Measured on an
H100 (benchmarks/README.md): once compiled a step is 9 % faster and the peak 15.5 GiB lower, the losses the same;
the first step compiles for 30-40 s and the first batch of another padded length recompiles once (10-19 s). Only
short runs were measured, so no profile turns it on yet. VLM_LORA_COMPILE_VISION=1 compiles the vision tower's
blocks the same way (forward only: the tower is frozen).
"""

from __future__ import annotations

from components.train_lora.speedups import registry


def language(environ) -> bool:
    """Whether the decoder layers are compiled (VLM_LORA_COMPILE_LAYERS=1)."""
    return registry.option_on("VLM_LORA_COMPILE_LAYERS", environ)


def vision(environ) -> bool:
    """Whether the vision blocks are compiled (VLM_LORA_COMPILE_VISION=1)."""
    return registry.option_on("VLM_LORA_COMPILE_VISION", environ)


def compile_decoder_layers(model, language: bool = True, vision: bool = False) -> int:
    """torch.compile (in place) the language model's decoder layers and/or the vision tower's blocks; how many."""
    import torch

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    count = 0
    for module in model.modules():
        name = type(module).__name__
        is_vision = "Vision" in name
        if (language and name.endswith("DecoderLayer") and not is_vision) or (
            vision and is_vision and name.endswith(("VisionBlock", "VisionLayer"))
        ):
            module.compile()
            count += 1
    return count


def keep_liger_out_of_layers(training_args) -> None:
    """With Liger on, keeps only its fused loss: its RMSNorm / rotary kernels inside the layers cannot be traced.

    transformers applies Liger when training starts, from `liger_kernel_config` (ms-swift's
    command line cannot pass that dict), so it is set on the training arguments here.
    """
    if training_args is None or not getattr(training_args, "use_liger_kernel", False):
        return
    config = dict(getattr(training_args, "liger_kernel_config", None) or {})
    config.update(rope=False, rms_norm=False, swiglu=False)
    training_args.liger_kernel_config = config


def install(ctx) -> registry.Outcome:
    """Nothing to patch when the plugin loads; which parts are compiled is read now (as the trainer's hook will)."""
    ctx.state["compile"] = (language(ctx.environ), vision(ctx.environ))
    return registry.pending()


def prepare(ctx, training_args) -> None:
    """Before the trainer is built: Liger's in-layer kernels off where the layers are compiled."""
    if ctx.state.get("compile", (False, False))[0]:
        keep_liger_out_of_layers(training_args)


def check(ctx, trainer) -> registry.Outcome:
    """Compiles the layers of the model the trainer holds."""
    lang, vis = ctx.state.get("compile", (False, False))
    count = compile_decoder_layers(trainer.model, language=lang, vision=vis)
    what = " and ".join(w for w, on in (("decoder layers", lang), ("vision blocks", vis)) if on)
    ctx.say(f"torch.compile on {count} {what}")
    if not count:
        return registry.found_nothing(f"no {what} by class name")
    return registry.applied(f"{count} {what}")
