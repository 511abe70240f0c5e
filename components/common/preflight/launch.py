"""One torchrun per node, bounded in wall-clock time, and what it found (`run_launch`).

Part of the preflight (`components.common.preflight`, its docstring says what it checks and why).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from components.common import cluster
from components.common.preflight.checks import Problem, Report, failure_message
from components.common.preflight.expectations import MODULE, NCCL_KNOBS, PORT_OFFSET, PreflightFailed, RendezvousTimeout
from components.common.preflight.nccl_transport import NcclTransport, expected_network, mismatch, parse_nccl_log, seen
from components.common.preflight.options import Options
from components.common.preflight.report import metrics_of

# --- launch: one torchrun per node ------------------------------------------------------------


def launch_command(
    opts: Options, plan: cluster.LaunchPlan, port: int, hosts: Sequence[str] = (), python: str = sys.executable
) -> list[str]:
    """The torchrun command that runs this node's part of the preflight.

    torchrun runs standalone on this node (its own free port); the nodes meet at the
    preflight's own rendezvous (`rendezvous`), which names a missing node instead of
    hanging in torchrun's.

    Args:
        opts: The options (`worker_args` are passed on).
        plan: This node's launch plan (nodes, node rank, master address, processes).
        port: The rendezvous port on the master (not training's).
        hosts: Hostnames by node rank, for messages. Default ().
        python: The interpreter. Default sys.executable.

    Returns:
        The argv.
    """
    cmd = [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(plan.nproc_per_node)]
    cmd += ["-m", MODULE, "--nnodes", str(plan.nnodes), "--node-rank", str(plan.node_rank)]
    cmd += ["--master-addr", plan.master_addr or "127.0.0.1", "--master-port", str(port)]
    if hosts:
        cmd += ["--hosts", ",".join(hosts)]
    return cmd + opts.worker_args()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_bounded(cmd: list[str], env: Mapping[str, str], wall_s: float, log: Any) -> tuple[int | None, str]:
    """Runs a command in its own process group, streaming its output; kills the group after `wall_s`.

    Returns:
        (exit code, or None when it was killed at the bound; the last 8 kB of output).
    """
    from components.common.swift import end_watchdog, start_watchdog

    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(env), text=True, start_new_session=True
    )
    watchdog = start_watchdog(proc.pid)  # torchrun and its workers die with this process, even on kill -9
    tail: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            log(line.rstrip("\n"))
            tail.append(line)
            del tail[:-200]

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code: int | None = proc.wait(timeout=wall_s)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.5 if sig == signal.SIGTERM else 0)
        proc.wait()
        end_watchdog(watchdog)
    reader.join(timeout=5)
    return code, "".join(tail)[-8000:]


def _read_results(json_path: str) -> dict[str, Any]:
    """Local rank 0's JSON, with the errors of the node's other ranks (`<json>.rank<N>`) appended."""
    results = []
    for path in [Path(json_path), *sorted(Path(json_path).parent.glob(Path(json_path).name + ".rank*"))]:
        try:
            results.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError):
            continue
    if not results:
        return {}
    first = results[0] if Path(json_path).is_file() else {"ok": False}
    errors = list(dict.fromkeys(str(r["error"]) for r in results if r.get("error")))
    if errors:
        first["error"] = "\n".join(errors)
        first["error_type"] = next(r["error_type"] for r in results if r.get("error"))
    return first


@dataclass
class Outcome:
    """What a node's preflight (`run_launch`) found.

    Attributes:
        ok: Every check passed.
        metrics: `metrics_of` the figures ({} without figures).
        figures: The figures (None when the run did not get that far).
        message: Why it did not pass ("" when ok).
    """

    ok: bool
    metrics: dict[str, float] = field(default_factory=dict)
    figures: dict[str, Any] | None = None
    message: str = ""


def nccl_figures(nccl: NcclTransport, env: Mapping[str, str], log: Any = print) -> dict[str, str]:
    """The `nccl` entry of the figures: what NCCL chose and what the environment set up; a mismatch is logged.

    Args:
        nccl: What NCCL's INFO lines said (`parse_nccl_log`).
        env: The environment preflight's torchrun ran with.
        log: Prints one line. Default print.

    Returns:
        {"version", "network", "plugin", "transport", "gpudirect", "expected"}.
    """
    expected = expected_network(env)
    warning = mismatch(nccl, expected)
    if warning:
        log(f"preflight: WARNING: {warning}")
    return {
        "version": nccl.version,
        "network": nccl.network,
        "plugin": nccl.plugin,
        "transport": nccl.transport,
        "gpudirect": nccl.gpudirect,
        "expected": expected,
    }


def _run_reading_nccl(cmd: list[str], env: dict[str, str], bound: float, log: Any) -> tuple[int | None, str, Any]:
    """`_run_bounded`, and what NCCL's INFO lines in the output say it chose (logged as one line)."""
    lines: list[str] = []

    def keep(line: str) -> None:
        lines.append(line)
        log(line)

    code, tail = _run_bounded(cmd, env, bound, keep)
    nccl = parse_nccl_log(lines)
    if seen(nccl):
        log(f"preflight: {nccl.summary()}")
    return code, tail, nccl


def run_launch(
    opts: Options,
    plan: cluster.LaunchPlan,
    *,
    hosts: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    wall_s: float | None = None,
    log: Any = print,
) -> Outcome:
    """Runs this node's part of the preflight under torchrun, bounded in wall-clock time.

    Args:
        opts: The options (mode, expectations, timeouts, JSON path, device).
        plan: This node's launch plan (`cluster.launch_plan`); nproc_per_node processes.
        hosts: Hostnames by node rank (CLUSTER_SPEC), for messages. Default ().
        env: Environment of torchrun (with the job environment). Default None (os.environ).
        wall_s: Hard bound: the process group is killed after this many seconds.
            Default None (timeout_s + op_timeout_s + 120).
        log: Prints one line of output. Default print.

    Returns:
        The Outcome (mode warn: also when it failed; the warning was logged).

    Raises:
        PreflightFailed: mode fail and a check failed, a rank did not join
            (RendezvousTimeout), or the run did not finish within `wall_s`.
    """
    if opts.mode == "off":
        log("preflight: off")
        return Outcome(True, message="off")
    port = plan.master_port + PORT_OFFSET if plan.nnodes > 1 else (opts.master_port or _free_port())
    json_path = opts.json_path or str(Path(tempfile.mkdtemp(prefix="preflight-")) / "preflight.json")
    run_opts = Options(**{**asdict(opts), "json_path": json_path})
    cmd = launch_command(run_opts, plan, port, hosts)
    bound = wall_s if wall_s is not None else opts.timeout_s + opts.op_timeout_s + 120
    root = str(Path(__file__).resolve().parents[2])
    base = dict(os.environ if env is None else env)
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [root, base.get("PYTHONPATH", "")]))
    if opts.device != "cpu" and "NCCL_DEBUG" not in base:  # what NCCL chose, reported below (nccl_transport)
        base.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET")
    log(f"preflight: node {plan.node_rank}/{plan.nnodes}, {plan.nproc_per_node} process(es): {' '.join(cmd)}")
    for stale in [Path(json_path), *Path(json_path).parent.glob(Path(json_path).name + ".rank*")]:
        stale.unlink(missing_ok=True)
    code, tail, nccl = _run_reading_nccl(cmd, base, bound, log)
    result = _read_results(json_path)
    figures = result.get("figures")
    if figures is not None and seen(nccl):
        figures["nccl"] = nccl_figures(nccl, base, log)
    outcome = Outcome(code == 0 and bool(result.get("ok")), metrics_of(figures), figures)
    if outcome.ok:
        return outcome
    error: type[PreflightFailed] = (
        RendezvousTimeout if result.get("error_type") == "RendezvousTimeout" else PreflightFailed
    )
    if code is None:
        outcome.message = (
            f"preflight did not finish within {bound:g} s and was stopped (a hung collective?). {NCCL_KNOBS}"
        )
    elif result.get("error"):
        outcome.message = str(result["error"])
    elif code != 0:
        last = [line for line in tail.splitlines() if line.strip()][-5:]
        outcome.message = f"preflight's torchrun exited with code {code}; last lines:\n" + "\n".join(last)
    else:
        outcome.message = failure_message(Report(opts.mode, [Problem(**p) for p in result.get("problems", [])]))
    if opts.mode == "fail":
        raise error(outcome.message)
    if code != 0:  # mode warn, no verdict from the workers: say so once
        log(f"preflight: WARNING (mode warn, training goes on): {outcome.message}")
    return outcome
