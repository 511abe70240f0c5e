"""What a build target decides: the op each task runs, its image, and the reference evaluate compares with.

`plan_for(cfg, target)` returns the `Plan` the task builders read (`pipelines.task_builders`):
on `vertex` train-lora is a Vertex CustomJob (`training_job`, GCPC) and every task runs in the
project's images; on `gke` the same tasks are placed by `pipelines.gke` (several training nodes:
a JobSet launcher); on `local` the plain components run under `kfp.local`.
"""

import copy
from dataclasses import dataclass
from typing import Any

from components.common.reference import BASE, CHAMPION, plan_reference
from components.deploy import deploy
from components.images import ImageTagError, resolve_images
from components.register import promote, register
from components.train_lora import train_lora
from pipelines.config import Config, ConfigError
from pipelines.shapes import SCHEDULING, boot_disk_type

TARGETS = ("vertex", "local", "gke")


@dataclass(frozen=True)
class Plan:
    """The per-target task settings, decided once per build; what the task helpers read.

    Attributes:
        cfg: The validated config (its compile-time sections: pipeline, resources, register, vertex).
        vertex: Whether the target runs in the cloud (Vertex or GKE: task images, GPUs, checkpoints, register).
        gke: Whether the target is GKE (`pipelines.gke` places the tasks; JobSet for several nodes).
        images: Container images {"light": ..., "train": ...} (`components.images`); {} locally.
        train_op: train-lora: a Vertex CustomJob (GCPC wrapper) or the plain component.
        register_op: register in the light image; None when there is no register step
            (local target, or no `register.serving_image`).
        deploy_op: deploy in the light image; None without `deploy.endpoint` or register.
        promote_op: promote in the light image; None without deploy.
        reference: What evaluate compares with: "base", "champion" or "folder".
        reference_uri: The reference folder when `reference` is "folder"; "" otherwise.
    """

    cfg: Config
    vertex: bool
    gke: bool
    images: dict[str, str]
    train_op: Any
    register_op: Any
    deploy_op: Any
    promote_op: Any
    reference: str
    reference_uri: str


def _gke_training(cfg: Config, images: dict[str, str]) -> Any:
    """train-lora on GKE: the component in the train image (one node), or the JobSet launcher in the light image."""
    if cfg.resources.replica_count == 1:
        return exec_python(with_image(train_lora, images["train"]))
    from components.train_lora.component import train_lora_jobset

    return with_image(train_lora_jobset, images["light"])


def plan_for(cfg: Config, target: str) -> Plan:
    """Returns the task settings of a build (raises ConfigError for a reference Vertex cannot read or an unknown image tag)."""
    gke = target == "gke"
    vertex = target == "vertex" or gke
    if gke:
        from pipelines.gke import check_target

        check_target(cfg)
    reference, reference_uri = reference_plan(cfg, target)
    try:  # the local target runs no image
        images = resolve_images(cfg.images.light, cfg.images.train) if vertex else {}
    except ImageTagError as exc:
        raise ConfigError(f"{cfg.path or 'config'}: {exc}") from None
    registering = vertex and bool(cfg.register.serving_image) and not (gke and cfg.gke.registry == "skip")
    return Plan(
        cfg=cfg,
        vertex=vertex,
        gke=gke,
        images=images,
        train_op=(_gke_training(cfg, images) if gke else training_job(cfg, images["train"])) if vertex else train_lora,
        register_op=with_image(register, images["light"]) if registering else None,
        deploy_op=with_image(deploy, images["light"]) if registering and cfg.deploy.endpoint else None,
        promote_op=with_image(promote, images["light"]) if registering and cfg.deploy.endpoint else None,
        reference=reference,
        reference_uri=reference_uri,
    )


def reference_plan(cfg: Config, target: str) -> tuple[str, str]:
    """Resolves `eval.reference` for a target (`components.common.reference.plan_reference` decides).

    Args:
        cfg: The validated config.
        target: "vertex", "local" or "gke".

    Returns:
        (kind, uri): ("base", "") for the staged base model; ("champion", "") for the
        registry's champion, looked up at run time (Vertex; GKE unless `gke.registry: skip`);
        ("folder", uri) for a given model folder (gs:// or /gcs/ on Vertex and GKE; an
        absolute local path locally).

    Raises:
        ConfigError: A local folder as reference on the Vertex or GKE target (its tasks cannot read it).
    """
    reg = cfg.register
    try:
        kind, uri = plan_reference(
            cfg.eval.reference,
            vertex=target in ("vertex", "gke"),  # GKE's pods read gs:// (/gcs/) as Vertex's do, no local folder
            model_id=reg.model_id,
            serving_image=reg.serving_image,
            alias=reg.alias,
        )
    except ValueError as exc:
        raise ConfigError(f"{cfg.path}: {exc}") from None
    if kind == CHAMPION and target == "gke" and cfg.gke.registry == "skip":
        return BASE, ""  # no registry: compared with the base model, as locally
    return kind, uri


def with_image(component: Any, image: str) -> Any:
    """Returns a copy of a lightweight component that runs in `image`."""
    out = copy.deepcopy(component)
    out.component_spec.implementation.container.image = image
    return out


_EXECUTOR = "_KFP_RUNTIME=true python3 -m kfp.dsl.executor_main"


def exec_python(component: Any) -> Any:
    """Makes the component's shell wrapper `exec` the KFP executor instead of forking it.

    KFP starts a lightweight component as `sh -ec '...; _KFP_RUNTIME=true python3 -m
    kfp.dsl.executor_main ...'`; dash keeps running as PID 1 of the container with Python
    as its child, and does not pass on the SIGTERM that Vertex sends on preemption. With
    `exec env`, Python replaces the shell, receives SIGTERM, and train-lora can stop
    `swift sft` and copy its last finished checkpoint before the grace period ends.
    """
    out = copy.deepcopy(component)
    container = out.component_spec.implementation.container
    command = list(container.command or [])
    for i, part in enumerate(command):
        if _EXECUTOR in part and f"exec env {_EXECUTOR}" not in part:
            command[i] = part.replace(_EXECUTOR, f"exec env {_EXECUTOR}")
            container.command = command
            return out
    raise RuntimeError(
        "the KFP component command no longer contains "
        f"{_EXECUTOR!r}; update pipelines.targets.exec_python for this kfp version"
    )


def training_job(cfg: Config, image: str) -> Any:
    """Returns train_lora wrapped as a Vertex CustomJob with the config's GPU profile."""
    from google_cloud_pipeline_components.v1.custom_job import create_custom_training_job_from_component

    r, v = cfg.resources, cfg.vertex
    reservation: dict[str, Any] = {}
    if r.reservation == "any":
        reservation = {"reservation_affinity_type": "ANY_RESERVATION"}
    elif r.reservation:
        reservation = {
            "reservation_affinity_type": "SPECIFIC_RESERVATION",
            "reservation_affinity_key": "compute.googleapis.com/reservation-name",
            "reservation_affinity_values": [r.reservation],
        }
    root = cfg.pipeline.root.rstrip("/")
    # No per-run value (job id) here: it would be part of train-lora's cache key and make
    # every run retrain. Each job writes TensorBoard events to a subfolder of its own id.
    output_dir = f"{root}/custom-jobs/{cfg.pipeline.name}" if root.startswith("gs://") else ""
    return create_custom_training_job_from_component(
        exec_python(with_image(train_lora, image)),
        display_name=f"{cfg.pipeline.name}-train-lora",
        replica_count=r.replica_count,
        machine_type=r.machine_type,
        accelerator_type=r.accelerator_type,
        accelerator_count=r.accelerator_count if r.accelerator_type else 0,
        boot_disk_type=boot_disk_type(r.machine_type, r.boot_disk_type),
        boot_disk_size_gb=r.boot_disk_gb,
        timeout=f"{r.timeout_s}s",
        # A worker that restarts alone would wait at torchrun's static rendezvous until the DDP
        # timeout: with several nodes the whole job restarts and resumes from the durable checkpoint.
        restart_job_on_worker_restart=r.replica_count > 1,
        strategy=SCHEDULING[r.scheduling],
        max_wait_duration=f"{r.max_wait_s}s",
        service_account=v.service_account,
        network=v.network,
        encryption_spec_key_name=v.encryption_key,
        tensorboard=v.tensorboard,
        base_output_directory=output_dir,
        labels={str(k): str(x) for k, x in v.labels.items()},
        **({"persistent_resource_id": v.persistent_resource_id} if v.persistent_resource_id else {}),
        **reservation,
    )
