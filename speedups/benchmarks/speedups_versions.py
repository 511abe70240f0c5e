"""The speed-up layer's start-up table under the installed library versions, on the CPU (issue 42).

1. The planner's side of a one-GPU job: `registry.planned(..., gpu=True)` for `train_throughput`'s `auto_liger`
   arguments and the Qwen3-VL-4B config (counted on the meta device): outcomes, memory flags, and `_plan`'s plan on an
   80 GB H100 (79.1 GiB) for synthesised token figures (136 rows of 1,207 tokens on average, 1,221 at most, as in
   tests/test_train_plan.py); with this machine's packages, and with requirements.lock's torch / Triton.
2. The job's side: train-lora's core trains the tiny Qwen3-VL for 2 CPU steps with the plugin; the table the plugin
   wrote (`VLM_LORA_SPEEDUPS_TABLE`) beside `registry.planned(..., gpu=False)` and `registry.disagreements`.

Exits 1 when training failed, an item raised, the planner disagrees with the table, or `swift sft` ran another
transformers; writes OUT/speedups_versions.json. Another transformers goes first on PYTHONPATH:

    .venv/bin/python -m speedups.benchmarks.speedups_versions --out DIR
    .venv/bin/pip install --no-deps --target /tmp/t517 transformers==5.17.0
    PYTHONPATH=/tmp/t517 .venv/bin/python -m speedups.benchmarks.speedups_versions --out /tmp/sv517
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from components.train_lora import _plan, _plan_run
from speedups import registry
from speedups import versions as speedup_versions

DISTRIBUTIONS = ("transformers", "peft", "accelerate", "ms-swift", "liger-kernel", "torch", "triton")
SEED_TOKENS = {"max_tokens": 1221, "p95_tokens": 1221, "mean_tokens": 1207.0, "rows": 136}
H100_GIB = 79.1  # what torch reports for an H100 80GB
CPU_STEPS = 2
LOCK = Path(__file__).resolve().parents[2] / "requirements.lock"
GPU_ONLY = ("torch", "triton")  # what only a GPU job is gated on (`Item.gpu_verified`)


def versions() -> dict[str, Any]:
    """The installed versions (the registry's source), and the transformers Python imports, with where from."""
    import transformers

    found = {name: registry.installed_version(name) for name in DISTRIBUTIONS}
    found["transformers imported"] = f"{transformers.__version__} ({Path(transformers.__file__).parent})"
    return found


def gpu_args() -> dict[str, Any]:
    """The throughput benchmark's `auto_liger` arguments for one GPU (seed config, 16 samples per step)."""
    from benchmarks.train_throughput import DEFAULT_MAX_PIXELS, PROFILES, profile_args, seed_swift_args

    return profile_args("auto_liger", PROFILES["auto_liger"], 16, 1, 8, seed_swift_args(DEFAULT_MAX_PIXELS))


def weight_bytes_4b() -> int:
    """Bytes of the Qwen3-VL-4B's bf16 parameters, counted on the meta device (no weights built)."""
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from benchmarks.qwen3_vl_4b import QWEN3_VL_4B_CONFIG

    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(Qwen3VLConfig(**QWEN3_VL_4B_CONFIG))
    return 2 * sum(p.numel() for p in model.parameters())


def outcomes(decided: registry.Planned | registry.Table) -> dict[str, str]:
    """{item number: its outcome line}, in item order."""
    return {str(number): outcome.line() for number, outcome in decided.outcomes.items()}


def lock_pins() -> dict[str, str]:
    """requirements.lock's torch and Triton (the GPU image's; a CPU machine may have others)."""
    found = {name: re.search(rf"^{name}==(\S+)$", LOCK.read_text(encoding="utf-8"), re.M) for name in GPU_ONLY}
    return {name: m.group(1) for name, m in found.items() if m}


def planner_side(weights: int, gpu_gib: float, pins: dict[str, str]) -> dict[str, Any]:
    """The planner's view of the one-GPU 4B job, torch / Triton as `pins` say: outcomes, memory flags, its plan."""
    from benchmarks.qwen3_vl_4b import QWEN3_VL_4B_CONFIG

    args, real = gpu_args(), speedup_versions.installed_version  # the package's one source of versions
    speedup_versions.installed_version = lambda name: pins.get(name) or real(name)
    try:
        planned = registry.planned(dict(os.environ), 1, args, QWEN3_VL_4B_CONFIG, gpu=True)
    finally:
        speedup_versions.installed_version = real
    flags = planned.memory_flags()
    try:
        plan = _plan_run.plan_for_run(
            args, model_config=QWEN3_VL_4B_CONFIG, weight_bytes=weights, token_stats=SEED_TOKENS,
            gpu_bytes=int(gpu_gib * _plan.GIB), world_size=1, **flags,
        )  # fmt: skip
        chosen: dict[str, Any] = {**plan.metrics(), "reasons": list(plan.reasons)}
    except _plan.PlanError as exc:
        chosen = {"error": str(exc)}
    return {"pins": pins, "expected": outcomes(planned), "memory_flags": flags, "plan": chosen}


def planner(gpu_gib: float = H100_GIB) -> dict[str, Any]:
    """The planner's side with this machine's packages, and with the lock's torch / Triton."""
    weights = weight_bytes_4b()
    return {
        "gpu_gib": gpu_gib, "weight_bytes": weights, "token_stats": SEED_TOKENS, "swift_args": gpu_args(),
        "installed": planner_side(weights, gpu_gib, {}), "lock_torch": planner_side(weights, gpu_gib, lock_pins()),
    }  # fmt: skip


def cpu_args() -> dict[str, Any]:
    """The same for 2 CPU steps: float32 (no bf16 training on a CPU), no Liger (GPU kernels), micro-batch `auto`."""
    return {
        **gpu_args(), "torch_dtype": "float32", "use_liger_kernel": False, "gradient_checkpointing": False,
        "gradient_accumulation_steps": 1, "max_steps": CPU_STEPS, "save_steps": CPU_STEPS, "dataloader_num_workers": 0,
    }  # fmt: skip


def job_side(work: Path) -> dict[str, Any]:
    """train-lora's core on the tiny Qwen3-VL (4 generated rows): its start-up table beside the planner's."""
    from components.train_lora.core import TrainError, train_lora
    from components.validate_data.core import validate_data
    from pipelines.demo.drawings import generate_dataset
    from pipelines.demo.tiny_model import ensure_tiny_model

    args, model = cpu_args(), str(ensure_tiny_model())
    config = json.loads(Path(model, "config.json").read_text(encoding="utf-8"))
    expected = registry.planned(dict(os.environ), 1, args, config, gpu=False)
    raw = generate_dataset(work / "raw", n_train=4, n_eval=2, image_size=128)
    validate_data([raw["train"]], str(work / "train"), str(work / "eval"), str(work / "q.jsonl"), [raw["eval"]])
    try:
        result = train_lora(model, "qwen3_vl", str(work / "train"), "", args, str(work / "adapter"), str(work / "work"))
        metrics = {k: v for k, v in result.metrics.items() if k.startswith(("speedup", "plan_", "steps"))}
    except TrainError as exc:
        metrics = {"error": str(exc)}
    table = registry.read_table(work / "work" / "speedups.json")  # where train-lora points VLM_LORA_SPEEDUPS_TABLE
    out = {"swift_args": args, "expected": outcomes(expected), "metrics": metrics, "table": {}, "disagreements": []}
    if table is not None:
        out.update(table=outcomes(table), versions=table.versions)
        out["disagreements"] = registry.disagreements(expected, table)
    return {**out, "problems": problems(metrics, table, out["disagreements"])}


def problems(metrics: dict[str, Any], table: registry.Table | None, disagreements: list[str]) -> list[str]:
    """What fails the call: training, no table, an item that raised, a disagreement, another transformers in swift."""
    if table is None:
        return [f"no start-up table: {metrics.get('error', 'train-lora read none')}"]
    found = [f"train-lora failed: {metrics['error']}"] if "error" in metrics else []
    found += [f"item {n}: {o.line()}" for n, o in table.outcomes.items() if o.kind == registry.ERROR] + disagreements
    if metrics.get("speedups_unplanned"):
        found.append(f"train-lora's speedups_unplanned is {metrics['speedups_unplanned']}")
    ran, here = table.versions.get("transformers"), registry.installed_version("transformers")
    if ran != here:
        found.append(f"swift sft ran transformers {ran}, this process {here}: PYTHONPATH did not reach it")
    return found


def print_report(report: dict[str, Any]) -> None:
    print("versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()))
    gpu, job = report["planner_gpu"], report["job_cpu"]
    here, lock = gpu["installed"], gpu["lock_torch"]
    for title, left, right in (
        (f"planner, one GPU of {gpu['gpu_gib']} GiB, Qwen3-VL-4B ({gpu['weight_bytes']:,} weight bytes), synthesised "
         f"tokens {gpu['token_stats']}: installed | torch, Triton as the lock's {lock['pins']}", here["expected"],
         lock["expected"]),
        (f"tiny Qwen3-VL, CPU, {CPU_STEPS} steps: start-up table | planner", job["table"], job["expected"]),
    ):  # fmt: skip
        print(title)
        for it in registry.ITEMS:
            print(f"  {it.number:>2} {it.name:<15} {left.get(str(it.number), '(none)'):<72} | {right[str(it.number)]}")
    for name, side in (("installed", here), ("lock's torch", lock)):
        print(f"planner, {name}: memory flags {side['memory_flags']}; plan {side['plan']}")
    print(f"swift sft's versions {job.get('versions')}; disagreements {job['disagreements']}")
    for problem in job["problems"]:
        print(f"PROBLEM: {problem}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for speedups_versions.json and the training's files")
    parser.add_argument("--gpu-gib", type=float, default=H100_GIB, help=f"the planner's GPU memory ({H100_GIB})")
    args = parser.parse_args(argv)
    out = Path(args.out)
    shutil.rmtree(out / "job", ignore_errors=True)  # this script's own training folder of an earlier call
    out.mkdir(parents=True, exist_ok=True)
    report = {"versions": versions(), "planner_gpu": planner(args.gpu_gib), "job_cpu": job_side(out / "job")}
    (out / "speedups_versions.json").write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    print_report(report)
    print(f"wrote {out / 'speedups_versions.json'}")
    return 1 if report["job_cpu"]["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
