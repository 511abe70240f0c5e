"""The `swift sft` arguments of one run: the config's `swift` section checked against ms-swift, what the
task decides on top (strategy, distributed settings, TensorBoard, durable checkpoints) and the command line.

`build_sft_command` is a pure function from the config's `swift` section (ms-swift's own argument names,
passed through unchanged) plus the task's inputs to the command line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from components.common.errors import TrainError
from components.common.quantization import quantization_of
from components.common.swift import RESERVED_ARGS, swift_arg_problem, to_cli
from components.train_lora import _input_checks, _launch
from speedups import registry

# Set by the task from its inputs; a config that sets them is refused.
PLUGIN = str(Path(registry.__file__).parent / "swift_plugin.py")


def swift_arg_names() -> set[str]:
    """Returns the argument names the installed ms-swift's `swift sft` accepts."""
    import dataclasses

    from swift.arguments import SftArguments

    return {f.name for f in dataclasses.fields(SftArguments)}


def check_swift_args(args: dict[str, Any], known: set[str] | None = None, where: str = "swift") -> None:
    """Checks a `swift` config section against ms-swift's argument names.

    Args:
        args: The section.
        known: Accepted names; default: read from the installed ms-swift.
        where: Prefix for messages (e.g. the config file). Default "swift".

    Raises:
        TrainError: A key ms-swift does not know, or one the task sets itself.
    """
    known = swift_arg_names() if known is None else known
    for key in args:
        problem = swift_arg_problem(key, known)
        if problem:
            raise TrainError(f"{where}: {problem.replace('ms-swift `', 'the installed ms-swift `')}")


def tensorboard_args(swift_args: dict[str, Any], environ: dict[str, str] | Any) -> dict[str, Any]:
    """Returns swift args that write TensorBoard events where Vertex TensorBoard reads them.

    Vertex sets AIP_TENSORBOARD_LOG_DIR on a CustomJob that has a TensorBoard attached; then
    ms-swift reports to TensorBoard in that folder, in a subfolder named after the job
    (CLOUD_ML_JOB_ID) when Vertex sets it. A config that sets `report_to` or
    `logging_dir` itself wins. Without the variable: nothing.
    """
    log_dir = environ.get("AIP_TENSORBOARD_LOG_DIR", "")
    if not log_dir or "report_to" in swift_args or "logging_dir" in swift_args:
        return {}
    job = environ.get("CLOUD_ML_JOB_ID", "")  # the jobs of all runs share one output folder: one subfolder each
    return {"report_to": "tensorboard", "logging_dir": f"{log_dir.rstrip('/')}/{job}" if job else log_dir}


def build_sft_command(
    swift_args: dict[str, Any],
    model_dir: str,
    model_type: str,
    train_jsonl: str,
    eval_jsonl: str,
    output_dir: str,
    resume_from: str | None = None,
) -> list[str]:
    """Builds the `swift sft` command line.

    Args:
        swift_args: The config's `swift` section (ms-swift names), passed through.
        model_dir: The staged base model folder.
        model_type: ms-swift model_type of the base model (from stage-model's metadata).
        train_jsonl: Training JSONL with absolute image paths.
        eval_jsonl: Held-out JSONL with absolute image paths ("" = none).
        output_dir: Where swift writes checkpoints (exactly this folder; no version subfolder).
        resume_from: A complete checkpoint folder to resume from. Default None.

    Returns:
        The argv list, starting with "swift", "sft".

    Raises:
        TrainError: `swift_args` sets a key the pipeline sets itself.
    """
    for key in swift_args:
        if key in RESERVED_ARGS:
            raise TrainError(f"swift.{key} is set by the pipeline from its inputs; remove it from the config")
    args: dict[str, Any] = {
        "model": model_dir,
        "model_type": model_type,
        "dataset": train_jsonl,
        "output_dir": output_dir,
        "add_version": False,
        "check_model": False,
        "tuner_type": "lora",
        # transformers then logs num_input_tokens_seen and train_tokens_per_second (the
        # task's tokens/s); the plugin's item 1 (speedups/token_count.py) makes the count exclude padding.
        "include_num_input_tokens_seen": True,
        # transformers' filter of the logged loss tests every micro-step's loss with `torch.isnan(loss)` in a Python
        # `if`: the host waits for the whole backward before it prepares the next step, and the GPU waits for that
        # host work (−1.8 to −2.6 % per step on an H100, 2026-11-26, benchmarks/train_throughput.py auto_liger against
        # auto_liger_nanfilter). Off, the training is the same and a NaN / Inf loss shows in the log
        # instead of being replaced by the running mean. A config may set it.
        "logging_nan_inf_filter": False,
        "external_plugins": [PLUGIN],
    }
    if eval_jsonl:
        args["val_dataset"] = eval_jsonl
    user_plugins = swift_args.get("external_plugins") or []
    args.update(swift_args)
    args["external_plugins"] = [PLUGIN, *([user_plugins] if isinstance(user_plugins, str) else user_plugins)]
    if resume_from:
        args["resume_from_checkpoint"] = resume_from
    return ["swift", "sft", *to_cli(args)]


def final_swift_args(
    swift_args: dict[str, Any],
    model_dir: str,
    launch: _launch.Launch,
    *,
    ddp_timeout_s: int | None,
    environ: dict[str, str] | None,
    checkpoint_dir: str | None,
) -> tuple[dict[str, Any], Any]:
    """Returns the swift args of this run and the parallelism strategy chosen for it.

    The config's section plus what the task decides: the strategy's DeepSpeed config
    ("none" drops the key), the distributed settings of the launch plan, TensorBoard under
    Vertex, and save_only_model false when checkpoints are kept durably (to resume with
    optimizer state). The task's inputs (model, datasets, resume) are added by
    `build_sft_command`.
    """
    args = dict(swift_args)
    plan = launch.plan
    strategy = _launch.choose_strategy(
        _launch.model_weight_bytes(model_dir, args.get("torch_dtype"), quantization_of(args)),
        plan.nproc_per_node if launch.gpu_count else 0,
        launch.gpu_memory,
        args,
        nnodes=plan.nnodes,
        deepspeed_available=_launch.deepspeed_importable(),
    )
    if strategy.deepspeed:
        args["deepspeed"] = strategy.deepspeed
    elif "deepspeed" in args and args["deepspeed"] in _launch.NO_DEEPSPEED:
        del args["deepspeed"]  # "none": plain DDP, no DeepSpeed config for swift
    args.update(_launch.distributed_swift_args(args, plan, ddp_timeout_s))
    args.update(tensorboard_args(args, os.environ if environ is None else environ))
    print(
        f"train-lora: node {plan.node_rank}/{plan.nnodes}, {plan.nproc_per_node} process(es) per node, "
        f"strategy {strategy.name}: {strategy.reason}",
        flush=True,
    )
    if unused := _launch.ddp_unused_args(args, strategy.name, _input_checks.load_model_config(model_dir)):
        args.update(unused)
        print(
            "train-lora: DDP without the search for unused parameters (ddp_find_unused_parameters false: a dense "
            "model with a frozen vision tower trains every adapter every step; set it in swift to search)",
            flush=True,
        )
    if checkpoint_dir:
        if args.get("save_only_model"):
            print(
                "train-lora: checkpoint_dir set: saving optimizer state too (save_only_model false) to resume",
                flush=True,
            )
        args["save_only_model"] = False
    return args, strategy
