"""The figures as Metrics (`metrics_of`) and as the table a node logs (`format_table`).

Part of the preflight (`components.common.preflight`, its docstring says what it checks and why).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.common.preflight.checks import Report


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
