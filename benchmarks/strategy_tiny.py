"""The train-lora core's automatic strategy on every visible GPU, with the tiny Qwen3-VL (a minute).

A cheap check of the multi-GPU paths before (or instead of) a run with a real architecture: the
strategy chosen, 4 steps with durable checkpoints every 2, gradient checkpointing on or off, a
`swift.deepspeed` of the user's (e.g. zero2, whose saves the train-lora plugin keeps to the adapter).

    python3 -m benchmarks.strategy_tiny --out /tmp/st --gradient-checkpointing          # automatic: DDP on 2 GPUs
    python3 -m benchmarks.strategy_tiny --out /tmp/st2 --gradient-checkpointing --deepspeed zero2

Prints one `RESULT {json}` line (strategy, GPUs, wall time, losses).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="a folder for the data, checkpoints and adapter")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--deepspeed", default="", help="swift.deepspeed (default: the task's own choice)")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")

    import torch

    from components.train_lora.core import train_lora
    from components.validate_data.core import validate_data
    from pipelines.demo.drawings import generate_dataset
    from pipelines.demo.tiny_model import ensure_tiny_model

    out = Path(args.out)
    if not (out / "train").is_dir():
        raw = generate_dataset(out / "raw", n_train=32, n_eval=2, image_size=128)
        validate_data([raw["train"]], str(out / "train"), str(out / "eval"), str(out / "q.jsonl"))
    gpus = torch.cuda.device_count()
    swift = {
        "lora_rank": 8, "lora_alpha": 16, "target_modules": "all-linear", "freeze_vit": True,
        "learning_rate": 1e-3, "max_steps": args.steps, "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 1, "max_length": 512, "torch_dtype": "bfloat16" if gpus else "float32",
        "save_steps": 2, "logging_steps": 1, "dataloader_num_workers": 0, "report_to": "none", "seed": 42,
        "gradient_checkpointing": args.gradient_checkpointing,
    }  # fmt: skip
    if args.deepspeed:
        swift["deepspeed"] = args.deepspeed
    start = time.time()
    result = train_lora(
        str(ensure_tiny_model()),
        "qwen3_vl",
        str(out / "train"),
        "",
        swift,
        str(out / "adapter"),
        str(out / "work"),
        checkpoint_dir=str(out / "durable"),
        expected_gpus=gpus,
    )
    row = {
        "strategy": result.strategy,
        "gpus": gpus,
        "gradient_checkpointing": args.gradient_checkpointing,
        "deepspeed": args.deepspeed or None,
        "wall_s": round(time.time() - start, 1),
        "losses": [round(float(e["loss"]), 4) for e in result.log_history if "loss" in e],
    }
    print("RESULT " + json.dumps(row), flush=True)
    return row


if __name__ == "__main__":
    main()
