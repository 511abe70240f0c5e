"""Running `swift sft` once: its environment (CPU-only speed-ups, progress bars), the durable copy of its
checkpoints while it runs, SIGTERM (preemption), and a failure's message naming the likely knob."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from components.common import cluster
from components.common.errors import TrainError
from components.common.swift import SigtermForwarder, run_command
from components.train_lora import _checkpoints, _data

# Printed when SIGTERM arrives: what the task does next.
_SIGTERM_NOTICE = "stopping swift, then saving the last finished checkpoint"

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
class Durability:
    """Durable checkpoints and preemption: the train_lora arguments of the same names."""

    checkpoint_dir: str | None
    interval_s: float
    keep: int
    node_timeout_s: float
    term_wait_s: float
    grace_s: float


def run_swift(
    cmd: list[str], inputs: _data.Inputs, plan: cluster.LaunchPlan, durable: Durability, job_env: dict[str, str]
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
