"""Train a LoRA adapter from the command line: what each pod of the GKE training JobSet runs.

    python -m components.train_lora --model DIR --train DIR --eval DIR --adapter DIR
        [--model-type T] [--swift-args JSON] [--checkpoint-dir DIR] [--expected-gpus N]
        [--preflight fail|warn|off] [--job-env JSON] [--result FILE]

The same core as the KFP component (`components.train_lora.core.train_lora`), on folders (on GKE
the `/gcs/<bucket>/...` paths of the FUSE mount). The node's rank and the chief come from the
JobSet's environment (`components.common.cluster.launch_plan`). The chief writes the adapter and, with --result,
one JSON of the run (metrics, checkpoint, strategy, resumed_from) and the loss curve beside it
(`<result>.html`), each whole or not at all. Exit 0 trained (or a worker node done), 1 training
failed (one line), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path


class _BadArgument(ValueError):
    """An argument is not what the command takes (exit 2)."""


def _json_arg(text: str, name: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _BadArgument(f"{name} is not JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(value, dict):
        raise _BadArgument(f"{name} must be a JSON object, got {type(value).__name__}")
    return value


def _write_whole(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m components.train_lora", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="staged base model folder")
    p.add_argument("--model-type", default="", help="ms-swift model_type (default: the staged model's)")
    p.add_argument("--train", required=True, help="validated training dataset folder")
    p.add_argument("--eval", default="", help="validated held-out dataset folder")
    p.add_argument("--adapter", required=True, help="adapter output folder (the chief writes it)")
    p.add_argument("--swift-args", default="{}", help="`swift sft` arguments as a JSON object")
    p.add_argument("--checkpoint-dir", default="", help="durable checkpoint folder (resume after a restart)")
    p.add_argument("--expected-gpus", type=int, default=0, help="GPUs per node the profile asks for (0 = no check)")
    p.add_argument("--preflight", default="fail", choices=("fail", "warn", "off"))
    p.add_argument("--job-env", default="{}", help="extra environment of the job (NCCL_*, ...) as a JSON object")
    p.add_argument("--result", default="", help="JSON of the run written by the chief (and <result>.html)")
    p.add_argument("--checkpoint-interval-s", type=_positive_seconds, default=5.0,
                   help="seconds between looks for swift's finished checkpoints to copy durably (default 5)")  # fmt: skip
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        swift_args, job_env = _json_arg(args.swift_args, "--swift-args"), _json_arg(args.job_env, "--job-env")
    except _BadArgument as exc:
        print(f"train-lora: {exc}", file=sys.stderr)
        return 2
    from components.train_lora.core import TrainError, loss_curve_html, train_lora

    try:
        result = train_lora(
            model_dir=args.model,
            model_type=args.model_type,
            train_dir=args.train,
            eval_dir=args.eval,
            swift_args=swift_args,
            adapter_out=args.adapter,
            work_dir=tempfile.mkdtemp(prefix="train-lora-"),
            base_model_ref={"uri": args.model},
            checkpoint_dir=args.checkpoint_dir or None,
            expected_gpus=args.expected_gpus,
            preflight=args.preflight,
            job_env=job_env,
            checkpoint_interval_s=args.checkpoint_interval_s,
        )
    except TrainError as exc:
        print(f"train-lora: {exc}", file=sys.stderr, flush=True)
        return 1
    if not result.is_chief:
        print("train-lora: worker node done; the chief writes the outputs", flush=True)
        return 0
    if args.result:
        out = Path(args.result)
        record = {
            "metrics": result.metrics,
            "checkpoint": result.checkpoint.rsplit("/", 1)[-1],
            "strategy": result.strategy,
            "resumed_from": result.resumed_from,
        }
        _write_whole(out.with_name(out.name + ".html"), loss_curve_html(result.log_history, speedups=result.speedups))
        _write_whole(out, json.dumps(record, indent=1, sort_keys=True))
    print(f"train-lora: adapter written to {args.adapter}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
