"""What a training run will take and cost, before the money is spent: pure tables and one estimate.

Two tables and one function, no cloud client, no kfp, no torch:

* `PRICES`: Vertex AI custom-training prices per machine type, USD per hour for the whole
  machine (its GPUs included), on-demand and Spot. **Approximate list prices**: see
  `PRICE_SOURCE` and `PRICE_TABLE_DATE`; override them with `resources.price_usd_per_hour`
  (and `resources.price_date`), since discounts, committed use and regional prices differ.
* `THROUGHPUT`: LM tokens/s (text + image tokens, padding excluded) of one GPU training the
  Qwen3-VL-4B architecture with LoRA (15,668 at 8 x 2 on one H100 80GB, 2026-11-25, benchmarks/train_throughput.py),
  scaled to other GPUs by a stated ratio.
* `estimate(...)`: training time, GPU-hours and cost from the rows and tokens to train, the
  micro-batch plan and the profile, with every assumption listed.

train-lora logs the same estimate once it knows its plan, and records the actual `gpu_hours`
(wall time of the task x GPUs) in its Metrics; `pipelines.run` prints it before it submits.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from components.common.quantization import STEP_COST_FACTOR
from speedups.model_config import quantization_of

# --- prices ----------------------------------------------------------------------------------

PRICE_TABLE_DATE = "2026-11-24"
PRICE_REGION = "us-central1"
PRICE_SOURCE = (
    "Vertex AI custom-training prices (https://cloud.google.com/vertex-ai/pricing), us-central1, machine + GPUs "
    "per hour, estimated as Compute Engine list prices x 1.15 (Vertex's markup: n1-standard-4 $0.21849885 on "
    "Vertex vs $0.189999 on Compute Engine); Compute Engine figures from the Cloud Billing catalog, see the "
    "notes above PRICES: verify them and override with resources.price_usd_per_hour"
)
SPOT_NOTE = (
    "Spot column: Compute Engine Spot prices of 2026-07-30 (a3-ultragpu-8g: 2026-10-13) x 1.15; Spot prices "
    "change up to monthly (a3-highgpu-1g: $4.45 in 2024-11, $6.33 in 2026-07, $6.57 without Local SSD in 2026-09, on Compute Engine)"
)

# machine type -> (on-demand, Spot), USD per hour for the whole machine. A3 machines with fewer
# than 8 GPUs run only as Spot or FLEX_START: their on-demand figure is 1/8, 2/8, 4/8 of
# a3-highgpu-8g's, for comparison and for FLEX_START (whose own, lower DWS prices are not here).
# Checked 2026-11-24 against stored copies of public pages (no live network):
# - Compute Engine, us-central1, Cloud Billing catalog as compiled in
#   github.com/Cyclenerd/google-cloud-pricing-cost-calculator pricing.yml (generated 2026-07-30):
#   on-demand a2-highgpu-1g 3.6734, a2-ultragpu-1g 5.0688, a3-highgpu-8g 88.49, g2-standard-4 0.7068
#   (x 1.15 = the on-demand column within 0.4 %, kept); Spot a2-highgpu-1g 1.928, a2-ultragpu-1g 2.760,
#   a3-highgpu-1g 6.326, a3-highgpu-8g 50.61, g2-standard-4 0.397 (x 1.15 = the Spot column).
# - a3-ultragpu-8g (not in that file): huggingface.co/datasets/tanod/cloud-gpu-list-prices (Billing catalog,
#   2026-10-13): 10.4365 on-demand, 6.2607 Spot per GPU without Local SSD; Spot column = 8 x 6.2607 x 1.15;
#   on-demand 97.50 kept (8 x 10.4365 x 1.15 = 96.0 plus Local SSD).
# - https://cloud.google.com/vertex-ai/pricing as transcribed on 2026-10-07 (github.com/api-evangelist/
#   google-vertex-ai plans/google-vertex-ai-plans-pricing.yml): NVIDIA_H100_80GB training $9.79655057 per GPU,
#   which looks like Compute Engine's own H100 price (derived, not stated): whether Vertex adds 15 % on A3 (or
#   a separate management fee of another size) is not confirmed, so the A3 rows (x 1.15) remain estimates.
# - a4-highgpu-8g (8 x B200; in neither file; checked 2026-12-01, no live network): a public repository's
#   GPU price list gives "GCP a4-highgpu-8g: $148.21/hr" (Compute Engine on-demand, undated, unverified);
#   on-demand column = 148.21 x 1.15; Spot column = that x 0.59 (a3-ultragpu-8g's Spot / on-demand ratio),
#   an estimate with no Spot source at all. Check the pricing page and set resources.price_usd_per_hour.
PRICES: dict[str, tuple[float, float]] = {
    "a2-highgpu-1g": (4.22, 2.22),
    "a2-highgpu-2g": (8.44, 4.43),
    "a2-highgpu-4g": (16.88, 8.87),
    "a2-highgpu-8g": (33.76, 17.74),
    "a2-ultragpu-1g": (5.83, 3.17),
    "a2-ultragpu-2g": (11.66, 6.35),
    "a2-ultragpu-4g": (23.32, 12.69),
    "a2-ultragpu-8g": (46.64, 25.39),
    "a3-highgpu-1g": (12.69, 7.28),
    "a3-highgpu-2g": (25.38, 14.55),
    "a3-highgpu-4g": (50.75, 29.10),
    "a3-highgpu-8g": (101.50, 58.20),
    "a3-ultragpu-8g": (97.50, 57.60),
    "a4-highgpu-8g": (170.44, 100.56),  # estimate, see above: check https://cloud.google.com/vertex-ai/pricing
    "g2-standard-4": (0.81, 0.46),
    "g2-standard-8": (0.98, 0.55),
    "g2-standard-12": (1.15, 0.65),
    "g2-standard-16": (1.32, 0.74),
    "g2-standard-24": (2.30, 1.29),
    "g2-standard-32": (1.99, 1.12),
    "g2-standard-48": (4.61, 2.59),
    "g2-standard-96": (9.22, 5.17),
}

# --- throughput ------------------------------------------------------------------------------

# Reference: one H100 80GB, Qwen3-VL-4B (4.44 B parameters, named 4B), LoRA r8 all-linear, bf16,
# rows of 1,207 LM tokens on average (1024² drawings), micro-batch 8 x 2 without checkpointing,
# Liger, the task's plugin: 12.99 samples/s = 15,668 LM tokens/s (benchmarks/train_throughput.py b8_nogc_liger,
# run B of 2026-11-25; 15,690 in run C; 12,972 on 2026-11-24 before
# the plugin's later levers).
REF_TOKENS_PER_S = 15668
REF_TOKENS = 1207
REF_BATCH = 8
REF_MODEL_B = 4.0  # billions of parameters as the model's name says (Qwen3-VL-4B: 4.44 B)
# A mixture of experts per *active* parameter, against the 4B dense model: Qwen3-VL-30B-A3B
# (3.3 B active) trained 16 rows in 0.77 s on 2 x H200 (8 rows per GPU, ZeRO-2; single steps from
# ms-swift's speed figure, 2026-11-26): ~12,500 LM tokens/s per GPU (benchmarks/large_models.py --model 30b-a3b;
# the earlier ~8,300 on one H200 was read on a 1-s clock with a save inside the window):
# routing, gathers and 128 small expert matmuls.
MOE_FACTOR = 0.66
# Speed model: time per sample ∝ T/PLAN_T_REF · (GC_SLOWDOWN with checkpointing) + MICRO_STEP_COST / B,
# the planner's own (components/train_lora/_plan.py; a test keeps the numbers equal). On 2026-11-24 it
# gave the seed settings (batch 1, checkpointing) 2.41 samples/s (measured 2.40 in the same run) and
# 16 x 1 with checkpointing 8.8 (measured 8.80); on 2026-11-25 (run B) 16 x 1 with checkpointing
# 1.216 x the tuned 8 x 2's step time (measured 1.234), the seed slower than it says (below). On another GPU only the first term (the GPU's
# compute) scales by its ratio; the per-micro-step host cost stays (the seed's GPU idles 79 %).
PLAN_T_REF = 1221
GC_SLOWDOWN = 1.76
MICRO_STEP_COST = 6.0
# Without Liger at batch 1 (the seed's settings: checkpointing, the ViT checkpointed too), measured
# against the speed model: the seed's tokens/s over the tuned path's in the same run was 0.135-0.163
# in five runs since the plugin's levers (the model says 0.225, which matched on 2026-11-24): x0.66.
NO_LIGER_BATCH1_FACTOR = 0.66
# Rows much longer than the reference (larger images) measured slower than the speed model says:
# 1600² drawings, 2,686 tokens, 16 x 1 with checkpointing: 2.78 samples/s against 4.40 predicted.
LONG_ROW_TOKENS = 2686
LONG_ROW_FACTOR = 0.63
# Without Liger's kernels (measured at batch 16 with checkpointing: 5.69 vs 7.31 samples/s).
NO_LIGER_FACTOR = 0.78
# Run-to-run spread on the same GPU and settings (seed 2,096-2,913 tokens/s; tuned 10,628-12,972 on
# 2026-11-24, 14,565-15,690 with the plugin's later levers):
# the time may be up to 1 / SPREAD of the estimate.
SPREAD = 0.72
# ZeRO-3 against a replicated base (ZeRO-2 / DDP) on the same GPUs (2 x H200: 0.58 vs 3.3 samples/s).
ZERO3_FACTOR = 0.17
MULTI_NODE_EFFICIENCY = 0.9  # not measured across real nodes: an estimate

# Accelerator -> (LM tokens/s relative to one H100, how the ratio was obtained). A GPU's memory is
# in components.common.model_fit.GPU_MEMORY_GIB (one table, also train-lora's fit rule's).
GPU_RATIO: dict[str, tuple[float, str]] = {
    "NVIDIA_H100_80GB": (1.0, "measured"),
    "NVIDIA_H100_MEGA_80GB": (1.0, "same GPU as the measured H100"),
    "NVIDIA_H200_141GB": (
        1.0,
        "measured on one H200 (2026-11-26): with an H100's compute the speed model gives its planned 16 x 1 "
        "19,977 LM tokens/s against 19,911 measured (8 x 2 without dropout: 10 % under)",
    ),
    "NVIDIA_B200": (
        1.5,
        "estimate, not measured: bf16 dense peak 2,250 vs 989 TFLOP/s (NVIDIA HGX B200 datasheet), "
        "less the host-bound share (an H200's 1.4x memory bandwidth gained nothing measurable)",
    ),
    "NVIDIA_TESLA_A100": (0.40, "estimate: bf16 matmul 250 vs 700 TFLOP/s (preflight), host-bound share"),
    "NVIDIA_A100_80GB": (0.40, "estimate: bf16 matmul 250 vs 700 TFLOP/s (preflight), host-bound share"),
    "NVIDIA_L4": (0.12, "estimate: bf16 matmul 85 vs 700 TFLOP/s (preflight)"),
}


class CostError(ValueError):
    """An estimate cannot be made (unknown machine or GPU); the message names it and the fix."""


@dataclass(frozen=True)
class Profile:
    """The training job's machines and the price to use.

    Attributes:
        machine_type: Vertex machine type, e.g. a2-highgpu-1g.
        accelerator_type: Vertex accelerator enum, e.g. NVIDIA_TESLA_A100.
        accelerator_count: GPUs per replica.
        replica_count: Machines of the job. Default 1.
        scheduling: standard, spot or flex_start. Default standard.
        region: Vertex region. Default us-central1.
        price_usd_per_hour: Price of one machine per hour; 0 = the table's. Default 0.
        price_date: The date of that price, shown with it. Default "".
    """

    machine_type: str
    accelerator_type: str
    accelerator_count: int
    replica_count: int = 1
    scheduling: str = "standard"
    region: str = PRICE_REGION
    price_usd_per_hour: float = 0.0
    price_date: str = ""

    @property
    def gpus(self) -> int:
        return max(self.accelerator_count, 0) * max(self.replica_count, 1)


@dataclass(frozen=True)
class Workload:
    """What will be trained and how each step is computed.

    Attributes:
        rows: Training rows (after validation); 0 = unknown.
        mean_tokens: Mean LM tokens per row (text + image); 0 = unknown.
        epochs: Passes over the rows (swift.num_train_epochs). Default 1.
        max_steps: Optimizer steps when set (swift.max_steps > 0), else 0. Default 0.
        samples_per_step: Samples per optimizer step across all GPUs. Default 16.
        micro_batch: Rows per forward pass on one GPU. Default 1.
        checkpointing: Gradient checkpointing on. Default True.
        liger: Liger kernels on. Default False.
        zero3: ZeRO-3 (frozen weights split over the GPUs). Default False.
        model_b: Billions of parameters (from the model's name); 0 = unknown (4B assumed). Default 0.
            For a mixture of experts: the active ones (`moe`).
        moe: A mixture-of-experts model (`MOE_FACTOR` applies). Default False.
        tokens_from: Where rows and tokens came from, for the printout. Default "".
        quantization: `model.quantization` (none, nf4, int8): a quantised base's step is slower
            by `STEP_COST_FACTOR` (both measured on one H200). Default "none".
    """

    rows: int
    mean_tokens: float
    epochs: float = 1.0
    max_steps: int = 0
    samples_per_step: int = 16
    micro_batch: int = 1
    checkpointing: bool = True
    liger: bool = False
    zero3: bool = False
    model_b: float = 0.0
    moe: bool = False
    tokens_from: str = ""
    quantization: str = "none"


@dataclass(frozen=True)
class Estimate:
    """The expected training time and cost; figures are None when the data is not known.

    Attributes:
        tokens_per_s: LM tokens/s of the whole job.
        price_usd_per_hour: Price of the whole job per hour (every replica).
        price_label: Where the price comes from (table and date, or the override).
        train_tokens: LM tokens the run trains (rows x mean tokens x epochs), None = unknown.
        hours: Expected training time, None = unknown.
        hours_high: Upper end of the time (run-to-run spread), None = unknown.
        gpu_hours: hours x GPUs, None = unknown.
        cost_usd: hours x price, None = unknown.
        cost_usd_high: hours_high x price, None = unknown.
        usd_per_million_tokens: Cost of 1M trained tokens.
        assumptions: One line per assumption.
        rows: Training rows when known, else 0.
    """

    tokens_per_s: float
    price_usd_per_hour: float
    price_label: str
    train_tokens: float | None
    hours: float | None
    hours_high: float | None
    gpu_hours: float | None
    cost_usd: float | None
    cost_usd_high: float | None
    usd_per_million_tokens: float
    assumptions: tuple[str, ...] = field(default_factory=tuple)
    rows: int = 0

    def lines(self) -> list[str]:
        """The estimate as printed: one summary line, then the assumptions."""
        rate = f"{_money(self.price_usd_per_hour)}/h ({self.price_label})"
        if self.hours is None:
            known = f"{self.rows:,} rows, tokens per row unknown" if self.rows else "rows unknown"
            head = (
                f"cost estimate: {known} before validate-data; {_money(self.usd_per_million_tokens)} per 1M "
                f"training tokens at ~{self.tokens_per_s:,.0f} LM tokens/s; {rate}"
            )
        else:
            head = (
                f"cost estimate: ~{_duration(self.hours)} of training (up to {_duration(self.hours_high or 0)}), "
                f"{_sig(self.gpu_hours or 0)} GPU-hours, ~{_money(self.cost_usd or 0)} "
                f"(up to {_money(self.cost_usd_high or 0)}) at {rate}; "
                f"{_sig((self.train_tokens or 0) / 1e6)}M training tokens at ~{self.tokens_per_s:,.0f} LM tokens/s"
            )
        return [head, *(f"  - {a}" for a in self.assumptions)]


def model_size_b(source: str) -> float:
    """Billions of parameters a model's name says (`Qwen3-VL-8B-Instruct` → 8, `30B-A3B` → 3 active); 0 = none."""
    name = source.rstrip("/").rsplit("/", 1)[-1]
    active = re.search(r"(?i)(?:^|[-_])A(\d+(?:\.\d+)?)B(?:$|[-_])", name)
    if active:
        return float(active.group(1))
    sizes = re.findall(r"(?i)(?:^|[-_])(\d+(?:\.\d+)?)B(?:$|[-_])", name)
    return float(sizes[0]) if sizes else 0.0


def is_moe_name(source: str) -> bool:
    """Whether a model's name says it is a mixture of experts (`…-30B-A3B-…`: 3 B active)."""
    name = source.rstrip("/").rsplit("/", 1)[-1]
    return bool(re.search(r"(?i)(?:^|[-_])A\d+(?:\.\d+)?B(?:$|[-_])", name))


def machine_price(profile: Profile) -> tuple[float, str]:
    """USD per hour of one machine and where it comes from.

    Raises:
        CostError: The machine type is not in `PRICES` and no price override is set.
    """
    if profile.price_usd_per_hour > 0:
        when = f" of {profile.price_date}" if profile.price_date else ""
        return profile.price_usd_per_hour, f"your price{when}, resources.price_usd_per_hour"
    if profile.machine_type not in PRICES:
        raise CostError(
            f"no list price for machine type {profile.machine_type!r} (the table in components/common/cost.py has "
            f"{', '.join(PRICES)}); set resources.price_usd_per_hour to its price"
        )
    on_demand, spot = PRICES[profile.machine_type]
    kind = "Spot" if profile.scheduling == "spot" else "on-demand"
    where = PRICE_REGION if profile.region == PRICE_REGION else f"{PRICE_REGION}'s, not {profile.region}'s"
    label = f"{kind} list price {where}, table of {PRICE_TABLE_DATE}"
    if profile.scheduling == "flex_start":
        label += ", FLEX_START priced at on-demand: its lower DWS price is not in the table"
    return (spot if profile.scheduling == "spot" else on_demand), label


def gpu_tokens_per_s(workload: Workload, accelerator_type: str) -> tuple[float, list[str]]:
    """LM tokens/s of one GPU for this workload, and the assumptions behind it.

    Raises:
        CostError: The accelerator has no throughput figure.
    """
    if accelerator_type not in GPU_RATIO:
        raise CostError(
            f"no throughput figure for accelerator {accelerator_type or '(none)'!r} (known: {', '.join(GPU_RATIO)}); "
            "the time cannot be estimated"
        )
    ratio, how = GPU_RATIO[accelerator_type]
    tokens = workload.mean_tokens if workload.mean_tokens > 0 else REF_TOKENS
    b = max(workload.micro_batch, 1)
    ref = REF_TOKENS / PLAN_T_REF + MICRO_STEP_COST / REF_BATCH
    compute = tokens / PLAN_T_REF * (GC_SLOWDOWN if workload.checkpointing else 1.0)
    rel = compute / ratio + MICRO_STEP_COST / b
    per_gpu = REF_TOKENS_PER_S / REF_TOKENS * ref / rel * tokens
    notes = [
        f"throughput: {REF_TOKENS_PER_S:,} LM tokens/s measured on one H100 for the 4B model (micro-batch "
        f"{REF_BATCH}, no checkpointing, Liger, {REF_TOKENS:,}-token rows, benchmarks/README.md); micro-batch {b}, "
        f"checkpointing {'on' if workload.checkpointing else 'off'} through the planner's speed model",
    ]
    if tokens > REF_TOKENS:
        factor = max(
            LONG_ROW_FACTOR, 1 - (1 - LONG_ROW_FACTOR) * (tokens - REF_TOKENS) / (LONG_ROW_TOKENS - REF_TOKENS)
        )
        per_gpu *= factor
        notes.append(f"rows of {tokens:,.0f} tokens: x{factor:.2f} (measured 0.63 at {LONG_ROW_TOKENS:,} tokens)")
    if not workload.liger and b > 1:
        per_gpu *= NO_LIGER_FACTOR
        notes.append(f"without Liger: x{NO_LIGER_FACTOR} (measured at batch 16)")
    elif not workload.liger:
        per_gpu *= NO_LIGER_BATCH1_FACTOR
        notes.append(f"without Liger at batch 1 (the seed's settings): x{NO_LIGER_BATCH1_FACTOR} (measured)")
    if accelerator_type != "NVIDIA_H100_80GB":
        notes.append(f"{accelerator_type}: its compute x{ratio} of an H100's ({how}); the host's share unchanged")
    size = workload.model_b or REF_MODEL_B
    if size != REF_MODEL_B:
        per_gpu *= REF_MODEL_B / size
        notes.append(f"{size:g}B model: x{REF_MODEL_B / size:.2f} (tokens/s scaled by parameter count from the 4B)")
    elif not workload.model_b:
        notes.append("model size not in its name: the 4B model's figures")
    if workload.moe:
        per_gpu *= MOE_FACTOR
        notes.append(f"mixture of experts: x{MOE_FACTOR} per active parameter (measured, 30B-A3B on 2 x H200)")
    slower = STEP_COST_FACTOR.get(workload.quantization, 1.0)
    if slower != 1.0:
        per_gpu /= slower
        notes.append(
            f"{workload.quantization} base (QLoRA): x{1 / slower:.2f} (steps {slower}x slower: each weight is "
            "dequantised before its matmul; measured at one plan on one H200, the 4B, 2026-12-02)"
        )
    return per_gpu, notes


def estimate(profile: Profile, workload: Workload) -> Estimate:
    """Expected training time, GPU-hours and cost of one run, with its assumptions.

    Args:
        profile: The machines and the price (`Profile`).
        workload: Rows, tokens, epochs and the micro-batch plan (`Workload`); rows or
            mean_tokens 0 = unknown: only the per-hour and per-1M-token figures are given.

    Returns:
        The `Estimate`.

    Raises:
        CostError: The machine type has no price (and none is configured) or the GPU has no
            throughput figure; the message names it and the key that fixes it.
    """
    price, label = machine_price(profile) if profile.machine_type else (0.0, "no machine type: no price")
    per_gpu, notes = gpu_tokens_per_s(workload, profile.accelerator_type)
    gpus = max(profile.gpus, 1)
    job = per_gpu * gpus
    if profile.replica_count > 1:
        job *= MULTI_NODE_EFFICIENCY
        notes.append(f"{profile.replica_count} nodes: x{MULTI_NODE_EFFICIENCY} (estimate, not measured)")
    elif gpus > 1:
        notes.append(f"{gpus} GPUs: x{gpus} (DDP, 2 H200s: 2.3x at one micro-batch, 1.8x vs one GPU at twice it)")
    if workload.zero3:
        job *= ZERO3_FACTOR
        notes.append(f"ZeRO-3: x{ZERO3_FACTOR} (measured on 2 x H200)")
    hourly = price * max(profile.replica_count, 1)
    per_million = hourly / (job * 3600) * 1e6
    known = workload.rows > 0 and workload.mean_tokens > 0
    tokens = None
    if known:
        if workload.max_steps > 0:
            samples = workload.max_steps * workload.samples_per_step
            notes.append(f"swift.max_steps {workload.max_steps} x {workload.samples_per_step} samples per step")
        else:
            samples = math.ceil(workload.rows * workload.epochs)
        tokens = samples * workload.mean_tokens
        notes.insert(
            0,
            f"data: {workload.rows:,} rows x {workload.mean_tokens:,.0f} tokens x {workload.epochs:g} epochs "
            f"({workload.tokens_from or 'counted'})",
        )
    else:
        notes.insert(0, f"data: {workload.tokens_from or 'rows and tokens per row not known before validate-data'}")
    notes.append(
        "not counted: start-up (image pull, model load, preflight), evaluation, checkpoints, merge-export and evaluate"
    )
    hours = tokens / job / 3600 if tokens is not None else None
    high = hours / SPREAD if hours is not None else None
    return Estimate(
        tokens_per_s=job,
        price_usd_per_hour=hourly,
        price_label=label,
        train_tokens=tokens,
        hours=hours,
        hours_high=high,
        gpu_hours=hours * gpus if hours is not None else None,
        cost_usd=hours * hourly if hours is not None else None,
        cost_usd_high=high * hourly if high is not None else None,
        usd_per_million_tokens=per_million,
        assumptions=tuple(notes),
        rows=workload.rows,
    )


def planned_micro_batch(batch: object, checkpointing: object, mean_tokens: float, gpu_gib: float) -> tuple[int, bool]:
    """The micro-batch and checkpointing an `auto` config will most likely get, before train-lora plans.

    What the planner chose on the recorded runs: 16 rows without checkpointing for ~1.2k-token rows
    on 80 GB or more (an H100 since 2026-11-26, with the plugin's memory levers; 8 rows before), 16 with
    checkpointing for longer rows or on a 40 GB card. Fixed values win.
    """
    if batch != "auto" and checkpointing != "auto":
        return int(batch or 1), bool(checkpointing)
    roomy = gpu_gib >= 75 and (mean_tokens or REF_TOKENS) <= 1.5 * REF_TOKENS
    b = int(batch) if batch != "auto" else 16
    gc = bool(checkpointing) if checkpointing != "auto" else not (roomy and b <= 16)
    return b, gc


def training_log_line(
    swift_args: dict,
    token_stats: dict | None,
    *,
    micro_batch: int,
    checkpointing: bool,
    gpus: int,
    nodes: int,
    gpu_name: str,
    model_source: str = "",
    model_b: float = 0.0,
    moe: bool = False,
) -> str:
    """What train-lora logs once it knows its plan: the expected training time and GPU-hours.

    Args:
        swift_args: The run's `swift sft` arguments (epochs, max_steps, Liger, accumulation).
        token_stats: The training set's `token_stats.json` (rows, mean_tokens); None = no line.
        micro_batch: Rows per forward pass and GPU (the plan's or the config's).
        checkpointing: Gradient checkpointing on.
        gpus: GPUs per node.
        nodes: Nodes of the job.
        gpu_name: CUDA device name (`torch.cuda.get_device_name`); unknown kinds give no line.
        model_source: The base model's source, whose name gives its size. Default "".
        model_b: Billions of (active) parameters when the name does not say (from the weights). Default 0.
        moe: A mixture-of-experts model. Default False.

    Returns:
        One line without a price (the task does not know the machine's), or "" when it
        cannot be estimated (no token figures, no GPU, a GPU without a throughput figure).
    """
    accelerator = accelerator_of_gpu_name(gpu_name)
    if not token_stats or not gpus or accelerator not in GPU_RATIO:
        return ""
    accum = swift_args.get("gradient_accumulation_steps")
    steps = swift_args.get("max_steps")
    workload = Workload(
        rows=int(token_stats.get("rows", 0)),
        mean_tokens=float(token_stats.get("mean_tokens", 0.0)),
        epochs=float(swift_args.get("num_train_epochs", 3)),
        max_steps=steps if isinstance(steps, int) and steps > 0 else 0,
        samples_per_step=micro_batch * (accum if isinstance(accum, int) else 1) * gpus * nodes,
        micro_batch=micro_batch,
        checkpointing=checkpointing,
        liger=bool(swift_args.get("use_liger_kernel", False)),
        zero3="zero3" in str(swift_args.get("deepspeed", "")),
        model_b=model_size_b(model_source) or model_b,
        moe=moe or is_moe_name(model_source),
        tokens_from="token_stats.json",
        quantization=quantization_of(swift_args),
    )
    est = estimate(Profile("", accelerator, gpus, nodes), workload)
    if est.hours is None:
        return ""
    return (
        f"expected ~{_duration(est.hours)} of training (up to {_duration(est.hours_high or 0)}), "
        f"{_sig(est.gpu_hours or 0)} GPU-hours on {gpus * nodes} x {accelerator}: {_sig((est.train_tokens or 0) / 1e6)}M "
        f"tokens at ~{est.tokens_per_s:,.0f} LM tokens/s (components/common/cost.py; actual gpu_hours in Metrics)"
    )


def accelerator_of_gpu_name(name: str) -> str:
    """The Vertex accelerator enum of a CUDA device name (`NVIDIA H100 80GB HBM3` → NVIDIA_H100_80GB); "" = unknown."""
    text = name.upper()
    if "H200" in text:
        return "NVIDIA_H200_141GB"
    if "H100" in text:
        return "NVIDIA_H100_80GB"
    if "A100" in text:
        return "NVIDIA_A100_80GB" if "80GB" in text.replace(" ", "") else "NVIDIA_TESLA_A100"
    if "L4" in text.split():
        return "NVIDIA_L4"
    return ""


def _sig(value: float) -> str:
    """Two significant figures, never a false precision."""
    if value <= 0:
        return "0"
    digits = max(0, 1 - int(math.floor(math.log10(value))))
    return f"{round(value, digits):,.{digits}f}"


def _money(value: float) -> str:
    return f"${_sig(value)}"


def _duration(hours: float) -> str:
    if hours < 1:
        return f"{_sig(hours * 60)} min"
    return f"{_sig(hours)} h"
