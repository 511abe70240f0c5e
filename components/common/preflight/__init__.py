"""GPU and interconnect health check ("preflight") that train-lora runs on every node before `swift sft`.

It finds, in about a minute, the faults that otherwise cost hours of a multi-GPU job: a
GPU missing or held by another process, a slow (throttled, faulty) GPU, NCCL on the wrong
network interface or without NVLink, a node that never joins, a broken DDP gradient sync.

Run it yourself:

    # every GPU of this machine, one process per GPU
    torchrun --nproc-per-node 8 -m components.common.preflight --expect-gpus 8 --json pf.json
    # one process, every visible GPU's matmul and memory (no all-reduce)
    python -m components.common.preflight
    # as train-lora does on each Vertex node: reads CLUSTER_SPEC, starts torchrun itself
    python -m components.common.preflight --launch --expect-gpus 8
    # on a CPU machine (gloo): the same code paths, no thresholds
    python -m components.common.preflight --launch --device cpu --nproc 2

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

Importing this package is cheap: torch is imported only by the functions that measure.
The job environment (NCCL_* and friends) that train-lora applies to the preflight and to
`swift sft` is checked by train-lora's job_env. Where this node sits (CLUSTER_SPEC or a
JobSet's environment) is read by `components.common.cluster`, as train-lora's launcher reads it.

The modules, one concept each: `expectations` (the GPU table, thresholds, modes, errors),
`checks` (the pure evaluation), `report` (Metrics and the logged table), `options`,
`rendezvous`, `measure` (torch), `worker` (one rank), `launch` (one torchrun per node,
bounded), `nccl_transport` (what NCCL chose, from its log), `cli` (`python -m`).
"""

from __future__ import annotations

from components.common.preflight.checks import (
    Problem,
    Report,
    busbw_gbps,
    enforce,
    evaluate,
    failure_message,
    lookup_gpu,
)
from components.common.preflight.cli import main
from components.common.preflight.expectations import (
    DEFAULT_SIZES_MB,
    FAIL_FRACTION,
    GPU_TABLE,
    GRAD_TOLERANCE,
    INTER_NODE_BUSBW_FLOOR_GBPS,
    MIN_FREE_FRACTION,
    MODES,
    MODULE,
    NCCL_KNOBS,
    PORT_OFFSET,
    GpuSpec,
    PreflightFailed,
    PreflightSettingError,
    RendezvousTimeout,
    check_mode,
)
from components.common.preflight.launch import Outcome, launch_command, run_launch
from components.common.preflight.options import Options
from components.common.preflight.rendezvous import rendezvous
from components.common.preflight.report import format_table, metrics_of
from components.common.preflight.worker import run_worker

__all__ = [
    "DEFAULT_SIZES_MB",
    "FAIL_FRACTION",
    "GPU_TABLE",
    "GRAD_TOLERANCE",
    "GpuSpec",
    "INTER_NODE_BUSBW_FLOOR_GBPS",
    "MIN_FREE_FRACTION",
    "MODES",
    "MODULE",
    "NCCL_KNOBS",
    "Options",
    "Outcome",
    "PORT_OFFSET",
    "PreflightFailed",
    "PreflightSettingError",
    "Problem",
    "RendezvousTimeout",
    "Report",
    "busbw_gbps",
    "check_mode",
    "enforce",
    "evaluate",
    "failure_message",
    "format_table",
    "launch_command",
    "lookup_gpu",
    "main",
    "metrics_of",
    "rendezvous",
    "run_launch",
    "run_worker",
]
