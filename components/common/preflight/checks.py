"""The checks: a pure function of the figures (`evaluate`), and what a failure says (`enforce`).

Part of the preflight (`components.common.preflight`, its docstring says what it checks and why).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from components.common.preflight.expectations import (
    FAIL_FRACTION,
    GPU_TABLE,
    GRAD_TOLERANCE,
    INTER_NODE_BUSBW_FLOOR_GBPS,
    MIN_FREE_FRACTION,
    NCCL_KNOBS,
    GpuSpec,
    PreflightFailed,
    check_mode,
)

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
