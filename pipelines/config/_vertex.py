"""The Vertex target's sections: `vertex` (where it runs), `resources` (its machines) and `images`.

`resources` and `vertex.region` are checked against the machine-shape and region tables in
`pipelines.shapes`; a released model whose bf16 weights cannot fit the profile's GPUs is
refused here too (`components.common.model_fit`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from components.common.model_fit import GPU_MEMORY_GIB, ModelTooLarge, check_fits, known_model_bytes
from components.common.quantization import known_quantized_bytes
from pipelines import shapes
from pipelines.config._errors import Check, ConfigError, Where
from pipelines.config._inputs import ModelSection


@dataclass(frozen=True)
class VertexSection:
    """Where the Vertex target runs. Every key is optional until a run is submitted.

    Attributes:
        project: Google Cloud project ID. Required by run / schedule / upload. Default "".
        region: Vertex region (also where GPUs must be offered). Default us-central1.
        service_account: Service account the pipeline and its jobs run as
            (docs/setup.md creates it). Default "" (the Compute Engine default account).
        network: VPC network `projects/NUMBER/global/networks/NAME` for peering. Default "".
        experiment: Vertex experiment the runs join, to compare metrics across runs. Default "".
        labels: Labels of runs, jobs and models (lowercase keys and values). Default {}.
        encryption_key: CMEK key `projects/P/locations/R/keyRings/K/cryptoKeys/C`. Default "".
        tensorboard: Vertex TensorBoard `projects/P/locations/R/tensorboards/ID` for
            train-lora's logs (needs a gs:// `pipeline.root`). Default "".
        template_repo: Artifact Registry KFP repository
            `https://REGION-kfp.pkg.dev/PROJECT/REPO` for `pipelines.upload`. Default "".
        region_check: Check the region against the GPU table in `pipelines.shapes` (a
            snapshot; turn off if Vertex has added the GPU there since). Default true.
        persistent_resource_id: ID of a Vertex persistent resource (a reserved cluster) of this
            project and region that train-lora's CustomJob runs on: a lowercase letter, then up to
            62 of a-z, 0-9 and '-', not ending in '-'; "" = on-demand machines. Default "".
    """

    project: str = ""
    region: str = "us-central1"
    service_account: str = ""
    network: str = ""
    experiment: str = ""
    labels: dict[str, Any] = field(default_factory=dict)
    encryption_key: str = ""
    tensorboard: str = ""
    template_repo: str = ""
    region_check: bool = True
    persistent_resource_id: str = ""


@dataclass(frozen=True)
class ResourcesSection:
    """Machines of the Vertex target. Defaults are the seed profile (1 x A100 40GB).

    Attributes:
        machine_type: train-lora's machine type. Default a2-highgpu-1g.
        accelerator_type: Vertex accelerator enum, e.g. NVIDIA_H100_80GB. Default NVIDIA_TESLA_A100.
        accelerator_count: GPUs per replica (must match the machine type). Default 1.
        replica_count: Machines (nodes) of the training job; > 1 = multi-node. Default 1.
        boot_disk_gb: Boot disk per replica, GB (checkpoints land here first). Default 200.
        boot_disk_type: pd-ssd, pd-standard or hyperdisk-balanced, as the machine takes
            (`pipelines.shapes.disk_types`: A3 Ultra and A4 take hyperdisk-balanced only);
            "" = the machine's default (hyperdisk-balanced on those, else pd-ssd). Default "".
        scheduling: standard (on demand), spot or flex_start (Dynamic Workload
            Scheduler). Default standard.
        max_wait_s: Longest wait for capacity with flex_start, seconds; 0 = no limit
            (aiplatform_v1.Scheduling.max_wait_duration). Default 86400.
        timeout_s: Longest training run, seconds. Default 604800 (7 days).
        reservation: "" (none), "any" (any matching reservation) or a reservation name
            `projects/P/zones/Z/reservations/R` (that one only). Default "".
        eval_accelerator_type: GPU of merge-export and evaluate (one each).
            Default NVIDIA_TESLA_A100.
        eval_cpu: vCPUs of merge-export and evaluate. Default 12.
        eval_memory_gb: Memory of merge-export and evaluate, GB. Default 85.
        light_cpu: vCPUs of stage-model, validate-data, find-champion and register. Default 4.
        light_memory_gb: Memory of the light tasks, GB. Default 16.
        preflight: GPU and interconnect check train-lora runs on every node before training
            (`components.common.preflight`): "fail" stops a bad node, "warn" logs and
            trains, "off" skips it. Default "fail". train-lora's setting
            (`components.train_lora.settings.TrainSettings`, which checks it).
        price_usd_per_hour: Price of one training machine per hour, USD, for the cost estimate
            `pipelines.run` prints and train-lora logs; 0 = the approximate list price in
            `components.common.cost.PRICES` (on-demand or Spot by `scheduling`). Default 0.
        price_date: The date of `price_usd_per_hour` (YYYY-MM-DD), printed with it. Default "".
    """

    machine_type: str = "a2-highgpu-1g"
    accelerator_type: str = "NVIDIA_TESLA_A100"
    accelerator_count: int = 1
    replica_count: int = 1
    boot_disk_gb: int = 200
    boot_disk_type: str = ""
    scheduling: str = "standard"
    max_wait_s: int = 86400
    timeout_s: int = 604800
    reservation: str = ""
    eval_accelerator_type: str = "NVIDIA_TESLA_A100"
    eval_cpu: int = 12
    eval_memory_gb: int = 85
    light_cpu: int = 4
    light_memory_gb: int = 16
    preflight: str = "fail"
    price_usd_per_hour: float = 0.0
    price_date: str = ""


@dataclass(frozen=True)
class ImagesSection:
    """Container image overrides; "" = the tag in `components.images`.

    Attributes:
        light: CPU image of stage-model, validate-data, find-champion and register. Default "".
        train: CUDA image of train-lora, merge-export and evaluate. Default "".
    """

    light: str = ""
    train: str = ""


def resources_checks(r: ResourcesSection) -> list[Check]:
    """The `resources` fields' own checks (counts, disk, scheduling, price, reservation, the light machines)."""
    return [
        ("resources.accelerator_count", r.accelerator_count >= 0, "0 or a positive integer"),
        ("resources.replica_count", r.replica_count >= 1, "a positive integer (machines of the training job)"),
        ("resources.boot_disk_gb", 100 <= r.boot_disk_gb <= 65536, "an integer from 100 to 65536 (GB)"),
        ("resources.scheduling", r.scheduling in shapes.SCHEDULING, "one of " + ", ".join(shapes.SCHEDULING)),
        ("resources.max_wait_s", r.max_wait_s >= 0, "0 (no limit) or a positive number of seconds"),
        ("resources.timeout_s", r.timeout_s > 0, "a positive number of seconds"),
        (
            "resources.price_usd_per_hour",
            0 <= r.price_usd_per_hour < 10_000,
            "0 (the list price table) or the machine's price per hour in USD, e.g. 4.22",
        ),
        (
            "resources.price_date",
            r.price_date == "" or _is_date(r.price_date),
            "'' or the price's date as YYYY-MM-DD",
        ),
        (
            "resources.reservation",
            r.reservation in ("", "any") or _is_reservation(r.reservation),
            "'', 'any' or 'projects/P/zones/Z/reservations/R'",
        ),
        (
            "resources.eval_accelerator_type",
            r.eval_accelerator_type in shapes.GPU_REGIONS,
            "one of " + ", ".join(shapes.ACCELERATOR_TYPES),
        ),
        ("resources.eval_cpu", r.eval_cpu > 0, "a positive integer"),
        ("resources.eval_memory_gb", r.eval_memory_gb > 0, "a positive integer"),
        ("resources.light_cpu", r.light_cpu > 0, "a positive integer"),
        ("resources.light_memory_gb", r.light_memory_gb > 0, "a positive integer"),
    ]


def vertex_checks(v: VertexSection) -> list[Check]:
    """The `vertex` fields' own checks (region, labels, service account, template repository, TensorBoard)."""
    return [
        ("vertex.region", _is_region(v.region), "a Vertex region such as 'us-central1'"),
        (
            "vertex.labels",
            all(_is_label(k, 1) and _is_label(str(x), 0) for k, x in v.labels.items()),
            "a mapping of lowercase labels (letters, digits, '_' and '-', at most 63 characters)",
        ),
        (
            "vertex.service_account",
            v.service_account == "" or v.service_account.endswith(".gserviceaccount.com"),
            "'' or a service account e-mail NAME@PROJECT.iam.gserviceaccount.com",
        ),
        (
            "vertex.template_repo",
            v.template_repo == "" or v.template_repo.startswith(("https://", "http://")),
            "'' or https://REGION-kfp.pkg.dev/PROJECT/REPO",
        ),
        (
            "vertex.tensorboard",
            v.tensorboard == "" or "/tensorboards/" in v.tensorboard,
            "'' or projects/P/locations/R/tensorboards/ID",
        ),
    ]


def check_machine(r: ResourcesSection, where: Where) -> None:
    """Refuses a machine type, GPU and GPU count that Vertex does not combine (`pipelines.shapes`)."""
    problem = shapes.check_machine(r.machine_type, r.accelerator_type, r.accelerator_count)
    if problem:
        n1_count = "count" in problem and r.machine_type.startswith("n1-")
        key = "resources.accelerator_count" if n1_count else "resources.machine_type"
        raise ConfigError(f"{where(key)}: {problem}")


def check_preemptible(r: ResourcesSection, where: Where) -> None:
    """Refuses on-demand scheduling for a machine Vertex offers only as Spot or Flex Start."""
    if r.machine_type in shapes.PREEMPTIBLE_ONLY and r.scheduling == "standard":
        raise ConfigError(
            f"{where('resources.scheduling')}: {r.machine_type} runs only with scheduling spot or flex_start"
        )


def check_model_fits(m: ModelSection, r: ResourcesSection, swift: Mapping[str, Any], where: Where) -> None:
    """Refuses a released model whose bf16 weights do not fit the profile's GPUs even with ZeRO-3.

    The size comes from the model's name (`components.common.model_fit.KNOWN_MODELS`); other
    sources are checked by train-lora once staged, before `swift sft`.
    """
    q = m.quantization
    size = known_quantized_bytes(known_model_bytes(m.source), q, moe=bool(_MOE_NAME.search(m.source)))
    gib = GPU_MEMORY_GIB.get(r.accelerator_type)
    if not size or not gib or r.accelerator_count < 1 or "deepspeed" in swift:
        return  # a DeepSpeed setting of the user's own (e.g. ZeRO-3 with CPU offload) is theirs to size
    what = f"{m.source} on {r.replica_count} x {r.accelerator_count} x {r.accelerator_type}"
    what += f" (model.quantization: {q})" if q != "none" else ""
    try:
        check_fits(size, int(gib * 1024**3), r.accelerator_count, r.replica_count, what)
    except ModelTooLarge as exc:
        raise ConfigError(f"{where('resources.machine_type')}: {exc}") from None


# A mixture-of-experts name (Qwen3-VL-30B-A3B): its fused 3-D experts stay bf16 under bitsandbytes.
_MOE_NAME = re.compile(r"-a\d+(\.\d+)?b", re.IGNORECASE)


def check_regions(v: VertexSection, r: ResourcesSection, where: Where) -> None:
    """Refuses a training or eval GPU that `vertex.region` does not offer (unless `vertex.region_check` is off)."""
    if not v.region_check:
        return
    gpus = (
        ("resources.accelerator_type", r.accelerator_type),
        ("resources.eval_accelerator_type", r.eval_accelerator_type),
    )
    for key, gpu in gpus:
        problem = shapes.check_region(gpu, v.region)
        if problem:
            raise ConfigError(f"{where(key)}: {problem} (vertex.region at {where('vertex.region')})")


def _is_date(text: str) -> bool:
    return bool(re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])", text))


def _is_reservation(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 6 and parts[0] == "projects" and parts[2] == "zones" and parts[4] == "reservations"


def _is_region(region: str) -> bool:
    parts = region.split("-")
    return len(parts) >= 2 and all(p.isalnum() and p.islower() for p in parts) and parts[-1][-1].isdigit()


def _is_label(text: str, min_len: int) -> bool:
    return min_len <= len(text) <= 63 and all(c.islower() or c.isdigit() or c in "_-" for c in text)
