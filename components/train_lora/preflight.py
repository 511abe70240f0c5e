"""GPU and interconnect health check ("preflight") that train-lora runs on every node before `swift sft`.

It finds, in about a minute, the faults that otherwise cost hours of a multi-GPU job: a
GPU missing or held by another process, a slow (throttled, faulty) GPU, NCCL on the wrong
network interface or without NVLink, a node that never joins, a broken DDP gradient sync.

Run it yourself:

    # every GPU of this machine, one process per GPU
    torchrun --nproc-per-node 8 -m components.train_lora.preflight --expect-gpus 8 --json pf.json
    # one process, every visible GPU's matmul and memory (no all-reduce)
    python -m components.train_lora.preflight
    # as train-lora does on each Vertex node: reads CLUSTER_SPEC, starts torchrun itself
    python -m components.train_lora.preflight --launch --expect-gpus 8
    # on a CPU machine (gloo): the same code paths, no thresholds
    python -m components.train_lora.preflight --launch --device cpu --nproc 2

What is measured (all bounded: a timed loop stops after `--budget-s`):

* per GPU: CUDA usable, visible GPU count == the profile's `accelerator_count`, free
  memory, a bf16 matmul of 8192³ (TFLOP/s = 2·n³ / seconds);
* per link, across all ranks through torch.distributed (NCCL on GPU, gloo on CPU): the
  all-reduce bus bandwidth at a few sizes, busbw = algbw × 2(n−1)/n with algbw = bytes /
  seconds, as nccl-tests reports it (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md);
  on several nodes the intra-node link (each node's GPUs) and the inter-node link (all ranks);
* one DDP step of a tiny model: the gradients must be equal on every rank and equal to
  the mean of the ranks' own gradients.

Expectations (`GPU_TABLE`, one row per GPU type, matched on torch.cuda.get_device_name):

* TFLOP/s, as this check measures them (random bf16 data, 1-3 s): H100 80GB HBM3 679-713,
  H200 666-682 (this project, torch 2.11, NVLS off). Random data draws more power than
  constant data: the same GPUs run `torch.ones` at 821 / 777 (the project's reference
  runs: H100 ~798, H200 ~788; datasheet dense bf16 peak 989). Without a measurement the
  row is the datasheet peak derated like H100 (~0.7-0.8): A100 312 -> 250, H100 PCIe
  756 -> 530, L4 121 -> 85. A GPU below FAIL_FRACTION (0.5) of its row fails: a
  healthy GPU is within ~10 %, so this flags throttling, ECC/XID faults or a shared
  GPU, not noise.
* Intra-node all-reduce busbw floor at the largest size: NVLink 4 (H100/H200 SXM, 900
  GB/s per GPU) measures ~350-480 GB/s on 8 GPUs in nccl-tests, and 298 GB/s here on
  2 x H200 (256 MB, NVLS off); NVLink 3 (A100 SXM, 600 GB/s) ~200-230 GB/s. The floors
  (100 and 60 GB/s) sit below any healthy NVLink run and above what PCIe gives when NCCL
  falls back to it (PCIe 4/5 x16: 32/64 GB/s raw per direction, ~20-45 GB/s busbw).
  PCIe cards (L4, the PCIe A100/H100) get a 5 GB/s floor: without peer-to-peer the data
  bounces through host memory (~10-20 GB/s busbw on g2 machines).
* Inter-node floor: INTER_NODE_BUSBW_FLOOR_GBPS = 1 GB/s (8 Gbit/s). Deliberately low:
  Vertex's slowest GPU machines have a 50-100 Gbit/s gVNIC (6-12 GB/s line rate) and the
  A3 machines several 200 Gbit/s NICs; 1 GB/s still passes a single TCP stream, and
  catches NCCL on a loopback / management interface or a broken route.
* An unknown GPU type has no threshold: a warning, and the figures are recorded.

`evaluate` is a pure function of the figures; `--mode fail` raises `PreflightFailed`
(which names node, host, GPU, the figure and its expected value, and the NCCL knobs),
`warn` logs and goes on, `off` skips. A rank that never joins is named after at most
`--timeout-s` (`RendezvousTimeout`) instead of hanging.

Importing this module is cheap: torch is imported only by the functions that measure.
The job environment (NCCL_* and friends) that train-lora applies to the preflight and to
`swift sft` is checked by `components.train_lora.job_env`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from components.train_lora import _launch
from components.train_lora._errors import TrainError
from components.train_lora.nccl_transport import parse_nccl_log, seen

MODES = ("fail", "warn", "off")
# A GPU below this share of its expected TFLOP/s fails.
FAIL_FRACTION = 0.5
# Free memory below this share of the total, before the check allocates anything, fails:
# another process (a stale run, a stuck notebook) holds the GPU. A CUDA context is < 1 GiB.
MIN_FREE_FRACTION = 0.85
INTER_NODE_BUSBW_FLOOR_GBPS = 1.0
# Gradients of the DDP step may differ by this much (relative to their size) between ranks.
GRAD_TOLERANCE = 1e-4
DEFAULT_SIZES_MB = (4.0, 32.0, 256.0)
# The preflight's own rendezvous port on a multi-node job: the training port (CLUSTER_SPEC) + this.
PORT_OFFSET = 1
MODULE = "components.train_lora.preflight"

NCCL_KNOBS = (
    "NCCL knobs to check (set them in the config's job environment): NCCL_SOCKET_IFNAME (the network "
    "interface NCCL uses between nodes; a wrong one means loopback or a slow management NIC), NCCL_DEBUG=INFO "
    "(with NCCL_DEBUG_SUBSYS=INIT,NET: read the log lines of the failing all-reduce: which transport, NET/IB, "
    "NET/Socket, P2P or SHM, and which interface), NCCL_P2P_DISABLE=1 (rules out peer-to-peer between GPUs). "
    "To train anyway, set resources.preflight: warn."
)


@dataclass(frozen=True)
class GpuSpec:
    """What a healthy GPU of one type achieves (see the module docstring for the sources).

    Attributes:
        pattern: Regular expression searched in torch.cuda.get_device_name().
        label: Short name for messages.
        tflops: Expected dense bf16 matmul TFLOP/s (8192³).
        link: "nvlink" or "pcie": how the GPUs of one node are connected.
        intra_busbw_gbps: Floor of the intra-node all-reduce busbw at the largest size, GB/s.
        source: Where `tflops` comes from.
    """

    pattern: str
    label: str
    tflops: float
    link: str
    intra_busbw_gbps: float
    source: str


GPU_TABLE: tuple[GpuSpec, ...] = (
    GpuSpec(r"\bH100\b.*PCIe", "H100 PCIe", 530.0, "pcie", 5.0, "datasheet peak 756, derated like H100 SXM"),
    GpuSpec(r"\bH100\b.*HBM3", "H100 SXM", 700.0, "nvlink", 100.0, "measured 679-713 by this check, peak 989"),
    GpuSpec(r"\bH200\b(?!.*NVL)", "H200 SXM", 675.0, "nvlink", 100.0, "measured 666-682 by this check, peak 989"),
    # B200: NVIDIA HGX B200 datasheet, BF16 tensor core 4.5 PFLOP/s with sparsity = 2,250 dense per GPU;
    # NVLink 5 (1.8 TB/s). Not measured here: derated like the H100 SXM (700 of 989) and the NVLink 4 floor kept.
    GpuSpec(r"\bB200\b", "B200", 1600.0, "nvlink", 100.0, "datasheet dense peak 2250, derated 0.71 like H100"),
    GpuSpec(r"\bA100\b.*PCIe", "A100 PCIe", 250.0, "pcie", 5.0, "datasheet peak 312, derated 0.8"),
    GpuSpec(r"\bA100\b", "A100 SXM", 250.0, "nvlink", 60.0, "datasheet peak 312, derated 0.8"),
    GpuSpec(r"\bL4\b", "L4", 85.0, "pcie", 5.0, "datasheet peak 121 (dense), derated 0.7 (72 W power limit)"),
)


class PreflightFailed(TrainError):
    """A GPU or link check failed; the message names node, host, GPU, the figure vs its expected value."""


class RendezvousTimeout(PreflightFailed):
    """Not every rank joined the preflight within the timeout; the message names the missing ranks."""


class PreflightSettingError(TrainError):
    """A preflight setting (the mode) is invalid; the message names the key and the fix."""


def check_mode(mode: str, where: str = "resources.preflight") -> None:
    """Refuses a preflight mode other than fail, warn or off.

    Args:
        mode: The mode.
        where: The setting's name, for the message. Default "resources.preflight".

    Raises:
        PreflightSettingError: Unknown mode.
    """
    if mode not in MODES:
        raise PreflightSettingError(f"{where}: {mode!r} is not a preflight mode; use one of {', '.join(MODES)}")


# --- evaluation (pure) ------------------------------------------------------------------------


def lookup_gpu(name: str, table: Sequence[GpuSpec] = GPU_TABLE) -> GpuSpec | None:
    """Returns the first row of `table` whose pattern matches the GPU name (None: unknown type)."""
    for spec in table:
        if re.search(spec.pattern, name):
            return spec
    return None


def busbw_gbps(algbw: float, ranks: int) -> float:
    """All-reduce bus bandwidth from the algorithm bandwidth, as nccl-tests: algbw × 2(n−1)/n."""
    return algbw * 2 * (ranks - 1) / ranks if ranks > 1 else 0.0


@dataclass(frozen=True)
class Problem:
    """One failed check.

    Attributes:
        node: Node rank(s), e.g. "1" or "0-1".
        host: Hostname(s).
        gpu: GPU index and name, e.g. "GPU 3 (NVIDIA H100 80GB HBM3)", or the link.
        figure: What was measured, e.g. "bf16 matmul TFLOP/s".
        value: The measured figure.
        expected: Its expected value, e.g. ">= 350 TFLOP/s (0.5 x 700, H100 SXM: ...)".
        hint: What to look at.
    """

    node: str
    host: str
    gpu: str
    figure: str
    value: str
    expected: str
    hint: str = ""

    def line(self) -> str:
        text = f"node {self.node} ({self.host}) {self.gpu}: {self.figure} {self.value}, expected {self.expected}"
        return f"{text} ({self.hint})" if self.hint else text


@dataclass
class Report:
    """The verdict of `evaluate`.

    Attributes:
        mode: fail, warn or off.
        problems: The failed checks.
        warnings: What could not be judged (an unknown GPU type, ...).
    """

    mode: str
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _where(entries: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """(node ranks, hostnames) of a group of GPU entries, for messages."""
    nodes = sorted({int(e["node_rank"]) for e in entries})
    hosts = sorted({str(e["hostname"]) for e in entries})
    node = str(nodes[0]) if len(nodes) == 1 else f"{nodes[0]}-{nodes[-1]}"
    return node, ", ".join(hosts)


def _gpu_label(entry: Mapping[str, Any]) -> str:
    if entry.get("device") == "cpu":
        return f"rank {entry['rank']} (cpu)"
    return f"GPU {entry['gpu_index']} ({entry['gpu_name']})"


def _count_problems(gpus: Sequence[Mapping[str, Any]], expected: int) -> list[Problem]:
    """The visible GPU count of each node against the profile's accelerator_count."""
    out = []
    for node in sorted({int(g["node_rank"]) for g in gpus}):
        entries = [g for g in gpus if int(g["node_rank"]) == node]
        visible = int(entries[0].get("gpus_visible", 0))
        if expected and visible != expected:
            n, host = _where(entries)
            out.append(
                Problem(
                    n,
                    host,
                    "GPUs",
                    "visible GPU count",
                    str(visible),
                    f"{expected} (resources.accelerator_count)",
                    "CUDA_VISIBLE_DEVICES, the driver (nvidia-smi), or a machine type with another GPU count",
                )
            )
    return out


def _gpu_problems(
    gpus: Sequence[Mapping[str, Any]], table: Sequence[GpuSpec], expected_tflops: float | None, fail_fraction: float
) -> tuple[list[Problem], list[str]]:
    """Free memory and matmul TFLOP/s of each GPU against its row of the table."""
    problems, warnings = [], []
    for g in gpus:
        node, host = _where([g])
        if g.get("device") == "cuda" and g.get("total_bytes"):
            free = float(g["free_bytes"]) / float(g["total_bytes"])
            if free < MIN_FREE_FRACTION:
                problems.append(
                    Problem(
                        node,
                        host,
                        _gpu_label(g),
                        "free memory",
                        f"{g['free_bytes'] / 2**30:.1f} of {g['total_bytes'] / 2**30:.1f} GiB ({free:.0%})",
                        f">= {MIN_FREE_FRACTION:.0%}",
                        "another process holds the GPU: nvidia-smi on that node",
                    )
                )
        spec = lookup_gpu(str(g.get("gpu_name", "")), table) if g.get("device") == "cuda" else None
        target = expected_tflops if expected_tflops is not None else (spec.tflops if spec else None)
        if target is None:
            if g.get("device") == "cuda":
                warnings.append(f"node {node} {_gpu_label(g)}: not in the expectations table; figures recorded")
            continue
        floor = fail_fraction * target
        if not float(g.get("tflops", 0.0)) >= floor:
            why = "--expected-tflops" if expected_tflops is not None else f"{spec.label}: {spec.source}"
            problems.append(
                Problem(
                    node,
                    host,
                    _gpu_label(g),
                    "bf16 matmul" if g.get("device") == "cuda" else "fp32 matmul",
                    f"{float(g.get('tflops', 0.0)):.1f} TFLOP/s",
                    f">= {floor:.1f} TFLOP/s ({fail_fraction} x {target:g}, {why})",
                    "clocks, temperature, ECC/XID errors: nvidia-smi -q -d PERFORMANCE,CLOCK,ECC; replace the node",
                )
            )
    return problems, warnings


def _link_floor(link: Mapping[str, Any], gpus: Sequence[Mapping[str, Any]], table: Sequence[GpuSpec]) -> tuple:
    """(floor GB/s or None, why) of one link."""
    if link.get("kind") == "inter-node":
        return INTER_NODE_BUSBW_FLOOR_GBPS, "inter-node floor"
    members = [g for g in gpus if int(g["node_rank"]) == int(link["node_rank"])]
    spec = lookup_gpu(str(members[0].get("gpu_name", "")), table) if members else None
    if spec is None:
        return None, ""
    return spec.intra_busbw_gbps, f"{spec.label} {'NVLink' if spec.link == 'nvlink' else 'PCIe'} floor"


def _link_problems(
    links: Sequence[Mapping[str, Any]],
    gpus: Sequence[Mapping[str, Any]],
    table: Sequence[GpuSpec],
    override: float | None,
) -> tuple[list[Problem], list[str]]:
    """All-reduce correctness and the busbw at the largest size of each link against its floor."""
    problems, warnings = [], []
    for link in links:
        members = [g for g in gpus if link.get("kind") == "inter-node" or int(g["node_rank"]) == int(link["node_rank"])]
        node, host = _where(members)
        what = f"{link['kind']} link ({link['ranks']} ranks)"
        if not link.get("correct", True):
            problems.append(
                Problem(node, host, what, "all-reduce result", "wrong", "the sum over ranks", "data corruption")
            )
        if not link.get("sizes"):
            continue
        last = link["sizes"][-1]
        if override is not None:
            floor, why = override, "--expected-busbw"
        elif link.get("device") == "cpu":
            continue
        else:
            floor, why = _link_floor(link, gpus, table)
        if floor is None:
            warnings.append(f"node {node} {what}: GPU type not in the expectations table; busbw recorded")
        elif not float(last["busbw_gbps"]) >= floor:
            problems.append(
                Problem(
                    node,
                    host,
                    what,
                    f"all-reduce busbw at {last['mb']:g} MB",
                    f"{float(last['busbw_gbps']):.2f} GB/s",
                    f">= {floor:g} GB/s ({why})",
                    "see the NCCL knobs below",
                )
            )
    return problems, warnings


def _ddp_problems(ddp: Mapping[str, Any] | None, gpus: Sequence[Mapping[str, Any]]) -> list[Problem]:
    if not ddp:
        return []
    diff = float(ddp.get("max_grad_diff", 0.0))
    if math.isfinite(diff) and diff <= GRAD_TOLERANCE and ddp.get("grads_nonzero", True):
        return []
    node, host = _where(gpus)
    return [
        Problem(
            node,
            host,
            f"DDP step ({len(gpus)} ranks)",
            "max gradient difference between ranks",
            f"{diff:.3g}" + ("" if ddp.get("grads_nonzero", True) else " (all gradients zero)"),
            f"<= {GRAD_TOLERANCE:g} (relative)",
            "gradient all-reduce is broken: TORCH_DISTRIBUTED_DEBUG=DETAIL",
        )
    ]


def evaluate(
    figures: Mapping[str, Any],
    mode: str = "fail",
    *,
    expected_tflops: float | None = None,
    expected_busbw_gbps: float | None = None,
    table: Sequence[GpuSpec] = GPU_TABLE,
    fail_fraction: float = FAIL_FRACTION,
) -> Report:
    """Judges the figures of a preflight run against the expectations.

    Args:
        figures: What `run_worker` measured: `expected_gpus`, `gpus` (one entry per GPU:
            rank, node_rank, hostname, gpu_index, gpu_name, device, gpus_visible,
            free_bytes, total_bytes, tflops), `links` (kind, node_rank, ranks, device,
            correct, sizes: [{mb, algbw_gbps, busbw_gbps}]) and `ddp` (max_grad_diff).
        mode: "fail", "warn" or "off" ("off": nothing is judged). Default "fail".
        expected_tflops: Expected TFLOP/s of every GPU (CPU too) instead of the table
            (to simulate a fault). Default None.
        expected_busbw_gbps: busbw floor of every link instead of the table. Default None.
        table: GPU expectations. Default GPU_TABLE.
        fail_fraction: A GPU below this share of its expected TFLOP/s fails. Default 0.5.

    Returns:
        The Report (problems and warnings; the mode is applied by `enforce`).

    Raises:
        PreflightSettingError: Unknown mode.
    """
    check_mode(mode, "mode")
    if mode == "off":
        return Report(mode, warnings=["preflight off: nothing checked"])
    gpus = list(figures.get("gpus") or [])
    report = Report(mode, _count_problems(gpus, int(figures.get("expected_gpus") or 0)))
    found, warned = _gpu_problems(gpus, table, expected_tflops, fail_fraction)
    report.problems += found
    report.warnings += list(dict.fromkeys(warned))
    found, warned = _link_problems(figures.get("links") or [], gpus, table, expected_busbw_gbps)
    report.problems += found
    report.warnings += warned
    report.problems += _ddp_problems(figures.get("ddp"), gpus)
    if gpus and all(g.get("device") == "cpu" for g in gpus) and expected_tflops is None:
        report.warnings.append("CPU run (gloo): figures recorded, no thresholds")
    return report


def failure_message(report: Report) -> str:
    """The text of PreflightFailed: every problem on its own line, then the NCCL knobs."""
    lines = [f"preflight failed {len(report.problems)} check(s):"]
    lines += [f"  - {p.line()}" for p in report.problems]
    return "\n".join([*lines, NCCL_KNOBS])


def enforce(report: Report, log: Any = print) -> None:
    """Applies the mode: "fail" raises on a problem, "warn" logs it, "off" does nothing.

    Args:
        report: From `evaluate`.
        log: Prints one line. Default print.

    Raises:
        PreflightFailed: mode "fail" and at least one problem.
    """
    for warning in report.warnings:
        log(f"preflight: note: {warning}")
    if report.ok or report.mode == "off":
        return
    if report.mode == "fail":
        raise PreflightFailed(failure_message(report))
    log("preflight: WARNING (mode warn, training goes on): " + failure_message(report))


def metrics_of(figures: Mapping[str, Any] | None) -> dict[str, float]:
    """Metrics-ready figures: preflight_tflops_min, preflight_busbw_gbps, preflight_seconds, preflight_gpus.

    Args:
        figures: What `run_worker` measured (None = nothing).

    Returns:
        preflight_busbw_gbps is the busbw at the largest size of the widest link (inter-node
        when there are several nodes); absent without a link (one process).
    """
    if not figures:
        return {}
    gpus = figures.get("gpus") or []
    out = {
        "preflight_seconds": round(float(figures.get("seconds", 0.0)), 2),
        "preflight_gpus": float(sum(1 for g in gpus if g.get("device") == "cuda")),
    }
    if gpus:
        out["preflight_tflops_min"] = round(min(float(g.get("tflops", 0.0)) for g in gpus), 3)
    links = [link for link in figures.get("links") or [] if link.get("sizes")]
    if links:
        widest = max(links, key=lambda link: int(link["ranks"]))
        out["preflight_busbw_gbps"] = round(float(widest["sizes"][-1]["busbw_gbps"]), 3)
    return out


def format_table(figures: Mapping[str, Any], report: Report | None = None) -> str:
    """A table per GPU and per link (all-reduce size -> algbw / busbw GB/s), printed by the chief."""
    gpus = figures.get("gpus") or []
    lines = [
        f"preflight: {len(gpus)} GPU(s)/rank(s) on {figures.get('nnodes', 1)} node(s), "
        f"{figures.get('device', '?')}/{figures.get('backend', '-')}, {float(figures.get('seconds', 0)):.1f} s",
        f"{'rank':>4} {'node':>4} {'host':<24} {'gpu':>3} {'name':<28} {'free/total GiB':>15} {'TFLOP/s':>9}",
    ]
    for g in gpus:
        mem = f"{g['free_bytes'] / 2**30:.1f}/{g['total_bytes'] / 2**30:.1f}" if g.get("total_bytes") else "-"
        lines.append(
            f"{g['rank']:>4} {g['node_rank']:>4} {str(g['hostname'])[:24]:<24} {g['gpu_index']:>3} "
            f"{str(g['gpu_name'])[:28]:<28} {mem:>15} {float(g.get('tflops', 0.0)):>9.1f}"
        )
    links = figures.get("links") or []
    if links:
        lines.append(f"{'link':<22} {'ranks':>5} {'size MB':>8} {'algbw GB/s':>11} {'busbw GB/s':>11}")
    for link in links:
        name = link["kind"] + (f" node {link['node_rank']}" if link["kind"] == "intra-node" else "")
        for s in link.get("sizes") or []:
            lines.append(
                f"{name:<22} {link['ranks']:>5} {s['mb']:>8g} {float(s['algbw_gbps']):>11.2f} "
                f"{float(s['busbw_gbps']):>11.2f}"
            )
    ddp = figures.get("ddp")
    if ddp:
        lines.append(f"DDP step: max gradient difference {float(ddp['max_grad_diff']):.3g}, {ddp['seconds']:.2f} s")
    if report is not None:
        lines.append("preflight: PASSED" if report.ok else f"preflight: {len(report.problems)} problem(s)")
    return "\n".join(lines)


# --- measurements (torch) ---------------------------------------------------------------------


def _sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _matmul_tflops(torch: Any, device: Any, n: int, budget_s: float) -> float:
    """TFLOP/s of an n×n×n matmul (bf16 on GPU, fp32 on CPU), timed for about `budget_s` seconds."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    a @ b
    _sync(torch, device)
    t0 = time.perf_counter()
    a @ b
    _sync(torch, device)
    one = max(time.perf_counter() - t0, 1e-7)
    for _ in range(min(50, int(0.2 / one))):  # warm up: clocks ramp, cuBLAS picks its kernel
        a @ b
    _sync(torch, device)
    iters = max(3, min(500, int(budget_s / one)))
    t0 = time.perf_counter()
    for _ in range(iters):
        a @ b
    _sync(torch, device)
    return 2 * n**3 * iters / (time.perf_counter() - t0) / 1e12


def _gpu_entry(torch: Any, me: _Identity, index: int, opts: Options) -> dict[str, Any]:
    """Free memory and matmul TFLOP/s of one GPU (or of the CPU)."""
    entry: dict[str, Any] = {
        "rank": me.rank,
        "node_rank": me.node_rank,
        "local_rank": me.local_rank,
        "hostname": me.hostname,
        "gpu_index": index,
        "device": opts.device,
    }
    if opts.device == "cpu":
        device = torch.device("cpu")
        entry.update(gpu_name="cpu", gpus_visible=0, free_bytes=0, total_bytes=0)
    else:
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
        props = torch.cuda.get_device_properties(device)
        free, total = torch.cuda.mem_get_info(device)
        entry.update(
            gpu_name=torch.cuda.get_device_name(device),
            uuid=str(getattr(props, "uuid", "")),
            gpus_visible=torch.cuda.device_count(),
            free_bytes=int(free),
            total_bytes=int(total),
        )
    n = opts.matmul_n or (8192 if opts.device == "cuda" else 256)
    entry.update(matmul_n=n, tflops=round(_matmul_tflops(torch, device, n, opts.budget_s), 4))
    return entry


def _allreduce_figures(torch: Any, dist: Any, device: Any, sizes_mb: Sequence[float], group: Any, budget_s: float):
    """Times all-reduces of float32 tensors of each size in `group`; returns (sizes, correct)."""
    n = dist.get_world_size(group)
    out, correct = [], True

    def group_max(value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64 if device.type == "cpu" else torch.float32, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return float(t.item())

    for mb in sizes_mb:
        numel = max(1, int(mb * 2**20) // 4)
        x = torch.ones(numel, dtype=torch.float32, device=device)
        dist.all_reduce(x, group=group)
        _sync(torch, device)
        correct = correct and float(x[0].item()) == n and float(x[-1].item()) == n
        t0 = time.perf_counter()
        dist.all_reduce(x, group=group)
        _sync(torch, device)
        iters = max(1, min(20, int(budget_s / max(group_max(time.perf_counter() - t0), 1e-7))))
        group_max(0.0)  # line the ranks up
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x, group=group)
        _sync(torch, device)
        per = group_max(time.perf_counter() - t0) / iters
        algbw = numel * 4 / per / 1e9
        out.append({"mb": mb, "seconds": per, "algbw_gbps": algbw, "busbw_gbps": busbw_gbps(algbw, n)})
        del x
    return out, correct


def _link_figures(torch: Any, dist: Any, device: Any, me: _Identity, gpus: list[dict], opts: Options) -> list[dict]:
    """The all-reduce figures of each link: each node's GPUs (several nodes) and all ranks."""
    nodes = sorted({int(g["node_rank"]) for g in gpus})
    kind = "inter-node" if len(nodes) > 1 else "intra-node"
    links = []
    if len(nodes) > 1:
        groups = {k: sorted(int(g["rank"]) for g in gpus if int(g["node_rank"]) == k) for k in nodes}
        handles = {k: dist.new_group(ranks) for k, ranks in groups.items()}  # every rank creates every group
        mine = None
        if len(groups[me.node_rank]) > 1:
            sizes, ok = _allreduce_figures(
                torch, dist, device, opts.sizes_mb[-1:], handles[me.node_rank], opts.budget_s
            )
            mine = {"kind": "intra-node", "node_rank": me.node_rank, "ranks": len(groups[me.node_rank])}
            mine.update(device=opts.device, correct=ok, sizes=sizes)
        per_node: list[Any] = [None] * me.world
        dist.all_gather_object(per_node, mine if me.local_rank == 0 else None)
        links += [link for link in per_node if link]
    sizes, ok = _allreduce_figures(torch, dist, device, opts.sizes_mb, None, opts.budget_s)
    links.append(
        {"kind": kind, "node_rank": nodes[0], "ranks": me.world, "device": opts.device, "correct": ok, "sizes": sizes}
    )
    return links


def _ddp_figures(torch: Any, dist: Any, device: Any, me: _Identity) -> dict[str, Any]:
    """One DDP step of a tiny model: its gradients against rank 0's and the mean of the local ones."""
    from torch.nn.parallel import DistributedDataParallel

    t0 = time.perf_counter()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)).to(device)
    gen = torch.Generator().manual_seed(1000 + me.rank)  # different data on each rank
    x, y = torch.randn(16, 64, generator=gen).to(device), torch.randn(16, 1, generator=gen).to(device)
    torch.nn.functional.mse_loss(model(x), y).backward()
    local = torch.cat([p.grad.flatten() for p in model.parameters()])
    mean = local.clone()
    dist.all_reduce(mean)
    mean /= me.world
    model.zero_grad(set_to_none=True)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    loss.backward()
    synced = torch.cat([p.grad.flatten() for p in model.parameters()])
    ref = synced.clone()
    dist.broadcast(ref, 0)
    largest = float(mean.abs().max().item())
    scale = largest or 1.0
    diff = torch.stack([(synced - ref).abs().max(), (synced - mean).abs().max()]).max().reshape(1) / scale
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    _sync(torch, device)
    return {
        "max_grad_diff": float(diff.item()),
        "grads_nonzero": largest > 0 and bool(synced.abs().sum().item() > 0),
        "loss": float(loss.item()),
        "seconds": time.perf_counter() - t0,
    }


# --- rendezvous ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Identity:
    """Who this process is in the preflight job."""

    rank: int
    world: int
    local_rank: int
    local_world: int
    node_rank: int
    nnodes: int
    hostname: str
    master_addr: str
    master_port: int
    agent_store: bool = False  # under torchrun: use the agent's store (it listens on MASTER_PORT)
    prefix: str = "preflight/"
    hosts: tuple[str, ...] = ()


def _identity(opts: Options, environ: Mapping[str, str]) -> _Identity:
    """This process's rank, node and rendezvous address, from the options (--launch) or torchrun's variables."""
    host = socket.gethostname()
    local_rank = int(environ.get("LOCAL_RANK", 0))
    local_world = int(environ.get("LOCAL_WORLD_SIZE", 1))
    if opts.nnodes:  # started by --launch: torchrun --standalone on this node, our own cross-node rendezvous
        rank = opts.node_rank * local_world + local_rank
        return _Identity(
            rank,
            opts.nnodes * local_world,
            local_rank,
            local_world,
            opts.node_rank,
            opts.nnodes,
            host,
            opts.master_addr,
            opts.master_port,
            hosts=tuple(opts.hosts),
        )
    if "RANK" in environ:  # under torchrun, started by the user
        rank, world = int(environ["RANK"]), int(environ.get("WORLD_SIZE", 1))
        local_world = int(environ.get("LOCAL_WORLD_SIZE", world))
        run = f"preflight/{environ.get('TORCHELASTIC_RUN_ID', 'run')}/{environ.get('TORCHELASTIC_RESTART_COUNT', 0)}/"
        return _Identity(
            rank,
            world,
            local_rank,
            local_world,
            int(environ.get("GROUP_RANK", rank // max(local_world, 1))),
            max(1, world // max(local_world, 1)),
            host,
            environ.get("MASTER_ADDR", "127.0.0.1"),
            int(environ.get("MASTER_PORT", 0)),
            agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
            prefix=run,
        )
    return _Identity(0, 1, 0, 1, 0, 1, host, "127.0.0.1", 0)


def _first_line(exc: BaseException) -> str:
    """The first line of an error from torch's C++ side (the rest is a C++ stack trace)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:500]


def _rank_place(me: _Identity, rank: int) -> str:
    """'rank 5 (node 1, host-b)': where a rank runs when the ranks are node-major."""
    node = rank // max(me.local_world, 1)
    host = f", {me.hosts[node]}" if node < len(me.hosts) else ""
    return f"rank {rank} (node {node}{host})"


def _wait_reachable(me: _Identity, deadline: float) -> None:
    """Waits until rank 0's store accepts connections (a plain socket: no C++ stack traces in the log)."""
    while True:
        try:
            with socket.create_connection((me.master_addr, me.master_port), timeout=2):
                return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise RendezvousTimeout(
                    f"{_rank_place(me, me.rank)} could not reach rank 0's rendezvous at {me.master_addr}:"
                    f"{me.master_port} ({exc.strerror or exc}): node 0 did not start its preflight, or the "
                    f"address/port is blocked between the nodes. {NCCL_KNOBS}"
                ) from None
            time.sleep(0.5)


def rendezvous(me: _Identity, timeout_s: float) -> Any:
    """Meets every rank at rank 0's TCPStore, waiting at most `timeout_s` seconds.

    Each rank sets a key; rank 0 waits for all keys and names the ranks whose key is
    missing when time runs out (and tells the others); the other ranks give up too.

    Args:
        me: This process.
        timeout_s: Longest wait for all ranks, seconds.

    Returns:
        The store (a PrefixStore), ready for init_process_group.

    Raises:
        RendezvousTimeout: A rank did not join, or rank 0 could not be reached.
    """
    import torch.distributed as dist

    deadline = time.monotonic() + timeout_s
    hosting = me.rank == 0 and not me.agent_store
    if not hosting:
        _wait_reachable(me, deadline)
    try:
        store = dist.TCPStore(
            me.master_addr,
            me.master_port,
            is_master=hosting,
            timeout=timedelta(seconds=max(timeout_s, 10)),
            wait_for_workers=False,
        )
    except RuntimeError as exc:  # the port is taken (rank 0), or the store went away
        raise PreflightFailed(
            f"{_rank_place(me, me.rank)}: the rendezvous store at {me.master_addr}:{me.master_port} failed: "
            f"{_first_line(exc)}; is another preflight or job using that port?"
        ) from None
    store = dist.PrefixStore(me.prefix, store)
    store.set(f"joined/{me.rank}", json.dumps({"node": me.node_rank, "host": me.hostname}))
    while True:
        if me.rank == 0:
            missing = [r for r in range(me.world) if not store.check([f"joined/{r}"])]
            if not missing:
                store.set("go", "1")
                return store
        elif store.check(["go"]):
            return store
        elif store.check(["abort"]):
            raise RendezvousTimeout(store.get("abort").decode())
        if time.monotonic() > deadline + (0 if me.rank == 0 else 5):
            break
        time.sleep(0.2)
    if me.rank != 0:
        raise RendezvousTimeout(f"{_rank_place(me, me.rank)}: rank 0 did not see every rank within {timeout_s:g} s")
    message = (
        f"{len(missing)} of {me.world} rank(s) did not join the preflight within {timeout_s:g} s: "
        f"{', '.join(_rank_place(me, r) for r in missing)}. That node did not start (Vertex still provisioning "
        f"it, a crash before the preflight: read its log), or cannot reach {me.master_addr}:{me.master_port}"
    )
    store.set("abort", message)
    time.sleep(1.0)  # let the others read it before this store goes away
    raise RendezvousTimeout(message)


# --- the worker -------------------------------------------------------------------------------


@dataclass
class Options:
    """Settings of one preflight run (the command-line options).

    Attributes:
        mode: fail, warn or off. Default fail.
        expect_gpus: GPUs each node must have (0 = no check). Default 0.
        timeout_s: Longest wait for every rank to join, seconds. Default 60.
        op_timeout_s: Timeout of each collective (NCCL / gloo), seconds. Default 60.
        json_path: JSON file with the figures and the verdict ("" = none). Default "".
        sizes_mb: All-reduce sizes, MB (2^20 bytes). Default (4, 32, 256).
        expected_tflops: Override of the table's TFLOP/s (simulates a fault). Default None.
        expected_busbw_gbps: Override of every link's busbw floor, GB/s. Default None.
        device: auto (cuda when available), cuda or cpu. Default auto.
        matmul_n: Matmul size (0 = 8192 on GPU, 256 on CPU). Default 0.
        budget_s: Seconds of each timed loop. Default 1.0.
        nproc: --launch: processes on this node (0 = one per GPU, 1 on CPU). Default 0.
        nnodes, node_rank, master_addr, master_port, hosts: set by --launch for its
            workers: the node's place in a multi-node preflight.
    """

    mode: str = "fail"
    expect_gpus: int = 0
    timeout_s: float = 60.0
    op_timeout_s: float = 60.0
    json_path: str = ""
    sizes_mb: tuple[float, ...] = DEFAULT_SIZES_MB
    expected_tflops: float | None = None
    expected_busbw_gbps: float | None = None
    device: str = "auto"
    matmul_n: int = 0
    budget_s: float = 1.0
    nproc: int = 0
    nnodes: int = 0
    node_rank: int = 0
    master_addr: str = ""
    master_port: int = 0
    hosts: tuple[str, ...] = ()

    def worker_args(self) -> list[str]:
        """The options a --launch passes on to its workers (not the node's place)."""
        args = ["--mode", self.mode, "--expect-gpus", str(self.expect_gpus), "--device", self.device]
        args += ["--timeout-s", f"{self.timeout_s:g}", "--op-timeout-s", f"{self.op_timeout_s:g}"]
        args += ["--sizes-mb", ",".join(f"{s:g}" for s in self.sizes_mb), "--budget-s", f"{self.budget_s:g}"]
        args += ["--matmul-n", str(self.matmul_n)]
        if self.json_path:
            args += ["--json", self.json_path]
        if self.expected_tflops is not None:
            args += ["--expected-tflops", f"{self.expected_tflops:g}"]
        if self.expected_busbw_gbps is not None:
            args += ["--expected-busbw", f"{self.expected_busbw_gbps:g}"]
        return args


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


# --- launch: one torchrun per node ------------------------------------------------------------


def cluster_hosts(environ: Mapping[str, str]) -> list[str]:
    """The hosts of CLUSTER_SPEC (or of a JobSet's pods) in node-rank order (chief first); [] without one."""
    text = environ.get("CLUSTER_SPEC", "").strip()
    if not text and environ.get("JOBSET_NAME", "").strip():
        return _launch.parse_jobset_env(environ)[2]
    if not text:
        return []
    chief, workers, _, _ = _launch.parse_cluster_spec(text)
    return [entry.rpartition(":")[0] for entry in chief + workers]


def launch_command(
    opts: Options, plan: _launch.LaunchPlan, port: int, hosts: Sequence[str] = (), python: str = sys.executable
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
    plan: _launch.LaunchPlan,
    *,
    hosts: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    wall_s: float | None = None,
    log: Any = print,
) -> Outcome:
    """Runs this node's part of the preflight under torchrun, bounded in wall-clock time.

    Args:
        opts: The options (mode, expectations, timeouts, JSON path, device).
        plan: This node's launch plan (`_launch.launch_plan`); nproc_per_node processes.
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
        figures["nccl"] = {"network": nccl.network, "plugin": nccl.plugin, "gpudirect": nccl.gpudirect}
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
        gpu_count = _launch.detect_gpus()[0] if opts.device == "cuda" else 0
        plan = _launch.launch_plan(os.environ, opts.nproc or gpu_count)
        outcome = run_launch(opts, plan, hosts=cluster_hosts(os.environ), wall_s=wall_s)
        print(f"preflight: node {plan.node_rank}: {'PASSED' if outcome.ok else 'problems (mode warn)'}", flush=True)
        return 0
    except TrainError as exc:
        print(f"preflight: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
