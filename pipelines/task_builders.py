"""One function per task of the DAG: its component called with the run's parameters, named and placed.

Each builder takes the build's `Plan` (`pipelines.targets`) and the pipeline's parameters `p`
(by name, `pipelines.run_parameters`), calls one component and returns the task; `light` and
`gpu` name a task and, on Vertex and GKE, give it its image, machine and retries.
`pipelines.pipeline` wires them into the DAG.
"""

import dataclasses
from typing import Any

from kfp import dsl

from components.common.reference import CHAMPION
from components.evaluate import evaluate
from components.find_champion import find_champion
from components.merge_export import merge_export
from components.snapshot_data import nothing_to_train, snapshot_data
from components.stage_model import stage_model
from components.validate_data import validate_data, validate_regression
from pipelines.config import TRAIN_SERVING, Config, train_settings
from pipelines.targets import Plan

TASK_ORDER = ("snapshot-data", "stage-model", "validate-data", "train-lora", "merge-export", "evaluate")
# The first task: resolves the data sources to exact files (never cached).
SNAPSHOT_TASK = "snapshot-data"
# With eval.regression only: checks the regression set (before train-lora, which waits for it).
REGRESSION_TASK = "validate-regression"
# Vertex with a champion only: the branch taken when the champion already saw this data and settings.
NOTHING_TASK = "nothing-to-train"
# Vertex only, after the gate: the condition group and the task inside it.
REGISTER_TASK = "register"
DEPLOY_TASK = "deploy"
PROMOTE_TASK = "promote"
# Vertex only, with eval.reference champion: the registry look-up evaluate depends on.
CHAMPION_TASK = "find-champion"


# Light tasks that only read (listings, downloads, the registry's champion) are retried on
# Vertex when they fail: a transient API or network error should not end a scheduled run.
# register, deploy and promote change state and are not retried (a lost reply to an upload
# would otherwise add a second version).
RETRIED_TASKS = ("snapshot-data", "stage-model", "validate-data", "validate-regression", "find-champion")
RETRY_POLICY = {"num_retries": 2, "backoff_duration": "60s", "backoff_factor": 2.0, "backoff_max_duration": "600s"}


def light(task: Any, name: str, plan: Plan) -> Any:
    """Names a light (CPU) task; on Vertex it runs in the light image on a small machine (read-only ones retried)."""
    task.set_display_name(name)
    if plan.vertex:
        r = plan.cfg.resources
        task.set_container_image(plan.images["light"]).set_cpu_limit(str(r.light_cpu))
        task.set_memory_limit(f"{r.light_memory_gb}G")
        if name in RETRIED_TASKS:
            task.set_retry(**RETRY_POLICY)
    if plan.gke:
        from pipelines.gke import place_task

        place_task(task, plan.cfg, 0, node_pool=plan.cfg.gke.cpu_node_pool)
    return task


def gpu(task: Any, name: str, plan: Plan) -> Any:
    """Names a single-GPU task (merge-export, evaluate); on Vertex it gets the train image and one GPU."""
    task.set_display_name(name)
    if plan.vertex:
        r = plan.cfg.resources
        task.set_container_image(plan.images["train"]).set_accelerator_type(r.eval_accelerator_type)
        task.set_accelerator_limit(1).set_cpu_limit(str(r.eval_cpu)).set_memory_limit(f"{r.eval_memory_gb}G")
    if plan.gke:
        from pipelines.gke import place_task

        place_task(task, plan.cfg, 1, plan.cfg.resources.eval_accelerator_type, plan.cfg.gke.eval_node_pool)
    return task


def reference_task(plan: Plan) -> tuple[Any, dict[str, Any]]:
    """Adds find-champion when evaluate compares with the registry's champion.

    Returns:
        (the find-champion task, or None; evaluate's reference arguments: none for the
        base model, the folder's URI, or the champion's URI and version from find-champion).
    """
    if plan.reference != CHAMPION:
        return None, ({"reference_uri": plan.reference_uri} if plan.reference_uri else {})
    cfg = plan.cfg
    champion = light(
        find_champion(
            model_id=cfg.register.model_id or cfg.pipeline.name,
            alias=cfg.register.alias,
        ),
        CHAMPION_TASK,
        plan,
    )
    champion.set_caching_options(False)  # the registry's champion changes between runs
    return champion, {"reference_uri": champion.outputs["uri"], "reference_version": champion.outputs["version_id"]}


def snapshot_task(plan: Plan, p: dict[str, Any], champion: Any) -> Any:
    """Adds snapshot-data: resolves the data sources to exact files; never cached (data changes behind names)."""
    task = light(
        snapshot_data(
            train_sources=p["data_train"],
            eval_sources=p["data_eval"],
            model_source=p["model_source"],
            model_revision=p["model_revision"],
            model_token_from=p["model_token_from"],
            swift_args=p["swift_args"],
            eval_fraction=p["data_eval_fraction"],
            max_invalid_fraction=p["data_max_invalid_fraction"],
            split_seed=p["data_split_seed"],
            task=p["data_task"],
            box_convention=p["data_box_convention"],
            leakage=p["data_leakage"],
            **({"champion_uri": champion.outputs["uri"]} if champion is not None else {}),
            **({"regression_sources": plan.cfg.eval.regression} if plan.cfg.eval.regression else {}),
        ),
        SNAPSHOT_TASK,
        plan,
    )
    task.set_caching_options(False)
    return task


def stage_task(plan: Plan, p: dict[str, Any], snapshot: Any) -> Any:
    """Adds stage-model: the base model into the model cache, verified (a hit copies nothing)."""
    return light(
        stage_model(
            source=snapshot.outputs["model_source"],  # a hub source pinned to its commit at the start of the run
            cache=p["model_cache"],
            revision=snapshot.outputs["model_revision"],
            token_from=p["model_token_from"],
            allow=p["model_allow"],
            ignore=p["model_ignore"],
        ),
        "stage-model",
        plan,
    )


def validate_task(plan: Plan, p: dict[str, Any], snapshot: Any, stage: Any, champion: Any) -> Any:
    """Adds validate-data: the snapshot's rows checked, split into train / eval, the rest quarantined."""
    return light(
        validate_data(
            snapshot=snapshot.outputs["snapshot"],
            training_key=snapshot.outputs["training_key"],
            eval_fraction=p["data_eval_fraction"],
            max_invalid_fraction=p["data_max_invalid_fraction"],
            split_seed=p["data_split_seed"],
            base_model=stage.outputs["model"],
            swift_args=p["swift_args"],
            task=p["data_task"],
            box_convention=p["data_box_convention"],
            leakage=p["data_leakage"],
            **({"champion_uri": champion.outputs["uri"]} if champion is not None else {}),
        ),
        "validate-data",
        plan,
    )


def regression_task(plan: Plan, p: dict[str, Any], snapshot: Any, stage: Any) -> Any:
    """Adds validate-regression when the config has a regression set (else None); cached like validate-data."""
    if not plan.cfg.eval.regression:
        return None
    return light(
        validate_regression(
            snapshot=snapshot.outputs["regression_snapshot"],
            base_model=stage.outputs["model"],
            max_invalid_fraction=p["data_max_invalid_fraction"],
            swift_args=p["swift_args"],
            box_convention=p["data_box_convention"],
        ),
        REGRESSION_TASK,
        plan,
    )


def train_task(plan: Plan, stage: Any, data: Any, swift_args: Any, champion: Any) -> Any:
    """Adds train-lora; on Vertex with durable checkpoints, after find-champion, retried on Spot."""
    cfg = plan.cfg
    jobset: dict[str, Any] = {}
    if plan.gke and cfg.resources.replica_count > 1:
        from pipelines.gke import jobset_template

        jobset["jobset"] = jobset_template(cfg, plan.images["train"])
    train = plan.train_op(
        base_model=stage.outputs["model"],
        train_dataset=data.outputs["train_dataset"],
        eval_dataset=data.outputs["eval_dataset"],
        swift_args=swift_args,
        # preflight, GPU check, durable checkpoints (Vertex, GKE), job environment: one value, rebuilt by the task
        settings=train_settings(cfg, plan.vertex).as_param(),
        **jobset,
    ).set_display_name("train-lora")
    if champion is not None:  # Vertex fails slow: without this, a failed look-up would still let training run
        train.after(champion)
    if plan.vertex and not plan.gke and cfg.resources.scheduling == "spot":
        train.set_retry(num_retries=2)  # a preempted job restarts and resumes from its newest complete checkpoint
    if plan.gke:
        from pipelines.gke import place_training

        place_training(train, cfg)
    return train


def merge_task(plan: Plan, stage: Any, train: Any) -> Any:
    """Adds merge-export: the adapter merged into the base model, weight-verified."""
    return gpu(merge_export(base_model=stage.outputs["model"], adapter=train.outputs["adapter"]), "merge-export", plan)


def evaluate_task(
    plan: Plan, p: dict[str, Any], stage: Any, data: Any, merge: Any, reference_args: dict, regression: Any
) -> Any:
    """Adds evaluate: base (or reference) and tuned model on the held-out rows, the gate, the regression rule."""
    regression_args = {}
    if regression is not None:
        regression_args = {"regression_dataset": regression.outputs["regression_dataset"]}
    return gpu(
        evaluate(
            base_model=stage.outputs["model"],
            tuned_model=merge.outputs["merged_model"],
            eval_dataset=data.outputs["eval_dataset"],
            data_report=data.outputs["report"],  # to MLflow beside evaluate's own report
            settings=p["eval_settings"],  # the run's eval section; the task rebuilds it (from_dict)
            swift_args=p["swift_args"],  # max_pixels: the images are shrunk as in training
            box_convention=p["data_box_convention"],
            task=p["data_task"],
            **reference_args,
            **regression_args,
            **_tracking_args(plan.cfg),
        ),
        "evaluate",
        plan,
    )


def _tracking_args(cfg: Config) -> dict[str, Any]:
    """evaluate's and register's `tracking` argument (MLflow, W&B); nothing when the config names neither."""
    param = cfg.tracking.param(cfg.pipeline.name)
    return {"tracking": param} if param else {}


def register_task(plan: Plan, merge: Any, evaluation: Any, champion: Any, eval_dataset: Any, p: dict[str, Any]) -> None:
    """Adds register behind the gate (Vertex with `register.serving_image` set; else nothing).

    Without `deploy.endpoint`: register uploads the version and moves the alias. With it:
    register uploads without moving the alias → deploy (smoke test through the deployed model,
    then its traffic share) → promote (the champion check again, then the alias). A failed
    deploy leaves the alias, the default version and the endpoint's traffic where they were.
    """
    if plan.register_op is None:
        return
    deploying = bool(plan.cfg.deploy.endpoint)
    check = {"check_champion": True, "champion_version": champion.outputs["version_id"]} if champion is not None else {}
    with dsl.If(evaluation.outputs["passed"] == True, name="gate-passed"):  # noqa: E712 (KFP condition)
        registered = _register_version_task(plan, merge, evaluation, check, p, promote=not deploying)
        if deploying:
            _deploy_and_promote(plan, registered, eval_dataset, check)


def _register_version_task(
    plan: Plan, merge: Any, evaluation: Any, check: dict, p: dict[str, Any], promote: bool
) -> Any:
    """Adds register: the merged model as a new registry version; `promote` also moves the alias to it."""
    cfg, reg = plan.cfg, plan.cfg.register
    return light(
        plan.register_op(
            merged_model=merge.outputs["merged_model"],
            eval_metrics=evaluation.outputs["metrics"],
            eval_report=evaluation.outputs["report"],  # linked from the imported Model Registry evaluation
            gate_reason=evaluation.outputs["reason"],
            gate_rules=p["eval_settings"],  # the gate's metric, min_value and min_margin are recorded
            model_id=reg.model_id or cfg.pipeline.name,
            display_name=reg.display_name or cfg.pipeline.name,
            serving_image=plan.images["train"] if reg.serving_image == TRAIN_SERVING else reg.serving_image,
            alias=reg.alias,
            labels={str(k): str(v) for k, v in cfg.vertex.labels.items()},
            run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
            serving_container=reg.container(),
            promote=promote,
            **check,
            **_tracking_args(cfg),
        ),
        REGISTER_TASK,
        plan,
    )


def _deploy_and_promote(plan: Plan, registered: Any, eval_dataset: Any, check: dict) -> None:
    """Adds deploy (beside the old version, smoke test, traffic share), then promote (alias, default version)."""
    cfg, reg = plan.cfg, plan.cfg.register
    deployed = light(
        plan.deploy_op(
            registered_model=registered.outputs["registered_model"],
            eval_dataset=eval_dataset,
            settings=dataclasses.asdict(cfg.deploy),  # the section itself; the task rebuilds it (from_dict)
            task=cfg.data.task,
            alias=reg.alias,
            **check,
        ),
        DEPLOY_TASK,
        plan,
    )
    deployed.set_caching_options(False)  # acts on the endpoint as it is now
    promoted = light(
        plan.promote_op(
            registered_model=registered.outputs["registered_model"],
            deployment=deployed.outputs["deployment"],
            alias=reg.alias,
            **check,
        ),
        PROMOTE_TASK,
        plan,
    )
    promoted.set_caching_options(False)  # moves the registry's alias as it is now


def nothing_task(plan: Plan, snapshot: Any) -> Any:
    """Adds nothing-to-train: the branch taken when the champion was trained on this data and settings."""
    return light(
        nothing_to_train(fingerprint=snapshot.outputs["fingerprint"], training_key=snapshot.outputs["training_key"]),
        NOTHING_TASK,
        plan,
    )
