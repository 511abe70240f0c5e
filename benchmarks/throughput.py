"""FLOP count and steady-state speed of a LoRA training run (pure; no GPU, no ms-swift).

Used by `benchmarks/train_throughput.py` (and its tests). Model FLOPs of one training
sample of a Qwen3-VL model with a frozen base, LoRA on the language model's linear layers
and a frozen ViT (`freeze_vit`), counting multiply-adds as 2 FLOPs:

    LM linear layers   forward 2·N_layer·T per layer; backward 2·N_layer·T (activation
                       gradients only: the base weights are frozen, so no weight gradients)
    LM attention       forward 2·H·d_head·T² per layer (QKᵀ and PV, causal: half of T²);
                       backward twice the forward (dQ, dK, dV)
    LM head            forward 2·d·V·L on the L label positions (where the loss is taken);
                       backward 2·d·V·L (activation gradient)
    LoRA adapters      6·N_lora·T (forward, activation and weight gradients)
    ViT                forward only (frozen, nothing trainable before it): 2·N_block·P per
                       block + 4·d_v·P² full attention per block, patch embedding, mergers
    recompute          gradient checkpointing re-runs each LM layer's forward once (and the
                       ViT's when ms-swift also checkpoints it and sends gradients into it)

MFU = model FLOPs per second / peak bf16 dense FLOP/s (H100/H200 SXM: 989 TFLOP/s).
HFU adds the recomputation (and any backward pass through the frozen ViT) that the run
really executes. T = tokens of the sample in the language model (text + image tokens),
L = label tokens, P = ViT patches (4 per image token for spatial merge 2).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "B200": 2250e12}


@dataclass(frozen=True)
class ArchShape:
    """The shapes the FLOP count needs (from a Qwen3-VL config.json)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    vit_depth: int
    vit_hidden: int
    vit_ffn: int
    vit_patch_in: int  # channels * temporal patch * patch * patch
    vit_out: int
    merge: int  # spatial merge size
    deepstack: int  # extra mergers (deepstack layers)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ArchShape:
        text, vision = config["text_config"], config["vision_config"]
        head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
        return cls(
            layers=text["num_hidden_layers"],
            hidden=text["hidden_size"],
            heads=text["num_attention_heads"],
            kv_heads=text.get("num_key_value_heads", text["num_attention_heads"]),
            head_dim=head_dim,
            ffn=text["intermediate_size"],
            vocab=text["vocab_size"],
            vit_depth=vision["depth"],
            vit_hidden=vision["hidden_size"],
            vit_ffn=vision["intermediate_size"],
            vit_patch_in=vision.get("in_channels", 3)
            * vision.get("temporal_patch_size", 2)
            * vision["patch_size"] ** 2,
            vit_out=vision["out_hidden_size"],
            merge=vision.get("spatial_merge_size", 2),
            deepstack=len(vision.get("deepstack_visual_indexes") or []),
        )

    def lm_linear_shapes(self) -> list[tuple[int, int]]:
        """(in, out) of the 7 linear layers of one decoder layer."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        d = self.hidden
        return [(d, q), (d, kv), (d, kv), (q, d), (d, self.ffn), (d, self.ffn), (self.ffn, d)]

    def lm_layer_params(self) -> int:
        return sum(i * o for i, o in self.lm_linear_shapes())

    def lora_params(self, rank: int) -> int:
        return self.layers * sum(rank * (i + o) for i, o in self.lm_linear_shapes())

    def vit_block_params(self) -> int:
        v = self.vit_hidden
        return 4 * v * v + 2 * v * self.vit_ffn

    def merger_params(self) -> int:
        wide = self.vit_hidden * self.merge**2
        return wide * wide + wide * self.vit_out


@dataclass(frozen=True)
class SampleStats:
    """Means over the training samples of what the FLOP count depends on."""

    tokens: float  # E[T]
    tokens_sq: float  # E[T²]
    labels: float  # E[L]
    patches: float  # E[P]
    patches_sq: float  # E[Σ over images of P_image²]

    @classmethod
    def from_samples(cls, samples: Iterable[tuple[int, int, list[int]]]) -> SampleStats:
        """From (tokens, label tokens, [patches of each image]) per sample."""
        rows = list(samples)
        if not rows:
            raise ValueError("no samples to measure")
        n = len(rows)
        return cls(
            tokens=sum(t for t, _, _ in rows) / n,
            tokens_sq=sum(t * t for t, _, _ in rows) / n,
            labels=sum(lab for _, lab, _ in rows) / n,
            patches=sum(sum(p) for _, _, p in rows) / n,
            patches_sq=sum(sum(x * x for x in p) for _, _, p in rows) / n,
        )


def flops_per_sample(
    arch: ArchShape,
    stats: SampleStats,
    lora_rank: int,
    *,
    lm_recompute: bool = False,
    vit_backward: bool = False,
    vit_recompute: bool = False,
) -> dict[str, float]:
    """Returns the FLOPs of one training sample, by part, plus 'model' and 'hardware' totals.

    Args:
        arch: Model shapes.
        stats: Sample means.
        lora_rank: LoRA rank r.
        lm_recompute: Gradient checkpointing on the LM (forward re-run in backward).
        vit_backward: Gradients are propagated through the frozen ViT (wasted work, but
            executed: ms-swift does this when it checkpoints the ViT).
        vit_recompute: The ViT's forward is re-run in backward (ViT checkpointing).

    Returns:
        Part name -> FLOPs; 'model' (what MFU counts) and 'hardware' (HFU) totals.
    """
    t, t2, lab = stats.tokens, stats.tokens_sq, stats.labels
    lm_lin_fwd = 2.0 * arch.layers * arch.lm_layer_params() * t
    lm_attn_fwd = 2.0 * arch.layers * arch.heads * arch.head_dim * t2
    head_fwd = 2.0 * arch.hidden * arch.vocab * lab
    lora = 6.0 * arch.lora_params(lora_rank) * t
    image_tokens = stats.patches / arch.merge**2
    vit_fwd = (
        2.0 * arch.vit_depth * arch.vit_block_params() * stats.patches
        + 4.0 * arch.vit_depth * arch.vit_hidden * stats.patches_sq
        + 2.0 * arch.vit_patch_in * arch.vit_hidden * stats.patches
        + 2.0 * (1 + arch.deepstack) * arch.merger_params() * image_tokens
    )
    parts = {
        "lm_linear": 2 * lm_lin_fwd,
        "lm_attention": 3 * lm_attn_fwd,
        "lm_head": 2 * head_fwd,
        "lora": lora,
        "vit_forward": vit_fwd,
    }
    model = sum(parts.values())
    extra = 0.0
    if lm_recompute:
        parts["lm_recompute"] = lm_lin_fwd + lm_attn_fwd
        extra += parts["lm_recompute"]
    if vit_backward:
        vit_attn = 4.0 * arch.vit_depth * arch.vit_hidden * stats.patches_sq
        parts["vit_backward"] = (vit_fwd - vit_attn) + 2 * vit_attn
        extra += parts["vit_backward"]
        if vit_recompute:
            parts["vit_recompute"] = vit_fwd
            extra += vit_fwd
    parts["model"] = model
    parts["hardware"] = model + extra
    return parts


def _step(entry: dict[str, Any]) -> int | None:
    """The optimizer step of a log entry (transformers' `step` or ms-swift's 'N/M')."""
    if entry.get("step") is not None:
        return int(entry["step"])
    if isinstance(entry.get("global_step/max_steps"), str):
        return int(entry["global_step/max_steps"].split("/")[0])
    return None


def steady_state(log_history: list[dict[str, Any]], skip_steps: int = 2) -> dict[str, float]:
    """Speed between a warm-up step and the last logged step of one fresh run.

    ms-swift logs `train_speed(s/it)` = seconds since training started / steps done, to 6
    decimals, so `speed × step` is the elapsed time at that step; transformers logs
    `num_input_tokens_seen` (non-padding tokens when asked for) at each logging step.

    Args:
        log_history: The run's log entries (logging_steps 1 gives the finest figures).
        skip_steps: Steps treated as warm-up (first entry at or after it is the start).

    Returns:
        seconds_per_step (mean over the window), median_seconds_per_step (of its single
        steps), single_steps (s per step between consecutive logged steps, in order), steps,
        tokens_per_second (when tokens were logged); {} if the log has fewer than two usable
        entries.
    """
    points = []
    for entry in log_history:
        speed = entry.get("train_speed(s/it)")
        step = _step(entry)
        if speed is None or step is None or "loss" not in entry:
            continue
        points.append((int(step), float(speed) * int(step), entry.get("num_input_tokens_seen")))
    by_step = {}
    for point in points:  # one entry per step (the last logged), in step order
        by_step[point[0]] = point
    points = [by_step[k] for k in sorted(by_step) if k >= skip_steps]
    if len(points) < 2:
        return {}
    (s0, e0, k0), (s1, e1, k1) = points[0], points[-1]
    if s1 <= s0 or e1 <= e0:
        return {}
    out = {"seconds_per_step": (e1 - e0) / (s1 - s0), "steps": float(s1 - s0), "seconds": e1 - e0}
    # the median of the single steps in the same window: a one-off stall (a recompilation when
    # torch.compile meets a new padded length, a data-loader hiccup) moves the mean, not this
    singles = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(points, points[1:]) if b[0] > a[0]]
    out["median_seconds_per_step"] = statistics.median(singles)
    out["single_steps"] = singles
    if k0 is not None and k1 is not None:
        out["tokens_per_second"] = (float(k1) - float(k0)) / (e1 - e0)
    return out


def losses_at(log_history: list[dict[str, Any]], steps: Iterable[int]) -> dict[int, float]:
    """The logged training loss at the given optimizer steps (those that were logged)."""
    by_step = {}
    for entry in log_history:
        step = _step(entry)
        if "loss" in entry and step is not None:
            by_step[step] = float(entry["loss"])
    return {s: by_step[s] for s in steps if s in by_step}


def utilisation(flops: dict[str, float], samples_per_second: float, gpus: int, peak_flops: float) -> dict[str, float]:
    """MFU and HFU (fractions of the GPUs' peak) at a given training speed."""
    if samples_per_second <= 0 or gpus <= 0 or peak_flops <= 0 or not math.isfinite(samples_per_second):
        return {"mfu": 0.0, "hfu": 0.0, "model_tflops_per_gpu": 0.0}
    per_gpu = samples_per_second / gpus
    return {
        "mfu": flops["model"] * per_gpu / peak_flops,
        "hfu": flops["hardware"] * per_gpu / peak_flops,
        "model_tflops_per_gpu": flops["model"] * per_gpu / 1e12,
    }


def peak_flops_for(device_name: str) -> float:
    """Peak dense bf16 FLOP/s for a CUDA device name (e.g. 'NVIDIA H100 80GB HBM3')."""
    for key, value in PEAK_BF16_FLOPS.items():
        if key in device_name.upper():
            return value
    raise ValueError(f"no peak bf16 figure for device {device_name!r}; add it to PEAK_BF16_FLOPS")
