"""The config's `gke` section: where the pipeline and its training JobSet run on a user's GKE cluster.

Pure data and checks (no kfp, no Kubernetes client), so `pipelines.config` loads and checks it
with the rest of a config; `pipelines.gke` turns it into task placement and `components.jobset`
into a JobSet manifest. The section is read by `--target gke` and `vlm-lora gke jobset` only; a
Vertex run ignores it.

GKE's names, from its documentation (snapshot 2026): the node label
`cloud.google.com/gke-accelerator` holds the GPU (`GKE_ACCELERATORS`), GPU nodes carry the taint
`nvidia.com/gpu=present:NoSchedule`, a node pool's name is the label `cloud.google.com/gke-nodepool`,
the Cloud Storage FUSE CSI driver is `gcsfuse.csi.storage.gke.io` and its sidecar is asked for with
the pod annotation `gke-gcsfuse/volumes: "true"`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from components.common import gpudirect
from pipelines.shapes import FIXED_GPU_MACHINES, N1_GPU_COUNTS

# Vertex accelerator enum (resources.accelerator_type) -> GKE's node label value.
GKE_ACCELERATORS: dict[str, str] = {
    "NVIDIA_TESLA_A100": "nvidia-tesla-a100",
    "NVIDIA_A100_80GB": "nvidia-a100-80gb",
    "NVIDIA_H100_80GB": "nvidia-h100-80gb",
    "NVIDIA_H100_MEGA_80GB": "nvidia-h100-mega-80gb",
    "NVIDIA_H200_141GB": "nvidia-h200-141gb",
    "NVIDIA_B200": "nvidia-b200",
    "NVIDIA_L4": "nvidia-l4",
    "NVIDIA_TESLA_T4": "nvidia-tesla-t4",
    "NVIDIA_TESLA_V100": "nvidia-tesla-v100",
    "NVIDIA_TESLA_P100": "nvidia-tesla-p100",
    "NVIDIA_TESLA_P4": "nvidia-tesla-p4",
}
TOPOLOGY_MODES = ("required", "preferred")
REGISTRIES = ("vertex", "skip")


@dataclass(frozen=True)
class GkeSection:
    """The `--target gke` settings (Kubeflow Pipelines on GKE; the training JobSet).

    Attributes:
        namespace: Kubernetes namespace of the pipeline's pods and of the JobSet (KFP's
            profile namespace in a multi-user install). Default "kubeflow".
        service_account: Kubernetes service account of the JobSet's pods, bound to a Google
            service account with Workload Identity (the pipeline's own pods run as the
            service account the run is created with). Default "default".
        bucket: `gs://bucket` mounted with the Cloud Storage FUSE CSI driver at
            `/gcs/<bucket>` in every pod (the paths Vertex uses). "" = pipeline.root's bucket.
        volume_claim: PersistentVolumeClaim of that bucket (`vlm-lora gke jobset` writes it
            with its PersistentVolume). "" = `<pipeline.name>-gcs`.
        machine_type: The machine type of the GPU node pool train-lora runs on; its GPU
            count bounds resources.accelerator_count. "" = resources.machine_type.
        node_pool: `cloud.google.com/gke-nodepool` of the training nodes; "" = any node
            with the accelerator. Default "".
        eval_node_pool: The same for merge-export and evaluate. Default "".
        cpu_node_pool: The same for the light tasks; "" = any node without a GPU taint.
        kueue: Submit the JobSet through Kueue (queue label, suspended until admitted).
            Default false.
        queue: Kueue LocalQueue (`kueue.x-k8s.io/queue-name`); needs kueue: true.
        topology: Kueue topology level the nodes of one job must share, e.g.
            `cloud.google.com/gce-topology-block`; "" = none (needs kueue: true).
        topology_mode: "required" or "preferred" (Kueue's podset-*-topology). Default "required".
        max_restarts: Times the JobSet restarts all its nodes after one fails (resume from
            the newest complete checkpoint). Default 2.
        master_port: The chief's rendezvous port. Default 29500.
        registry: "vertex" (register uploads to the Vertex Model Registry, reached with
            Workload Identity) or "skip" (no register task). Default "vertex".
        runner_service_account: The service account KFP runs the pipeline's pods as
            (`pipeline-runner` in a standalone install, `default-editor` in a profile
            namespace); `vlm-lora gke setup` lets it create and follow JobSets. Default
            "pipeline-runner".
        gpudirect: GPUDirect in the training JobSet's pods (`components.common.gpudirect`): "auto" adds
            what GKE documents for the node pool's machine on more than one node (A3 Mega: TCPXO;
            A3 Ultra, A4: RDMA through gIB; nothing elsewhere), "require" the same on any number of
            nodes and an error on a machine without it, "skip" nothing. Default "auto".
        gpudirect_networks: GKE Network names of the GPU NICs, attached as eth1, eth2, ... in order;
            [] = the names GKE's guides create (A3 Mega: vpc1..vpc8; A3 Ultra, A4: gvnic-1,
            rdma-0..rdma-7). Default [].
    """

    namespace: str = "kubeflow"
    service_account: str = "default"
    bucket: str = ""
    volume_claim: str = ""
    machine_type: str = ""
    node_pool: str = ""
    eval_node_pool: str = ""
    cpu_node_pool: str = ""
    kueue: bool = False
    queue: str = ""
    topology: str = ""
    topology_mode: str = "required"
    max_restarts: int = 2
    master_port: int = 29500
    registry: str = "vertex"
    runner_service_account: str = "pipeline-runner"
    gpudirect: str = "auto"
    gpudirect_networks: list[str] = field(default_factory=list)


def machine_gpus(machine_type: str, accelerator_type: str) -> int | None:
    """GPUs a node of this machine type has (N1: the most it can attach); None when unknown."""
    if machine_type in FIXED_GPU_MACHINES:
        return FIXED_GPU_MACHINES[machine_type][1]
    if machine_type.startswith("n1-") and accelerator_type in N1_GPU_COUNTS:
        return max(N1_GPU_COUNTS[accelerator_type])
    return None


def _dns_label(text: str) -> bool:
    return 0 < len(text) <= 63 and text.replace("-", "a").isalnum() and text == text.lower() and text[0].isalpha()


def gpudirect_problems(g: GkeSection, machine: str, gpus_per_node: int, nnodes: int) -> list[tuple[str, str]]:
    """The problems of gke.gpudirect / gpudirect_networks for the node pool's machine, as (key, message)."""
    if g.gpudirect not in gpudirect.MODES:
        return [("gke.gpudirect", f"'gke.gpudirect' must be one of {', '.join(gpudirect.MODES)}, got {g.gpudirect!r}")]
    stack = gpudirect.MACHINES.get(machine)
    if g.gpudirect == "require" and stack is None:
        known = ", ".join(f"{m} ({s.name})" for m, s in gpudirect.MACHINES.items())
        return [("gke.gpudirect", f"'gke.gpudirect' is require but the node pool's machine {machine!r} has no GPUDirect; GKE documents it for {known}: name one in gke.machine_type or set gke.gpudirect: auto")]  # fmt: skip
    used = gpudirect.for_machine(machine, g.gpudirect, nnodes)
    if g.gpudirect_networks and used is None:
        return [("gke.gpudirect_networks", f"'gke.gpudirect_networks' is set but no GPUDirect is added on {machine!r} ({nnodes} node(s), gke.gpudirect: {g.gpudirect}); remove it")]  # fmt: skip
    if used is None:
        return []
    out: list[tuple[str, str]] = []
    full = machine_gpus(machine, "")
    if full is not None and gpus_per_node != full:
        out.append(("resources.accelerator_count", f"{used.name} on {machine} needs every GPU of the node ({full}), 'resources.accelerator_count' is {gpus_per_node}; set it to {full} or gke.gpudirect: skip"))  # fmt: skip
    nets = g.gpudirect_networks
    if nets and (len(nets) != len(used.networks) or not all(map(_dns_label, nets))):
        out.append(("gke.gpudirect_networks", f"'gke.gpudirect_networks' must name {len(used.networks)} GKE Networks (Kubernetes names) for {used.name}, like {', '.join(used.networks)}; got {nets}"))  # fmt: skip
    return out


def gke_problems(
    g: GkeSection, machine_type: str, accelerator_type: str, accelerator_count: int, root: str, replica_count: int = 1
) -> list[tuple[str, str]]:
    """Every problem of a `gke` section with the resources profile, as (config key, message with the fix).

    Args:
        g: The section.
        machine_type: resources.machine_type.
        accelerator_type: resources.accelerator_type.
        accelerator_count: resources.accelerator_count (GPUs per node).
        root: pipeline.root.
        replica_count: resources.replica_count (nodes). Default 1.

    Returns:
        [] when the section can be used; the first entry is what the loader reports.
    """
    out: list[tuple[str, str]] = []
    if g.bucket and (not g.bucket.startswith("gs://") or not g.bucket[5:].strip("/")):
        out.append(("gke.bucket", f"'gke.bucket' must be a gs://bucket URI, got {g.bucket!r}"))
    if g.queue and not g.kueue:
        out.append(("gke.queue", f"'gke.queue' names the Kueue queue {g.queue!r} but 'gke.kueue' is false; set gke.kueue: true or remove gke.queue"))  # fmt: skip
    if g.topology and not g.kueue:
        out.append(("gke.topology", "'gke.topology' is a Kueue topology request but 'gke.kueue' is false; set gke.kueue: true or remove gke.topology"))  # fmt: skip
    if g.kueue and not g.queue:
        out.append(("gke.queue", "'gke.kueue' is true but 'gke.queue' is empty; name the LocalQueue of the namespace"))
    if g.topology_mode not in TOPOLOGY_MODES:
        out.append(("gke.topology_mode", f"'gke.topology_mode' must be one of {', '.join(TOPOLOGY_MODES)}, got {g.topology_mode!r}"))  # fmt: skip
    if g.registry not in REGISTRIES:
        out.append(("gke.registry", f"'gke.registry' must be one of {', '.join(REGISTRIES)}, got {g.registry!r}"))
    for key in ("namespace", "service_account", "runner_service_account"):
        if not _dns_label(getattr(g, key)):
            out.append((f"gke.{key}", f"'gke.{key}' must be a Kubernetes name (lowercase letters, digits, '-'), got {getattr(g, key)!r}"))  # fmt: skip
    if not 0 <= g.max_restarts <= 100:
        out.append(("gke.max_restarts", f"'gke.max_restarts' must be 0 to 100, got {g.max_restarts}"))
    if not 1024 <= g.master_port <= 65535:
        out.append(("gke.master_port", f"'gke.master_port' must be a port from 1024 to 65535, got {g.master_port}"))
    if accelerator_type and accelerator_type not in GKE_ACCELERATORS:
        out.append(("resources.accelerator_type", f"{accelerator_type!r} has no GKE accelerator label here; known: {', '.join(GKE_ACCELERATORS)}"))  # fmt: skip
    pool_machine = g.machine_type or machine_type
    gpus = machine_gpus(pool_machine, accelerator_type)
    key = "gke.machine_type" if g.machine_type else "resources.machine_type"
    if accelerator_type and gpus is None:
        out.append((key, f"unknown GPU machine type {pool_machine!r} for the GKE node pool; use one of {', '.join(FIXED_GPU_MACHINES)}"))  # fmt: skip
    elif gpus is not None and accelerator_count > gpus:
        pool = f" (node pool {g.node_pool!r})" if g.node_pool else ""
        out.append(("resources.accelerator_count", f"'resources.accelerator_count' is {accelerator_count} GPUs per node but {pool_machine}{pool} has {gpus}; lower it to {gpus} or name a node pool of a larger machine in gke.machine_type"))  # fmt: skip
    if not g.bucket and not root.startswith("gs://"):
        out.append(("gke.bucket", f"'gke.bucket' is empty and pipeline.root {root!r} is not gs://; set gke.bucket: gs://BUCKET (mounted at /gcs/BUCKET)"))  # fmt: skip
    return out + gpudirect_problems(g, pool_machine, accelerator_count, replica_count)


def gke_bucket(g: GkeSection, root: str) -> str:
    """The bucket name mounted at /gcs/<bucket> (gke.bucket's, else pipeline.root's)."""
    uri = g.bucket or root
    return uri[5:].split("/", 1)[0] if uri.startswith("gs://") else ""
