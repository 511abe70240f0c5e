"""The training JobSet (kubernetes-sigs/jobset, `jobset.x-k8s.io/v1alpha2`): a pure manifest builder.

Why JobSet itself and not Kubeflow Trainer's TrainJob (which runs on JobSet): train-lora starts
torchrun itself (`components.train_lora._launch`), runs its preflight and copies checkpoints on
every node, so it needs from Kubernetes only N pods that know their rank and the chief's host and
that restart together; JobSet gives exactly that, is what GKE documents for multi-node GPU work
and Kueue admits it as one workload. TrainJob would add the Trainer controller, a
ClusterTrainingRuntime per image, and its own torchrun environment on top of ours.

The layout: one replicated job `node` with one Indexed Job of `nnodes` pods (parallelism =
completions = nodes, backoffLimit 0), so `JOB_COMPLETION_INDEX` is the node rank and the chief is
`<name>-node-0-0.<name>` under the headless service JobSet creates (`network.enableDNSHostnames`).
A failed pod fails the Job; `failurePolicy.maxRestarts` restarts every node, which resume from the
newest complete durable checkpoint. Every pod mounts the bucket with the Cloud Storage FUSE CSI
driver at `/gcs/<bucket>` (the paths Vertex uses), asks for its GPUs, tolerates the GPU taint and
selects the accelerator's nodes. With Kueue the JobSet carries the queue label (Kueue unsuspends it
when admitted) and, where asked, a topology request on the pod template. On A3 Mega / A3 Ultra / A4
nodes the pod template also gets what GKE documents for GPUDirect (`components.common.gpudirect`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from components.common import gpudirect

API_VERSION = "jobset.x-k8s.io/v1alpha2"
REPLICATED_JOB = "node"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
TOPOLOGY_ANNOTATIONS = {
    "required": "kueue.x-k8s.io/podset-required-topology",
    "preferred": "kueue.x-k8s.io/podset-preferred-topology",
}
ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
GPU_RESOURCE = "nvidia.com/gpu"
FUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
FUSE_ANNOTATION = "gke-gcsfuse/volumes"
CONFIG_ANNOTATION = "vlm-lora.dev/config"  # the config a manifest was written from (`pipelines.gke` checks it)
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


class JobSetSpecError(ValueError):
    """A JobSet cannot be built from these settings; the message names the field and the fix."""


@dataclass(frozen=True)
class JobSetSpec:
    """What the training JobSet is made from (`pipelines.gke.jobset_spec` fills it from a config).

    Attributes:
        name: JobSet name (a DNS label of at most 40 characters: pod names add suffixes).
        namespace: Namespace.
        image: The training image.
        command: The container's command.
        args: Its arguments.
        nnodes: Nodes (pods), one per node.
        gpus_per_node: GPUs each pod asks for (requests = limits); 0 = a CPU pod.
        accelerator: `cloud.google.com/gke-accelerator` value ("" = no selector).
        bucket: Bucket mounted at /gcs/<bucket>.
        volume_claim: The PersistentVolumeClaim of that bucket (`storage_manifests`).
        service_account: The pods' Kubernetes service account.
        node_pool: `cloud.google.com/gke-nodepool` ("" = any node with the accelerator).
        queue: Kueue LocalQueue ("" = no Kueue).
        topology: Kueue topology level ("" = none); `topology_mode` required or preferred.
        max_restarts: JobSet failurePolicy.maxRestarts.
        master_port: The chief's rendezvous port.
        env: Extra environment variables (the config's `environment`, MLflow's), strings.
        shm_gb: Size of the memory-backed /dev/shm (DataLoader workers, NCCL). Default 16.
        labels: Extra metadata labels of the JobSet. Default none.
        annotations: Extra metadata annotations of the JobSet. Default none.
        gpudirect: The node pool's machine type whose GPUDirect settings the pods get
            (`gpudirect.MACHINES`); "" = none. Default "".
        gpudirect_networks: GKE Network names of the GPU NICs; () = GKE's documented ones. Default ().
    """

    name: str
    namespace: str
    image: str
    command: list[str]
    args: list[str]
    nnodes: int
    gpus_per_node: int
    accelerator: str
    bucket: str
    volume_claim: str
    service_account: str = "default"
    node_pool: str = ""
    queue: str = ""
    topology: str = ""
    topology_mode: str = "required"
    max_restarts: int = 2
    master_port: int = 29500
    env: dict[str, str] = field(default_factory=dict)
    shm_gb: int = 16
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    gpudirect: str = ""
    gpudirect_networks: tuple[str, ...] = ()


def check_spec(spec: JobSetSpec) -> None:
    """Raises JobSetSpecError for a spec Kubernetes or JobSet would refuse (before anything is applied)."""
    if not _NAME.match(spec.name) or len(spec.name) > 40:
        raise JobSetSpecError(f"JobSet name {spec.name!r}: use at most 40 lowercase letters, digits and '-'")
    if not _NAME.match(spec.namespace):
        raise JobSetSpecError(f"namespace {spec.namespace!r} is not a Kubernetes name")
    if spec.nnodes < 1 or spec.gpus_per_node < 0:
        raise JobSetSpecError(f"nodes {spec.nnodes} / GPUs per node {spec.gpus_per_node}: need >= 1 node, >= 0 GPUs")
    if not spec.bucket or "/" in spec.bucket:
        raise JobSetSpecError(f"bucket {spec.bucket!r}: give the bucket name of a gs://bucket URI")
    if spec.topology and not spec.queue:
        raise JobSetSpecError("a Kueue topology request needs a Kueue queue (gke.kueue: true, gke.queue)")
    if spec.topology_mode not in TOPOLOGY_ANNOTATIONS:
        raise JobSetSpecError(f"topology mode {spec.topology_mode!r}: use {' or '.join(TOPOLOGY_ANNOTATIONS)}")
    if spec.gpudirect and spec.gpudirect not in gpudirect.MACHINES:
        raise JobSetSpecError(
            f"GPUDirect for machine type {spec.gpudirect!r}: GKE documents it for {', '.join(gpudirect.MACHINES)} only"
        )


def _env(spec: JobSetSpec) -> list[dict[str, Any]]:
    def label(key: str) -> dict[str, Any]:
        return {"fieldRef": {"fieldPath": f"metadata.labels['jobset.sigs.k8s.io/{key}']"}}

    fixed = [
        {"name": "JOBSET_NAME", "valueFrom": label("jobset-name")},
        {"name": "REPLICATED_JOB_NAME", "valueFrom": label("replicatedjob-name")},
        {"name": "JOBSET_NNODES", "value": str(spec.nnodes)},
        {"name": "JOBSET_MASTER_PORT", "value": str(spec.master_port)},
    ]
    return fixed + [{"name": k, "value": str(v)} for k, v in sorted(spec.env.items())]


def _pod_spec(spec: JobSetSpec) -> dict[str, Any]:
    selector = {ACCELERATOR_LABEL: spec.accelerator} if spec.accelerator else {}
    if spec.node_pool:
        selector[NODE_POOL_LABEL] = spec.node_pool
    gpus = {GPU_RESOURCE: str(spec.gpus_per_node)} if spec.gpus_per_node else {}
    container: dict[str, Any] = {
        "name": "train-lora",
        "image": spec.image,
        "command": list(spec.command),
        "args": list(spec.args),
        "env": _env(spec),
        "ports": [{"containerPort": spec.master_port, "name": "rendezvous"}],
        "volumeMounts": [
            {"name": "gcs", "mountPath": f"/gcs/{spec.bucket}"},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }
    if gpus:
        container["resources"] = {"requests": dict(gpus), "limits": dict(gpus)}
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": spec.service_account,
        "subdomain": spec.name,
        "terminationGracePeriodSeconds": 120,  # SIGTERM: train-lora copies its last finished checkpoint
        "containers": [container],
        "volumes": [
            {"name": "gcs", "persistentVolumeClaim": {"claimName": spec.volume_claim}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{spec.shm_gb}Gi"}},
        ],
    }
    if selector:
        pod["nodeSelector"] = selector
    if gpus:
        pod["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    return pod


def build_jobset(spec: JobSetSpec) -> dict[str, Any]:
    """Returns the JobSet manifest (a dict, as `kubectl apply` / the API take it).

    Args:
        spec: The settings (checked with `check_spec`).

    Returns:
        The manifest: one replicated job of one Indexed Job with `nnodes` pods.

    Raises:
        JobSetSpecError: The spec is invalid.
    """
    check_spec(spec)
    pod_annotations = {FUSE_ANNOTATION: "true"}
    if spec.topology:
        pod_annotations[TOPOLOGY_ANNOTATIONS[spec.topology_mode]] = spec.topology
    labels = {"app.kubernetes.io/name": "vlm-lora", **spec.labels}
    if spec.queue:
        labels[QUEUE_LABEL] = spec.queue
    job = {
        "parallelism": spec.nnodes,
        "completions": spec.nnodes,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "template": {"metadata": {"annotations": pod_annotations}, "spec": _pod_spec(spec)},
    }
    if spec.gpudirect:
        gpudirect.add_to_pod(job["template"], gpudirect.MACHINES[spec.gpudirect], spec.gpudirect_networks)
    return {
        "apiVersion": API_VERSION,
        "kind": "JobSet",
        "metadata": {
            "name": spec.name,
            "namespace": spec.namespace,
            "labels": labels,
            **({"annotations": dict(spec.annotations)} if spec.annotations else {}),
        },
        "spec": {
            "network": {"enableDNSHostnames": True, "subdomain": spec.name},
            "failurePolicy": {"maxRestarts": spec.max_restarts},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": [REPLICATED_JOB]},
            **({"suspend": True} if spec.queue else {}),  # Kueue unsuspends it on admission
            "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": 1, "template": {"spec": job}}],
        },
    }


def training_command(
    model: str,
    train: str,
    eval_dir: str,
    adapter: str,
    checkpoint_dir: str,
    swift_args: dict[str, Any],
    expected_gpus: int,
    preflight: str,
    job_env: dict[str, Any],
    model_type: str = "",
) -> tuple[list[str], list[str]]:
    """Each pod's command and arguments: `python -m components.train_lora` on the FUSE paths of gs:// URIs.

    Args:
        model, train, eval_dir: The staged model and the clean datasets (gs:// or /gcs/ paths).
        adapter: The adapter folder; the chief writes `<adapter>.run.json` (metrics) and `.run.json.html`.
        checkpoint_dir: The durable checkpoint folder ("" = none).
        swift_args: The `swift sft` arguments.
        expected_gpus: GPUs per node (0 = no check).
        preflight: fail, warn or off.
        job_env: The job's extra environment.
        model_type: ms-swift model_type of the staged model (stage-model's metadata). Default "" (swift guesses).

    Returns:
        (command, args).
    """
    from components.common.storage import to_fuse_path

    args = [
        "--model", to_fuse_path(model), "--train", to_fuse_path(train), "--eval", to_fuse_path(eval_dir),
        "--adapter", to_fuse_path(adapter), "--result", result_path(adapter),
        "--swift-args", json.dumps(swift_args, sort_keys=True), "--checkpoint-dir", to_fuse_path(checkpoint_dir),
        "--expected-gpus", str(expected_gpus), "--preflight", preflight,
        "--job-env", json.dumps(job_env, sort_keys=True),
    ]  # fmt: skip
    if model_type:
        args += ["--model-type", model_type]
    return ["python3", "-m", "components.train_lora"], args


def result_path(adapter: str) -> str:
    """The chief's record of the run beside the adapter folder (`<adapter>.run.json`, FUSE path)."""
    from components.common.storage import to_fuse_path

    return to_fuse_path(adapter).rstrip("/") + ".run.json"


def storage_manifests(bucket: str, claim: str, namespace: str, size_gi: int = 5000) -> list[dict[str, Any]]:
    """The PersistentVolume and PersistentVolumeClaim of a bucket (GKE's static provisioning for GCS FUSE).

    Args:
        bucket: Bucket name.
        claim: The claim's name (and the volume's, with `-pv`).
        namespace: The claim's namespace.
        size_gi: Nominal size (GCS has none; Kubernetes needs one). Default 5000.

    Returns:
        [PersistentVolume, PersistentVolumeClaim].
    """
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{claim}-pv"},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "capacity": {"storage": f"{size_gi}Gi"},
            "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"namespace": namespace, "name": claim},
            "mountOptions": ["implicit-dirs", "file-cache:enable-parallel-downloads:true"],
            "csi": {"driver": FUSE_DRIVER, "volumeHandle": bucket},
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": f"{size_gi}Gi"}},
            "storageClassName": "",
            "volumeName": f"{claim}-pv",
        },
    }
    return [pv, pvc]


def with_run(template: dict[str, Any], name: str, args: list[str]) -> dict[str, Any]:
    """A copy of a compiled JobSet template with this run's name (and service) and container arguments.

    Args:
        template: `build_jobset`'s manifest (compiled into the pipeline).
        name: The JobSet name (a DNS label of at most 40 characters).
        args: The container's arguments (`training_command`).

    Returns:
        The manifest to create.
    """
    import copy

    if not _NAME.match(name) or len(name) > 40:
        raise JobSetSpecError(f"JobSet name {name!r}: use at most 40 lowercase letters, digits and '-'")
    out = copy.deepcopy(template)
    out["metadata"]["name"] = name
    out["spec"]["network"]["subdomain"] = name
    pod = out["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["subdomain"] = name
    pod["containers"][0]["args"] = list(args)
    return out


def rbac_manifests(namespace: str, runner: str) -> list[dict[str, Any]]:
    """The Role and RoleBinding that let the pipeline's pods (service account `runner`) run a training JobSet.

    The launcher creates, watches and deletes JobSets and reads the pods and logs of a failed one
    (`components.common.kube_jobs`); nothing else.

    Args:
        namespace: The namespace of the pipeline's pods and of the JobSet.
        runner: The service account KFP runs the pipeline's pods as.

    Returns:
        [Role, RoleBinding].
    """
    name = "vlm-lora-jobset-launcher"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": namespace},
        "rules": [
            {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"],
             "verbs": ["create", "get", "list", "watch", "delete"]},
            {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]},
        ],
    }  # fmt: skip
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": runner, "namespace": namespace}],
    }
    return [role, binding]
