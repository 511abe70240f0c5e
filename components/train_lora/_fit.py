"""What a run is expected to fit and cost, and what the plugin reported: the speed-up items expected to
apply, the micro-batch plan (`_plan`) sized from them, the expected time and GPU-hours, and the plugin's
start-up table read back after the run. Each reads the run's facts (`_facts.RunFacts`: model config, weight bytes,
token figures, launch) rather than the files again."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from components.common import cost
from components.train_lora import _input_checks, _offload, _plan, _plan_run
from components.train_lora._facts import RunFacts
from speedups import registry


def _active_billions(facts: RunFacts) -> tuple[float, bool]:
    """(Billions of parameters a token passes through, whether the model is a mixture of experts), from the
    staged weights (bf16 = 2 bytes a parameter) and config: the cost estimate's size when the name has none."""
    config = facts.config
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    total = facts.weight_bytes_in("bfloat16") / 2
    experts = _input_checks.expert_count(config)
    active = text.get("num_experts_per_tok")
    if not (isinstance(active, int) and experts):
        return total / 1e9, False
    expert_params = (
        _input_checks.wrapped_parameter_bytes(
            {"target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"], "torch_dtype": "bfloat16"},
            facts.model_dir,
        )
        / 2
    )
    return (total - expert_params * (1 - active / experts)) / 1e9, True


def log_expected_time(args: dict[str, Any], plan: _plan.Plan | None, facts: RunFacts, model_source: str) -> None:
    """Logs the expected training time and GPU-hours (`components.common.cost`), when they can be estimated."""
    launch = facts.launch
    if not launch.gpu_count:
        return
    import torch

    billions, moe = _active_billions(facts)

    micro = plan.micro_batch if plan else int(args.get("per_device_train_batch_size") or 1)
    line = cost.training_log_line(
        args if not plan else {**args, **plan.swift_args()},
        facts.token_stats,
        micro_batch=micro,
        checkpointing=plan.gradient_checkpointing if plan else args.get("gradient_checkpointing") is True,
        gpus=launch.gpu_count,
        nodes=launch.plan.nnodes,
        gpu_name=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "",
        model_source=model_source,
        model_b=round(billions, 1),
        moe=moe,
    )
    if line:
        print(f"train-lora: {line}", flush=True)


def _job_setting(job_env: dict[str, str], name: str) -> str:
    """A train-lora plugin setting as the training job will see it: the environment section, else this process's."""
    return str(job_env.get(name) or os.environ.get(name, ""))


def planned_speedups(args: dict[str, Any], facts: RunFacts, job_env: dict[str, str]) -> registry.Planned:
    """Which speed-up items the training job will apply (`registry.planned`: switches as the job will see them, the
    packages' versions, the targets importable, what the run's arguments and model config allow)."""
    return registry.planned(
        {**os.environ, **job_env}, facts.world_size, args, facts.config, gpu=bool(facts.launch.gpu_count)
    )


def micro_batch_plan(
    args: dict[str, Any], facts: RunFacts, job_env: dict[str, str], expected: registry.Planned | None = None
) -> _plan.Plan | None:
    """Resolves `auto` micro-batch / checkpointing (`_plan`); None when the config fixes both. The memory flags
    come from the speed-up items expected to apply (`expected`, else `planned_speedups`). Offloaded checkpoints
    are checked against the host's memory (`check_offload`) either way."""
    if not _plan_run.wants_plan(args):
        check_offload(args, None, facts, job_env)
        return None
    launch, world = facts.launch, facts.world_size
    if not launch.gpu_count:
        per_gpu = _plan_run.samples_per_step(args, world) // world
        checkpointing = args.get("gradient_checkpointing")
        plan = _plan.Plan(
            1, per_gpu, checkpointing is True, 0, 0, ("no GPU: micro-batch 1 (the planner sizes for GPU memory)",)
        )
    else:
        cap = _job_setting(job_env, "VLM_LORA_GPU_MEMORY_GIB")
        expected = expected or planned_speedups(args, facts, job_env)
        gpu_bytes = min(launch.gpu_memory, int(float(cap) * _plan.GIB)) if cap else launch.gpu_memory
        plan = _plan_run.plan_for_run(
            args,
            model_config=facts.config,
            weight_bytes=facts.weight_bytes,
            token_stats=facts.token_stats,
            gpu_bytes=gpu_bytes,
            world_size=world,
            zero3="zero3" in str(args.get("deepspeed", "")) or facts.strategy.name == "zero3",
            wrapped_bytes=facts.wrapped_bytes,
            **expected.memory_flags(),
        )
    for reason in plan.reasons:
        print(f"train-lora: plan: {reason}", flush=True)
    check_offload(args, plan, facts, job_env)
    return plan


def check_offload(args: dict[str, Any], plan: _plan.Plan | None, facts: RunFacts, job_env: dict[str, str]) -> int:
    """With `VLM_LORA_CHECKPOINT_OFFLOAD=1` on a GPU: the pinned host memory one micro-step's offloaded layer inputs
    need, refused (`_offload.OffloadHostMemoryError`) where this host has too little available; 0 otherwise."""
    environ = {**os.environ, **job_env}
    if not facts.launch.gpu_count or str(environ.get(_offload.OFFLOAD, "")) != "1":
        return 0
    shape = _plan.ModelShape.from_config(facts.config, 0)
    if plan is not None:
        batch, checkpointing, layers = plan.micro_batch, plan.gradient_checkpointing, plan.checkpoint_layers
    else:
        batch, checkpointing, layers = (
            int(args.get("per_device_train_batch_size", 1)),
            bool(args.get("gradient_checkpointing", True)),
            None,
        )
    stats = facts.token_stats or {}
    tokens = int(stats.get("max_tokens") or args.get("max_length") or 0)
    k = (shape.layers if layers is None else layers) if checkpointing else 0
    need = _offload.check_host_memory(
        environ, micro_batch=batch, tokens=tokens, hidden=shape.hidden, layers=k,
        available=_offload.available_host_bytes(),
    )  # fmt: skip
    if need:
        print(f"train-lora: checkpointed layers' inputs offloaded: {need / _plan.GIB:.1f} GiB of pinned host memory")
    return need


def read_speedups(path: Path, is_chief: bool) -> registry.Table | None:
    """The start-up table the plugin wrote (rank 0, on the chief), with one summary line; None where there is none."""
    table = registry.read_table(path)
    if table is None:
        if is_chief:
            print(f"train-lora: speed-ups: no start-up table at {path} (no trainer was built)", flush=True)
        return None
    got, missed = table.counts()
    skipped = [
        f"{it.number} {it.name} ({table.outcomes[it.number].kind})"
        for it in registry.ITEMS
        if it.number in table.outcomes and table.outcomes[it.number].skipped
    ]
    print(
        f"train-lora: speed-ups: {got} of {len(registry.ITEMS)} applied"
        + (f"; skipped: {', '.join(skipped)}" if skipped else ""),
        flush=True,
    )
    return table


def unplanned(expected: registry.Planned | None, table: registry.Table | None) -> list[str]:
    """One line per memory-relevant item the planner expected otherwise than the run's table says (logged)."""
    if expected is None or table is None:
        return []
    lines = registry.disagreements(expected, table)
    for line in lines:
        print(f"train-lora: speed-ups: {line}", flush=True)
    return lines
