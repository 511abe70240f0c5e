"""Vertex AI machine shapes: pure tables and checks (no cloud client, no kfp).

Which accelerator type and count each machine type takes, and which regions offer each
GPU for custom training. Both tables are a **snapshot** (see `SNAPSHOT`) of the Vertex AI
documentation; they exist so that a typo or an impossible shape fails when the config
loads, naming the key, instead of an hour later in a queued job. When Vertex adds a shape
or a region, add it here (or set `vertex.region_check: false`).

`pipelines.config` checks `resources` and `vertex.region` against these tables;
`pipelines.pipeline` maps `resources.scheduling` through `SCHEDULING`; tests compare the
compiled worker pools with `expected_worker_pools`.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    "NVIDIA_TESLA_A100": frozenset(
        {
            "us-central1",
            "us-east1",
            "us-west1",
            "us-west3",
            "us-west4",
            "europe-west4",
            "asia-northeast1",
            "asia-northeast3",
            "asia-southeast1",
            "me-west1",
        }
    ),
    "NVIDIA_A100_80GB": frozenset({"us-central1", "us-east4", "us-east5", "europe-west4", "asia-southeast1"}),
    "NVIDIA_H100_80GB": frozenset(
        {
            "us-central1",
            "us-east4",
            "us-east5",
            "us-west1",
            "us-west4",
            "europe-west4",
            "asia-northeast1",
            "asia-southeast1",
        }
    ),
    "NVIDIA_H100_MEGA_80GB": frozenset({"us-central1", "us-east4", "us-east5", "europe-west4", "asia-northeast1"}),
    "NVIDIA_H200_141GB": frozenset({"us-central1", "us-east4", "us-east5", "europe-west1", "asia-south1"}),
    "NVIDIA_B200": frozenset({"us-central1", "us-east4", "europe-west4"}),
    "NVIDIA_L4": frozenset(
        {
            "us-central1",
            "us-east1",
            "us-east4",
            "us-west1",
            "us-west4",
            "europe-west1",
            "europe-west2",
            "europe-west3",
            "europe-west4",
            "asia-east1",
            "asia-northeast1",
            "asia-northeast3",
            "asia-south1",
            "asia-southeast1",
        }
    ),
    "NVIDIA_TESLA_T4": frozenset(
        {
            "us-central1",
            "us-east1",
            "us-east4",
            "us-west1",
            "us-west2",
            "us-west4",
            "northamerica-northeast1",
            "southamerica-east1",
            "europe-west1",
            "europe-west2",
            "europe-west3",
            "europe-west4",
            "asia-east1",
            "asia-northeast1",
            "asia-northeast3",
            "asia-south1",
            "asia-southeast1",
            "australia-southeast1",
        }
    ),
    "NVIDIA_TESLA_V100": frozenset({"us-central1", "us-east1", "us-west1", "europe-west4", "asia-east1"}),
    "NVIDIA_TESLA_P100": frozenset(
        {
            "us-central1",
            "us-east1",
            "us-west1",
            "europe-west1",
            "europe-west4",
            "asia-east1",
        }
    ),
    "NVIDIA_TESLA_P4": frozenset(
        {
            "us-central1",
            "us-east4",
            "us-west2",
            "northamerica-northeast1",
            "europe-west4",
            "asia-southeast1",
        }
    ),
}
ACCELERATOR_TYPES = tuple(sorted(GPU_REGIONS))

SCHEDULING = {"standard": "STANDARD", "spot": "SPOT", "flex_start": "FLEX_START"}

# Boot disks. `google.cloud.aiplatform_v1.DiskSpec.boot_disk_type` documents the valid values
# "pd-ssd", "pd-standard" and "hyperdisk-balanced", and that A3 Ultra defaults to
# "hyperdisk-balanced" (all others to "pd-ssd"). Which machine takes which disk is Compute
# Engine's (accelerator-optimized machines, "Supported disk types", snapshot 2026-12): A3 Ultra
# and A4 take Hyperdisk only, A3 High / Mega and C3 take Hyperdisk Balanced or PD-SSD, the
# A2, G2, N1, N2, N2D, E2, C2 and M1 series Persistent Disk only.
DISK_TYPES = ("pd-ssd", "pd-standard", "hyperdisk-balanced")
HYPERDISK_ONLY = frozenset({"a3-ultragpu-8g", "a4-highgpu-8g"})
_HYPERDISK_OR_SSD = ("a3-", "c3-")


def disk_types(machine_type: str) -> tuple[str, ...]:
    """Returns the boot disk types `machine_type` takes, the default first."""
    if machine_type in HYPERDISK_ONLY:
        return ("hyperdisk-balanced",)
    if machine_type.startswith(_HYPERDISK_OR_SSD):
        return ("pd-ssd", "hyperdisk-balanced")
    return ("pd-ssd", "pd-standard")


def boot_disk_type(machine_type: str, configured: str) -> str:
    """Returns the boot disk type the job asks for: `configured`, or "" = the machine's default."""
    return configured or disk_types(machine_type)[0]


def check_disk(machine_type: str, configured: str) -> str | None:
    """Returns None when `machine_type` takes the boot disk `configured` ("" = its default), else a message."""
    if not configured:
        return None
    if configured not in DISK_TYPES:
        return f"unknown boot disk type {configured!r}; aiplatform_v1.DiskSpec documents {', '.join(DISK_TYPES)}"
    allowed = disk_types(machine_type)
    if configured in allowed:
        return None
    why = " (Hyperdisk only)" if machine_type in HYPERDISK_ONLY else ""
    return (
        f"{machine_type}{why} does not take boot disk type {configured!r}; valid: {', '.join(allowed)} "
        "(or leave resources.boot_disk_type out for the machine's default)"
    )


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
            return (
                f"{machine_type} comes with exactly {count} x {gpu}, got {accelerator_count} x "
                f"{accelerator_type or 'no accelerator'}"
            )
        return None
    if accelerator_type and accelerator_type not in GPU_REGIONS:
        return f"unknown accelerator type {accelerator_type!r}; known: {', '.join(ACCELERATOR_TYPES)}"
    if machine_type.startswith("n1-"):
        if not accelerator_type:
            return None if accelerator_count == 0 else "accelerator_count must be 0 without accelerator_type"
        allowed = N1_GPU_COUNTS.get(accelerator_type)
        if allowed is None:
            return (
                f"{accelerator_type} does not attach to N1 machines; "
                f"use its machine family ({_family_of(accelerator_type)})"
            )
        if accelerator_count not in allowed:
            return (
                f"{accelerator_type} on {machine_type} allows accelerator_count "
                f"{'/'.join(map(str, allowed))}, got {accelerator_count}"
            )
        return None
    if machine_type.startswith(CPU_FAMILIES):
        if accelerator_type or accelerator_count:
            return f"{machine_type} takes no GPU; use an a2-/a3-/g2- machine type or n1- with T4/V100/P100/P4"
        return None
    return (
        f"unknown machine type {machine_type!r}; known GPU machine types: "
        f"{', '.join(FIXED_GPU_MACHINES)}, or n1-*/n2-*/e2-* with attachable GPUs"
    )


def _family_of(accelerator_type: str) -> str:
    return ", ".join(sorted({m for m, (g, _) in FIXED_GPU_MACHINES.items() if g == accelerator_type})) or "none known"


def check_region(accelerator_type: str, region: str) -> str | None:
    """Returns None when `region` offers `accelerator_type` for training, else a message."""
    if not accelerator_type:
        return None
    regions = GPU_REGIONS.get(accelerator_type, frozenset())
    if region in regions:
        return None
    return (
        f"{accelerator_type} is not offered for Vertex training in {region!r} (known regions: "
        f"{', '.join(sorted(regions))}; table in pipelines/shapes.py is a {SNAPSHOT}; "
        "set vertex.region_check: false if Vertex has added it since)"
    )


@dataclass(frozen=True)
class WorkerPool:
    """One CustomJob worker pool as Vertex receives it (what tests compare against)."""

    machine_type: str
    accelerator_type: str
    accelerator_count: int
    replica_count: int


def expected_worker_pools(
    machine_type: str, accelerator_type: str, accelerator_count: int, replica_count: int
) -> list[WorkerPool]:
    """Returns the worker pools Vertex runs for a shape: the chief, then the other replicas."""
    pools = [WorkerPool(machine_type, accelerator_type, accelerator_count, 1)]
    if replica_count > 1:
        pools.append(WorkerPool(machine_type, accelerator_type, accelerator_count, replica_count - 1))
    return pools
