"""One rank of the preflight: measure, gather, evaluate, write the JSON (`run_worker`).

Part of the preflight (`components.common.preflight`, its docstring says what it checks and why).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

from components.common.errors import TrainError
from components.common.preflight.checks import Report, _count_problems, enforce, evaluate, failure_message
from components.common.preflight.expectations import NCCL_KNOBS, PreflightFailed
from components.common.preflight.measure import _ddp_figures, _gpu_entry, _link_figures
from components.common.preflight.options import Options
from components.common.preflight.rendezvous import _first_line, _Identity, _identity, rendezvous
from components.common.preflight.report import format_table, metrics_of

# --- the worker -------------------------------------------------------------------------------


def _resolve_device(device: str) -> str:
    if device in ("cpu", "cuda"):
        return device
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def _local_figures(me: _Identity, opts: Options) -> list[dict[str, Any]]:
    """This rank's GPU entries (all visible GPUs when it is the only process) after the local checks.

    Raises:
        PreflightFailed: CUDA is not usable, or (mode fail) the node's GPU count is wrong.
    """
    import torch

    if opts.device == "cuda":
        where = f"node {me.node_rank} ({me.hostname}) rank {me.rank}"
        if not torch.cuda.is_available():
            raise PreflightFailed(f"{where}: CUDA is not usable (torch.cuda.is_available() is False): driver, image")
        visible = torch.cuda.device_count()
        if me.local_rank >= visible:
            raise PreflightFailed(f"{where}: local rank {me.local_rank} but only {visible} GPU(s) are visible")
    else:
        visible = 0
    problems = _count_problems(
        [{"node_rank": me.node_rank, "hostname": me.hostname, "gpus_visible": visible}], opts.expect_gpus
    )
    if problems and opts.mode == "fail":
        raise PreflightFailed(failure_message(Report("fail", problems)))
    indices = range(visible) if me.world == 1 and visible else [me.local_rank if visible else -1]
    entries = []
    for index in indices:
        try:
            entries.append(_gpu_entry(torch, me, index, opts))
        except RuntimeError as exc:  # a CUDA error: ECC, XID, out of memory (a GPU held by another process)
            raise PreflightFailed(f"node {me.node_rank} ({me.hostname}) GPU {index}: CUDA error: {exc}") from None
    return entries


def _collective_figures(me: _Identity, opts: Options, local: list[dict[str, Any]]) -> dict[str, Any]:
    """Rendezvous, then the all-reduce and DDP figures of all ranks (one process: the local entries only).

    The process group stays up (`_teardown` ends it), so that rank 0 reports before the others exit.
    """
    figures: dict[str, Any] = {"device": opts.device, "backend": "-", "links": [], "ddp": None}
    if me.world == 1:
        return {**figures, "nnodes": 1, "world_size": 1, "gpus": local}
    import torch
    import torch.distributed as dist

    store = rendezvous(me, opts.timeout_s)
    backend = "nccl" if opts.device == "cuda" else "gloo"
    device = torch.device("cuda", me.local_rank) if opts.device == "cuda" else torch.device("cpu")
    dist.init_process_group(
        backend, store=dist.PrefixStore("pg/", store), rank=me.rank, world_size=me.world,
        timeout=timedelta(seconds=opts.op_timeout_s), device_id=device if device.type == "cuda" else None,
    )  # fmt: skip
    gathered: list[Any] = [None] * me.world
    dist.all_gather_object(gathered, local)
    gpus = [entry for entries in gathered for entry in entries]
    links = _link_figures(torch, dist, device, me, gpus, opts)
    ddp = _ddp_figures(torch, dist, device, me)
    nnodes = len({int(g["node_rank"]) for g in gpus})
    figures.update(backend=backend, nnodes=nnodes, world_size=me.world, gpus=gpus, links=links, ddp=ddp)
    return figures


def _teardown(barrier: bool) -> None:
    """Ends the process group (if any); with `barrier`, once every rank got there."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            if barrier:
                dist.barrier()
            dist.destroy_process_group()
    except RuntimeError:  # a rank is gone: nothing left to wait for
        pass


def _measure(me: _Identity, opts: Options, start: float) -> dict[str, Any]:
    """Every figure of this run (the process group stays up).

    Raises:
        PreflightFailed: A local check failed, a rank did not join (RendezvousTimeout),
            or a collective failed (an NCCL / gloo error or timeout).
    """
    local = _local_figures(me, opts)
    try:
        figures = _collective_figures(me, opts, local)
    except TrainError:
        raise
    except RuntimeError as exc:  # NCCL / gloo errors and timeouts are the interconnect's faults
        raise PreflightFailed(
            f"node {me.node_rank} ({me.hostname}) rank {me.rank}: a collective failed: {_first_line(exc)}. {NCCL_KNOBS}"
        ) from None
    figures.update(expected_gpus=opts.expect_gpus, seconds=round(time.monotonic() - start, 2))
    return figures


def _write_json(path: str, data: Mapping[str, Any]) -> None:
    if not path:
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    tmp.replace(target)


def _report_failure(me: _Identity, opts: Options, result: dict[str, Any], exc: PreflightFailed) -> int:
    """Records and prints a failure; returns the exit status (0 under --launch: the launcher reports)."""
    result.update(ok=False, error=str(exc), error_type=type(exc).__name__)
    launched = bool(opts.nnodes and opts.json_path)
    if me.local_rank == 0 or launched:
        _write_json(opts.json_path + ("" if me.local_rank == 0 else f".rank{me.local_rank}"), result)
    if launched or me.local_rank:
        print(f"preflight: rank {me.rank}: {type(exc).__name__}: {_first_line(exc)}", file=sys.stderr, flush=True)
    else:
        print(f"preflight: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    return 0 if launched else 1  # exit 0 under --launch: torchrun then lets the node's other ranks report theirs


def run_worker(opts: Options, environ: Mapping[str, str] | None = None) -> int:
    """One rank of the preflight: local checks, rendezvous, collectives, verdict.

    The chief (rank 0) prints the table; local rank 0 of each node writes the JSON
    (`figures`, `problems`, `warnings`, `metrics`; `error` and `error_type` on failure;
    under --launch the node's other ranks write their errors to `<json>.rank<N>`).

    Args:
        opts: The options.
        environ: Environment with torchrun's variables. Default None (os.environ).

    Returns:
        The exit status: 0 passed (or mode warn, or under --launch), 1 failed (the
        message is printed).
    """
    env = os.environ if environ is None else environ
    start = time.monotonic()
    opts.device = _resolve_device(opts.device)
    me = _identity(opts, env)
    result: dict[str, Any] = {"ok": False, "mode": opts.mode, "node_rank": me.node_rank, "hostname": me.hostname}
    try:
        figures = _measure(me, opts, start)
    except PreflightFailed as exc:
        _teardown(barrier=False)
        return _report_failure(me, opts, result, exc)
    report = evaluate(
        figures, opts.mode, expected_tflops=opts.expected_tflops, expected_busbw_gbps=opts.expected_busbw_gbps
    )
    result.update(figures=figures, metrics=metrics_of(figures), ok=report.ok)
    result.update(problems=[asdict(p) for p in report.problems], warnings=report.warnings)
    if me.rank == 0:
        print(format_table(figures, report), flush=True)
    status = 0
    try:
        enforce(report, log=(lambda line: print(line, flush=True)) if me.rank == 0 else (lambda line: None))
        if me.local_rank == 0:
            _write_json(opts.json_path, result)
    except PreflightFailed as exc:
        status = _report_failure(me, opts, result, exc)
    if me.rank == 0 and opts.json_path:
        print(f"preflight: figures written to {opts.json_path}", flush=True)
    _teardown(barrier=True)  # rank 0 has reported before any rank exits
    return status
