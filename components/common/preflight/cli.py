"""`python -m components.common.preflight`: the command line.

Part of the preflight (`components.common.preflight`, its docstring says what it checks and why).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from components.common import cluster
from components.common.errors import TrainError
from components.common.preflight.expectations import DEFAULT_SIZES_MB, MODES, MODULE
from components.common.preflight.launch import run_launch
from components.common.preflight.options import Options
from components.common.preflight.worker import _resolve_device, run_worker

# --- command line -----------------------------------------------------------------------------


def _floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected sizes in MB separated by commas, e.g. 4,32,256; got {text!r}"
        ) from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive sizes in MB, e.g. 4,32,256; got {text!r}")
    return tuple(sorted(values))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m {MODULE}",
        description="GPU and interconnect health check; run under torchrun, as one process, or with --launch.",
    )
    p.add_argument("--launch", action="store_true", help="read CLUSTER_SPEC and start torchrun on this node")
    p.add_argument("--mode", choices=MODES, default="fail", help="fail (default), warn or off")
    p.add_argument("--expect-gpus", type=int, default=0, help="GPUs each node must have (0 = no check)")
    p.add_argument("--timeout-s", type=float, default=60.0, help="longest wait for all ranks to join (default 60)")
    p.add_argument("--op-timeout-s", type=float, default=60.0, help="timeout of each collective (default 60)")
    p.add_argument("--wall-s", type=float, default=None, help="--launch: hard bound in seconds (default: sum + 120)")
    p.add_argument("--json", dest="json_path", default="", help="write the figures and the verdict here")
    p.add_argument("--sizes-mb", type=_floats, default=DEFAULT_SIZES_MB, help="all-reduce sizes (default 4,32,256)")
    p.add_argument("--expected-tflops", type=float, default=None, help="override the table (simulate a fault)")
    p.add_argument("--expected-busbw", dest="expected_busbw_gbps", type=float, default=None, help="busbw floor GB/s")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="cpu: gloo, no GPU")
    p.add_argument("--matmul-n", type=int, default=0, help="matmul size (default 8192 on GPU, 256 on CPU)")
    p.add_argument("--budget-s", type=float, default=1.0, help="seconds per timed loop (default 1)")
    p.add_argument("--nproc", type=int, default=0, help="--launch: processes on this node (default: one per GPU)")
    p.add_argument("--nnodes", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--node-rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--master-addr", default="127.0.0.1", help=argparse.SUPPRESS)
    p.add_argument("--master-port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--hosts", type=lambda s: tuple(h for h in s.split(",") if h), default=(), help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Command line; returns the exit status (errors are one message, no stack trace)."""
    args = vars(_parser().parse_args(argv))
    launch, wall_s = args.pop("launch"), args.pop("wall_s")
    opts = Options(**args)
    try:
        if not launch:
            return run_worker(opts)
        opts.device = _resolve_device(opts.device)
        gpu_count = cluster.detect_gpus()[0] if opts.device == "cuda" else 0
        plan = cluster.launch_plan(os.environ, opts.nproc or gpu_count)
        outcome = run_launch(opts, plan, hosts=cluster.cluster_hosts(os.environ), wall_s=wall_s)
        print(f"preflight: node {plan.node_rank}: {'PASSED' if outcome.ok else 'problems (mode warn)'}", flush=True)
        return 0
    except TrainError as exc:
        print(f"preflight: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
