"""One JSON file per GPU run under benchmarks/results/, from the `RESULT {...}` lines of a benchmark log.

    python -m benchmarks.results_json LOG --date 2026-12-01 --machine "1 x H200 (nvidia-h200)" \\
        --command "bash benchmarks/cards_gpu.sh ours ..." [--leanest PROFILE,...] [--model 8b] [--tag b] \\
        [--out benchmarks/results]

Reads the lines `benchmarks/cards_gpu.sh` writes (`[ours:PROFILE] RESULT {...}` from train_throughput, `[peer:SPEC]
RESULT {...}` from unsloth_peer) and writes the keys issue 53 names: date, machine, versions, command, trainer,
model, precision, cap_gib, plan, leanest, seconds_per_step, tokens_per_second, peak_gib, predicted_peak_gib.
A file of that name already there (an earlier call on the same date) is refused: `--tag` tells the two apart.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

LINE = re.compile(r"^\[(ours|peer):([^\]]+)\] RESULT (\{.*)$")


LAYERS = {"4b": 36, "8b": 36, "32b": 64}  # decoder layers: "every layer checkpointed" in a record


def record(
    kind: str,
    spec: str,
    row: dict[str, Any],
    date: str,
    machine: str,
    command: str,
    leanest: set[str],
    model: str = "4b",
):
    """The issue's keys for one run (pure)."""
    if kind == "ours":
        tags = spec.split("@")[1:]
        precision = next((t for t in tags if t in ("nf4", "int8")), "bf16")
        cap = next((float(t[3:]) for t in tags if t.startswith("cap")), None)
        plan_metrics = row.get("plan") or {}
        gc = bool(
            plan_metrics.get("plan_gradient_checkpointing", row.get("settings", {}).get("gradient_checkpointing"))
        )
        plan = {
            "micro_batch": row["batch"],
            "grad_accum": row["grad_accum"],
            "checkpointing": gc,
            "checkpoint_layers": plan_metrics.get("plan_checkpoint_layers", LAYERS[model] if gc else 0),
            "offload": "VLM_LORA_CHECKPOINT_OFFLOAD" in (row.get("env") or {}),
        }
        if row.get("error") and not plan_metrics:
            plan = None  # refused before training: no plan ran
        predicted = plan_metrics.get("plan_peak_gib") or None  # 0.0: a re-plan of a planner that did not predict it
        peak = row.get("peak_memory_gib")
        versions = {"torch": "2.11.0+cu130", "transformers": "5.19.0", "peft": "0.20.0", "ms-swift": "4.6.0"}
        trainer = "project"
    else:
        precision = "nf4" if row.get("load_in_4bit") else "bf16"
        cap = row.get("cap_gib")
        plan = {
            "micro_batch": row["batch"],
            "grad_accum": row["grad_accum"],
            "checkpointing": row.get("gradient_checkpointing"),
        }
        predicted, peak = None, row.get("peak_memory_gib")
        versions = row.get("versions", {})
        trainer = "unsloth"
    return {
        "date": date,
        "machine": machine,
        "versions": versions,
        "command": command,
        "trainer": trainer,
        "model": model,
        "precision": precision,
        "cap_gib": cap,
        "plan": plan,
        "leanest": spec in leanest,
        "seconds_per_step": row.get("seconds_per_step"),
        "tokens_per_second": row.get("tokens_per_second"),
        "peak_gib": peak,
        "predicted_peak_gib": predicted,
        "run": spec,
        **({"error": row["error"]} if row.get("error") else {}),  # a run the planner refused, with its message
        **({"oom_replans": replans} if (replans := (row.get("plan") or {}).get("oom_replans")) else {}),
    }


def _row(text: str) -> dict[str, Any]:
    """A RESULT line's JSON; a line cut short within its last keys (the logs of 2026-12-01 cut lines at 1,500
    characters, inside `speedups`) is read up to that key."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(text[: text.index(', "speedups"')] + "}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("log")
    parser.add_argument("--date", required=True)
    parser.add_argument("--machine", required=True)
    parser.add_argument("--command", required=True)
    parser.add_argument("--leanest", default="", help="comma-separated runs that are the leanest plans")
    parser.add_argument("--model", default="4b", choices=("4b", "8b", "32b"), help="the call's MODEL (cards_gpu.sh)")
    parser.add_argument("--tag", default="", help="added to each file's name (a second call on one date)")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    leanest = {x for x in args.leanest.split(",") if x}
    for line in Path(args.log).read_text(encoding="utf-8").splitlines():
        match = LINE.match(line)
        if not match:
            continue
        kind, spec, text = match.groups()
        rec = record(kind, spec, _row(text), args.date, args.machine, args.command, leanest, args.model)
        model = "" if args.model == "4b" else args.model + "_"
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{args.date}{args.tag}_{rec['trainer']}_{model}{spec}") + ".json"
        if (out / name).exists():
            raise SystemExit(f"{out / name} exists (an earlier run of that date): give this call a --tag")
        (out / name).write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
        print(out / name)


if __name__ == "__main__":
    main()
