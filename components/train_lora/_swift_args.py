"""The `swift sft` arguments of one run, in ordered layers (`_layers`): the task's defaults, the config's `swift`
section (`user`, checked against ms-swift), its quant_* arguments (`quantisation`), then what the task decides on top
(`strategy`, `distributed`, `tracking`, durable `checkpoints`, the micro-batch `batch_plan`) and last the task's
`inputs` (model, datasets, output folder, plugin, resume point).

Each `*_layer` function returns the keys it sets and one line of why; `task_layers` builds those known before the
micro-batch plan, `command` merges all of them into the command line, and `build_sft_command` is the pure function
from a `swift` section plus the task's inputs to the command line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from components.common import tracking, wandb_tracking
from components.common.errors import TrainError
from components.common.quantization import swift_quant_args
from components.common.swift import RESERVED_ARGS, swift_arg_problem, to_cli
from components.train_lora import _launch, _plan
from components.train_lora._facts import RunFacts
from components.train_lora._layers import DROPPED, Layer, Layered, merge
from speedups import registry

# The train-lora plugin (the speed-up items), which swift loads before any of the config's `external_plugins`.
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


# The task's defaults (a config may set them); the inputs layer sets model, datasets and output folder last.
DEFAULTS: dict[str, Any] = {
    "add_version": False,  # output_dir is exactly the folder given (a reserved key: never the config's)
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
}


def defaults_layer() -> Layer:
    return Layer("defaults", dict(DEFAULTS), "the task's defaults; the config's swift section may set them")


def user_layer(swift_args: dict[str, Any], quantization: str) -> Layer:
    """The config's `swift` section, less the quant_* arguments `model.quantization` stands for.

    Raises:
        TrainError: The section sets a key the pipeline sets itself.
    """
    for key in swift_args:
        if key in RESERVED_ARGS:
            raise TrainError(f"swift.{key} is set by the pipeline from its inputs; remove it from the config")
    quant = swift_quant_args(quantization)
    keys = {k: v for k, v in swift_args.items() if k not in quant}
    return Layer("user", keys, "the config's swift section")


def quantisation_layer(swift_args: dict[str, Any], quantization: str) -> Layer:
    """The section's bitsandbytes arguments of `model.quantization` (the config adds them; none without)."""
    keys = {k: swift_args[k] for k in swift_quant_args(quantization) if k in swift_args}
    why = f"model.quantization {quantization}: a bitsandbytes base" if keys else "model.quantization none"
    return Layer("quantisation", keys, why)


def strategy_layer(args: dict[str, Any], facts: RunFacts) -> Layer:
    """The strategy's DeepSpeed config ("none" drops the key)."""
    strategy, keys = facts.strategy, {}
    if strategy.deepspeed:
        keys["deepspeed"] = strategy.deepspeed
    elif "deepspeed" in args and args["deepspeed"] in _launch.NO_DEEPSPEED:
        keys["deepspeed"] = DROPPED  # "none": plain DDP, no DeepSpeed config for swift
    return Layer("strategy", keys, f"{strategy.name}: {strategy.reason}")


def distributed_layer(args: dict[str, Any], facts: RunFacts, ddp_timeout_s: int | None) -> Layer:
    """The NCCL timeout of a distributed run (`_launch.distributed_swift_args`), and DDP without the unused-parameter
    search where every adapter trains every step (`_launch.ddp_unused_args`)."""
    plan = facts.launch.plan
    keys = _launch.distributed_swift_args(args, plan, ddp_timeout_s)
    why = f"node {plan.node_rank}/{plan.nnodes}, {plan.nproc_per_node} process(es) per node"
    if unused := _launch.ddp_unused_args(args, facts.strategy.name, facts.config):
        keys.update(unused)
        why += (
            "; DDP without the search for unused parameters (ddp_find_unused_parameters false: a dense model with a "
            "frozen vision tower trains every adapter every step; set it in swift to search)"
        )
    return Layer("distributed", keys, why)


def tracking_layer(
    args: dict[str, Any], environ: dict[str, str] | Any, job_env: dict[str, str], train_dir: str, adapter_out: str
) -> tuple[Layer, dict[str, str]]:
    """TensorBoard under Vertex (`tensorboard_args`), MLflow (MLFLOW_TRACKING_URI) and W&B (WANDB_PROJECT in the job
    environment), each server checked before `swift sft` starts.

    Returns:
        (The layer, the trackers' variables for the job's environment.)

    Raises:
        TrainError: A server cannot be reached (or W&B's key not read) and tracking is required.
    """
    out = {**args, **tensorboard_args(args, environ)}
    try:
        out, tracking_env = tracking.prepare_training(out, job_env, train_dir, adapter_out)
        tags = tracking.training_tags(train_dir, adapter_out)
        out, wandb_env = wandb_tracking.prepare_training(out, job_env, adapter_out, tags)
    except tracking.TrackingError as exc:
        raise TrainError(str(exc)) from None
    keys = {k: v for k, v in out.items() if k not in args or args[k] != v}
    keys.update({k: DROPPED for k in args if k not in out})
    named = [name for name, on in (("TensorBoard", "logging_dir" in keys), ("MLflow", tracking_env),
                                   ("W&B", wandb_env)) if on]  # fmt: skip
    return Layer("tracking", keys, ", ".join(named) or "no tracker"), {**tracking_env, **wandb_env}


def checkpoints_layer(checkpoint_dir: str | None) -> Layer:
    """save_only_model false when checkpoints are kept durably (to resume with optimizer state)."""
    if not checkpoint_dir:
        return Layer("checkpoints", {}, "no durable checkpoints")
    return Layer("checkpoints", {"save_only_model": False}, "checkpoint_dir set: optimizer state saved to resume")


def batch_plan_layer(plan: _plan.Plan | None) -> Layer:
    """The micro-batch plan's micro-batch, accumulation and checkpointing (`_fit.micro_batch_plan`)."""
    if plan is None:
        return Layer("batch_plan", {}, "the config fixes micro-batch and checkpointing")
    why = next((r for r in reversed(plan.reasons) if "micro-batch" in r), "the micro-batch planner")
    return Layer("batch_plan", plan.swift_args(), why)


def inputs_layer(
    args: dict[str, Any], model_dir: str, model_type: str, train_jsonl: str, eval_jsonl: str, output_dir: str,
    resume_from: str | None = None,
) -> Layer:  # fmt: skip
    """The task's inputs: model, datasets, output folder, the train-lora plugin before the config's, resume point."""
    keys: dict[str, Any] = {"model": model_dir, "model_type": model_type, "dataset": train_jsonl}
    if eval_jsonl:
        keys["val_dataset"] = eval_jsonl
    keys["output_dir"] = output_dir
    user_plugins = args.get("external_plugins") or []
    keys["external_plugins"] = [PLUGIN, *([user_plugins] if isinstance(user_plugins, str) else user_plugins)]
    if resume_from:
        keys["resume_from_checkpoint"] = resume_from
    return Layer("inputs", keys, "the task's inputs" + (", resumed" if resume_from else ""))


def task_layers(
    swift_args: dict[str, Any],
    facts: RunFacts,
    *,
    ddp_timeout_s: int | None,
    environ: dict[str, str] | None,
    checkpoint_dir: str | None,
    job_env: dict[str, str],
    train_dir: str = "",
    adapter_out: str = "",
) -> list[Layer]:
    """The layers from the task's defaults to durable checkpoints (all but the batch plan and the inputs).

    Args:
        swift_args: The config's `swift` section.
        facts: The run's facts (strategy, quantisation, model config, launch).
        ddp_timeout_s: NCCL timeout of a distributed run when swift.ddp_timeout is not set (None = the default).
        environ: Environment with Vertex's TensorBoard variables. None = os.environ.
        checkpoint_dir: The durable checkpoint folder (None = none).
        job_env: The job's extra environment; the trackers' variables are added to it.
        train_dir: The validated training set (the trackers' lineage tags). Default "".
        adapter_out: The adapter folder (the trackers' run identity). Default "".

    Raises:
        TrainError: A reserved key in the section, or a required tracker cannot be reached.
    """
    layers = [
        defaults_layer(),
        user_layer(swift_args, facts.quantization),
        quantisation_layer(swift_args, facts.quantization),
    ]
    layers.append(strategy_layer(planner_args(layers), facts))
    layers.append(distributed_layer(planner_args(layers), facts, ddp_timeout_s))
    track, env = tracking_layer(
        planner_args(layers), os.environ if environ is None else environ, job_env, train_dir, adapter_out
    )
    job_env.update(env)
    return [*layers, track, checkpoints_layer(checkpoint_dir)]


def planner_args(layers: list[Layer]) -> dict[str, Any]:
    """The arguments the layers after the defaults set, merged: what the planner, the speed-up gate and the cost
    estimate read (the task's defaults and inputs concern none of them)."""
    return merge(la for la in layers if la.name not in ("defaults", "inputs")).final


# Where the command line puts the task's own arguments (the rest follow in the layers' order, the resume point last).
_CLI_FIRST = ("model", "model_type", "dataset", "output_dir", *DEFAULTS, "external_plugins", "val_dataset")


def command(layered: Layered) -> list[str]:
    """The `swift sft` command line of the merged layers."""
    final = layered.final
    ordered = {k: final[k] for k in _CLI_FIRST if k in final}
    ordered.update({k: v for k, v in final.items() if k not in ordered and k != "resume_from_checkpoint"})
    if "resume_from_checkpoint" in final:
        ordered["resume_from_checkpoint"] = final["resume_from_checkpoint"]
    return ["swift", "sft", *to_cli(ordered)]


def build_sft_command(
    swift_args: dict[str, Any],
    model_dir: str,
    model_type: str,
    train_jsonl: str,
    eval_jsonl: str,
    output_dir: str,
    resume_from: str | None = None,
) -> list[str]:
    """Builds the `swift sft` command line: the task's defaults, `swift_args`, then the inputs.

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
    user = user_layer(swift_args, "none")
    inputs = inputs_layer(swift_args, model_dir, model_type, train_jsonl, eval_jsonl, output_dir, resume_from)
    return command(merge([defaults_layer(), user, inputs]))
