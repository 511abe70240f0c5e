"""The task cores on the larger Qwen3-VL architectures (GPU machine, not a test; issue 17).

Builds the real architecture with random bf16 weights (benchmarks/qwen3_vl_large.py),
seed-shaped data (1024x1024 synthetic drawings, JSON-list answers), validates it, then:

* `--model 8b` (one H100): train-lora for `--steps` steps with the planner's `auto`
  micro-batch / checkpointing, merge-export with both checks (weights tensor by tensor, logits
  against base + adapter), evaluate `--eval-samples` rows with the task's batched generation.
* `--model 30b-a3b` (two or more GPUs): train-lora with the automatically chosen strategy and
  durable checkpoints; `--kill-after-checkpoint` stops it with SIGTERM (what Vertex sends on
  preemption) once the first durable checkpoint is complete; `--phase resume` runs the same
  training again, which must resume from that checkpoint and finish.

    python -m benchmarks.large_models --model 8b --out /tmp/l8 --steps 12 --eval-samples 8
    python -m benchmarks.large_models --model 30b-a3b --out /tmp/l30 --phase prepare   # build + validate only
    python -m benchmarks.large_models --model 30b-a3b --out /tmp/l30 --steps 10 --save-steps 3 --phase first
    python -m benchmarks.large_models --model 30b-a3b --out /tmp/l30 --steps 10 --save-steps 3 --phase resume

GPU memory per GPU is sampled with nvidia-smi every second while a phase runs. Prints one
`RESULT {json}` line per phase (also appended to OUT/results.jsonl).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

SWIFT = {
    "tuner_type": "lora",
    "lora_rank": 8,
    "lora_alpha": 32,
    "target_modules": "all-linear",
    "freeze_vit": True,
    "learning_rate": 1e-4,
    "per_device_train_batch_size": "auto",
    "gradient_checkpointing": "auto",
    "use_liger_kernel": True,
    "max_length": 3000,
    "torch_dtype": "bfloat16",
    "logging_steps": 1,
    "dataloader_num_workers": 4,
    "report_to": "none",
    "seed": 42,
}


class GpuMemory:
    """Samples `nvidia-smi --query-gpu=memory.used` every `interval` s; keeps the peak per GPU (MiB)."""

    def __init__(self, interval: float = 1.0):
        self.interval, self.peak, self._stop = interval, {}, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                ).stdout
                for line in out.strip().splitlines():
                    idx, used = (int(x) for x in line.split(","))
                    self.peak[idx] = max(self.peak.get(idx, 0), used)
            except (OSError, ValueError, subprocess.SubprocessError):
                pass
            self._stop.wait(self.interval)

    def __enter__(self) -> GpuMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


def _emit(out: Path, row: dict[str, Any]) -> None:
    line = json.dumps(row, default=str)
    print("RESULT " + line, flush=True)
    with open(out / "results.jsonl", "a", encoding="utf-8") as f:
        f.write(line + "\n")


def prepare(name: str, out: Path, n_train: int, n_eval: int, tiny: bool = False) -> Path:
    """Builds the model (reused when present) and validates the data (reused when present)."""
    from benchmarks.qwen3_vl_large import build_random_model
    from components.validate_data.core import validate_data
    from pipelines.demo.drawings import generate_dataset

    model = out / "model"
    if not (model / "config.json").is_file():
        start = time.time()
        build_random_model(name, model, tiny=tiny)
        size = sum(p.stat().st_size for p in model.glob("*.safetensors"))
        _emit(out, {"phase": "build", "model": name, "seconds": round(time.time() - start, 1), "bytes": size})
    if not (out / "train").is_dir():
        start = time.time()
        size = 256 if tiny else 1024
        data = generate_dataset(out / "raw", n_train=n_train, n_eval=n_eval, image_size=size, seed=0)
        validate_data(
            [data["train"]],
            str(out / "train"),
            str(out / "eval"),
            str(out / "q.jsonl"),
            eval_files=[data["eval"]],
            model_dir=str(model),
            max_length=3000,
            task="detection",
            max_pixels=1048576,
        )
        _emit(out, {"phase": "validate", "seconds": round(time.time() - start, 1)})
    return model


def _train_row(result: Any, wall: float, memory: GpuMemory, steps: int) -> dict[str, Any]:
    from benchmarks.throughput import steady_state

    m = result.metrics
    steady = steady_state(result.log_history, skip_steps=2)
    return {
        "strategy": result.strategy,
        "resumed_from": result.resumed_from,
        "wall_s": round(wall, 1),
        "steps": m.get("steps"),
        "max_steps": steps,
        "seconds_per_step": round(steady.get("seconds_per_step", 0.0), 3) or m.get("seconds_per_step"),
        # a single step's median: the mean above counts checkpoint saves (42 s each under ZeRO-2 on 2 x H200)
        "median_seconds_per_step": round(steady.get("median_seconds_per_step", 0.0), 3),
        "tokens_per_second": round(steady.get("tokens_per_second", 0.0), 1) or m.get("tokens_per_second"),
        "samples_per_second": m.get("samples_per_second"),
        "peak_memory_gib_swift": m.get("peak_memory_gib"),
        "gpu_memory_peak_mib": dict(sorted(memory.peak.items())),
        "plan": {k: v for k, v in m.items() if k.startswith("plan_") or k == "oom_replans"},
        "final_loss": m.get("final_loss"),
        "metrics": m,
    }


def train(model: Path, model_type: str, out: Path, steps: int, save_steps: int, durable: bool) -> dict[str, Any]:
    """One train-lora run (resumes from OUT/durable when it holds a complete checkpoint)."""
    import torch

    from components.train_lora.core import train_lora

    swift = {**SWIFT, "max_steps": steps, "save_steps": save_steps}
    start = time.time()
    with GpuMemory() as memory:
        result = train_lora(
            str(model),
            model_type,
            str(out / "train"),
            "",
            swift,
            str(out / "adapter"),
            str(out / "train-work"),
            checkpoint_dir=str(out / "durable") if durable else None,
            expected_gpus=torch.cuda.device_count(),
        )
    return _train_row(result, time.time() - start, memory, steps)


def merge_and_evaluate(
    model: Path, model_type: str, out: Path, eval_samples: int, merged_dir: Path | None = None
) -> None:
    """merge-export (weights + logits checks) and evaluate's batched generation on a few rows.

    merged_dir: where the merged copy (and merge-export's work folder beside it) goes; default
    OUT/merged. At 30B the model and its merged copy do not fit one filesystem of the GPU
    machine: the model is in /dev/shm, the merged copy on disk.
    """
    from components.merge_export.core import merge_export

    merged_dir = merged_dir or out / "merged"
    start = time.time()
    with GpuMemory() as memory:
        merged = merge_export(
            str(out / "adapter"), str(model), str(merged_dir), str(merged_dir.parent / (merged_dir.name + "-work"))
        )
    size = sum(p.stat().st_size for p in merged_dir.glob("*.safetensors"))
    keep = ("merge_seconds", "weights_seconds", "verify_seconds", "weights_checked", "adapted_weights")
    keep += ("adapted_within_step_min_fraction", "logits_max_abs_diff", "logits_tolerance", "merge_check_dtype")
    _emit(
        out,
        {
            "phase": "merge",
            "wall_s": round(time.time() - start, 1),
            "merged_bytes": size,
            "gpu_memory_peak_mib": memory.peak,
            **{k: merged.metadata.get(k) for k in keep},
        },
    )
    evaluate(merged_dir, model_type, out, eval_samples)


def evaluate(model: Path, model_type: str, out: Path, eval_samples: int) -> None:
    """evaluate's batched generation (ms-swift TransformersEngine) on a few held-out rows."""
    from components.evaluate.core import load_eval_rows, swift_generate

    rows = load_eval_rows(out / "eval", eval_samples)
    timings: dict[str, float] = {}
    with GpuMemory() as memory:
        answers, generated = swift_generate(str(model), model_type, rows, len(rows), 64, timings, max_pixels=1048576)
    _emit(
        out,
        {
            "phase": "evaluate",
            "rows": len(rows),
            "load_s": round(timings.get("load_s", 0.0), 1),
            "generate_s": round(timings.get("generate_s", 0.0), 1),
            "generated_tokens": generated,
            "gen_tokens_per_s": round(generated / max(timings.get("generate_s", 1e-9), 1e-9), 1),
            "gpu_memory_peak_mib": memory.peak,
            "first_answer": answers[0][:120] if answers else "",
        },
    )


def _complete_checkpoints(durable: Path) -> list[str]:
    from components.train_lora import _checkpoints

    newest = _checkpoints.newest_complete_checkpoint(durable, deep=False) if durable.is_dir() else None
    return [str(newest)] if newest else []


def first_phase_killed(args: argparse.Namespace, out: Path) -> None:
    """Runs training in a child process and SIGTERMs it once a durable checkpoint is complete."""
    cmd = [sys.executable, "-m", "benchmarks.large_models", "--model", args.model, "--out", str(out)]
    cmd += ["--steps", str(args.steps), "--save-steps", str(args.save_steps), "--phase", "train-child"]
    cmd += ["--tiny"] if args.tiny else []
    cmd += ["--swift-json", args.swift_json] if args.swift_json else []
    log = open(out / "first.log", "w")
    start = time.time()
    child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    killed_at = None
    while child.poll() is None:
        if killed_at is None and _complete_checkpoints(out / "durable"):
            killed_at = time.time() - start
            os.killpg(child.pid, signal.SIGTERM)
        time.sleep(2)
    log.close()
    tail = (out / "first.log").read_text(errors="replace").splitlines()
    _emit(
        out,
        {
            "phase": "first (killed)",
            "exit": child.returncode,
            "sigterm_after_s": round(killed_at or 0.0, 1),
            "wall_s": round(time.time() - start, 1),
            "durable": _complete_checkpoints(out / "durable"),
            "last_lines": [line for line in tail if "train-lora" in line or "Preempted" in line][-8:],
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=("8b", "32b", "30b-a3b"), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--save-steps", type=int, default=0, help="0 = only at the end")
    parser.add_argument("--n-train", type=int, default=64)
    parser.add_argument("--eval-samples", type=int, default=8)
    parser.add_argument(
        "--phase",
        choices=("all", "prepare", "first", "resume", "train-child", "train", "merge", "evaluate-base"),
        default="all",
    )
    parser.add_argument("--merged-dir", default="", help="merged copy's folder (default OUT/merged)")
    parser.add_argument("--tiny", action="store_true", help="tiny dimensions, float32 (CPU smoke run)")
    parser.add_argument("--swift-json", default="", help="extra swift arguments as JSON, e.g. LoRA on the experts")
    args = parser.parse_args()
    os.environ.setdefault("MAX_PIXELS", str(1024 * 1024))
    from benchmarks.qwen3_vl_large import ARCHITECTURES

    model_type = ARCHITECTURES[args.model][0]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    save_steps = args.save_steps or args.steps
    if args.tiny:  # CPU: no bf16 kernels, no Liger, no checkpointing needed
        SWIFT.update(torch_dtype="float32", use_liger_kernel=False, dataloader_num_workers=0)
    SWIFT.update(json.loads(args.swift_json) if args.swift_json else {})
    if args.phase == "train-child":
        row = train(out / "model", model_type, out, args.steps, save_steps, durable=True)
        _emit(out, {"phase": "train-child", **row})
        return
    model = prepare(args.model, out, args.n_train, args.eval_samples, tiny=args.tiny)
    if args.phase == "prepare":
        return
    if args.phase == "evaluate-base":  # the generation path at this size (the base model: same shapes)
        evaluate(model, model_type, out, args.eval_samples)
        return
    if args.phase == "first":
        first_phase_killed(args, out)
        return
    if args.phase == "merge":  # the adapter of an earlier train / resume phase in OUT/adapter
        merge_and_evaluate(
            model, model_type, out, args.eval_samples, Path(args.merged_dir) if args.merged_dir else None
        )
        return
    durable = args.phase == "resume"
    row = train(model, model_type, out, args.steps, save_steps, durable=durable)
    _emit(out, {"phase": "resume" if durable else "train", "model": args.model, **row})
    if args.phase == "all" and args.model == "8b":
        merge_and_evaluate(model, model_type, out, args.eval_samples)


if __name__ == "__main__":
    main()
