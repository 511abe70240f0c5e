"""The merged model's card (`README.md`) and the training figures it shows.

The card names the base model and revision, the adapter, the run and the library
versions, plus the training figures (`training_summary`: final / eval loss, steps,
samples/s, tokens/s from the adapter's log_history.json) and the LoRA hyper-parameters
(from its args.json); what the adapter folder does not record is shown as "not recorded".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from components.common.adapter import LOG_HISTORY, summarize_log
from components.common.snapshot import LINEAGE_FILE
from components.merge_export._json import read_json

# Training figures of the model card: (key of summarize_log's figures, label).
TRAINING_FIGURES = (
    ("final_loss", "train loss (last logged step)"),
    ("train_loss", "train loss (mean over the run)"),
    ("eval_loss", "eval loss (last evaluation)"),
    ("steps", "optimizer steps"),
    ("train_runtime_s", "train runtime (s)"),
    ("samples_per_second", "train samples/s"),
    ("tokens_per_second", "train tokens/s"),
)
# LoRA hyper-parameters of the model card: (ms-swift argument in args.json, label).
HYPERPARAMETERS = (
    ("lora_rank", "LoRA rank"),
    ("lora_alpha", "LoRA alpha"),
    ("lora_dropout", "LoRA dropout"),
    ("target_modules", "target modules"),
    ("learning_rate", "learning rate"),
    ("num_train_epochs", "epochs"),
    ("max_steps", "max steps (-1 = by epochs)"),
    ("per_device_train_batch_size", "per-device batch size"),
    ("gradient_accumulation_steps", "gradient accumulation steps"),
    ("global_world_size", "processes (world size)"),
    ("max_length", "max length (tokens)"),
    ("torch_dtype", "dtype"),
    ("seed", "seed"),
)
NOT_RECORDED = "not recorded"


def training_summary(adapter_dir: str | Path) -> dict[str, Any]:
    """Training figures and LoRA hyper-parameters recorded in an adapter folder.

    Reads `log_history.json` (the trainer's log entries, written by train-lora) through
    `components.common.adapter.summarize_log`, and `args.json` (ms-swift's arguments).
    A missing or unreadable file is not an error: its values are left out and the file is
    listed under "missing".

    Args:
        adapter_dir: Adapter folder from train-lora.

    Returns:
        {"metrics": summarize_log's figures (final_loss, train_loss, eval_loss, steps,
        samples_per_second, tokens_per_second, ...), "hyperparameters": the HYPERPARAMETERS
        keys found in args.json plus effective_batch_size when computable, "missing": names
        of the files that were absent or unreadable}.
    """
    adapter = Path(adapter_dir)
    missing: list[str] = []
    history: Any = None
    try:
        history = json.loads((adapter / LOG_HISTORY).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    if not isinstance(history, list):
        missing.append(LOG_HISTORY)
        history = []
    metrics = summarize_log([e for e in history if isinstance(e, dict)]) if history else {}
    args = read_json(adapter / "args.json")
    if not isinstance(args, dict) or not args:
        missing.append("args.json")
        args = {}
    hyper = {key: args[key] for key, _ in HYPERPARAMETERS if args.get(key) is not None}
    if args.get("max_pixels"):  # the training resize: evaluate and serving apply it too (not a card row)
        hyper["max_pixels"] = args["max_pixels"]
    batch, accum = hyper.get("per_device_train_batch_size"), hyper.get("gradient_accumulation_steps")
    if isinstance(batch, int) and isinstance(accum, int):
        world = hyper.get("global_world_size")
        hyper["effective_batch_size"] = batch * accum * (world if isinstance(world, int) and world > 0 else 1)
    return {"metrics": metrics, "hyperparameters": hyper, "missing": missing}


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "—"
    return str(value) if value not in (None, "") else "—"


def _training_lines(training: dict[str, Any]) -> list[str]:
    """The model card's training section: figures and LoRA hyper-parameters, gaps named."""
    figures = training.get("metrics") or {}
    hyper = training.get("hyperparameters") or {}
    lines = ["", "## Training", ""]
    missing = training.get("missing") or []
    if missing:
        lines += [f"The adapter folder has no readable {' or '.join(missing)}: those values are not recorded.", ""]
    lines += ["| figure | value |", "|---|---|"]
    for key, label in TRAINING_FIGURES:
        lines.append(f"| {label} | {_fmt(figures[key]) if key in figures else NOT_RECORDED} |")
    lines += ["", "### LoRA hyper-parameters", "", "| argument | value |", "|---|---|"]
    for key, label in HYPERPARAMETERS:
        lines.append(f"| {label} (`{key}`) | {_fmt(hyper[key]) if key in hyper else NOT_RECORDED} |")
    effective = hyper.get("effective_batch_size")
    lines.append(
        "| effective batch size (batch × accumulation × processes) | "
        f"{effective if effective is not None else NOT_RECORDED} |"
    )
    return lines


def model_card(lineage: dict[str, Any], metrics: dict[str, Any] | None = None) -> str:
    """Returns the merged model's README.md (pure): lineage, verification, training, metrics.

    Args:
        lineage: What lineage.json holds (base_model, adapter, run_id, versions,
            verification, training: `training_summary(...)`; a lineage without
            "training" gets no training section).
        metrics: More metrics to list (e.g. evaluation figures). Default None.
    """
    base = lineage.get("base_model") or {}
    name = base.get("source") or base.get("uri") or base.get("model_dir") or "unknown"
    lines = [
        "---",
        f"base_model: {name}",
        "library_name: transformers",
        "tags: [lora, merged, ms-swift, qwen3-vl]",
        "---",
        "",
        f"# LoRA-merged {base.get('architecture') or 'model'}",
        "",
        "The LoRA adapter merged into its base model with `swift export --merge_lora true`, "
        "then verified: its logits match base model + adapter (peft) on probe inputs.",
        "",
        "## Lineage",
        "",
        "| | |",
        "|---|---|",
        f"| base model | `{name}` |",
        f"| base revision | `{_fmt(base.get('revision'))}` |",
        f"| base architecture | {_fmt(base.get('architecture'))} ({_fmt(base.get('model_type'))}) |",
        f"| adapter | `{_fmt(lineage.get('adapter'))}` |",
        f"| run | {_fmt(lineage.get('run_id'))} |",
    ]
    data = lineage.get("data") or {}
    if data:
        lines += [
            f"| data snapshot | `{_fmt(data.get('snapshot'))}` ({_fmt(data.get('files'))} files, "
            f"{_fmt(data.get('rows'))} rows: {_fmt(data.get('train_rows'))} train, {_fmt(data.get('eval_rows'))} eval; "
            f"`{LINEAGE_FILE}` lists every file) |",
            f"| training key (data + settings) | `{_fmt(data.get('training_key'))}` |",
        ]
    for key, value in sorted((lineage.get("versions") or {}).items()):
        lines.append(f"| {key} | {_fmt(value)} |")
    trained = lineage.get("trained_on") or {}
    if trained:
        lines += [
            "",
            "## Quantised training base (QLoRA)",
            "",
            f"The adapter was trained on a {trained.get('quantization')} (bitsandbytes) base: "
            + ", ".join(f"`--{k} {v}`" for k, v in sorted((trained.get("swift_args") or {}).items()))
            + ". It was merged into the original bf16 base model (stage-model's), not into dequantised "
            "4-bit weights, and checked against base + update; the merged model therefore differs slightly "
            "from the quantised model the adapter saw in training.",
        ]
    check = lineage.get("verification") or {}
    if check:
        lines += ["", "## Merge verification", "", "| | |", "|---|---|"]
        lines += [f"| {key} | {_fmt(value)} |" for key, value in sorted(check.items())]
    if "training" in lineage:
        lines += _training_lines(lineage.get("training") or {})
    if metrics:
        lines += ["", "## Metrics", "", "| metric | value |", "|---|---|"]
        lines += [f"| {key} | {_fmt(value)} |" for key, value in sorted(metrics.items())]
    return "\n".join(lines) + "\n"
