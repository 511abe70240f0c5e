"""Vertex AI facts and helpers shared by compile, run, schedule and upload.

* Machine shapes: which accelerator type and count each machine type takes, and which
  regions offer each GPU for custom training. Both tables are a **snapshot** (see
  `SNAPSHOT`) of the Vertex AI documentation; they exist so that a typo or an impossible
  shape fails at compile time, naming the key, instead of an hour later in a queued job.
  When Vertex adds a shape or a region, add it here (or set `vertex.region_check: false`).
* `init_vertex`: one place that points `google.cloud.aiplatform` at a project and region
  (and, in tests, at a local recording server).
* `check_bucket`: the pipeline root's bucket must exist before anything is submitted.

No project, region or bucket is hard-coded here: they come from the config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Sources (snapshot, compiled by hand; re-check when adding a shape):
#   https://cloud.google.com/vertex-ai/docs/training/configure-compute#gpu-compatibility-table
#   https://cloud.google.com/vertex-ai/docs/general/locations#accelerators (custom training)
SNAPSHOT = "Vertex AI docs (configure-compute GPU table, locations#accelerators), snapshot 2025"

# Accelerator-optimized machine types carry a fixed number of GPUs of one type.
FIXED_GPU_MACHINES: dict[str, tuple[str, int]] = {
    "a2-highgpu-1g": ("NVIDIA_TESLA_A100", 1),
    "a2-highgpu-2g": ("NVIDIA_TESLA_A100", 2),
    "a2-highgpu-4g": ("NVIDIA_TESLA_A100", 4),
    "a2-highgpu-8g": ("NVIDIA_TESLA_A100", 8),
    "a2-megagpu-16g": ("NVIDIA_TESLA_A100", 16),
    "a2-ultragpu-1g": ("NVIDIA_A100_80GB", 1),
    "a2-ultragpu-2g": ("NVIDIA_A100_80GB", 2),
    "a2-ultragpu-4g": ("NVIDIA_A100_80GB", 4),
    "a2-ultragpu-8g": ("NVIDIA_A100_80GB", 8),
    "a3-highgpu-1g": ("NVIDIA_H100_80GB", 1),  # Spot / FLEX_START only
    "a3-highgpu-2g": ("NVIDIA_H100_80GB", 2),  # Spot / FLEX_START only
    "a3-highgpu-4g": ("NVIDIA_H100_80GB", 4),  # Spot / FLEX_START only
    "a3-highgpu-8g": ("NVIDIA_H100_80GB", 8),
    "a3-megagpu-8g": ("NVIDIA_H100_MEGA_80GB", 8),
    "a3-ultragpu-8g": ("NVIDIA_H200_141GB", 8),
    "a4-highgpu-8g": ("NVIDIA_B200", 8),
    "g2-standard-4": ("NVIDIA_L4", 1),
    "g2-standard-8": ("NVIDIA_L4", 1),
    "g2-standard-12": ("NVIDIA_L4", 1),
    "g2-standard-16": ("NVIDIA_L4", 1),
    "g2-standard-32": ("NVIDIA_L4", 1),
    "g2-standard-24": ("NVIDIA_L4", 2),
    "g2-standard-48": ("NVIDIA_L4", 4),
    "g2-standard-96": ("NVIDIA_L4", 8),
}
# A3 shapes with fewer than 8 GPUs exist only for Spot and FLEX_START.
PREEMPTIBLE_ONLY = {"a3-highgpu-1g", "a3-highgpu-2g", "a3-highgpu-4g"}

# N1 machines take attachable GPUs in these counts.
N1_GPU_COUNTS: dict[str, tuple[int, ...]] = {
    "NVIDIA_TESLA_T4": (1, 2, 4),
    "NVIDIA_TESLA_V100": (1, 2, 4, 8),
    "NVIDIA_TESLA_P100": (1, 2, 4),
    "NVIDIA_TESLA_P4": (1, 2, 4),
}
# CPU-only families accepted for light tasks and CPU custom jobs.
CPU_FAMILIES = ("n1-", "n2-", "n2d-", "e2-", "c2-", "c3-", "m1-")

# Regions that offer each GPU for Vertex AI custom training (snapshot, see SNAPSHOT).
GPU_REGIONS: dict[str, frozenset[str]] = {
    "NVIDIA_TESLA_A100": frozenset({
        "us-central1", "us-east1", "us-west1", "us-west3", "us-west4", "europe-west4",
        "asia-northeast1", "asia-northeast3", "asia-southeast1", "me-west1",
    }),
    "NVIDIA_A100_80GB": frozenset({"us-central1", "us-east4", "us-east5", "europe-west4", "asia-southeast1"}),
    "NVIDIA_H100_80GB": frozenset({
        "us-central1", "us-east4", "us-east5", "us-west1", "us-west4", "europe-west4",
        "asia-northeast1", "asia-southeast1",
    }),
    "NVIDIA_H100_MEGA_80GB": frozenset({"us-central1", "us-east4", "us-east5", "europe-west4", "asia-northeast1"}),
    "NVIDIA_H200_141GB": frozenset({"us-central1", "us-east4", "us-east5", "europe-west1", "asia-south1"}),
    "NVIDIA_B200": frozenset({"us-central1", "us-east4", "europe-west4"}),
    "NVIDIA_L4": frozenset({
        "us-central1", "us-east1", "us-east4", "us-west1", "us-west4", "europe-west1", "europe-west2",
        "europe-west3", "europe-west4", "asia-east1", "asia-northeast1", "asia-northeast3",
        "asia-south1", "asia-southeast1",
    }),
    "NVIDIA_TESLA_T4": frozenset({
        "us-central1", "us-east1", "us-east4", "us-west1", "us-west2", "us-west4",
        "northamerica-northeast1", "southamerica-east1", "europe-west1", "europe-west2",
        "europe-west3", "europe-west4", "asia-east1", "asia-northeast1", "asia-northeast3",
        "asia-south1", "asia-southeast1", "australia-southeast1",
    }),
    "NVIDIA_TESLA_V100": frozenset({"us-central1", "us-east1", "us-west1", "europe-west4", "asia-east1"}),
    "NVIDIA_TESLA_P100": frozenset({"us-central1", "us-east1", "us-west1", "europe-west1", "europe-west4", "asia-east1"}),
    "NVIDIA_TESLA_P4": frozenset({"us-central1", "us-east4", "us-west2", "northamerica-northeast1", "europe-west4", "asia-southeast1"}),
}
ACCELERATOR_TYPES = tuple(sorted(GPU_REGIONS))

SCHEDULING = {"standard": "STANDARD", "spot": "SPOT", "flex_start": "FLEX_START"}


class VertexError(RuntimeError):
    """A Vertex request cannot be made; the message says what, where and how to fix it."""


def check_machine(machine_type: str, accelerator_type: str, accelerator_count: int) -> str | None:
    """Checks that Vertex allows this accelerator type and count on this machine type.

    Args:
        machine_type: Compute Engine machine type, e.g. `a2-highgpu-1g`.
        accelerator_type: Vertex accelerator enum name, e.g. `NVIDIA_TESLA_A100`; "" = none.
        accelerator_count: GPUs per replica (0 when there is no accelerator).

    Returns:
        None when the shape is allowed, else a message that says what is allowed.
    """
    if machine_type in FIXED_GPU_MACHINES:
        gpu, count = FIXED_GPU_MACHINES[machine_type]
        if accelerator_type != gpu or accelerator_count != count:
            return (f"{machine_type} comes with exactly {count} x {gpu}, got {accelerator_count} x "
                    f"{accelerator_type or 'no accelerator'}")
        return None
    if accelerator_type and accelerator_type not in GPU_REGIONS:
        return f"unknown accelerator type {accelerator_type!r}; known: {', '.join(ACCELERATOR_TYPES)}"
    if machine_type.startswith("n1-"):
        if not accelerator_type:
            return None if accelerator_count == 0 else "accelerator_count must be 0 without accelerator_type"
        allowed = N1_GPU_COUNTS.get(accelerator_type)
        if allowed is None:
            return f"{accelerator_type} does not attach to N1 machines; use its machine family ({_family_of(accelerator_type)})"
        if accelerator_count not in allowed:
            return f"{accelerator_type} on {machine_type} allows accelerator_count {'/'.join(map(str, allowed))}, got {accelerator_count}"
        return None
    if machine_type.startswith(CPU_FAMILIES):
        if accelerator_type or accelerator_count:
            return f"{machine_type} takes no GPU; use an a2-/a3-/g2- machine type or n1- with T4/V100/P100/P4"
        return None
    return (f"unknown machine type {machine_type!r}; known GPU machine types: "
            f"{', '.join(FIXED_GPU_MACHINES)}, or n1-*/n2-*/e2-* with attachable GPUs")


def _family_of(accelerator_type: str) -> str:
    return ", ".join(sorted({m for m, (g, _) in FIXED_GPU_MACHINES.items() if g == accelerator_type})) or "none known"


def check_region(accelerator_type: str, region: str) -> str | None:
    """Returns None when `region` offers `accelerator_type` for training, else a message."""
    if not accelerator_type:
        return None
    regions = GPU_REGIONS.get(accelerator_type, frozenset())
    if region in regions:
        return None
    return (f"{accelerator_type} is not offered for Vertex training in {region!r} (known regions: "
            f"{', '.join(sorted(regions))}; table in pipelines/vertex.py is a {SNAPSHOT}; "
            "set vertex.region_check: false if Vertex has added it since)")


@dataclass(frozen=True)
class WorkerPool:
    """One CustomJob worker pool as Vertex receives it (what tests compare against)."""

    machine_type: str
    accelerator_type: str
    accelerator_count: int
    replica_count: int


def expected_worker_pools(machine_type: str, accelerator_type: str, accelerator_count: int,
                          replica_count: int) -> list[WorkerPool]:
    """Returns the worker pools Vertex runs for a shape: the chief, then the other replicas."""
    pools = [WorkerPool(machine_type, accelerator_type, accelerator_count, 1)]
    if replica_count > 1:
        pools.append(WorkerPool(machine_type, accelerator_type, accelerator_count, replica_count - 1))
    return pools


def console_link(resource_name: str) -> str:
    """Returns the Cloud console URL of a pipeline job or schedule resource name."""
    parts = resource_name.split("/")
    fields = dict(zip(parts[::2], parts[1::2]))
    project, region = fields.get("projects", ""), fields.get("locations", "")
    if "pipelineJobs" in fields:
        return (f"https://console.cloud.google.com/vertex-ai/locations/{region}/pipelines/runs/"
                f"{fields['pipelineJobs']}?project={project}")
    if "schedules" in fields:
        return f"https://console.cloud.google.com/vertex-ai/pipelines/schedules?project={project}"
    return f"https://console.cloud.google.com/vertex-ai?project={project}"


def init_vertex(project: str, region: str, *, credentials: Any = None, api_endpoint: str | None = None,
                staging_bucket: str | None = None, experiment: str | None = None,
                service_account: str | None = None, encryption_key: str | None = None) -> None:
    """Points `google.cloud.aiplatform` at a project and region.

    Args:
        project: Google Cloud project ID.
        region: Vertex region, e.g. `us-central1`.
        credentials: google-auth credentials; default Application Default Credentials.
        api_endpoint: Override of the regional endpoint (tests: `http://127.0.0.1:PORT`,
            which also selects the REST transport). Default: the regional endpoint, gRPC.
        staging_bucket: `gs://` bucket for staging. Default none.
        experiment: Vertex experiment name (not created here). Default none.
        service_account: Default service account of jobs. Default none.
        encryption_key: Default CMEK key name. Default none.
    """
    from google.cloud import aiplatform

    kwargs: dict[str, Any] = {"project": project, "location": region}
    if credentials is not None:
        kwargs["credentials"] = credentials
    if api_endpoint:
        kwargs["api_endpoint"] = api_endpoint
        kwargs["api_transport"] = "rest"
    if staging_bucket:
        kwargs["staging_bucket"] = staging_bucket
    if service_account:
        kwargs["service_account"] = service_account
    if encryption_key:
        kwargs["encryption_spec_key_name"] = encryption_key
    aiplatform.init(**kwargs)


def bucket_of(uri: str) -> str:
    """Returns the bucket name of a `gs://bucket/...` URI ("" if it is not one)."""
    return uri[len("gs://"):].split("/", 1)[0] if uri.startswith("gs://") else ""


def check_bucket(uri: str, project: str, key: str, credentials: Any = None) -> None:
    """Checks that the bucket of a `gs://` URI exists (and is readable with our credentials).

    Args:
        uri: `gs://bucket/prefix`.
        project: Project billed for the check.
        key: Config key the URI came from (named in the error).
        credentials: google-auth credentials; default ADC.

    Raises:
        VertexError: Not a gs:// URI, or the bucket does not exist.
    """
    from google.api_core import exceptions
    from google.cloud import storage

    bucket = bucket_of(uri)
    if not bucket:
        raise VertexError(f"{key}: {uri!r} is not a gs://bucket/prefix URI; Vertex needs a Cloud Storage location")
    client = storage.Client(project=project, credentials=credentials)
    try:
        exists = client.bucket(bucket).exists(retry=None, timeout=30)
    except exceptions.Forbidden:
        raise VertexError(f"{key}: no permission to read bucket gs://{bucket} (see docs/setup.md)") from None
    if not exists:
        raise VertexError(f"{key}: bucket gs://{bucket} does not exist; create it first (docs/setup.md) "
                          "or point the config at an existing bucket")


PLACEHOLDER_MARKERS = ("YOUR_PROJECT", "YOUR_BUCKET")


def preflight(cfg: Any, credentials: Any = None, check_buckets: bool = True) -> None:
    """Checks a config can be submitted to Vertex, before anything is created.

    Args:
        cfg: The validated `Config` (shapes, regions and cron were checked at load).
        credentials: google-auth credentials for the bucket check; default ADC.
        check_buckets: Also check that the pipeline root's bucket exists. Default true.

    Raises:
        VertexError: Missing or placeholder project, a pipeline root that is not gs://,
            placeholder values left in the config, or a bucket that does not exist.
    """
    where = cfg.path or "config"
    project, root = cfg.vertex.project, cfg.pipeline.root
    if not project or project in PLACEHOLDER_MARKERS:
        raise VertexError(f"{where}: vertex.project is not set; set it to your Google Cloud project ID "
                          "(or pass --project)")
    if not root.startswith("gs://"):
        raise VertexError(f"{where}: pipeline.root {root!r} must be gs://bucket/prefix on Vertex")
    for key, value in (("pipeline.root", root), ("model.cache", cfg.model.cache), ("data.train", cfg.data.train)):
        if any(marker in value for marker in PLACEHOLDER_MARKERS):
            raise VertexError(f"{where}: {key} still holds the placeholder {value!r}; set your bucket")
    if check_buckets:
        check_bucket(root, project, "pipeline.root", credentials)
        if cfg.model.cache.startswith("gs://") and bucket_of(cfg.model.cache) != bucket_of(root):
            check_bucket(cfg.model.cache, project, "model.cache", credentials)


def run_labels(cfg: Any) -> dict[str, str]:
    """Returns the labels of a run: the config's `vertex.labels` plus the pipeline and config names."""
    from pathlib import Path

    def clean(text: str) -> str:
        return "".join(c if c.isalnum() or c in "_-" else "-" for c in text.lower())[:63]

    labels = {str(k): str(v) for k, v in cfg.vertex.labels.items()}
    labels.setdefault("pipeline", clean(cfg.pipeline.name))
    if cfg.path:
        labels.setdefault("config", clean(Path(cfg.path).stem))
    return labels


def pipeline_job(cfg: Any, template_path: str, *, enable_caching: bool | None = None,
                 credentials: Any = None, job_id: str | None = None) -> Any:
    """Returns an `aiplatform.PipelineJob` for a config (not yet submitted).

    Args:
        cfg: The validated config.
        template_path: Compiled pipeline YAML (or an Artifact Registry template URL).
        enable_caching: Reuse unchanged tasks; default the config's `pipeline.enable_caching`.
            On, the compiled per-task settings apply (every task caches except
            find-champion, whose answer changes between runs); off, no task caches.
        credentials: google-auth credentials; default the ones given to `init_vertex`.
        job_id: Pipeline job ID; default `<pipeline name>-<timestamp>`.

    Returns:
        The job; its parameter values are the config's (`pipelines.pipeline.pipeline_arguments`).
    """
    from google.cloud import aiplatform

    from pipelines.pipeline import pipeline_arguments

    caching = cfg.pipeline.enable_caching if enable_caching is None else enable_caching

    return aiplatform.PipelineJob(
        display_name=cfg.pipeline.name,
        template_path=template_path,
        job_id=job_id,
        pipeline_root=cfg.pipeline.root,
        parameter_values=pipeline_arguments(cfg),
        # True would force caching onto every task, find-champion included; None keeps the compiled settings
        enable_caching=None if caching else False,
        encryption_spec_key_name=cfg.vertex.encryption_key or None,
        labels=run_labels(cfg),
        credentials=credentials,
        project=cfg.vertex.project,
        location=cfg.vertex.region,
    )
