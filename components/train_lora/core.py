"""Train a LoRA adapter with `swift sft` on a staged model and validated datasets.

`build_sft_command` is a pure function from the config's `swift` section (ms-swift's own
argument names, passed through unchanged) plus the task's inputs to the command line;
`train_lora` first runs the GPU and interconnect preflight on every node
(`components.common.preflight`, skipped without a GPU), then the command, then
collects the adapter and the training metrics (with the chief's preflight figures). Running the
command (`components.common.swift`) and the adapter folder's layout
(`components.common.adapter`) are shared with merge-export.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.common import cluster, cost, tracking
from components.common import preflight as gpu_check
from components.common.adapter import ADAPTER_FILES, BASE_MODEL_REF, LOG_HISTORY, summarize_log
from components.common.dataset import checked_rows_file, read_token_stats
from components.common.errors import TrainError  # re-exported: core.TrainError
from components.common.manifest import ManifestError, write_manifest
from components.common.provenance import strip_origin
from components.common.snapshot import LINEAGE_FILE
from components.common.swift import (
    RESERVED_ARGS,
    SigtermForwarder,
    run_command,
    swift_arg_problem,
    swift_executable,
    to_cli,
)
from components.train_lora import _checkpoints, _input_checks, _launch, _plan
from components.train_lora.job_env import check_job_env, job_env_strings
from speedups import registry
from speedups.model_config import quantization_of

# Set by the task from its inputs; a config that sets them is refused.
PLUGIN = str(Path(registry.__file__).parent / "swift_plugin.py")
# Printed when SIGTERM arrives: what the task does next.
_SIGTERM_NOTICE = "stopping swift, then saving the last finished checkpoint"
# How long each node's preflight waits for every rank to join, seconds: the ranks of one
# node start together; the replicas of a multi-node Vertex job can start minutes apart
# (provisioning, image pull), and a missing one is named when this runs out.
PREFLIGHT_TIMEOUT_S = 60.0
PREFLIGHT_MULTI_NODE_TIMEOUT_S = 600.0


@dataclass
class TrainResult:
    """What training produced.

    Attributes:
        adapter_dir: Folder with the adapter weights/config, args.json and base_model.json.
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


def materialize_dataset(dataset_dir: str | Path, out_jsonl: str | Path, expected_marker: str = "") -> int:
    """Writes a dataset folder's rows with absolute image paths (what `swift sft` reads).

    Each row's provenance key (`components.common.provenance.ORIGIN_KEY`) is left out: ms-swift
    would drop it anyway (`remove_unused_columns`), and this way no setting can pass it on.

    Args:
        dataset_dir: A validated dataset folder (data.jsonl + images/).
        out_jsonl: The JSONL to write.
        expected_marker: The sha256 of its completion marker as validate-data recorded it (the
            artifact's `manifest_sha256`): a marker removed or edited since is caught too.
            Default "" (checked when the folder has a marker).

    Returns:
        Number of rows.

    Raises:
        TrainError: The folder has no data.jsonl, its files differ from its completion marker
            (`components.common.manifest`), or a referenced image is missing.
    """
    base = Path(dataset_dir)
    try:
        src = checked_rows_file(base, expected_marker)
    except ManifestError as exc:
        raise TrainError(str(exc)) from None
    n = 0
    with open(src, encoding="utf-8") as fin, open(out_jsonl, "w", encoding="utf-8") as fout:
        for number, line in enumerate(fin, start=1):
            row = json.loads(line)
            images = []
            for ref in row.get("images", []):
                path = (base / ref).resolve()
                if not path.is_file():
                    raise TrainError(f"{src}:{number}: image {ref!r} not found in the dataset folder")
                images.append(str(path))
            if "images" in row:
                row["images"] = images
            row = strip_origin(row)  # validate-data's provenance is for reports, never for the model
            fout.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def find_checkpoints(output_dir: str | Path) -> list[Path]:
    """Returns swift's checkpoint-N folders holding an adapter, oldest step first."""
    return [
        p
        for p in _checkpoints.checkpoint_folders(output_dir)
        if (p / "adapter_model.safetensors").is_file() and (p / "adapter_config.json").is_file()
    ]


def read_trainer_log(output_dir: Path, checkpoint: Path | None = None) -> list[dict[str, Any]]:
    """Returns the training log entries (loss, eval_loss, speed, memory per logging step).

    ms-swift appends every log entry, the final summary (train_runtime, samples/s)
    included, to `<output_dir>/logging.jsonl`; a checkpoint's trainer_state.json holds only
    the entries up to that checkpoint. The first is read when present.
    """
    log = Path(output_dir) / "logging.jsonl"
    entries: list[dict[str, Any]] = []
    if log.is_file():
        for line in log.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(entry, dict) and ("loss" in entry or "eval_loss" in entry or "train_runtime" in entry):
                entries.append(entry)
    if entries or checkpoint is None:
        return entries
    state = checkpoint / "trainer_state.json"
    if not state.is_file():
        return []
    return json.loads(state.read_text(encoding="utf-8")).get("log_history", [])


_FAILURES = (
    (
        "CUDA out of memory",
        "CUDA out of memory: lower swift.per_device_train_batch_size or swift.max_length, "
        "set swift.gradient_checkpointing: true, or use a ZeRO-3 / larger-GPU profile",
    ),
    ("OutOfMemoryError", "out of memory: lower swift.per_device_train_batch_size or swift.max_length"),
    ("NCCL", "NCCL error between workers: check the network between nodes, or raise the NCCL timeout"),
    ("Target modules", "swift.target_modules names modules the model does not have; use all-linear or real names"),
)


class SwiftFailed(TrainError):
    """`swift sft` exited non-zero; the message names the likely knob, `log_tail` holds its last lines."""

    def __init__(self, message: str, log_tail: str):
        super().__init__(message)
        self.log_tail = log_tail


def _explain_failure(log_tail: str, code: int) -> str:
    for needle, advice in _FAILURES:
        if needle in log_tail:
            return advice
    last = [line for line in log_tail.strip().splitlines() if line.strip()][-1:] or ["(no output)"]
    return f"swift sft exited with code {code}; last line: {last[0]}"


# CPU-only runs (the local demo): one intra-op thread per process and a glibc malloc that
# keeps freed memory instead of returning it to the OS after every step. On a 2-core machine
# this halves the time per training step (the step is dominated by page faults and thread
# hand-offs around the 151936-wide LM head, not by arithmetic).
CPU_SPEED_ENV = {
    "OMP_NUM_THREADS": "1",
    "MALLOC_MMAP_THRESHOLD_": "2147483647",
    "MALLOC_TRIM_THRESHOLD_": "4294967296",
    "MALLOC_TOP_PAD_": "536870912",
}


def cpu_speed_env(cuda_available: bool, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Returns environment variables that speed up `swift sft` on a CPU-only machine.

    Args:
        cuda_available: Whether a GPU is usable; then nothing is returned.
        environ: The current environment (default os.environ); variables already set
            there are left alone, so a user's choice wins.

    Returns:
        The variables of CPU_SPEED_ENV that are not set yet ({} with a GPU).
    """
    if cuda_available:
        return {}
    current = os.environ if environ is None else environ
    return {k: v for k, v in CPU_SPEED_ENV.items() if k not in current}


# A progress bar in a log file (Vertex, kfp.local) writes a line per refresh: 188 lines for 160
# steps. One refresh per 30 s keeps the log readable; ms-swift's own loss lines are unaffected.
LOG_PROGRESS_ENV = {"TQDM_MININTERVAL": "30"}


def log_progress_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The progress-bar settings for a run whose output goes to a log (a user's own setting wins)."""
    current = os.environ if environ is None else environ
    return {k: v for k, v in LOG_PROGRESS_ENV.items() if k not in current}


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no torch here means no GPU either
        return False


class Preempted(TrainError):
    """SIGTERM (Vertex preemption) stopped training; a restart resumes from the last durable checkpoint."""


def _preempted(sync: _checkpoints.CheckpointSync | None, checkpoint_dir: str | None, wait_s: float) -> Preempted:
    """The last durable copy after SIGTERM, and the error that says where a restart resumes."""
    if sync is None or not checkpoint_dir:
        return Preempted(
            "preempted: no checkpoint_dir is set, so nothing was saved durably; the restarted job starts from scratch"
        )
    if not sync.drain(wait_s):
        print(
            f"train-lora: WARNING: checkpoint(s) {sync.outstanding()} still wait on another node's marker; "
            "they stay incomplete",
            flush=True,
        )
    newest = _checkpoints.newest_complete_checkpoint(checkpoint_dir, deep=False)
    if newest is None:
        return Preempted(
            f"preempted: last durable checkpoint is none (no complete checkpoint in {checkpoint_dir} "
            "yet); the restarted job starts from scratch"
        )
    return Preempted(
        f"preempted: last durable checkpoint is {_checkpoints.checkpoint_step(newest)} ({newest}); "
        "the restarted job resumes from it"
    )


@dataclass(frozen=True)
class _Launch:
    """How this node trains: the launch plan and the GPUs it has."""

    plan: cluster.LaunchPlan
    gpu_count: int  # GPUs visible on this node
    gpu_memory: int  # bytes per GPU


@dataclass(frozen=True)
class _Inputs:
    """The datasets as `swift sft` reads them, in the work folder."""

    work: Path
    train_jsonl: Path
    eval_jsonl: str  # "" = no eval during training
    n_train: int

    @property
    def output_dir(self) -> Path:
        """swift's output_dir (local checkpoints and logging.jsonl)."""
        return self.work / "output"


@dataclass(frozen=True)
class _Durability:
    """Durable checkpoints and preemption: the train_lora arguments of the same names."""

    checkpoint_dir: str | None
    interval_s: float
    keep: int
    node_timeout_s: float
    term_wait_s: float
    grace_s: float


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
    gpu_check.check_mode(preflight, "preflight")
    check_job_env(job_env or {}, "job_env")
    extra_env = job_env_strings(job_env)
    durable = _Durability(checkpoint_dir, checkpoint_interval_s, keep_checkpoints, node_timeout_s, term_wait_s, grace_s)
    launch = _plan_launch(
        model_dir,
        swift_args,
        adapter_out,
        work_dir,
        checkpoint_dir,
        expected_gpus=expected_gpus,
        environ=environ,
        gpus=gpus,
    )
    checked = run_node_preflight(
        launch.plan, launch.gpu_count, preflight, work_dir=work_dir, job_env=extra_env, expected_gpus=expected_gpus,
        environ=environ,
    )  # fmt: skip
    inputs = _materialize_inputs(work_dir, train_dir, eval_dir, dataset_markers or {})
    args, strategy = _final_swift_args(
        swift_args, model_dir, launch, ddp_timeout_s=ddp_timeout_s, environ=environ, checkpoint_dir=checkpoint_dir
    )
    try:  # MLflow (MLFLOW_TRACKING_URI in the job environment): report_to mlflow, the server checked before swift
        args, tracking_env = tracking.prepare_training(args, extra_env, train_dir, adapter_out)
    except tracking.TrackingError as exc:
        raise TrainError(str(exc)) from None
    extra_env.update(tracking_env)
    expected = _planned_speedups(args, model_dir, launch, extra_env)
    batch_plan = _micro_batch_plan(args, model_dir, train_dir, launch, strategy.name, extra_env, expected)
    if launch.plan.is_chief:
        _log_expected_time(args, batch_plan, train_dir, launch, (base_model_ref or {}).get("source", ""), model_dir)
    run = _train_until_it_fits(
        args, batch_plan, model_dir=model_dir, model_type=model_type, inputs=inputs, launch=launch, durable=durable,
        job_env=extra_env, checkpoint_dir=checkpoint_dir, expected=expected,
    )  # fmt: skip
    ref = {"model_dir": model_dir, "model_type": model_type, **(base_model_ref or {})}
    result = _collect_outputs(
        inputs,
        adapter_out,
        ref,
        is_chief=launch.plan.is_chief,
        wall=run.wall,
        resume=run.resume,
        strategy=strategy.name,
    )
    if result.is_chief:
        result.metrics.update(checked)
        result.metrics.update(run.metrics())
        result.speedups = run.speedups.rows() if run.speedups is not None else []
        gpus = launch.gpu_count * launch.plan.nnodes  # wall time x GPUs: what the job held, start-up included
        result.metrics["gpu_hours"] = round((time.time() - started) / 3600 * gpus, 4)
    lineage = Path(train_dir) / LINEAGE_FILE  # the data lineage goes on with the adapter
    if result.is_chief and lineage.is_file():
        shutil.copyfile(lineage, Path(adapter_out) / LINEAGE_FILE)
    if result.is_chief:  # last: a reuse of the adapter checks its files against this marker
        result.manifest_sha256 = write_manifest(adapter_out, producer="train-lora")
    return result


def _active_billions(model_dir: str) -> tuple[float, bool]:
    """(Billions of parameters a token passes through, whether the model is a mixture of experts), from the
    staged weights (bf16 = 2 bytes a parameter) and config: the cost estimate's size when the name has none."""
    config = _input_checks.load_model_config(model_dir)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    total = _launch.model_weight_bytes(model_dir, "bfloat16") / 2
    experts = _input_checks.expert_count(config)
    active = text.get("num_experts_per_tok")
    if not (isinstance(active, int) and experts):
        return total / 1e9, False
    expert_params = (
        _input_checks.wrapped_parameter_bytes(
            {"target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"], "torch_dtype": "bfloat16"},
            model_dir,
        )
        / 2
    )
    return (total - expert_params * (1 - active / experts)) / 1e9, True


def _log_expected_time(
    args: dict[str, Any], plan: _plan.Plan | None, train_dir: str, launch: _Launch, model_source: str, model_dir: str
) -> None:
    """Logs the expected training time and GPU-hours (`components.common.cost`), when they can be estimated."""
    if not launch.gpu_count:
        return
    import torch

    billions, moe = _active_billions(model_dir)

    micro = plan.micro_batch if plan else int(args.get("per_device_train_batch_size") or 1)
    line = cost.training_log_line(
        args if not plan else {**args, **plan.swift_args()},
        read_token_stats(train_dir),
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


@dataclass
class _Run:
    """How the training ran: wall time, where it resumed from, the micro-batch plan, out-of-memory re-plans, and the
    speed-ups' start-up table the plugin wrote (None: no trainer was built, or not on this node)."""

    wall: float
    resume: Path | None
    plan: _plan.Plan | None
    replans: int = 0
    speedups: registry.Table | None = None
    unplanned: int = 0  # memory-relevant speed-ups the plan expected otherwise than the run's table says

    def metrics(self) -> dict[str, Any]:
        out = {} if self.plan is None else {**self.plan.metrics(), "oom_replans": self.replans}
        if self.speedups is not None:
            out.update(self.speedups.metrics())
            if self.plan is not None:
                out["speedups_unplanned"] = self.unplanned
        return out


def _job_setting(job_env: dict[str, str], name: str) -> str:
    """A train-lora plugin setting as the training job will see it: the environment section, else this process's."""
    return str(job_env.get(name) or os.environ.get(name, ""))


def _planned_speedups(
    args: dict[str, Any], model_dir: str, launch: _Launch, job_env: dict[str, str]
) -> registry.Planned:
    """Which speed-up items the training job will apply (`registry.planned`: switches as the job will see them, the
    packages' versions, the targets importable, what the run's arguments and model config allow)."""
    return registry.planned(
        {**os.environ, **job_env},
        launch.plan.world_size,
        args,
        _input_checks.load_model_config(model_dir),
        gpu=bool(launch.gpu_count),
    )


def _micro_batch_plan(
    args: dict[str, Any],
    model_dir: str,
    train_dir: str,
    launch: _Launch,
    strategy: str,
    job_env: dict[str, str],
    expected: registry.Planned | None = None,
) -> _plan.Plan | None:
    """Resolves `auto` micro-batch / checkpointing (`_plan`); None when the config fixes both. The memory flags
    come from the speed-up items expected to apply (`expected`, else `_planned_speedups`)."""
    if not _plan.wants_plan(args):
        return None
    world = launch.plan.world_size
    if not launch.gpu_count:
        per_gpu = _plan.samples_per_step(args, world) // world
        checkpointing = args.get("gradient_checkpointing")
        plan = _plan.Plan(
            1, per_gpu, checkpointing is True, 0, 0, ("no GPU: micro-batch 1 (the planner sizes for GPU memory)",)
        )
    else:
        cap = _job_setting(job_env, "VLM_LORA_GPU_MEMORY_GIB")
        model_config = _input_checks.load_model_config(model_dir)
        expected = expected or _planned_speedups(args, model_dir, launch, job_env)
        gpu_bytes = min(launch.gpu_memory, int(float(cap) * _plan.GIB)) if cap else launch.gpu_memory
        plan = _plan.plan_for_run(
            args,
            model_config=model_config,
            weight_bytes=_launch.model_weight_bytes(model_dir, args.get("torch_dtype"), quantization_of(args)),
            token_stats=read_token_stats(train_dir),
            gpu_bytes=gpu_bytes,
            world_size=world,
            zero3="zero3" in str(args.get("deepspeed", "")) or strategy == "zero3",
            wrapped_bytes=_input_checks.wrapped_parameter_bytes(args, model_dir),
            **expected.memory_flags(),
        )
    for reason in plan.reasons:
        print(f"train-lora: plan: {reason}", flush=True)
    return plan


def _train_until_it_fits(
    args: dict[str, Any],
    plan: _plan.Plan | None,
    *,
    model_dir: str,
    model_type: str,
    inputs: _Inputs,
    launch: _Launch,
    durable: _Durability,
    job_env: dict[str, str],
    checkpoint_dir: str | None,
    expected: registry.Planned | None = None,
) -> _Run:
    """Runs `swift sft`; with a planned micro-batch, an out-of-memory re-plans (smaller micro-batch, then
    checkpointing) and starts again from the last durable checkpoint, at most `_plan.MAX_OOM_REPLANS` times.

    Multi-node runs do not re-plan (every node would have to agree): they fail as before.
    """
    replans = 0
    per_gpu = plan.micro_batch * plan.grad_accum if plan else 0
    while True:
        resume = _resume_point(checkpoint_dir, launch.plan)
        run_args = {**args, **(plan.swift_args() if plan else {})}
        cmd = build_sft_command(
            run_args, model_dir, model_type, str(inputs.train_jsonl), inputs.eval_jsonl, str(inputs.output_dir),
            resume_from=str(resume) if resume else None,
        )  # fmt: skip
        cmd[0] = swift_executable()
        print("train-lora:", " ".join(cmd), flush=True)
        table_path = inputs.work / "speedups.json"  # the plugin's start-up table (rank 0 writes it)
        table_path.unlink(missing_ok=True)
        try:
            run_env = {**job_env, **(plan.job_env() if plan else {}), registry.TABLE_ENV: str(table_path)}
            wall = _run_swift(cmd, inputs, launch.plan, durable, run_env)
            table = _read_speedups(table_path, launch.plan.is_chief)
            unplanned = _unplanned(expected, table) if plan is not None else []
            return _Run(wall, resume, plan, replans, table, len(unplanned))
        except SwiftFailed as exc:
            nxt = _plan.replan_after_oom(plan, per_gpu) if plan and _plan.is_out_of_memory(exc.log_tail) else None
            if nxt is None or launch.plan.nnodes > 1 or replans >= _plan.MAX_OOM_REPLANS:
                raise
            replans += 1
            print(
                f"train-lora: out of memory; re-plan {replans}/{_plan.MAX_OOM_REPLANS}: {nxt.reasons[-1]}", flush=True
            )
            plan = nxt


def _read_speedups(path: Path, is_chief: bool) -> registry.Table | None:
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


def _unplanned(expected: registry.Planned | None, table: registry.Table | None) -> list[str]:
    """One line per memory-relevant item the planner expected otherwise than the run's table says (logged)."""
    if expected is None or table is None:
        return []
    lines = registry.disagreements(expected, table)
    for line in lines:
        print(f"train-lora: speed-ups: {line}", flush=True)
    return lines


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
) -> _Launch:
    """Checks what can be checked before any work: base model, GPU count, cluster spec, config, folders.

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
    _input_checks.check_inputs(swift_args, model_dir, writable)
    return _Launch(plan, gpu_count, gpu_memory)


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


def _materialize_inputs(work_dir: str, train_dir: str, eval_dir: str, markers: dict[str, str] | None = None) -> _Inputs:
    """Writes the datasets' rows with absolute image paths into the work folder.

    swift's local output folder of an earlier call with the same work folder is removed first:
    swift appends to its `logging.jsonl` (the metrics would mix both runs) and a stale
    `checkpoint-N` of a longer run would be taken for this run's adapter. Resuming reads the
    durable folder only, never this one.
    """
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    stale = work / "output"
    if stale.exists():
        print(f"train-lora: removing {stale} (the local output of an earlier run in this work folder)", flush=True)
        shutil.rmtree(stale)
    train_jsonl = work / "train.jsonl"
    markers = markers or {}
    n_train = materialize_dataset(train_dir, train_jsonl, markers.get(train_dir, ""))
    eval_jsonl = ""
    if eval_dir:
        eval_jsonl = str(work / "eval.jsonl")
        materialize_dataset(eval_dir, eval_jsonl, markers.get(eval_dir, ""))
    return _Inputs(work, train_jsonl, eval_jsonl, n_train)


def _final_swift_args(
    swift_args: dict[str, Any],
    model_dir: str,
    launch: _Launch,
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


def _run_swift(
    cmd: list[str], inputs: _Inputs, plan: cluster.LaunchPlan, durable: _Durability, job_env: dict[str, str]
) -> float:
    """Runs `swift sft` (with the job environment), copying its finished checkpoints durably meanwhile.

    Returns the wall time in seconds.

    Raises:
        Preempted: SIGTERM arrived; swift's process group was stopped and the last
            finished checkpoints were copied within the grace period.
        TrainError: swift exited non-zero (the message names the likely knob).
    """
    start = time.time()
    env = cpu_speed_env(_cuda_available(), {**os.environ, **job_env})
    if env:
        print("train-lora: CPU-only, setting", " ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    env.update(log_progress_env({**os.environ, **job_env}))
    if job_env:
        print("train-lora: job environment:", " ".join(f"{k}={v}" for k, v in sorted(job_env.items())), flush=True)
    env.update(job_env)
    env.update(plan.env)
    sync = None
    if durable.checkpoint_dir:
        sync = _checkpoints.CheckpointSync(
            inputs.output_dir,
            durable.checkpoint_dir,
            durable.interval_s,
            durable.keep,
            node_rank=plan.node_rank,
            nnodes=plan.nnodes,
            node_timeout_s=durable.node_timeout_s,
        ).start()
    with SigtermForwarder(durable.term_wait_s, log_name="train-lora", notice=_SIGTERM_NOTICE) as guard:
        try:
            code, tail = run_command(cmd, env=env, log_path=inputs.work / "swift_sft.log", guard=guard)
        finally:
            if sync is not None:
                sync.stop(final=False)
        if guard.received_at is not None:
            raise _preempted(sync, durable.checkpoint_dir, durable.grace_s - (time.monotonic() - guard.received_at))
    wall = time.time() - start
    if code != 0:
        raise SwiftFailed(_explain_failure(tail, code), tail)
    if sync is not None and not sync.drain(durable.node_timeout_s, final=True):
        print(
            f"train-lora: WARNING: checkpoint(s) {sync.outstanding()} lack another node's files; they stay incomplete",
            flush=True,
        )
    return wall


def _collect_outputs(
    inputs: _Inputs,
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
    log_history = read_trainer_log(output_dir)
    metrics = summarize_log(log_history)
    metrics.update({"wall_s": round(wall, 2), "n_train": float(inputs.n_train)})
    if resume:
        metrics["resumed_from_step"] = float(_checkpoints.checkpoint_step(resume) or 0)
    extra = {"resumed_from": str(resume or ""), "strategy": strategy}
    if not is_chief:
        return TrainResult("", "", metrics, log_history, is_chief=False, **extra)
    checkpoints = find_checkpoints(output_dir)
    if not checkpoints:
        raise TrainError(f"{output_dir}: swift sft finished but wrote no checkpoint with an adapter")
    last = checkpoints[-1]
    if not log_history:
        log_history = read_trainer_log(output_dir, last)
        metrics = {**summarize_log(log_history), **metrics}
    out = Path(adapter_out)
    out.mkdir(parents=True, exist_ok=True)
    for name in ADAPTER_FILES:
        if (last / name).is_file():
            shutil.copyfile(last / name, out / name)
    (out / BASE_MODEL_REF).write_text(json.dumps(ref, indent=2, sort_keys=True), encoding="utf-8")
    (out / LOG_HISTORY).write_text(json.dumps(log_history, indent=1), encoding="utf-8")
    return TrainResult(str(out), str(last), metrics, log_history, **extra)
