"""The adapter folder: what train-lora writes and merge-export reads.

An adapter folder holds swift's adapter files (`ADAPTER_FILES`, taken from the last
checkpoint), `BASE_MODEL_REF` (facts about the base model it was trained on) and
`LOG_HISTORY` (the trainer's log entries). `summarize_log` turns such a log into the
training figures both components report.
"""

from __future__ import annotations

from typing import Any

ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json", "additional_config.json", "args.json")
BASE_MODEL_REF = "base_model.json"
LOG_HISTORY = "log_history.json"


def summarize_log(log_history: list[dict[str, Any]]) -> dict[str, float]:
    """Extracts final metrics from a trainer log history."""
    metrics: dict[str, float] = {}
    losses = [e for e in log_history if "loss" in e]
    evals = [e for e in log_history if "eval_loss" in e]
    if losses:
        metrics["final_loss"] = float(losses[-1]["loss"])
        metrics["first_loss"] = float(losses[0]["loss"])
    if evals:
        metrics["eval_loss"] = float(evals[-1]["eval_loss"])
    for entry in log_history:
        for src, dst in (
            ("train_loss", "train_loss"),
            ("train_runtime", "train_runtime_s"),
            ("train_samples_per_second", "samples_per_second"),
            ("train_steps_per_second", "steps_per_second"),
        ):
            if src in entry:
                metrics[dst] = float(entry[src])
        if "step" in entry:
            metrics["steps"] = float(entry["step"])
        elif isinstance(entry.get("global_step/max_steps"), str):
            metrics["steps"] = float(entry["global_step/max_steps"].split("/")[0])
        if "memory(GiB)" in entry:
            metrics["peak_memory_gib"] = max(metrics.get("peak_memory_gib", 0.0), float(entry["memory(GiB)"]))
        if "train_speed(s/it)" in entry:
            metrics["seconds_per_step"] = float(entry["train_speed(s/it)"])
        if "num_input_tokens_seen" in entry:
            metrics["tokens_seen"] = float(entry["num_input_tokens_seen"])
        if "train_tokens_per_second" in entry:
            metrics["tokens_per_second"] = float(entry["train_tokens_per_second"])
    if "tokens_per_second" not in metrics and metrics.get("tokens_seen") and metrics.get("train_runtime_s"):
        metrics["tokens_per_second"] = metrics["tokens_seen"] / metrics["train_runtime_s"]
    return metrics
