"""Where this node sits in a multi-node job: Vertex AI's `CLUSTER_SPEC` or a JobSet's environment, read once for
train-lora's launcher and for the preflight (`components.common.preflight`), and the node's GPUs.

Vertex AI describes a multi-replica CustomJob in the `CLUSTER_SPEC` environment variable:

    {"cluster": {"workerpool0": ["host0:2222"], "workerpool1": ["host1:2222", "host2:2222"]},
     "task": {"type": "workerpool1", "index": 1}}

On GKE the nodes are the pods of one indexed Job of a JobSet (`components.common.jobset`). Kubernetes
sets `JOB_COMPLETION_INDEX` (the node rank); the manifest adds, from the pod's JobSet labels,
`JOBSET_NAME` and `REPLICATED_JOB_NAME`, and `JOBSET_NNODES` / `JOBSET_MASTER_PORT`. JobSet names
each pod's host `<jobset>-<replicated job>-<job index>-<pod index>` under the headless service
`<jobset>` (its default subdomain; `JOBSET_SUBDOMAIN` if another), so the chief is
`<jobset>-<rjob>-0-0.<service>`. `launch_plan` reads either description; both at once is an error.

ms-swift starts torchrun when NPROC_PER_NODE or NNODES is set and passes NNODES, NODE_RANK,
MASTER_ADDR and MASTER_PORT through; `launch_plan` maps the one onto the other. The chief
(workerpool0[0]) is node 0 and the only node that writes the task's outputs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from components.common.errors import TrainError


class ClusterSpecError(TrainError):
    """CLUSTER_SPEC is set but is not the JSON Vertex AI writes; the message says what is wrong."""


class JobSetEnvError(TrainError):
    """The JobSet / indexed Job environment is incomplete or contradicts itself; the message names the variable."""


@dataclass
class LaunchPlan:
    """How this node takes part in training.

    Attributes:
        nnodes: Number of nodes (replicas).
        node_rank: This node's rank (0 = chief).
        master_addr: Chief's host ("" on a single node).
        master_port: Chief's rendezvous port (0 on a single node).
        nproc_per_node: Training processes on this node (= GPUs, at least 1).
        env: Environment variables for `swift sft` ({} = plain single-process run).
    """

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = ""
    master_port: int = 0
    nproc_per_node: int = 1
    env: dict[str, str] = field(default_factory=dict)

    @property
    def is_chief(self) -> bool:
        """Whether this node writes the outputs (adapter, metrics, durable checkpoints)."""
        return self.node_rank == 0

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _host_port(entry: Any, where: str) -> tuple[str, int]:
    if not isinstance(entry, str) or ":" not in entry:
        raise ClusterSpecError(f"CLUSTER_SPEC: {where} is {entry!r}, expected 'host:port'")
    host, _, port = entry.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterSpecError(f"CLUSTER_SPEC: {where} is {entry!r}, expected 'host:port'")
    return host, int(port)


def parse_cluster_spec(text: str) -> tuple[list[str], list[str], str, int]:
    """Parses Vertex AI's CLUSTER_SPEC.

    Args:
        text: The variable's value.

    Returns:
        (chief entries, worker entries, this task's type, this task's index).

    Raises:
        ClusterSpecError: Not JSON, or a field is missing or of the wrong shape.
    """
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ClusterSpecError(f"CLUSTER_SPEC is not JSON ({exc.msg} at char {exc.pos}): {text[:200]!r}") from None
    if (
        not isinstance(spec, dict)
        or not isinstance(spec.get("cluster"), dict)
        or not isinstance(spec.get("task"), dict)
    ):
        raise ClusterSpecError("CLUSTER_SPEC: expected {'cluster': {...}, 'task': {'type': ..., 'index': ...}}")
    cluster, task = spec["cluster"], spec["task"]
    chief = cluster.get("workerpool0")
    if not isinstance(chief, list) or len(chief) != 1:
        raise ClusterSpecError(f"CLUSTER_SPEC: cluster.workerpool0 must list exactly one chief, got {chief!r}")
    workers = cluster.get("workerpool1", [])
    if not isinstance(workers, list):
        raise ClusterSpecError(f"CLUSTER_SPEC: cluster.workerpool1 must be a list, got {workers!r}")
    kind, index = task.get("type"), task.get("index", 0)
    if kind not in ("workerpool0", "workerpool1"):
        raise ClusterSpecError(
            f"CLUSTER_SPEC: task.type is {kind!r}; train-lora runs only in workerpool0 (chief) or workerpool1 (workers)"
        )
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ClusterSpecError(f"CLUSTER_SPEC: task.index must be a non-negative integer, got {index!r}")
    pool = chief if kind == "workerpool0" else workers
    if index >= len(pool):
        raise ClusterSpecError(f"CLUSTER_SPEC: task {kind}[{index}] but {kind} has {len(pool)} entr(y/ies)")
    for i, entry in enumerate(chief + workers):
        _host_port(entry, "cluster.workerpool0[0]" if i == 0 else f"cluster.workerpool1[{i - 1}]")
    return chief, workers, kind, index


# The variables a JobSet pod gets (Kubernetes: JOB_COMPLETION_INDEX; the manifest: the rest).
JOBSET_VARS = (
    "JOB_COMPLETION_INDEX", "JOBSET_NAME", "REPLICATED_JOB_NAME", "JOBSET_NNODES", "JOBSET_MASTER_PORT",
    "JOBSET_SUBDOMAIN",
)  # fmt: skip


def _env_int(environ: Mapping[str, str], name: str, low: int) -> int:
    text = environ.get(name, "").strip()
    if not text.isdigit() or int(text) < low:
        raise JobSetEnvError(f"{name} is {text!r}, expected an integer >= {low} (set by the JobSet manifest)")
    return int(text)


def parse_jobset_env(environ: Mapping[str, str]) -> tuple[int, int, list[str], int]:
    """Reads a JobSet pod's node count, rank, hosts and port.

    Args:
        environ: The pod's environment (`JOBSET_VARS`).

    Returns:
        (nodes, this node's rank, every node's host name by rank, the chief's port).

    Raises:
        JobSetEnvError: A variable is missing or not a number, or the rank is not below the node count.
    """
    nnodes = _env_int(environ, "JOBSET_NNODES", 1)
    rank = _env_int(environ, "JOB_COMPLETION_INDEX", 0)
    port = _env_int(environ, "JOBSET_MASTER_PORT", 1)
    name, rjob = environ.get("JOBSET_NAME", "").strip(), environ.get("REPLICATED_JOB_NAME", "").strip()
    for var, value in (("JOBSET_NAME", name), ("REPLICATED_JOB_NAME", rjob)):
        if not value:
            raise JobSetEnvError(f"{var} is not set; the manifest sets it from the pod's jobset.sigs.k8s.io label")
    if rank >= nnodes:
        raise JobSetEnvError(f"JOB_COMPLETION_INDEX is {rank} but JOBSET_NNODES is {nnodes}: the rank must be below it")
    service = environ.get("JOBSET_SUBDOMAIN", "").strip() or name
    return nnodes, rank, [f"{name}-{rjob}-0-{i}.{service}" for i in range(nnodes)], port


def launch_plan(environ: Mapping[str, str] | None = None, gpu_count: int = 0) -> LaunchPlan:
    """Maps the node's environment and GPU count to torchrun's variables.

    Args:
        environ: Environment (default os.environ); CLUSTER_SPEC or the JobSet variables
            (`JOBSET_VARS`) are read from it.
        gpu_count: GPUs on this node (0 = CPU only).

    Returns:
        The LaunchPlan. Its `env` is empty for a single process (one node, ≤ 1 GPU), so
        ms-swift runs without torchrun exactly as before; otherwise it holds NPROC_PER_NODE
        (and, with several nodes, NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT).

    Raises:
        ClusterSpecError: CLUSTER_SPEC is malformed.
        JobSetEnvError: The JobSet variables are incomplete, or set beside CLUSTER_SPEC.
    """
    env_in = os.environ if environ is None else environ
    nproc = max(int(gpu_count), 1)
    text = env_in.get("CLUSTER_SPEC", "").strip()
    jobset = env_in.get("JOBSET_NAME", "").strip() or env_in.get("JOB_COMPLETION_INDEX", "").strip()
    if text and jobset:
        raise JobSetEnvError("both CLUSTER_SPEC (Vertex) and JobSet variables are set; a node is one or the other")
    if jobset:
        nnodes, rank, hosts, port = parse_jobset_env(env_in)
        plan = LaunchPlan(nnodes=nnodes, node_rank=rank, master_addr=hosts[0], master_port=port, nproc_per_node=nproc)
    elif not text:
        plan = LaunchPlan(nproc_per_node=nproc)
    else:
        chief, workers, kind, index = parse_cluster_spec(text)
        host, port = _host_port(chief[0], "cluster.workerpool0[0]")
        rank = 0 if kind == "workerpool0" else 1 + index
        plan = LaunchPlan(
            nnodes=1 + len(workers), node_rank=rank, master_addr=host, master_port=port, nproc_per_node=nproc
        )
    if plan.nnodes > 1:
        plan.env = {
            "NNODES": str(plan.nnodes),
            "NODE_RANK": str(plan.node_rank),
            "MASTER_ADDR": plan.master_addr,
            "MASTER_PORT": str(plan.master_port),
            "NPROC_PER_NODE": str(plan.nproc_per_node),
        }
    elif plan.nproc_per_node > 1:
        plan.env = {"NPROC_PER_NODE": str(plan.nproc_per_node)}
    return plan


def cluster_hosts(environ: Mapping[str, str]) -> list[str]:
    """The hosts of CLUSTER_SPEC (or of a JobSet's pods) in node-rank order (chief first); [] without one."""
    text = environ.get("CLUSTER_SPEC", "").strip()
    if not text and environ.get("JOBSET_NAME", "").strip():
        return parse_jobset_env(environ)[2]
    if not text:
        return []
    chief, workers, _, _ = parse_cluster_spec(text)
    return [entry.rpartition(":")[0] for entry in chief + workers]


def detect_gpus() -> tuple[int, int]:
    """Returns (number of visible CUDA GPUs, memory of GPU 0 in bytes); (0, 0) without CUDA."""
    try:
        import torch

        if not torch.cuda.is_available():
            return 0, 0
        n = torch.cuda.device_count()
        return n, int(torch.cuda.get_device_properties(0).total_memory) if n else 0
    except Exception:  # noqa: BLE001 - no torch / broken driver = no GPU
        return 0, 0
