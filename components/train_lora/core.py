"""Train a LoRA adapter with `swift sft` on a staged model and validated datasets.

`train_lora` reads top to bottom: the facts of this node (`_plan_launch`: base model, GPUs,
cluster spec, folders), the GPU and interconnect preflight on every node
(`components.common.preflight`, skipped without a GPU), the datasets as swift reads them
(`_data`), the run's facts derived once (`_facts.RunFacts`: model config, weight bytes, quantisation,
GPUs and nodes, strategy, token figures), the swift arguments in ordered layers (`_swift_args`, merged by
`_layers`: the config's `swift` section in ms-swift's own names, then what the task decides, each key
recorded with the layer that set it), the micro-batch plan (`_fit`), the training (`_run_swift`, re-planned
after an out-of-memory), then the adapter, its layer table and the training metrics (with the chief's
preflight figures). Running the command (`components.common.swift`) and the adapter folder's layout
(`components.common.adapter`) are shared with merge-export."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.common import cluster
from components.common import preflight as gpu_check
from components.common.adapter import ADAPTER_FILES, BASE_MODEL_REF, LOG_HISTORY, summarize_log
from components.common.errors import TrainError  # re-exported: core.TrainError
from components.common.manifest import write_manifest
from components.common.snapshot import LINEAGE_FILE
from components.common.swift import swift_executable
from components.train_lora import (
    _checkpoints,
    _data,
    _facts,
    _fit,
    _input_checks,
    _launch,
    _layers,
    _plan,
    _plan_run,
    _run_swift,
    _swift_args,
)
from components.train_lora.job_env import check_job_env, job_env_strings
from speedups import registry

# How long each node's preflight waits for every rank to join, seconds: the ranks of one
# node start together; the replicas of a multi-node Vertex job can start minutes apart
# (provisioning, image pull), and a missing one is named when this runs out.
PREFLIGHT_TIMEOUT_S = 60.0
PREFLIGHT_MULTI_NODE_TIMEOUT_S = 600.0


@dataclass
class TrainResult:
    """What training produced.

    Attributes:
        adapter_dir: Folder with the adapter weights/config, args.json (ms-swift's), args_layers.json (which layer
            set each argument: `_layers.ARGS_LAYERS`) and base_model.json.
        checkpoint: The swift checkpoint folder the adapter was taken from.
        metrics: train_loss, eval_loss, steps, samples_per_second, tokens_per_second
            (language-model tokens, text + image, padding excluded), train_runtime_s, wall_s.
        log_history: The trainer's log entries (loss per logging step).
        is_chief: False on a non-chief node of a multi-node job: it trained but wrote
            nothing (adapter_dir and checkpoint are "").
        resumed_from: The durable checkpoint training resumed from ("" = from scratch).
        strategy: The parallelism used (single, ddp, zero2, zero3, user).
        speedups: The plugin's start-up table, one row per speed-up item (number, name, applied, outcome): what
            `loss_curve_html(..., speedups=)` shows. Empty where the table was not written (no trainer built).
        manifest_sha256: The sha256 of the adapter folder's completion marker (`components.common.manifest`:
            every file's size and sha256, written last), recorded in the artifact's metadata so a reuse
            checks it ("" on a non-chief node).
    """

    adapter_dir: str
    checkpoint: str
    metrics: dict[str, float]
    log_history: list[dict[str, Any]] = field(default_factory=list)
    is_chief: bool = True
    resumed_from: str = ""
    strategy: str = ""
    speedups: list[dict[str, Any]] = field(default_factory=list)
    manifest_sha256: str = ""


def loss_curve_html(
    log_history: list[dict[str, Any]], title: str = "train-lora", speedups: list[dict[str, Any]] | None = None
) -> str:
    """Renders the training curves as a self-contained HTML page (matplotlib SVG; `_report.render_curves`).

    Loss per optimizer step on a log scale (train loss a line, eval loss points, even a single
    one), and learning rate, grad norm and token accuracy panels when the log has them.

    Args:
        log_history: Log entries as ms-swift writes them (`loss`, `eval_loss`, `learning_rate`,
            `grad_norm`, `token_acc`, `eval_token_acc`, `epoch`, with `global_step/max_steps` or `step`).
        title: Page title. Default "train-lora".
        speedups: The speed-ups' start-up table (`TrainResult.speedups`), shown under the curves. Default None
            (none shown).

    Returns:
        The HTML text (renders in the Vertex console's HTML artifact view).
    """
    from components.train_lora._report import render_curves

    return render_curves(log_history, title, speedups=speedups)


def durable_checkpoint_dir(checkpoint_root: str, *inputs: Any) -> str:
    """Returns the durable checkpoint folder of one training: `<root>/<key>/train-lora`.

    The key is a hash of what the training reads (the input artifacts' URIs and the swift
    arguments): a retried or preempted job of the same run finds its checkpoints again,
    and no per-run value (job id, time) is needed among the task's inputs, which would
    make every run a cache miss.

    Args:
        checkpoint_root: Root folder of durable checkpoints ("" = none).
        *inputs: The values that identify the training (URIs, swift arguments).

    Returns:
        The folder, or "" without a root.
    """
    if not checkpoint_root:
        return ""
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"{checkpoint_root.rstrip('/')}/{key}/train-lora"


def train_lora(
    model_dir: str,
    model_type: str,
    train_dir: str,
    eval_dir: str,
    swift_args: dict[str, Any],
    adapter_out: str,
    work_dir: str,
    *,
    base_model_ref: dict[str, Any] | None = None,
    checkpoint_dir: str | None = None,
    expected_gpus: int = 0,
    ddp_timeout_s: int | None = None,
    environ: dict[str, str] | None = None,
    gpus: tuple[int, int] | None = None,
    checkpoint_interval_s: float = 5.0,
    keep_checkpoints: int = 2,
    node_timeout_s: float = 900.0,
    term_wait_s: float = 10.0,
    grace_s: float = 25.0,
    preflight: str = "fail",
    job_env: dict[str, Any] | None = None,
    dataset_markers: dict[str, str] | None = None,
) -> TrainResult:
    """Trains a LoRA adapter with `swift sft` and writes it to `adapter_out`.

    Args:
        model_dir: Staged base model folder.
        model_type: ms-swift model_type (e.g. qwen3_vl).
        train_dir: Validated training dataset folder.
        eval_dir: Validated held-out dataset folder ("" = no eval during training).
        swift_args: The config's `swift` section.
        adapter_out: Output folder for the adapter.
        work_dir: Local scratch folder for datasets and checkpoints.
        base_model_ref: Facts about the base model recorded next to the adapter
            (source, revision, path). Default None.
        checkpoint_dir: Durable folder for verified checkpoint copies (on Vertex a
            `/gcs/...` path). When set, training resumes from the newest complete copy
            there, swift keeps optimizer state in its checkpoints (save_only_model false),
            and each finished checkpoint is copied there while training runs (on a
            multi-node job every node copies its own ranks' files; the chief marks the
            checkpoint complete once all nodes have). Default None (no durable
            checkpoints, no resume).
        expected_gpus: GPUs per node the resources profile asks for; more than are
            visible is refused before any work. Default 0 (no check).
        ddp_timeout_s: NCCL timeout of a distributed run when swift.ddp_timeout is not
            set. Default None (_launch.DEFAULT_DDP_TIMEOUT_S).
        environ: Environment to read CLUSTER_SPEC from. Default None (os.environ).
        gpus: (GPU count, bytes per GPU) instead of asking torch. Default None.
        checkpoint_interval_s: Seconds between looks for new local checkpoints. Default 5.
        keep_checkpoints: Complete durable checkpoints kept (0 = all). Default 2.
        node_timeout_s: Multi-node: seconds to wait for the other nodes' part of a
            checkpoint before it is left incomplete (a warning). Default 900.
        term_wait_s: After SIGTERM: seconds swift's processes get to exit before SIGKILL.
            Default 10.
        grace_s: After SIGTERM: seconds (from the signal) the last durable copy may wait
            for other nodes' markers; Vertex kills the task about 30 s after SIGTERM.
            Default 25.
        preflight: The GPU and interconnect check run on every node before `swift sft`
            (`components.common.preflight`): "fail" stops on a problem, "warn" logs it
            and trains, "off" skips it. Skipped on a node without a GPU. Default "fail".
        job_env: Extra environment variables of the preflight and `swift sft` (NCCL_*,
            TORCH_NCCL_*, TORCH_DISTRIBUTED_DEBUG, CUDA_DEVICE_MAX_CONNECTIONS, ...; see
            `components.train_lora.job_env`). Default None (none).
        dataset_markers: {dataset folder: sha256 of its completion marker as validate-data recorded
            it} (the artifacts' `manifest_sha256`), checked before the rows are read. Default None.

    Returns:
        The TrainResult (on a non-chief node: no adapter, `is_chief` False).

    Raises:
        TrainError: Inputs invalid, or `swift sft` failed (message names the likely knob).
        JobEnvError: `job_env` names a variable outside the allow-list, or a secret (a TrainError).
        PreflightFailed: mode "fail" and a GPU or link check failed, or a rank did not join
            (a TrainError; the message names node, GPU, the figure and the NCCL knobs).
        Preempted: SIGTERM arrived (a TrainError); swift was stopped and the finished
            checkpoints were copied; the message names the last durable checkpoint.
    """
    started = time.time()  # the GPUs are held from here: gpu_hours counts the task's wall time
    extra_env = _job_env(preflight, job_env)
    durable = _run_swift.Durability(
        checkpoint_dir, checkpoint_interval_s, keep_checkpoints, node_timeout_s, term_wait_s, grace_s
    )
    config = _input_checks.load_model_config(model_dir)  # the one read of config.json (RunFacts keeps it)
    launch = _plan_launch(
        model_dir,
        swift_args,
        adapter_out,
        work_dir,
        checkpoint_dir,
        expected_gpus=expected_gpus,
        environ=environ,
        gpus=gpus,
        config=config,
    )
    checked = run_node_preflight(
        launch.plan, launch.gpu_count, preflight, work_dir=work_dir, job_env=extra_env, expected_gpus=expected_gpus,
        environ=environ,
    )  # fmt: skip
    inputs = _data.materialize_inputs(work_dir, train_dir, eval_dir, dataset_markers or {})
    facts = _facts.RunFacts.gather(model_dir, swift_args, launch, train_dir, config=config)
    layers = _swift_args.task_layers(  # the trackers' variables join extra_env
        swift_args, facts, ddp_timeout_s=ddp_timeout_s, environ=environ, checkpoint_dir=checkpoint_dir,
        job_env=extra_env, train_dir=train_dir, adapter_out=adapter_out,
    )  # fmt: skip
    args = _swift_args.planner_args(layers)
    expected = _fit.planned_speedups(args, facts, extra_env)
    batch_plan = _fit.micro_batch_plan(args, facts, extra_env, expected)
    if launch.plan.is_chief:
        _fit.log_expected_time(args, batch_plan, facts, (base_model_ref or {}).get("source", ""))
    run = _train_until_it_fits(
        layers, batch_plan, model_dir=model_dir, model_type=model_type, inputs=inputs, launch=launch, durable=durable,
        job_env=extra_env, checkpoint_dir=checkpoint_dir, expected=expected,
    )  # fmt: skip
    ref = {"model_dir": model_dir, "model_type": model_type, **(base_model_ref or {})}
    result = _collect_outputs(
        inputs, adapter_out, ref, is_chief=launch.plan.is_chief, wall=run.wall, resume=run.resume,
        strategy=facts.strategy.name,
    )  # fmt: skip
    if result.is_chief:
        _finish_on_chief(result, run, checked, adapter_out, gpus=facts.gpus, started=started, train_dir=train_dir)
    return result


def _job_env(preflight: str, job_env: dict[str, Any] | None) -> dict[str, str]:
    """Checks the preflight mode and the job environment section; returns the section as strings.

    Raises:
        TrainError: The mode is unknown, or `job_env` names a variable outside the allow-list or a secret.
    """
    gpu_check.check_mode(preflight, "preflight")
    check_job_env(job_env or {}, "job_env")
    return job_env_strings(job_env)


def _finish_on_chief(
    result: TrainResult, run: _Run, checked: dict[str, float], adapter_out: str, *, gpus: int, started: float,
    train_dir: str,
) -> None:  # fmt: skip
    """The chief's last steps: the preflight's, the run's and the GPU-hours figures into the metrics, the speed-ups'
    table, the argument layers and the data lineage beside the adapter, then its completion marker (written last: a
    reuse of the adapter checks its files against it)."""
    result.metrics.update(checked)
    result.metrics.update(run.metrics())
    result.speedups = run.speedups.rows() if run.speedups is not None else []
    # wall time x GPUs of the job: what the job held, start-up included
    result.metrics["gpu_hours"] = round((time.time() - started) / 3600 * gpus, 4)
    if run.layered is not None:
        _layers.write_record(run.layered, adapter_out)
    lineage = Path(train_dir) / LINEAGE_FILE  # the data lineage goes on with the adapter
    if lineage.is_file():
        shutil.copyfile(lineage, Path(adapter_out) / LINEAGE_FILE)
    result.manifest_sha256 = write_manifest(adapter_out, producer="train-lora")


def _plan_launch(
    model_dir: str,
    swift_args: dict[str, Any],
    adapter_out: str,
    work_dir: str,
    checkpoint_dir: str | None,
    *,
    expected_gpus: int,
    environ: dict[str, str] | None,
    gpus: tuple[int, int] | None,
    config: dict[str, Any] | None = None,
) -> _launch.Launch:
    """Checks what can be checked before any work: base model, GPU count, cluster spec, config, folders
    (`config`: the model's config.json already read; None = read here).

    Raises:
        TrainError: The base model folder has no config.json; or (subclasses) too few
            GPUs, a bad CLUSTER_SPEC, or an input check of the config or a folder failed.
    """
    if not Path(model_dir, "config.json").is_file():
        raise TrainError(f"{model_dir}: base model folder has no config.json; stage the model first")
    gpu_count, gpu_memory = cluster.detect_gpus() if gpus is None else gpus
    _launch.check_gpu_count(expected_gpus, gpu_count)
    plan = cluster.launch_plan(environ, gpu_count)
    writable = {"work_dir": work_dir}
    if plan.is_chief:
        writable["adapter output"] = adapter_out
    if checkpoint_dir:
        writable["checkpoint_dir"] = checkpoint_dir
    _input_checks.check_inputs(swift_args, model_dir, writable, model_config=config)
    return _launch.Launch(plan, gpu_count, gpu_memory)


def run_node_preflight(
    plan: cluster.LaunchPlan,
    gpu_count: int,
    mode: str,
    *,
    work_dir: str,
    job_env: dict[str, str] | None = None,
    expected_gpus: int = 0,
    environ: dict[str, str] | None = None,
    device: str | None = None,
    sizes_mb: tuple[float, ...] | None = None,
    timeout_s: float | None = None,
) -> dict[str, float]:
    """Runs the GPU and interconnect preflight on this node (torchrun, bounded), before training.

    Every node of the job runs it at the same point, so the nodes meet in its rendezvous.

    Args:
        plan: This node's launch plan (nodes, node rank, master address, processes).
        gpu_count: GPUs on this node; 0 skips the check (CPU run) unless `device` is set.
        mode: "fail", "warn" or "off".
        work_dir: Folder for the figures (`preflight.json`).
        job_env: Extra environment variables (strings). Default None.
        expected_gpus: GPUs the profile asks for per node (0 = no check). Default 0.
        environ: Environment with CLUSTER_SPEC (for host names). Default None (os.environ).
        device: "cuda" or "cpu" (gloo; for tests) instead of deciding from `gpu_count`.
            Default None.
        sizes_mb: All-reduce sizes in MB. Default None (the preflight's default).
        timeout_s: Longest wait for every rank. Default None (PREFLIGHT_TIMEOUT_S on one
            node, PREFLIGHT_MULTI_NODE_TIMEOUT_S on several).

    Returns:
        On the chief, the Metrics-ready figures (preflight_tflops_min, preflight_busbw_gbps,
        preflight_seconds, preflight_gpus); {} elsewhere, when skipped, or when off.

    Raises:
        PreflightFailed: mode "fail" and a check failed, a rank did not join, or the check
            did not finish within its wall-clock bound.
    """
    if mode == "off":
        print("train-lora: preflight off", flush=True)
        return {}
    if device is None and not gpu_count:
        print("train-lora: preflight skipped: no GPU on this node (CPU run)", flush=True)
        return {}
    wait = timeout_s or (PREFLIGHT_TIMEOUT_S if plan.nnodes == 1 else PREFLIGHT_MULTI_NODE_TIMEOUT_S)
    opts = gpu_check.Options(
        mode=mode,
        expect_gpus=expected_gpus,
        timeout_s=wait,
        json_path=str(Path(work_dir) / "preflight.json"),
        device=device or "cuda",
    )
    if sizes_mb:
        opts.sizes_mb = tuple(sorted(sizes_mb))
    hosts = cluster.cluster_hosts(os.environ if environ is None else environ)
    outcome = gpu_check.run_launch(
        opts, plan, hosts=hosts, env={**os.environ, **(job_env or {})}, log=lambda line: print(line, flush=True)
    )
    summary = ", ".join(f"{k} {v:g}" for k, v in outcome.metrics.items())
    print(f"train-lora: preflight {'passed' if outcome.ok else 'found problems (mode warn)'}: {summary}", flush=True)
    return outcome.metrics if plan.is_chief else {}


@dataclass
class _Run:
    """How the training ran: wall time, where it resumed from, the micro-batch plan, out-of-memory re-plans, the
    speed-ups' start-up table the plugin wrote (None: no trainer was built, or not on this node) and the argument
    layers of the last attempt."""

    wall: float
    resume: Path | None
    plan: _plan.Plan | None
    replans: int = 0
    speedups: registry.Table | None = None
    unplanned: int = 0  # memory-relevant speed-ups the plan expected otherwise than the run's table says
    layered: _layers.Layered | None = None

    def metrics(self) -> dict[str, Any]:
        out = {} if self.plan is None else {**self.plan.metrics(), "oom_replans": self.replans}
        if self.layered is not None:
            out.update(self.layered.metrics())
        if self.speedups is not None:
            out.update(self.speedups.metrics())
            if self.plan is not None:
                out["speedups_unplanned"] = self.unplanned
        return out


def _resume_point(checkpoint_dir: str | None, plan: cluster.LaunchPlan) -> Path | None:
    """The newest complete durable checkpoint to resume from (None: from scratch).

    A multi-node chief also deletes the incomplete ones of an earlier attempt, so that node
    markers of that attempt never mix with this attempt's files.
    """
    if not checkpoint_dir:
        return None
    resume = _checkpoints.newest_complete_checkpoint(checkpoint_dir)
    if resume:
        print(f"train-lora: resuming from {resume}", flush=True)
    if plan.nnodes > 1 and plan.is_chief:
        for stale in _checkpoints.discard_incomplete(checkpoint_dir):
            print(f"train-lora: removed incomplete checkpoint {stale} of an earlier attempt", flush=True)
    return resume


def _train_until_it_fits(
    layers: list[_layers.Layer],
    plan: _plan.Plan | None,
    *,
    model_dir: str,
    model_type: str,
    inputs: _data.Inputs,
    launch: _launch.Launch,
    durable: _run_swift.Durability,
    job_env: dict[str, str],
    checkpoint_dir: str | None,
    expected: registry.Planned | None = None,
) -> _Run:
    """Runs `swift sft` with the argument layers (`_swift_args.task_layers`) plus the batch plan's and the inputs';
    with a planned micro-batch, an out-of-memory re-plans (smaller micro-batch, then checkpointing) and starts again
    from the last durable checkpoint, at most `_plan_run.MAX_OOM_REPLANS` times.

    The layer table is logged once, before the first attempt; a later attempt logs the lines that changed.
    Multi-node runs do not re-plan (every node would have to agree): they fail as before.
    """
    replans, shown = 0, []
    per_gpu = plan.micro_batch * plan.grad_accum if plan else 0
    while True:
        resume = _resume_point(checkpoint_dir, launch.plan)
        layered = _layers.merge([*layers, *_run_layers(layers, plan, model_dir, model_type, inputs, resume)])
        lines = layered.log_lines()
        for line in [line for line in lines if line not in shown]:
            print(line, flush=True)
        shown = lines
        cmd = _swift_args.command(layered)
        cmd[0] = swift_executable()
        print("train-lora:", " ".join(cmd), flush=True)
        table_path = inputs.work / "speedups.json"  # the plugin's start-up table (rank 0 writes it)
        table_path.unlink(missing_ok=True)
        try:
            run_env = {**job_env, **(plan.job_env() if plan else {}), registry.TABLE_ENV: str(table_path)}
            wall = _run_swift.run_swift(cmd, inputs, launch.plan, durable, run_env)
            table = _fit.read_speedups(table_path, launch.plan.is_chief)
            unplanned = _fit.unplanned(expected, table) if plan is not None else []
            return _Run(wall, resume, plan, replans, table, len(unplanned), layered)
        except _run_swift.SwiftFailed as exc:
            nxt = (
                _plan_run.replan_after_oom(plan, per_gpu) if plan and _plan_run.is_out_of_memory(exc.log_tail) else None
            )
            if nxt is None or launch.plan.nnodes > 1 or replans >= _plan_run.MAX_OOM_REPLANS:
                raise
            replans += 1
            print(
                f"train-lora: out of memory; re-plan {replans}/{_plan_run.MAX_OOM_REPLANS}: {nxt.reasons[-1]}",
                flush=True,
            )
            plan = nxt


def _run_layers(
    layers: list[_layers.Layer], plan: _plan.Plan | None, model_dir: str, model_type: str, inputs: _data.Inputs,
    resume: Path | None,
) -> list[_layers.Layer]:  # fmt: skip
    """The last two layers of one attempt: the batch plan's and the inputs' (datasets, output folder, resume point)."""
    inputs_layer = _swift_args.inputs_layer(
        _swift_args.planner_args(layers), model_dir, model_type, str(inputs.train_jsonl), inputs.eval_jsonl,
        str(inputs.output_dir), resume_from=str(resume) if resume else None,
    )  # fmt: skip
    return [_swift_args.batch_plan_layer(plan), inputs_layer]


def _collect_outputs(
    inputs: _data.Inputs,
    adapter_out: str,
    ref: dict[str, Any],
    *,
    is_chief: bool,
    wall: float,
    resume: Path | None,
    strategy: str,
) -> TrainResult:
    """Reads the training metrics; on the chief, writes the last checkpoint's adapter to `adapter_out`.

    Raises:
        TrainError: swift finished but wrote no checkpoint with an adapter.
    """
    output_dir = inputs.output_dir
    log_history = _data.read_trainer_log(output_dir)
    metrics = summarize_log(log_history)
    metrics.update({"wall_s": round(wall, 2), "n_train": float(inputs.n_train)})
    if resume:
        metrics["resumed_from_step"] = float(_checkpoints.checkpoint_step(resume) or 0)
    extra = {"resumed_from": str(resume or ""), "strategy": strategy}
    if not is_chief:
        return TrainResult("", "", metrics, log_history, is_chief=False, **extra)
    checkpoints = _data.find_checkpoints(output_dir)
    if not checkpoints:
        raise TrainError(f"{output_dir}: swift sft finished but wrote no checkpoint with an adapter")
    last = checkpoints[-1]
    if not log_history:
        log_history = _data.read_trainer_log(output_dir, last)
        metrics = {**summarize_log(log_history), **metrics}
    out = Path(adapter_out)
    out.mkdir(parents=True, exist_ok=True)
    for name in ADAPTER_FILES:
        if (last / name).is_file():
            shutil.copyfile(last / name, out / name)
    (out / BASE_MODEL_REF).write_text(json.dumps(ref, indent=2, sort_keys=True), encoding="utf-8")
    (out / LOG_HISTORY).write_text(json.dumps(log_history, indent=1), encoding="utf-8")
    return TrainResult(str(out), str(last), metrics, log_history, **extra)
