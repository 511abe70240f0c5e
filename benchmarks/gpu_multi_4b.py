"""Multi-GPU runs of the train-lora core on a 4B-shaped Qwen3-VL (GPU machine, not a test).

On a 2-GPU host:
  1. the automatically chosen strategy (DDP when the frozen base fits one GPU; ZeRO-2 until 2026-11-26),
  2. ZeRO-3 forced (`swift.deepspeed: zero3`: it must still work for models that need it),
  3. a two-"node" run: two train_lora processes, one GPU each, with CLUSTER_SPEC set as
     Vertex sets it (workerpool0 = chief, workerpool1 = worker), so torchrun forms a
     2-node job over 127.0.0.1; only the chief writes the adapter.

    python -m benchmarks.gpu_multi_4b --out DIR [--steps 20] [--batch 1]

Prints one `RESULT {...}` JSON line per run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.gpu_tasks_4b import SEED_SWIFT


def _swift(steps: int, batch: int) -> dict:
    return {**SEED_SWIFT, "max_steps": steps, "save_steps": steps, "per_device_train_batch_size": batch}


def _summary(name: str, result, wall: float) -> dict:
    m = result.metrics
    return {
        "run": name,
        "strategy": getattr(result, "strategy", ""),
        "is_chief": getattr(result, "is_chief", True),
        "wall_s": round(wall, 1),
        "samples_per_second": m.get("samples_per_second"),
        "seconds_per_step": m.get("seconds_per_step"),
        "peak_memory_gib": m.get("peak_memory_gib"),
        "steps": m.get("steps"),
        "final_loss": m.get("final_loss"),
    }


def node_main(args) -> None:
    """One 'node' of the two-node run: train_lora with CLUSTER_SPEC from the environment."""
    from components.train_lora.core import train_lora

    start = time.time()
    result = train_lora(
        args.model, "qwen3_vl", args.train, "", _swift(args.steps, args.batch), args.adapter, args.work, expected_gpus=1
    )
    print(
        "RESULT "
        + json.dumps(
            _summary(f"two-node rank {os.environ.get('NODE_NAME')}", result, time.time() - start), default=str
        ),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--node", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model")
    parser.add_argument("--train")
    parser.add_argument("--adapter")
    parser.add_argument("--work")
    args = parser.parse_args()
    if args.node:
        node_main(args)
        return
    os.environ.setdefault("MAX_PIXELS", str(1024 * 1024))
    from benchmarks.qwen3_vl_4b import build_qwen3_vl_4b
    from components.train_lora.core import train_lora
    from components.validate_data.core import validate_data
    from pipelines.demo.drawings import generate_dataset

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = build_qwen3_vl_4b(out / "model")
    data = generate_dataset(out / "raw", n_train=64, n_eval=8, image_size=1024, seed=0)
    validate_data(
        [data["train"]], str(out / "train"), str(out / "eval"), str(out / "q.jsonl"), eval_files=[data["eval"]]
    )

    for name, extra in (("auto (2 GPUs)", {}), ("zero3 forced (2 GPUs)", {"deepspeed": "zero3"})):
        start = time.time()
        try:
            result = train_lora(
                str(model),
                "qwen3_vl",
                str(out / "train"),
                "",
                {**_swift(args.steps, args.batch), **extra},
                str(out / f"adapter-{len(extra)}"),
                str(out / f"work-{len(extra)}"),
                expected_gpus=2,
            )
            print("RESULT " + json.dumps(_summary(name, result, time.time() - start), default=str), flush=True)
        except Exception as exc:  # report and go on to the next run
            print("RESULT " + json.dumps({"run": name, "error": f"{type(exc).__name__}: {exc}"[:2000]}), flush=True)

    spec = {"cluster": {"workerpool0": ["127.0.0.1:29555"], "workerpool1": ["127.0.0.1:29556"]}}
    procs = []
    start = time.time()
    for i, (pool, gpu) in enumerate((("workerpool0", "0"), ("workerpool1", "1"))):
        env = {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": gpu,
            "NODE_NAME": pool,
            "CLUSTER_SPEC": json.dumps({**spec, "task": {"type": pool, "index": 0}}),
        }
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.gpu_multi_4b",
            "--node",
            "--out",
            args.out,
            "--steps",
            str(args.steps),
            "--batch",
            str(args.batch),
            "--model",
            str(model),
            "--train",
            str(out / "train"),
            "--adapter",
            str(out / f"adapter-node{i}"),
            "--work",
            str(out / f"work-node{i}"),
        ]
        log = open(out / f"node{i}.log", "w")
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log, i))
    for proc, log, i in procs:
        code = proc.wait(timeout=900)
        log.close()
        lines = (out / f"node{i}.log").read_text().splitlines()
        results = [line for line in lines if line.startswith("RESULT ")]
        print(
            results[-1]
            if results
            else f"RESULT {json.dumps({'run': f'two-node {i}', 'exit': code, 'tail': lines[-15:]})}",
            flush=True,
        )
    print(
        f"two-node wall {time.time() - start:.1f} s; chief adapter written: "
        f"{(out / 'adapter-node0' / 'adapter_model.safetensors').is_file()}; worker adapter written: "
        f"{(out / 'adapter-node1' / 'adapter_model.safetensors').is_file()}",
        flush=True,
    )


if __name__ == "__main__":
    main()
