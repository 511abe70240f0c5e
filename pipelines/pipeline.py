"""The pipeline: stage-model -> validate-data -> train-lora -> merge-export -> evaluate.

`build_pipeline(cfg, target)` returns the pipeline function with the config's values as
the parameters' defaults, so a run from the Vertex console (or `kfp.local`) needs no typing.

Targets (one DAG, same task names):

* `vertex`: train-lora runs as a Vertex CustomJob (GCPC
  `create_custom_training_job_from_component`) with the config's `resources` profile:
  machine, GPUs, replicas (multi-node), boot disk, Spot / FLEX_START, reservation, plus
  the `vertex` section's service account, network, CMEK key, TensorBoard and labels.
  merge-export and evaluate are single-GPU tasks: they ask for one GPU through the task's
  resource settings (accelerator type/limit, CPU, memory) and Vertex picks the machine;
  they need none of the CustomJob features (multi-node, Spot, reservation). The light
  tasks (stage-model, validate-data, find-champion, register) get a small CPU machine.
  When the gate passes and `register.serving_image` is set, register uploads the merged
  model to the Vertex Model Registry and moves `register.alias` (the champion) to it.
* `local`: plain lightweight components for `kfp.local` (GCPC wrappers do not run locally).

The reference model evaluate compares with (`eval.reference`, see `reference_plan`): with
`champion` (the default on Vertex when the config names a registry model) a find-champion
task looks up `register.model_id@register.alias` at the start of the run (no upstream
task, never cached: the registry changes between runs; train-lora waits for it, so a
missing permission stops the run before the GPU job starts), evaluate compares with that
version (the base model when there is none yet), and register refuses to promote if the
alias has moved to another version while this run was evaluating.
"""

import copy
from pathlib import Path
from typing import Any

from kfp import dsl

from components._storage import to_fuse_path
from components.evaluate import evaluate
from components.find_champion import find_champion
from components.images import resolve_images
from components.merge_export import merge_export
from components.stage_model import stage_model
from components.register import register
from components.train_lora import train_lora
from components.validate_data import validate_data
from pipelines.config import Config, ConfigError
from pipelines.vertex import SCHEDULING

TASK_ORDER = ("stage-model", "validate-data", "train-lora", "merge-export", "evaluate")
# Vertex only, after the gate: the condition group and the task inside it.
REGISTER_TASK = "register"
# Vertex only, with eval.reference champion: the registry look-up evaluate depends on.
CHAMPION_TASK = "find-champion"
TARGETS = ("vertex", "local")


def build_pipeline(cfg: Config, target: str = "local") -> Any:
    """Builds the pipeline for a config.

    Args:
        cfg: The validated config; its values become the parameters' defaults.
        target: "vertex" (train-lora as a CustomJob, GPUs on merge/eval, register) or
            "local" (plain components for kfp.local). Default "local" (what kfp.local runs;
            `pipelines.compile` passes "vertex").

    Returns:
        The `@dsl.pipeline` function (compile it, or call it under `kfp.local`).

    Raises:
        ValueError: Unknown target.
    """
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; use one of {', '.join(TARGETS)}")
    a = pipeline_arguments(cfg)
    vertex = target == "vertex"
    images = resolve_images(cfg.images.light, cfg.images.train)
    train_op = _training_job(cfg, images["train"]) if vertex else train_lora
    register_op = _with_image(register, images["light"]) if vertex and cfg.register.serving_image else None
    reference, reference_uri = reference_plan(cfg, target)
    root = cfg.pipeline.root

    def light(task: Any, name: str) -> Any:
        task.set_display_name(name)
        if vertex:
            r = cfg.resources
            task.set_container_image(images["light"]).set_cpu_limit(str(r.light_cpu)).set_memory_limit(f"{r.light_memory_gb}G")
        return task

    def gpu(task: Any, name: str) -> Any:
        task.set_display_name(name)
        if vertex:
            r = cfg.resources
            task.set_container_image(images["train"]).set_accelerator_type(r.eval_accelerator_type).set_accelerator_limit(1)
            task.set_cpu_limit(str(r.eval_cpu)).set_memory_limit(f"{r.eval_memory_gb}G")
        return task

    @dsl.pipeline(
        name=cfg.pipeline.name,
        description="Stage a Qwen-VL model, validate ms-swift data, LoRA-tune with ms-swift, merge, evaluate and gate.",
        pipeline_root=root if vertex and root.startswith("gs://") else None,
    )
    def vlm_lora_pipeline(
        model_source: str = a["model_source"],
        model_cache: str = a["model_cache"],
        model_revision: str = a["model_revision"],
        model_token_from: str = a["model_token_from"],
        model_allow: list = a["model_allow"],
        model_ignore: list = a["model_ignore"],
        train_data: str = a["train_data"],
        eval_data: str = a["eval_data"],
        eval_fraction: float = a["eval_fraction"],
        max_invalid_fraction: float = a["max_invalid_fraction"],
        split_seed: str = a["split_seed"],
        data_task: str = a["data_task"],
        swift_args: dict = a["swift_args"],
        eval_max_new_tokens: int = a["eval_max_new_tokens"],
        eval_batch_size: int = a["eval_batch_size"],
        eval_max_samples: int = a["eval_max_samples"],
        iou_threshold: float = a["iou_threshold"],
        gate_metric: str = a["gate_metric"],
        gate_min_value: float = a["gate_min_value"],
        gate_min_margin: float = a["gate_min_margin"],
    ) -> bool:
        """Fine-tunes a vision-language model with LoRA and gates it on held-out data.

        Args:
            model_source: Base model: hf://org/name, ms://org/name, gs://bucket/prefix or a folder.
            model_cache: Model cache root (folder or gs://bucket/models).
            model_revision: Branch, tag or commit of a hub model ("" = default branch).
            model_token_from: Gated-model token reference: env:VAR or a Secret Manager
                secret name (never the token itself; "" = none).
            model_allow: Only stage model files matching these globs ([] = all).
            model_ignore: Skip model files matching these globs.
            train_data: ms-swift JSONL file(s), comma-separated.
            eval_data: Held-out JSONL file(s), comma-separated; empty = split train_data.
            eval_fraction: Held-out fraction when eval_data is empty.
            max_invalid_fraction: Largest tolerated fraction of invalid data lines.
            split_seed: Salt of the deterministic train/eval hash split.
            data_task: Answer check in validation: "", "json" or "detection".
            swift_args: `swift sft` arguments (ms-swift names).
            eval_max_new_tokens: Greedy generation budget per held-out sample.
            eval_batch_size: Held-out samples generated together.
            eval_max_samples: Evaluate at most this many samples (0 = all).
            iou_threshold: IoU at which a predicted box matches a gold box.
            gate_metric: Metric the promotion gate compares.
            gate_min_value: Minimum value of the gate metric for the tuned model.
            gate_min_margin: Minimum improvement of the gate metric over the reference model
                (eval.reference: the base model or the registry's champion).

        Returns:
            Whether the tuned model passed the gate.
        """
        champion = None
        reference_args: dict[str, Any] = {"reference_uri": reference_uri} if reference_uri else {}
        if reference == "champion":  # runs at the start, beside staging; training waits for it (fail fast)
            champion = light(find_champion(
                model_id=cfg.register.model_id or cfg.pipeline.name,
                alias=cfg.register.alias,
            ), CHAMPION_TASK)
            champion.set_caching_options(False)  # the registry's champion changes between runs
            reference_args = {"reference_uri": champion.outputs["uri"],
                              "reference_version": champion.outputs["version_id"]}
        stage = light(stage_model(
            source=model_source,
            cache=model_cache,
            revision=model_revision,
            token_from=model_token_from,
            allow=model_allow,
            ignore=model_ignore,
        ), "stage-model")
        data = light(validate_data(
            train_data=train_data,
            eval_data=eval_data,
            eval_fraction=eval_fraction,
            max_invalid_fraction=max_invalid_fraction,
            split_seed=split_seed,
            base_model=stage.outputs["model"],
            swift_args=swift_args,
            task=data_task,
        ), "validate-data")
        train_kwargs = {}
        if vertex:  # durable, verified checkpoints under the pipeline root: a retried job resumes
            train_kwargs = {
                "checkpoint_root": to_fuse_path(cfg.pipeline.root.rstrip("/")) + "/checkpoints",
                "run_id": dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                "accelerator_count": cfg.resources.accelerator_count if cfg.resources.accelerator_type else 0,
            }
        train = train_op(
            base_model=stage.outputs["model"],
            train_dataset=data.outputs["train_dataset"],
            eval_dataset=data.outputs["eval_dataset"],
            swift_args=swift_args,
            **train_kwargs,
        ).set_display_name("train-lora")
        if champion is not None:  # Vertex fails slow: without this, a failed look-up would still let training run
            train.after(champion)
        if vertex and cfg.resources.scheduling == "spot":
            train.set_retry(num_retries=2)  # a preempted job is restarted and resumes from its newest complete checkpoint
        merge = gpu(merge_export(
            base_model=stage.outputs["model"],
            adapter=train.outputs["adapter"],
            run_id=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,  # lineage in the merged model's card
        ), "merge-export")
        evaluation = gpu(evaluate(
            base_model=stage.outputs["model"],
            tuned_model=merge.outputs["merged_model"],
            eval_dataset=data.outputs["eval_dataset"],
            max_new_tokens=eval_max_new_tokens,
            batch_size=eval_batch_size,
            max_samples=eval_max_samples,
            iou_threshold=iou_threshold,
            gate_metric=gate_metric,
            gate_min_value=gate_min_value,
            gate_min_margin=gate_min_margin,
            **reference_args,
        ), "evaluate")
        if register_op is not None:
            reg = cfg.register
            with dsl.If(evaluation.outputs["passed"] == True, name="gate-passed"):  # noqa: E712 (KFP condition)
                light(register_op(
                    merged_model=merge.outputs["merged_model"],
                    eval_metrics=evaluation.outputs["metrics"],
                    model_id=reg.model_id or cfg.pipeline.name,
                    display_name=reg.display_name or cfg.pipeline.name,
                    serving_image=reg.serving_image,
                    alias=reg.alias,
                    labels={str(k): str(v) for k, v in cfg.vertex.labels.items()},
                    run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
                    **({"check_champion": True, "champion_version": champion.outputs["version_id"]}
                       if champion is not None else {}),
                ), REGISTER_TASK)
        return evaluation.outputs["passed"]

    return vlm_lora_pipeline


def reference_plan(cfg: Config, target: str) -> tuple[str, str]:
    """Resolves `eval.reference` for a target: what evaluate compares the tuned model with.

    Args:
        cfg: The validated config.
        target: "vertex" or "local".

    Returns:
        (kind, uri): ("base", "") for the staged base model; ("champion", "") for the
        registry's champion, looked up at run time (Vertex only); ("folder", uri) for a
        given model folder (gs:// or /gcs/ on Vertex; an absolute local path locally).

    Raises:
        ConfigError: A local folder as reference on the Vertex target (its tasks cannot read it).
    """
    ref, reg = cfg.eval.reference, cfg.register
    if ref == "auto":
        names_a_model = bool(reg.model_id or reg.serving_image) and bool(reg.alias)
        ref = "champion" if target == "vertex" and names_a_model else "base"
    if ref == "champion":
        return ("champion", "") if target == "vertex" else ("base", "")  # no registry locally
    if ref == "base":
        return "base", ""
    if ref.startswith(("gs://", "/gcs/")):
        return "folder", ref.rstrip("/")
    if target == "vertex":
        raise ConfigError(f"{cfg.path}: 'eval.reference' {ref!r} is a local folder, which Vertex tasks cannot read; "
                          "upload it and give its gs:// URI")
    return "folder", str(Path(ref).expanduser().resolve())


def _with_image(component: Any, image: str) -> Any:
    """Returns a copy of a lightweight component that runs in `image`."""
    out = copy.deepcopy(component)
    out.component_spec.implementation.container.image = image
    return out


_EXECUTOR = "_KFP_RUNTIME=true python3 -m kfp.dsl.executor_main"


def _exec_python(component: Any) -> Any:
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
    raise RuntimeError("the KFP component command no longer contains "
                       f"{_EXECUTOR!r}; update pipelines.pipeline._exec_python for this kfp version")


def _training_job(cfg: Config, image: str) -> Any:
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
    return create_custom_training_job_from_component(
        _exec_python(_with_image(train_lora, image)),
        display_name=f"{cfg.pipeline.name}-train-lora",
        replica_count=r.replica_count,
        machine_type=r.machine_type,
        accelerator_type=r.accelerator_type,
        accelerator_count=r.accelerator_count if r.accelerator_type else 0,
        boot_disk_type=r.boot_disk_type,
        boot_disk_size_gb=r.boot_disk_gb,
        timeout=f"{r.timeout_s}s",
        strategy=SCHEDULING[r.scheduling],
        max_wait_duration=f"{r.max_wait_s}s",
        service_account=v.service_account,
        network=v.network,
        encryption_spec_key_name=v.encryption_key,
        tensorboard=v.tensorboard,
        base_output_directory=f"{root}/custom-jobs/{dsl.PIPELINE_JOB_ID_PLACEHOLDER}" if root.startswith("gs://") else "",
        labels={str(k): str(x) for k, x in v.labels.items()},
        **reservation,
    )


def pipeline_arguments(cfg: Config) -> dict[str, Any]:
    """Returns the pipeline's parameter values for a config (what a run passes)."""
    d, e = cfg.data, cfg.eval
    return {
        "model_source": cfg.model.source,
        "model_cache": cfg.model.cache,
        "model_revision": cfg.model.revision,
        "model_token_from": cfg.model.token_from,
        "model_allow": list(cfg.model.allow),
        "model_ignore": list(cfg.model.ignore),
        "train_data": d.train,
        "eval_data": d.eval,
        "eval_fraction": d.eval_fraction,
        "max_invalid_fraction": d.max_invalid_fraction,
        "split_seed": d.split_seed,
        "data_task": d.task,
        "swift_args": dict(cfg.swift),
        "eval_max_new_tokens": e.max_new_tokens,
        "eval_batch_size": e.batch_size,
        "eval_max_samples": e.max_samples,
        "iou_threshold": e.iou_threshold,
        "gate_metric": e.metric,
        "gate_min_value": e.min_value,
        "gate_min_margin": e.min_margin,
    }
