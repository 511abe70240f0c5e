"""The planner as train-lora runs it: `plan_for_run` reads what the task has (swift arguments, the model's config, the
rows' token figures, the GPU's memory, which speed-up items will apply) and asks `_plan`'s memory and speed models for
the plan; after an out-of-memory, `replan_after_oom` gives the next safer one, at most `MAX_OOM_REPLANS` times."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from components.train_lora._plan import (
    AUTO,
    GIB,
    SAMPLES_PER_STEP,
    SEEDED_COST,
    SWIFT_LORA_DROPOUT,
    ModelShape,
    Plan,
    PlanError,
    TokenStats,
    _divisors,
    act_bytes_full,
    dropout_mask_bytes,
    kv_copy_bytes,
    plan_micro_batch,
    relative_time,
)
from speedups.model_config import silu_mul_bytes

MAX_OOM_REPLANS = 3


def replan_after_oom(plan: Plan, per_gpu_samples: int) -> Plan | None:
    """The next safer plan after an out-of-memory: every layer checkpointed where only some were, then half the
    micro-batch, then checkpointing on; None = none left. Its reason ends with the memory model's peak for it."""
    if plan.gradient_checkpointing and plan.checkpoint_layers is not None:
        why = f"out of memory with {plan.checkpoint_layers} layers checkpointed: every layer checkpointed"
        nxt = replace(plan, checkpoint_layers=None)
    elif plan.micro_batch > 1:
        b = max(d for d in _divisors(per_gpu_samples) if d < plan.micro_batch)
        why = f"out of memory with micro-batch {plan.micro_batch}: micro-batch {b}"
        nxt = replace(plan, micro_batch=b, grad_accum=per_gpu_samples // b)
    elif not plan.gradient_checkpointing:
        why = "out of memory with micro-batch 1: gradient checkpointing on"
        nxt = replace(plan, micro_batch=1, grad_accum=per_gpu_samples, gradient_checkpointing=True)
    else:
        return None
    peak = nxt.predicted_peak()
    why += f" (predicted peak {peak / GIB:.1f} GiB)" if peak else ""
    return replace(nxt, peak_bytes=peak, reasons=(*plan.reasons, why))


_OOM_MARKERS = ("CUDA out of memory", "torch.OutOfMemoryError", "OutOfMemoryError", "CUBLAS_STATUS_ALLOC_FAILED")


def is_out_of_memory(log_tail: str) -> bool:
    """Whether a failed `swift sft` ran out of GPU memory (its log's last lines)."""
    return any(marker in log_tail for marker in _OOM_MARKERS)


def wants_plan(swift_args: Mapping[str, Any]) -> bool:
    """Whether the config leaves micro-batch or checkpointing to the planner (`auto`)."""
    return AUTO in (swift_args.get("per_device_train_batch_size"), swift_args.get("gradient_checkpointing"))


def samples_per_step(swift_args: Mapping[str, Any], world_size: int) -> int:
    """Samples per optimizer step an `auto` config asks for: what batch 1 would do.

    `gradient_accumulation_steps: N` with `per_device_train_batch_size: auto` means N samples
    per GPU and step (as the seed's batch 1 x accumulation 16); without it, ms-swift's own
    default for batch 1: 16 samples per step in all.
    """
    batch = swift_args.get("per_device_train_batch_size")
    accum = swift_args.get("gradient_accumulation_steps")
    per_gpu_batch = batch if isinstance(batch, int) and not isinstance(batch, bool) else 1
    if isinstance(accum, int) and not isinstance(accum, bool) and accum > 0:
        return per_gpu_batch * accum * world_size
    return max(SAMPLES_PER_STEP, world_size) if per_gpu_batch == 1 else per_gpu_batch * world_size


def plan_for_run(
    swift_args: Mapping[str, Any],
    *,
    model_config: Mapping[str, Any],
    weight_bytes: int,
    token_stats: Mapping[str, Any] | None,
    gpu_bytes: int,
    world_size: int,
    zero3: bool = False,
    wrapped_bytes: int = 0,
    fused_lora: bool = True,
    padding_mask: bool = False,
    fused_silu_mul: bool = False,
    silu_mul_down: bool = False,
    seeded_dropout: str = "off",
    partial_checkpointing: bool = False,
) -> Plan:
    """The plan for a run whose `swift` section says `auto` (inputs as the task reads them).

    `wrapped_bytes`: the parameters `swift.target_parameters` wraps, in the training dtype
    (`ModelShape.wrapped_bytes`). Default 0. `fused_lora`: whether the plugin's fused LoRA
    branch may run (False with VLM_LORA_FUSED_LORA=0); it never does under ZeRO-3, with DoRA
    (`swift.use_dora`) or with LoRA bias (`swift.lora_bias`). Default True. `padding_mask`:
    whether attention gets transformers' padding mask (VLM_LORA_RIGHT_PAD_CAUSAL=0 with sdpa, or
    eager attention), which adds `kv_copy_bytes`. Default False. `fused_silu_mul`: whether the
    plugin gives the MLPs Liger's fused SiLU-multiply (`swiglu.py`), which keeps no SiLU output:
    `silu_mul_bytes` less. Default False. `silu_mul_down`: whether, with that product, the down
    projections' LoRA (plain, through the fused branch) computes the product again in its backward
    instead of keeping it (`fused_lora.silu_mul_lora`): `silu_mul_bytes` less again. Default False.
    `seeded_dropout`: with dropout, LoRA on every linear layer (all-linear) and the fused branch, whether the
    masks are computed from seeds on the GPU (`lora_triton.Seeded`) instead of kept (`dropout_mask_bytes` less
    memory, `SEEDED_COST` more time per step): "on", "off", or "auto" (seeds only where they let a faster plan
    fit; `Plan.job_env` tells the plugin). Default "off". `partial_checkpointing`: whether speed-up item 19 can
    checkpoint only the first k decoder layers (`plan_micro_batch`'s `partial`). Default False.

    Raises:
        PlanError: No token figures (a dataset from before validate-data wrote them), or no plan fits.
    """
    if not token_stats:
        raise PlanError(
            "per_device_train_batch_size / gradient_checkpointing 'auto' needs the training set's token figures "
            "(token_stats.json, written by validate-data): re-run validate-data, or set both explicitly"
        )
    stats = TokenStats(
        max_tokens=int(token_stats["max_tokens"]),
        p95_tokens=int(token_stats.get("p95_tokens", 0)),
        mean_tokens=float(token_stats.get("mean_tokens", 0.0)),
        rows=int(token_stats.get("rows", 0)),
    )
    batch = swift_args.get("per_device_train_batch_size")
    checkpointing = swift_args.get("gradient_checkpointing", AUTO)
    dropout = swift_args.get("lora_dropout")
    # the fused branch takes plain LoRA only (fused_lora.py): DoRA and LoRA bias stay on peft, as under ZeRO-3
    plain = not swift_args.get("use_dora") and str(swift_args.get("lora_bias") or "none") == "none"
    fused = fused_lora and plain and not zero3
    dropout = SWIFT_LORA_DROPOUT if dropout is None else float(dropout)
    act_full = act_bytes_full(dropout, fused, model_config)
    if padding_mask:
        act_full += kv_copy_bytes(model_config)
    if fused_silu_mul:
        act_full -= silu_mul_bytes(model_config)
        if silu_mul_down and fused:
            act_full -= silu_mul_bytes(model_config)  # the product itself, 2 bytes x intermediate, not kept either

    def plan(act: float) -> Plan:
        return plan_micro_batch(
            ModelShape.from_config(model_config, weight_bytes, wrapped_bytes, act),
            stats,
            gpu_bytes,
            samples_per_step=samples_per_step(swift_args, world_size),
            world_size=world_size,
            liger=bool(swift_args.get("use_liger_kernel")),
            batch=batch if batch != AUTO and batch is not None else AUTO,
            checkpointing=AUTO if checkpointing == AUTO else bool(checkpointing),
            shards=world_size if zero3 else 1,
            partial=partial_checkpointing,
        )

    try:
        return _plan_masks(plan, act_full, seeded_dropout, fused, dropout, model_config, weight_bytes, stats)
    except PlanError as exc:
        if "budget" not in str(exc):  # not a memory refusal (the samples do not split over the GPUs)
            raise
        raise PlanError(_with_precision(str(exc), swift_args, weight_bytes)) from None


def _with_precision(message: str, swift_args: Mapping[str, Any], weight_bytes: int) -> str:
    """A no-fit message with the base's precision and size, and QLoRA where the base is in bf16."""
    from speedups.model_config import quantization_of

    quantization = quantization_of(dict(swift_args))
    said = f"the base is {weight_bytes / GIB:.1f} GiB " + (
        f"in {quantization} (model.quantization)" if quantization != "none" else "in bf16"
    )
    # nf4 keeps 0.18-0.21 of a dense Qwen3-VL's parameters in bf16 (quantization.py): the 4B's base in ~40 %
    hint = (
        "; model.quantization: nf4 stores a dense model's base in about 40 % of that" if quantization == "none" else ""
    )
    return f"{message} ({said}{hint})"


def _plan_masks(plan, act_full, seeded_dropout, fused, dropout, model_config, weight_bytes, stats) -> Plan:
    """The plan with dropout masks kept, from seeds, or whichever lets the faster plan fit (`seeded_dropout`)."""
    if seeded_dropout not in ("on", "auto") or not fused or dropout <= 0 or not dropout_mask_bytes(model_config):
        return plan(act_full)
    seeded = plan(act_full - dropout_mask_bytes(model_config))
    if seeded_dropout == "on":
        return _with_masks(seeded, True, "dropout masks from seeds (VLM_LORA_SEEDED_DROPOUT=1)")
    layers = ModelShape.from_config(model_config, weight_bytes).layers
    return _choose_masks(seeded, act_full, plan, stats, layers)


def _with_masks(plan: Plan, seeded: bool, why: str) -> Plan:
    return replace(plan, seeded_dropout=seeded, reasons=(*plan.reasons, why))


def _choose_masks(
    seeded: Plan, act_kept: float, plan: Callable[[float], Plan], stats: TokenStats, layers: int = 1
) -> Plan:
    """Kept masks unless seeds let a plan fit that the speed model puts ahead by more than `SEEDED_COST`."""
    try:
        kept = plan(act_kept)
    except PlanError:
        return _with_masks(seeded, True, "dropout masks from seeds: no plan fits with the masks kept")
    tokens = max(int(stats.max_tokens), 1)

    def step(p: Plan) -> float:
        share = 1.0 if p.checkpoint_layers is None else p.checkpoint_layers / max(layers, 1)
        return relative_time(p.micro_batch, tokens, p.gradient_checkpointing, share)

    if kept.conservative or step(seeded) * (1 + SEEDED_COST) >= step(kept):
        return _with_masks(kept, False, "dropout masks kept: seeds would not let a faster plan fit")
    return _with_masks(
        seeded,
        True,
        f"dropout masks from seeds, none kept: micro-batch {seeded.micro_batch} "
        f"(checkpointing {'on' if seeded.gradient_checkpointing else 'off'}) fits instead of {kept.micro_batch} "
        f"(checkpointing {'on' if kept.gradient_checkpointing else 'off'})",
    )
