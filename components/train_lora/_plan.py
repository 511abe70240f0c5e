"""Micro-batch, gradient accumulation and checkpointing chosen from the data, the model and the GPU.

`swift.per_device_train_batch_size: auto` and `swift.gradient_checkpointing: auto` are
resolved here (ms-swift never sees `auto`). The samples per optimizer step stay what the
config asks (`swift.gradient_accumulation_steps` × batch × GPUs as written, or
`SAMPLES_PER_STEP` = 16, the seed's), so the training is the same; only how each step is
computed changes.

Memory model (bytes, one GPU), for a micro-batch of B rows padded to T tokens:

    peak = weights / shards + FIXED + B·T·ROW + 1.1·wrapped + B·T·H·(L·a_full   without checkpointing
                                            | 2·L + a_full)       with checkpointing (inputs of every layer + one layer)
         + B·T·V·LOGIT_BYTES (no Liger: the LM head's logits)

with L layers, H hidden size, V vocabulary. FIXED + B·T·ROW is what a micro-batch holds besides the layers'
activations: CUDA workspaces, LoRA weights and Adam state (FIXED), and per token of the micro-batch the frozen ViT's
transient memory, the embeddings, the loss's chunks and the allocator's slack (ROW). One constant of 3.2 GiB, fitted at
16 rows, over-predicted one row by 19 % (one H200, 2026-12-02: 9.90 GiB measured at 1 x 16 with every layer
checkpointed, 11.8 predicted); split so that 16 rows of 1,221 tokens keep their 3.2 GiB: 1.0 GiB + 120,900 bytes a
token (1 x 16 then 9.80 predicted, -1 %; 8 x 2 in nf4 under 39.4 GiB 35.4 against 35.50 measured, was +2.8 %).
Image tokens are tokens: the frozen ViT's
transient memory (4 patches per image token) is part of the per-token figure. The constants were fitted on one H100 80GB with the Qwen3-VL-4B
architecture (36 layers, hidden 2560), bf16, LoRA r8 all-linear, sdpa, rows of 1,221 tokens:
batch 4 / 8 without checkpointing 43.6 / 75.7 GiB, batch 16 with checkpointing 17.9 GiB,
batch 16 without Liger 2.7 GiB above with it (1 x H100, 2026-11-22 and 2026-11-24, benchmarks/train_throughput.py
with b4 / b8_nogc_liger, b16_gc(_liger)). The plan keeps `margin` of the memory free and sizes for the longest
row: a batch is padded to its longest row, and the longest row's batch is the worst one.

The per-token figure without checkpointing depends on LoRA's dropout and on who runs the
LoRA branches (`act_bytes_full`): with dropout, peft keeps a dropped-out copy of the input and
its mask for every adapted layer (70.2); the train-lora plugin's fused branch (`fused_lora.py`)
keeps the shared input once and the masks (61.4); without dropout nothing but the input is kept
either way (51.0: fitted at 16 rows on one H100 on 2026-11-26, 71.89 GiB measured against 71.5
predicted; the 8-row runs before measured 2-3 % less, which the figure then over-predicts). With checkpointing only one layer's branches are alive at a time. Those are
the figures with sdpa's causal flag (the plugin's `right_padding.py`, measured on one H100 on
2026-11-25: batch 8 peaked 62.93 GiB fused, 52.93 without dropout). With a padding mask (the
plugin's switch off, or eager attention) transformers expands the grouped k / v heads to every
query head and sdpa keeps those copies: `kv_copy_bytes` more (4 · heads · head_dim / hidden:
6.4 for the 4B, which is what the same runs measured with the mask: 68.29 GiB fused, 75.69 peft,
58.30 without dropout). With Liger on, the plugin's fused SiLU-multiply (`swiglu.py`) keeps no
SiLU output: `silu_mul_bytes` less (2 · intermediate / hidden: 7.6 for the 4B; measured 56.54
GiB at batch 8, predicted 56.6; rows of 2,706 tokens at batch 4: 69.88 measured, 68.5 predicted),
and where the down projection's LoRA computes the product again in its backward instead of
keeping it (`fused_lora.silu_mul_lora`) the same again: the product is as wide. With dropout on a
GPU the fused branch computes the masks from seeds (`lora_triton.Seeded`) instead of keeping them:
`dropout_mask_bytes` less (one byte per input element of every adapted layer: 10.4 for the 4B;
measured: the same 71.89 GiB at 16 rows as without dropout). The seeds cost `SEEDED_COST` per step
at the same plan, so the planner asks for them only where they let a plan fit that its speed model
puts ahead by more (one H100, 4B, dropout: 16 x 1 instead of 8 x 2, -10 to -12 % per step).

Speed model (to rank the plans that fit): time per sample ∝ T/T_ref · (GC_SLOWDOWN with
checkpointing) + MICRO_STEP_COST / B — fitted to the same runs (batch 8 without
checkpointing 10.74 samples/s, batch 16 with it 8.80, batch 1 with it 2.40). Plans it puts within
`TIME_RESOLUTION` (2 %) of the fastest go to the largest micro-batch among them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from components.common.errors import TrainError

AUTO = "auto"
GIB = 1024**3
SAMPLES_PER_STEP = 16  # the seed's samples per optimizer step (batch 1 x ms-swift's default accumulation 16)

# Calibrated constants (see the module docstring).
ACT_BYTES_FULL = 70.2  # bytes per token x layer x hidden without checkpointing (peft's LoRA with dropout)
ACT_BYTES_FULL_FUSED = 61.4  # the same with the plugin's fused LoRA branch (dropout masks, no copies)
# lora_dropout 0 (or the masks from seeds): only the layers' inputs are kept. 49.5 was fitted at 8 rows (46.34 GiB
# measured, 2026-11-25); at 16 rows both paths measured 71.89 GiB (2026-11-26, one H100), which 51.0 reproduces (71.5)
ACT_BYTES_FULL_NO_DROPOUT = 51.0
SWIFT_LORA_DROPOUT = 0.05  # ms-swift's default lora_dropout
ACT_BYTES_GC_LAYER = 2.0  # bytes per token x layer x hidden kept with checkpointing (each layer's bf16 input)
# The figures above are the 4B's (intermediate 3.8 x hidden, query heads 1.6 x, k / v heads 0.4 x): another shape
# keeps, per token x layer, 2 bytes for each element of four intermediate-wide tensors (gate(x), up(x), the SiLU output,
# the product: 8; the fused SiLU-multiply's savings are `silu_mul_bytes`), of three query-wide ones (q before its norm,
# after RoPE, the attention's output: 6) and three k / v-wide ones (k before its norm, after RoPE, v: 6), and its own
# dropout masks (`dropout_mask_bytes`; the 4B's 10.4 are in the figures). With the 4B's figures alone one H200 measured
# the 8B (3.0 / 1.0 / 0.25) 31.75 / 33.39 GiB against 36.5 / 35.5 predicted (nf4 / bf16 under 39.4 GiB, 2026-12-02:
# whole layers over-predicted by ~12 bytes, this term says 12.3), and the 32B (5.0 / 1.6 / 0.2) out of memory at
# 78 GiB with 53 of 64 layers checkpointed, predicted 74.5 (this term: 84.3)
SHAPE_BYTES = (8.0, 6.0, 6.0)
REF_WIDTHS = (9728 / 2560, 4096 / 2560, 1024 / 2560)
REF_MASK_BYTES = (5 * 2560 + 4096 + 9728) / 2560  # the 4B's dropout_mask_bytes, 10.4
# CUDA workspaces, LoRA weights + Adam state; and per token of a micro-batch: the ViT's transient memory, embeddings,
# loss chunks, allocator slack. 1.0 GiB + 120,900 B x 19,536 tokens = the 3.2 GiB fitted at 16 rows of 1,221 tokens;
# one row measured 9.90 GiB (1 x H200, 2026-12-02, predicted 9.80; the single 3.2 GiB constant predicted 11.8)
FIXED_BYTES = int(1.0 * GIB)
ROW_TOKEN_BYTES = 120_900
LOGIT_BYTES = 2.0  # bytes per token x vocabulary entry without Liger's fused loss
T_REF = 1221  # tokens per row of the calibration runs
# time per sample with checkpointing of every layer / without, at the same batch: fitted with MICRO_STEP_COST on an
# H100 (2026-11-24). One H200 measured 1.37 at 16 x 1 with today's speed-ups (1.215 against 0.889 s/step, 2026-12-01);
# the two constants rank micro-batch against checkpointing together, so they change together, from one call's runs
GC_SLOWDOWN = 1.76
MICRO_STEP_COST = 6.0  # per-micro-step host cost, in units of one reference sample's compute
# Plans the speed model puts within 2 % of the fastest are ranked by micro-batch, the largest first: it cannot tell
# them apart. One H200 under 39.4 GiB: nf4 8 x 2 without checkpointing measured 1.046 and 1.189 s/step in two calls
# (2026-12-01 / 12-02), bf16 16 x 1 with 22 layers checkpointed 1.093 and 1.090; the model put them 0.3-1.5 % apart
TIME_RESOLUTION = 0.02
# time per step with dropout masks from seeds / kept, at the same plan: the Philox draws in the backward's A-gradient
# kernel (one H100, 2026-11-26: 8 x 2 medians 1.177 vs 1.156 s and 1.204 vs 1.165 s in two runs); with the seeded
# kernels on their own tiles (2 x H200, same run, 2026-11-26, benchmarks/train_throughput.py auto_liger_seeded
# vs auto_liger): 16 x 1 on one GPU 0.896 vs 0.921 s (seeds ahead), 8 x 1 per GPU on two 0.549 vs 0.531 s (behind; that
# machine's two-GPU runs spread 4.5 %): mixed, so left as it was
SEEDED_COST = 0.025
# Bytes held per byte of a parameter LoRA wraps directly (ParamWrapper: its update, materialised
# every forward, kept for backward). Fitted on one H200 with the Qwen3-VL-30B-A3B architecture,
# LoRA on the experts (54.0 GiB of expert weights): micro-batch 1 peaked 59 GiB above the same
# run without expert LoRA (128.7 vs 69.7 GiB predicted).
WRAPPED_FACTOR = 1.1


class PlanError(TrainError):
    """No micro-batch fits; the message names the row length, the memory and the longest row that fits."""


@dataclass(frozen=True)
class ModelShape:
    """What the memory model needs of a model.

    Attributes:
        layers: Language-model layers (0 = unknown architecture).
        hidden: Language-model hidden size.
        vocab: Vocabulary size.
        vision_hidden: ViT hidden size (0 = none / unknown).
        weight_bytes: Frozen base weights in the training dtype.
        wrapped_bytes: Parameters LoRA wraps directly (`swift.target_parameters`, e.g. a MoE
            model's fused experts) in the training dtype: peft's ParamWrapper materialises each
            one's update on every forward and keeps it for the backward pass. Default 0.
        act_full: Activation bytes per token x layer x hidden without checkpointing
            (`act_bytes_full`). Default ACT_BYTES_FULL, the largest.
    """

    layers: int
    hidden: int
    vocab: int
    vision_hidden: int
    weight_bytes: int
    wrapped_bytes: int = 0
    act_full: float = ACT_BYTES_FULL

    @property
    def known(self) -> bool:
        return self.layers > 0 and self.hidden > 0

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], weight_bytes: int, wrapped_bytes: int = 0, act_full: float = ACT_BYTES_FULL
    ) -> ModelShape:
        """Reads layers / hidden / vocabulary (text_config first) and the ViT's hidden size from a HF config."""
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        vision = config.get("vision_config") if isinstance(config.get("vision_config"), dict) else {}

        def num(d: Mapping[str, Any], *keys: str) -> int:
            for key in keys:
                value = d.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
            return 0

        return cls(
            layers=num(text, "num_hidden_layers", "n_layer", "num_layers"),
            hidden=num(text, "hidden_size", "n_embd", "d_model"),
            vocab=num(text, "vocab_size") or num(config, "vocab_size"),
            vision_hidden=num(vision, "hidden_size", "embed_dim"),
            weight_bytes=int(weight_bytes),
            wrapped_bytes=int(wrapped_bytes),
            act_full=float(act_full),
        )


def kv_copy_bytes(model_config: Mapping[str, Any]) -> float:
    """Bytes per token x layer x hidden of the k / v copies sdpa keeps when transformers expands grouped heads.

    transformers expands k and v to every query head (`repeat_kv`) when sdpa gets a padding mask;
    0 when the model has as many k / v heads as query heads or the config does not say.
    """
    text = model_config.get("text_config") if isinstance(model_config.get("text_config"), dict) else model_config
    heads, kv_heads, hidden = (text.get(k) for k in ("num_attention_heads", "num_key_value_heads", "hidden_size"))
    if not all(isinstance(v, int) and v > 0 for v in (heads, kv_heads, hidden)) or kv_heads >= heads:
        return 0.0
    head_dim = text.get("head_dim") if isinstance(text.get("head_dim"), int) else hidden // heads
    return 4.0 * heads * head_dim / hidden  # k and v, bf16


def dropout_mask_bytes(model_config: Mapping[str, Any]) -> float:
    """Bytes per token x layer x hidden of the boolean dropout masks LoRA on every linear layer keeps: one byte per
    input element of q, k, v, gate and up (hidden wide), o (heads x head_dim) and down (intermediate): 10.4 for
    the 4B. 0 where the config does not say."""
    text = model_config.get("text_config") if isinstance(model_config.get("text_config"), dict) else model_config
    hidden, heads, inter = (text.get(k) for k in ("hidden_size", "num_attention_heads", "intermediate_size"))
    if not all(isinstance(v, int) and v > 0 for v in (hidden, heads, inter)):
        return 0.0
    head_dim = text.get("head_dim") if isinstance(text.get("head_dim"), int) else hidden // heads
    return (5.0 * hidden + heads * head_dim + inter) / hidden


def _widths(model_config: Mapping[str, Any]) -> tuple[float, float, float] | None:
    """(intermediate, query heads x head_dim, k / v heads x head_dim) per hidden, or None where the config does not
    say."""
    text = model_config.get("text_config") if isinstance(model_config.get("text_config"), dict) else model_config
    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")
    hidden, inter, heads, kv_heads = (text.get(k) for k in keys)
    if not all(isinstance(v, int) and v > 0 for v in (hidden, inter, heads, kv_heads)):
        return None
    head_dim = text.get("head_dim") if isinstance(text.get("head_dim"), int) else hidden // heads
    return inter / hidden, heads * head_dim / hidden, kv_heads * head_dim / hidden


def shape_bytes(model_config: Mapping[str, Any]) -> float:
    """Bytes per token x layer x hidden a whole layer of this dense Qwen3-VL keeps beyond (or, narrower, short of)
    the `ACT_BYTES_FULL*` figures, which were fitted on the 4B: `SHAPE_BYTES` per width against `REF_WIDTHS`. 0 for
    the 4B, for other model types and where the config does not say."""
    from speedups.model_config import covers

    widths = _widths(model_config)
    if widths is None or not covers(dict(model_config)):  # a MoE's MLPs are its experts: its figures stay the 4B's
        return 0.0
    return sum(per * (width - ref) for per, width, ref in zip(SHAPE_BYTES, widths, REF_WIDTHS, strict=True))


def act_bytes_full(lora_dropout: float, fused: bool, model_config: Mapping[str, Any] | None = None) -> float:
    """Activation bytes per token x layer x hidden without checkpointing (see the module docstring).

    Args:
        lora_dropout: The run's `swift.lora_dropout` (ms-swift's default 0.05 when unset).
        fused: Whether the LoRA branches run through the plugin's fused function (not with
            VLM_LORA_FUSED_LORA=0, nor under ZeRO-3, whose partitioned adapters stay on peft).
        model_config: The model's config.json: its widths (`shape_bytes`) and, with dropout, its masks
            (`dropout_mask_bytes`) against the 4B's. Default None: the 4B's figures.
    """
    config = model_config or {}
    shape = shape_bytes(config)
    if float(lora_dropout) <= 0:
        return ACT_BYTES_FULL_NO_DROPOUT + shape
    masks = dropout_mask_bytes(config) - REF_MASK_BYTES if dropout_mask_bytes(config) else 0.0
    return (ACT_BYTES_FULL_FUSED if fused else ACT_BYTES_FULL) + shape + masks


@dataclass(frozen=True)
class TokenStats:
    """The training rows' lengths, as validate-data counted them (what ms-swift trains on).

    Attributes:
        max_tokens: Longest row, tokens.
        p95_tokens: 95th percentile, tokens.
        mean_tokens: Mean, tokens.
        image_tokens_max: Most image tokens in one row.
        rows: Number of rows.
    """

    max_tokens: int
    p95_tokens: int = 0
    mean_tokens: float = 0.0
    image_tokens_max: int = 0
    rows: int = 0

    @classmethod
    def from_counts(cls, counts: list[int], image_counts: list[int] | None = None) -> TokenStats:
        """Builds the stats from per-row token counts (and per-row image tokens)."""
        if not counts:
            return cls(max_tokens=0)
        ordered = sorted(counts)
        p95 = ordered[min(len(ordered) - 1, int(0.95 * (len(ordered) - 1) + 0.5))]
        return cls(
            max_tokens=ordered[-1],
            p95_tokens=p95,
            mean_tokens=round(sum(ordered) / len(ordered), 1),
            image_tokens_max=max(image_counts or [0]),
            rows=len(ordered),
        )


@dataclass(frozen=True)
class Plan:
    """A micro-batch plan and why.

    Attributes:
        micro_batch: per_device_train_batch_size.
        grad_accum: gradient_accumulation_steps.
        gradient_checkpointing: Whether activations are recomputed.
        peak_bytes: Predicted peak memory of the worst micro-batch.
        budget_bytes: Memory the plan may use (GPU memory less the margin).
        reasons: One line per decision, for the log and Metrics.
        conservative: True when the architecture was unknown to the memory model.
    """

    micro_batch: int
    grad_accum: int
    gradient_checkpointing: bool
    peak_bytes: int
    budget_bytes: int
    reasons: tuple[str, ...] = field(default_factory=tuple)
    conservative: bool = False
    seeded_dropout: bool | None = None  # LoRA's dropout masks from seeds (True), kept (False), not the planner's (None)
    # with checkpointing: the decoder layers checkpointed from the first (speed-up item 19); None = every layer
    checkpoint_layers: int | None = None
    # what the prediction was made of (the model, the longest row, Liger's loss, weight shards), for a re-plan's
    shape: ModelShape | None = field(default=None, compare=False, repr=False)
    tokens: int = 0
    liger: bool = False
    shards: int = 1

    def predicted_peak(self) -> int:
        """The memory model's peak for this plan as it stands (after a re-plan changed it); 0 without its model."""
        if self.shape is None or not self.shape.known or not self.tokens:
            return 0
        return predict_peak(
            self.shape, self.micro_batch, self.tokens, checkpointing=self.gradient_checkpointing, liger=self.liger,
            shards=self.shards, layers=self.checkpoint_layers,
        )  # fmt: skip

    def job_env(self) -> dict[str, str]:
        """The plugin switches this plan decided (VLM_LORA_SEEDED_DROPOUT, VLM_LORA_CHECKPOINT_LAYERS), for the training
        job's environment."""
        env = {} if self.seeded_dropout is None else {"VLM_LORA_SEEDED_DROPOUT": "1" if self.seeded_dropout else "0"}
        if self.gradient_checkpointing and self.checkpoint_layers is not None:
            env["VLM_LORA_CHECKPOINT_LAYERS"] = str(self.checkpoint_layers)
        return env

    def swift_args(self) -> dict[str, Any]:
        """The `swift sft` arguments of this plan."""
        return {
            "per_device_train_batch_size": self.micro_batch,
            "gradient_accumulation_steps": self.grad_accum,
            "gradient_checkpointing": self.gradient_checkpointing,
        }

    def metrics(self) -> dict[str, Any]:
        """Metrics of the plan (GiB rounded to 0.1)."""
        return {
            "plan_micro_batch": self.micro_batch,
            "plan_grad_accum": self.grad_accum,
            "plan_gradient_checkpointing": int(self.gradient_checkpointing),
            "plan_peak_gib": round(self.peak_bytes / GIB, 1),
            "plan_budget_gib": round(self.budget_bytes / GIB, 1),
            **({} if self.seeded_dropout is None else {"plan_seeded_dropout": int(self.seeded_dropout)}),
            **({} if self.checkpoint_layers is None else {"plan_checkpoint_layers": self.checkpoint_layers}),
        }


def predict_peak(
    model: ModelShape,
    batch: int,
    tokens: int,
    *,
    checkpointing: bool,
    liger: bool,
    shards: int = 1,
    layers: int | None = None,
) -> int:
    """Predicted peak bytes of one GPU for `batch` rows padded to `tokens` (the module's memory model); `layers`: with
    checkpointing, how many decoder layers are checkpointed (the first ones; None = all): the others keep their
    activations, and the backward frees those (the last layers) before the first recompute."""
    bt = batch * tokens
    if checkpointing:
        k = model.layers if layers is None else max(0, min(int(layers), model.layers))
        act = bt * model.hidden * (ACT_BYTES_GC_LAYER * k + max(model.layers - k, 1) * model.act_full)
    else:
        act = bt * model.hidden * model.layers * model.act_full
    logits = 0 if liger else bt * model.vocab * LOGIT_BYTES
    wrapped = WRAPPED_FACTOR * model.wrapped_bytes
    return int(model.weight_bytes / max(shards, 1) + FIXED_BYTES + bt * ROW_TOKEN_BYTES + act + logits + wrapped)


def relative_time(batch: int, tokens: int, checkpointing: bool, share: float = 1.0) -> float:
    """Time per sample in units of one reference sample's compute (the module's speed model); `share`: the share of
    decoder layers checkpointed (their forward runs twice)."""
    recompute = (GC_SLOWDOWN - 1.0) * share if checkpointing else 0.0
    return (tokens / T_REF) * (1.0 + recompute) + MICRO_STEP_COST / batch


def _fewest_checkpointed(model: ModelShape, batch: int, tokens: int, budget: int, **kw: Any) -> int | None:
    """The fewest decoder layers to checkpoint (from the first) for `batch` rows to fit `budget`; None: not even all."""
    if predict_peak(model, batch, tokens, checkpointing=True, layers=model.layers, **kw) > budget:
        return None
    lo, hi = 1, model.layers  # the peak falls as more layers are checkpointed
    while lo < hi:
        mid = (lo + hi) // 2
        if predict_peak(model, batch, tokens, checkpointing=True, layers=mid, **kw) <= budget:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def plan_micro_batch(
    model: ModelShape,
    stats: TokenStats,
    gpu_bytes: int,
    *,
    samples_per_step: int = SAMPLES_PER_STEP,
    world_size: int = 1,
    liger: bool = False,
    batch: int | str = AUTO,
    checkpointing: bool | str = AUTO,
    shards: int = 1,
    margin: float = 0.04,
    partial: bool = False,
) -> Plan:
    """Chooses micro-batch, accumulation and checkpointing that fit the GPU and run fastest.

    Args:
        model: The model's shape (`ModelShape.from_config`).
        stats: The training rows' token counts.
        gpu_bytes: Memory one training process may use (free memory, or a configured cap).
        samples_per_step: Samples per optimizer step across all GPUs (kept). Default 16.
        world_size: Training processes (GPUs). Default 1.
        liger: Whether Liger's fused loss is on (no logits kept). Default False.
        batch: A fixed micro-batch, or "auto". Default "auto".
        checkpointing: A fixed gradient_checkpointing, or "auto". Default "auto".
        shards: How many ways the frozen weights are split (ZeRO-3: the world size). Default 1.
        margin: Share of `gpu_bytes` kept free beyond the worst micro-batch (which the plan
            already sizes for the longest row); an out-of-memory anyway re-plans
            (`replan_after_oom`). Default 0.04.
        partial: With checkpointing "auto", whether it may checkpoint only the first k decoder layers (speed-up
            item 19): the fewest that fit for each micro-batch. Default False (every layer).

    Returns:
        The plan, with its reasons.

    Raises:
        PlanError: The samples per step do not split over the GPUs, or no plan fits (the
            message names the longest row, the memory and the longest row that would fit).
    """
    if samples_per_step % world_size:
        raise PlanError(
            f"{samples_per_step} samples per optimizer step do not split over {world_size} GPUs; set "
            "swift.gradient_accumulation_steps (or the batch) so that batch x accumulation x GPUs is a multiple"
        )
    per_gpu = samples_per_step // world_size
    budget = int(gpu_bytes * (1 - margin))
    tokens = max(int(stats.max_tokens), 1)
    batches = _divisors(per_gpu) if batch == AUTO else [int(batch)]
    if batch != AUTO and per_gpu % int(batch):
        raise PlanError(f"swift.per_device_train_batch_size {batch} does not divide {per_gpu} samples per GPU and step")
    gcs = [False, True] if checkpointing == AUTO else [bool(checkpointing)]
    reasons = [
        f"longest row {tokens} tokens (p95 {stats.p95_tokens}, mean {stats.mean_tokens}); "
        f"{samples_per_step} samples per optimizer step over {world_size} GPU(s)",
        f"memory budget {budget / GIB:.1f} GiB ({gpu_bytes / GIB:.1f} GiB less {margin:.0%})",
    ]
    if not model.known:
        return _conservative(model, per_gpu, budget, batches, gcs, reasons)
    kw = {"liger": liger, "shards": shards}
    fits = _candidates(model, batches, gcs, tokens, budget, partial and checkpointing == AUTO, kw)
    fitting = [f for f in fits if f[3] <= budget]
    if not fitting:
        raise PlanError(_no_fit_message(model, tokens, budget, liger, shards))
    fastest = min(f[0] for f in fitting)
    close = [f for f in fitting if f[0] <= fastest * (1 + TIME_RESOLUTION)]
    _, neg_b, gc, peak, k = min(close, key=lambda f: (f[1], f[0], f[2]))  # the largest micro-batch of those
    b = -neg_b
    best_nogc = max((-f[1] for f in fitting if not f[2]), default=0)
    which = "off" if not gc else ("on" if k is None else f"on for {k} of {model.layers} decoder layers")
    reasons.append(
        f"micro-batch {b} x accumulation {per_gpu // b}, checkpointing {which}: predicted peak "
        f"{peak / GIB:.1f} GiB for {b} rows of {tokens} tokens (fastest of {len(fitting)} plans that fit"
        + (f"; without checkpointing at most {best_nogc} rows fit" if gc and best_nogc else "")
        + ")"
    )
    return Plan(
        b, per_gpu // b, gc, peak, budget, tuple(reasons), checkpoint_layers=k, shape=model, tokens=tokens,
        liger=liger, shards=shards,
    )  # fmt: skip


def _candidates(
    model: ModelShape, batches: list[int], gcs: list[bool], tokens: int, budget: int, partial: bool, kw: dict
) -> list[tuple[float, int, bool, int, int | None]]:
    """Every (time, -batch, checkpointing, peak, layers checkpointed or None for all) the plan chooses from; with
    `partial`, a checkpointed plan checkpoints the fewest layers that fit."""
    fits = []
    for b in batches:
        for gc in gcs:
            k = _fewest_checkpointed(model, b, tokens, budget, **kw) if gc and partial else None
            if gc and k is not None and k >= model.layers:
                k = None
            share = 1.0 if k is None else k / model.layers
            peak = predict_peak(model, b, tokens, checkpointing=gc, layers=k, **kw)
            fits.append((relative_time(b, tokens, gc, share), -b, gc, peak, k))
    return fits


def _conservative(
    model: ModelShape, per_gpu: int, budget: int, batches: list[int], gcs: list[bool], reasons: list[str]
) -> Plan:
    b, gc = min(batches), (True in gcs)
    reasons.append(
        f"the memory model does not know this architecture (no layers / hidden size in config.json): "
        f"conservative plan micro-batch {b}, checkpointing {'on' if gc else 'off'}"
    )
    return Plan(b, per_gpu // b, gc, model.weight_bytes + FIXED_BYTES, budget, tuple(reasons), conservative=True)


def _no_fit_message(model: ModelShape, tokens: int, budget: int, liger: bool, shards: int) -> str:
    longest = 0
    lo, hi = 1, tokens
    while lo <= hi:  # the longest row that fits one per micro-batch with checkpointing
        mid = (lo + hi) // 2
        if predict_peak(model, 1, mid, checkpointing=True, liger=liger, shards=shards) <= budget:
            longest, lo = mid, mid + 1
        else:
            hi = mid - 1
    base = (model.weight_bytes / max(shards, 1) + FIXED_BYTES + tokens * ROW_TOKEN_BYTES) / GIB
    need = predict_peak(model, 1, tokens, checkpointing=True, liger=liger, shards=shards) / GIB
    if not longest:
        return (
            f"the frozen base alone ({base:.1f} GiB with buffers) does not fit the {budget / GIB:.1f} GiB budget of one "
            f"GPU; one row of {tokens} tokens with every layer checkpointed needs {need:.1f} GiB (a card of at least "
            f"{need / 0.96:.0f} GiB): use a larger GPU, more GPUs with swift.deepspeed: zero3, or a smaller model"
        )
    return (
        f"the longest training row has {tokens} tokens; even one row per micro-batch with gradient checkpointing "
        f"needs {predict_peak(model, 1, tokens, checkpointing=True, liger=liger, shards=shards) / GIB:.1f} GiB of the "
        f"{budget / GIB:.1f} GiB budget; rows up to {longest} tokens fit: lower swift.max_length / swift.max_pixels "
        "(validate-data then quarantines or shrinks longer rows), turn on swift.use_liger_kernel, or use a larger GPU"
    )
