"""Item 19: gradient checkpointing of only as many decoder layers as the card needs.

`gradient_checkpointing` is all or nothing in ms-swift: every decoder layer recomputes its forward in the backward
(on one H200 with the 4B at 16 rows of 1,207 tokens: 1.215 s/step against 0.889 without, 2026-12-01), even where the
memory would hold most layers' activations (the 39.4 GiB run peaked at 16.7 GiB). With
`VLM_LORA_CHECKPOINT_LAYERS=k` (the train-lora planner sets it, `_plan.Plan.job_env`), `gradient_checkpointing_enable`
checkpoints the language model's first k decoder layers and lets the others keep their activations. The last
layers stay whole because the backward reaches them first: their activations are freed before the first recompute,
so the peak is the forward's end, `k` layer inputs plus `L - k` layers' activations (`_plan.predict_peak`).

`VLM_LORA_CHECKPOINT_OFFLOAD=1` also holds the checkpointed layers' inputs in pinned host memory
(transformers' own `offload=True`, `torch.autograd.graph.save_on_cpu`): a device-to-host copy in the forward and one
back in the backward, on the compute stream.

transformers 5.19's `gradient_checkpointing_enable(every_n_layers=, offload=)` checkpoints every n-th layer; this
item wraps it, lets it set up checkpointing of every layer (and the offload) and then turns it off on the layers
past the first k, so k can be any count.
"""

from __future__ import annotations

import functools

from speedups import registry

LAYERS = "VLM_LORA_CHECKPOINT_LAYERS"
OFFLOAD = "VLM_LORA_CHECKPOINT_OFFLOAD"
_STATE: dict[str, int | bool] = {}


def layers_wanted(environ) -> int | None:
    """The k of VLM_LORA_CHECKPOINT_LAYERS (None: unset; every layer, as ms-swift does)."""
    text = str(environ.get(LAYERS, "") or "").strip()
    return int(text) if text else None


def decoder_layers(model) -> list:
    """The language model's checkpointable decoder layers in order (transformers' GradientCheckpointingLayer outside
    the vision tower)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [
        module
        for name, module in model.named_modules()
        if isinstance(module, GradientCheckpointingLayer) and ".visual." not in f".{name}." and "vision" not in name
    ]


def limit(model, k: int) -> tuple[int, int]:
    """Leaves checkpointing on for the first k decoder layers only; (checkpointed, of all)."""
    layers = decoder_layers(model)
    for index, layer in enumerate(layers):
        if index >= k:
            layer.gradient_checkpointing = False
    return sum(1 for layer in layers if layer.gradient_checkpointing), len(layers)


def install(ctx) -> registry.Outcome:
    """Wraps `PreTrainedModel.gradient_checkpointing_enable` (checkpointing of the first k layers, the offload)."""
    from transformers.modeling_utils import PreTrainedModel

    k = layers_wanted(ctx.environ)
    if k is None or k < 0:
        return registry.not_applicable(f"{LAYERS} unset: every layer or none, as gradient_checkpointing says")
    to_host = str(ctx.environ.get(OFFLOAD, "") or "") == "1"
    original = PreTrainedModel.gradient_checkpointing_enable
    if getattr(original, "_vlm_lora_layers", False):
        return registry.pending()

    @functools.wraps(original)
    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None, every_n_layers=1, offload=False):
        if "vision" in type(self).__name__.lower():  # the vision tower's own call (ms-swift's vit setting): as it is
            return original(self, gradient_checkpointing_kwargs=gradient_checkpointing_kwargs)
        original(self, gradient_checkpointing_kwargs=gradient_checkpointing_kwargs, offload=offload or to_host)
        done, total = limit(self, k)
        if total:
            _STATE.update(checkpointed=done, layers=total, offload=to_host)
            ctx.say(f"gradient checkpointing on {done} of {total} decoder layers" + (", inputs offloaded" * to_host))

    gradient_checkpointing_enable._vlm_lora_layers = True
    PreTrainedModel.gradient_checkpointing_enable = gradient_checkpointing_enable
    return registry.pending()


def check(ctx, trainer) -> registry.Outcome:
    """Applied where the model has decoder layers to choose from and training checkpoints (ms-swift enables it when
    training starts, after this check)."""
    args = getattr(trainer, "args", None)
    if args is not None and not getattr(args, "gradient_checkpointing", False):
        return registry.not_applicable("gradient_checkpointing off")
    layers = decoder_layers(trainer.model)
    if not layers:
        return registry.found_nothing("no decoder layer with gradient checkpointing")
    k = min(layers_wanted(ctx.environ) or 0, len(layers))
    offload = str(ctx.environ.get(OFFLOAD, "") or "") == "1"
    return registry.applied(f"{k} of {len(layers)} decoder layers checkpointed" + (", inputs offloaded" * offload))
