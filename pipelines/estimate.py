"""The cost estimate `pipelines.run` prints before it submits (or runs locally): what is known then.

The data is validated inside the pipeline, so before a run its token count is known only
when the data is here: a validated folder's `token_stats.json` (exact: what validate-data
counted), or local JSONL files (rows counted exactly; tokens per row approximated from a
sample of rows: image sizes through Qwen3-VL's resize rule and `swift.max_pixels`, text at
about 4 characters per token, as validate-data approximates without a tokenizer). Data on
`gs://` is not read here: the estimate then says "rows unknown" and gives the cost of 1M
training tokens and of an hour. Nothing is printed more precisely than it is known.

The tables and the arithmetic are `components.common.cost`; this module only maps a config
onto them.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from pathlib import Path
from typing import Any

from components.common import boxes
from components.common.cost import (
    CostError,
    Estimate,
    Profile,
    Workload,
    estimate,
    is_moe_name,
    model_size_b,
    planned_micro_batch,
)
from components.common.dataset import TOKEN_STATS_FILE
from components.common.model_fit import GIB, GPU_MEMORY_GIB, fit, known_model_bytes
from components.common.quantization import known_quantized_bytes
from pipelines.config import Config

SAMPLE_ROWS = 200  # rows whose tokens are approximated when no token_stats.json is there
SWIFT_DEFAULT_EPOCHS = 3  # ms-swift's num_train_epochs when the config does not set it
_PATCH_SIZE = 16  # Qwen3-VL


def data_figures(cfg: Config) -> tuple[int, float, str]:
    """Rows and mean tokens per row of `data.train` as far as they can be known here.

    Args:
        cfg: The config (demo sources already resolved to local paths).

    Returns:
        (rows, mean tokens per row, where they came from); 0 for what is unknown.
    """
    items = [s.strip() for s in cfg.data.train.split(",") if s.strip()]
    remote = [s for s in items if "://" in s]
    if remote:
        return 0, 0.0, f"data on {remote[0].split('://')[0]}:// is counted by validate-data in the pipeline"
    rows, token_sum, sampled, sources = 0, 0.0, 0, set()
    for item in items:
        stats = _token_stats_beside(item)
        if stats:
            rows += int(stats.get("rows", 0))
            token_sum += float(stats.get("mean_tokens", 0.0)) * int(stats.get("rows", 0))
            sampled += int(stats.get("rows", 0))
            sources.add(TOKEN_STATS_FILE)
            continue
        for path in _jsonl_files(item):
            n, mean, k = _count_file(path, int(cfg.swift.get("max_pixels") or 0))
            rows += n
            token_sum += mean * k
            sampled += k
            sources.add(f"rows counted, tokens approximated on {min(n, SAMPLE_ROWS)} of them" if k else "rows counted")
    mean = token_sum / sampled if sampled else 0.0
    if rows and not cfg.data.eval:
        rows = int(rows * (1 - cfg.data.eval_fraction))
        sources.add(f"{cfg.data.eval_fraction:g} held out")
    if rows and not mean:
        return rows, 0.0, f"{rows:,} rows, tokens per row not known before validate-data (no image sizes here)"
    return rows, mean, "; ".join(sorted(sources)) or "no data found"


def _token_stats_beside(item: str) -> dict[str, Any] | None:
    path = Path(item).expanduser()
    folder = path if path.is_dir() else path.parent
    if path.is_file() and path.name != "data.jsonl":
        return None  # a token_stats.json describes the folder's data.jsonl only
    try:
        stats = json.loads((folder / TOKEN_STATS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return stats if isinstance(stats, dict) and isinstance(stats.get("rows"), int) else None


def _jsonl_files(item: str) -> list[Path]:
    path = Path(item).expanduser()
    if any(c in item for c in "*?["):
        return sorted(Path(p) for p in glob.glob(os.path.expanduser(item), recursive=True) if p.endswith(".jsonl"))
    if path.is_dir():
        return sorted(path.rglob("*.jsonl"))
    return [path] if path.is_file() else []


def _count_file(path: Path, max_pixels: int) -> tuple[int, float, int]:
    """(rows, mean approximate tokens of the sampled rows, rows sampled) of one JSONL file."""
    try:
        lines = [line for line in path.read_bytes().splitlines() if line.strip()]
    except OSError:
        return 0, 0.0, 0
    step = max(1, len(lines) // SAMPLE_ROWS)
    counts = [c for c in (_row_tokens(lines[i], path.parent, max_pixels) for i in range(0, len(lines), step)) if c]
    return len(lines), (sum(counts) / len(counts) if counts else 0.0), len(counts)


def _row_tokens(line: bytes, base: Path, max_pixels: int) -> int:
    """Approximate LM tokens of one row; 0 when it cannot be read here (then it is not sampled)."""
    try:
        from PIL import Image  # the train extra has it; the light install does not (then: rows only)
    except ImportError:
        return 0
    try:
        row = json.loads(line)
        text = "".join(str(m.get("content", "")).replace("<image>", "") for m in row["messages"])
        tokens = _approx_text_tokens(text) + 5 * len(row["messages"])
        rule = boxes.ResizeRule.for_patch_size(_PATCH_SIZE, max_pixels)
        for ref in row.get("images") or []:
            ref = ref if isinstance(ref, str) else ref.get("path", "")
            if "://" in ref or ref.startswith("data:"):
                return 0
            with Image.open(base / ref) as image:
                width, height = image.size
            h, w = boxes.model_input_size(height, width, rule)
            tokens += h * w // (rule.factor * rule.factor) + 2
        return tokens
    except Exception:  # noqa: BLE001 - an unreadable row is validate-data's to report, not the estimate's
        return 0


def _approx_text_tokens(text: str) -> int:
    """Digits and non-ASCII characters one token each, the rest ~4 characters a token (validate-data's rule)."""
    digits = sum(c.isdigit() for c in text)
    other = sum(not c.isascii() for c in text)
    return digits + other + -(-(len(text) - digits - other) // 4)


def config_estimate(cfg: Config, figures: tuple[int, float, str] | None = None) -> Estimate:
    """The estimate for a config: its training profile, its swift settings and its data.

    Args:
        cfg: The config (demo sources already resolved for a local run).
        figures: `data_figures(cfg)` when already known. Default: computed.

    Raises:
        CostError: No price for the machine type (and no override), or no throughput figure for the GPU.
    """
    r, swift = cfg.resources, cfg.swift
    rows, mean, source = figures or data_figures(cfg)
    gpus = max(r.accelerator_count, 1) * max(r.replica_count, 1)
    gpu_gib = GPU_MEMORY_GIB.get(r.accelerator_type, 0.0)
    batch, gc = planned_micro_batch(
        swift.get("per_device_train_batch_size", 1), swift.get("gradient_checkpointing", True), mean, gpu_gib
    )
    auto = "auto" in (swift.get("per_device_train_batch_size"), swift.get("gradient_checkpointing"))
    size = model_size_b(cfg.model.source)
    deepspeed = str(swift.get("deepspeed", ""))
    total = known_model_bytes(cfg.model.source) or int(2e9 * (size or 4.0))  # every expert is resident
    total = known_quantized_bytes(total, cfg.model.quantization, moe=is_moe_name(cfg.model.source))
    replicated = fit(total, int(gpu_gib * GIB), gpus).one_gpu  # train-lora's rule
    zero3 = "zero3" in deepspeed or (gpus > 1 and not replicated and deepspeed != "none")
    accum = swift.get("gradient_accumulation_steps")
    per_batch = 1 if auto else batch  # with auto, the accumulation counts samples of batch 1 (the planner's rule)
    if not isinstance(accum, int) or isinstance(accum, bool):
        accum = max(1, 16 // (per_batch * gpus))  # ms-swift's default: 16 samples per step
    max_steps = swift.get("max_steps", 0)
    epochs = swift.get("num_train_epochs", SWIFT_DEFAULT_EPOCHS)
    workload = Workload(
        rows=rows,
        mean_tokens=mean,
        epochs=float(epochs),
        max_steps=max_steps if isinstance(max_steps, int) and max_steps > 0 else 0,
        samples_per_step=per_batch * accum * gpus,
        micro_batch=batch,
        checkpointing=gc,
        liger=bool(swift.get("use_liger_kernel", False)),
        zero3=zero3,
        model_b=size,
        moe=is_moe_name(cfg.model.source),
        tokens_from=source,
        quantization=cfg.model.quantization,
    )
    profile = Profile(
        machine_type=r.machine_type,
        accelerator_type=r.accelerator_type,
        accelerator_count=r.accelerator_count,
        replica_count=r.replica_count,
        scheduling=r.scheduling,
        region=cfg.vertex.region,
        price_usd_per_hour=r.price_usd_per_hour,
        price_date=r.price_date,
    )
    result = estimate(profile, workload)
    extra = []
    if auto:
        extra.append(f"auto: assumed micro-batch {batch}, checkpointing {'on' if gc else 'off'} (train-lora plans it)")
    if "num_train_epochs" not in swift:
        extra.append(f"swift.num_train_epochs not set: ms-swift's default {SWIFT_DEFAULT_EPOCHS}")
    return dataclasses.replace(result, assumptions=(*result.assumptions[:1], *extra, *result.assumptions[1:]))


def estimate_lines(cfg: Config, *, local: bool = False) -> list[str]:
    """What `pipelines.run` prints before a run: the estimate, or why there is none (never an exception).

    Args:
        cfg: The config.
        local: A `--local` run: says the figures are for the config's Vertex profile. Default False.
    """
    r = cfg.resources
    shape = f"{r.replica_count} x {r.machine_type}" if r.replica_count > 1 else r.machine_type
    head = f"training profile {shape} ({r.accelerator_count} x {r.accelerator_type}, {r.scheduling})"
    if local:
        head += " on Vertex; this local run uses no cloud GPU"
    try:
        return [head, *config_estimate(cfg).lines()]
    except CostError as exc:
        return [head, f"cost estimate: none: {exc}"]
