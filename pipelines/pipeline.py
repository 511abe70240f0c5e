"""The pipeline: snapshot-data -> stage-model -> validate-data -> train-lora -> merge-export -> evaluate.

`build_pipeline(cfg, target)` returns the pipeline function with the config's values as
the parameters' defaults, so a run from the Vertex console (or `kfp.local`) needs no typing.

Parameters (what a run can change) and the naming rule:

* The run-time settings are the pipeline's parameters: the `model`, `data`, `swift` and
  `eval` keys listed in `RUN_PARAMETERS` (every one of those sections' keys except
  `eval.reference` and `eval.regression`, which decide whether a task exists). They show in
  the console's "Create run" form with the config's values as defaults, and
  `pipeline_arguments(cfg)` is what `pipelines.run` / `schedule` submit.
* A parameter is named `<section>_<key>` after its config key: `data.train` ->
  `data_train`, `model.source` -> `model_source`. The exceptions are whole sections:
  `swift_args`, the `swift` section (ms-swift's own argument names), and `eval_settings`, the
  `eval` section less `eval.reference` and `eval.regression` (`EvalSettings.run_settings`;
  an override `eval.metric=recall` changes that key, the others stay the config's).
* `RUN_PARAMETERS` is the one table of (parameter name, config path); `pipeline_arguments`
  is derived from it, and the pipeline function's signature lists the same names (KFP
  reads the signature; a test checks the two agree).
* Components keep their own short names (a component does not know config sections); the
  pipeline function's body is the one place that maps a parameter to a component input,
  e.g. `data_train` -> snapshot-data's `train_sources`. A stage whose settings type is its
  config section takes it as one value, field for field under the YAML's names: deploy's
  `settings` is the `deploy` section (`components.deploy.settings.DeploySettings`, fixed at
  compile time), evaluate's `settings` the `eval_settings` parameter
  (`components.evaluate.settings.EvalSettings`; register records the gate's rules from it).
* Everything else is fixed when the pipeline is compiled: `pipeline.*`, `resources`,
  `images`, `register`, `deploy`, `vertex` (task machines, images, the CustomJob, the registry
  entry, labels), `eval.reference` (whether a find-champion task exists), `eval.regression`
  (whether a validate-regression task exists, and its sources) and `tracking` (the MLflow server:
  train-lora's job environment, evaluate's and register's `tracking` argument).

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
  model to the Vertex Model Registry (with its serving container spec) and moves
  `register.alias` (the champion) to it. With `deploy.endpoint` set the alias waits:
  register (no alias) → deploy (the new version beside the old with no traffic, a smoke
  test of held-out rows through it, then its traffic share) → promote (alias and default
  version move). A failed deploy leaves alias and traffic on the previous champion.
* `local`: plain lightweight components for `kfp.local` (GCPC wrappers do not run locally).
* `gke`: open-source Kubeflow Pipelines 2 on the user's GKE cluster (`pipelines.gke`, docs/gke.md):
  the same tasks in the same images, placed with `kfp-kubernetes` (GPU tasks: the accelerator's
  node selector, `nvidia.com/gpu` requests and toleration; light tasks on CPU nodes; every task
  mounts the bucket at `/gcs/<bucket>` through the GCS FUSE CSI driver, the paths Vertex uses).
  train-lora on one node is a GPU task; on several (`resources.replica_count` > 1) a light task
  submits a JobSet of the nodes and follows it (`components.train_lora.component.train_lora_jobset`).
  register uses the Vertex Model Registry (Workload Identity) unless `gke.registry: skip`.

The reference model evaluate compares with (`eval.reference`, decided by
`components.common.reference`; see `reference_plan`): with `champion` (the default on
Vertex when the config names a registry model) a find-champion task looks up
`register.model_id@register.alias` at the start of the run (no upstream task, never
cached: the registry changes between runs; train-lora waits for it, so a missing
permission stops the run before the GPU job starts), evaluate compares with that version
(the base model when there is none yet), and register refuses to promote if the alias
has moved to another version while this run was evaluating.

The regression set (`eval.regression`, `components.common.regression`): snapshot-data resolves
its sources to a snapshot of their own (outside the data's fingerprint and training key: a new
regression row trains nothing anew), validate-regression checks its rows (cached like
validate-data: same snapshot and base model, same output) and train-lora waits for it, so a
set that quarantines to nothing stops the run before any GPU work; evaluate takes the clean
set as an optional input and applies `eval.regression_max_drop`.
"""

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

from kfp import dsl

from components.common.reference import BASE, CHAMPION, plan_reference
from components.deploy import deploy
from components.evaluate import evaluate
from components.evaluate.settings import EvalSettings
from components.find_champion import find_champion
from components.images import ImageTagError, resolve_images
from components.merge_export import merge_export
from components.register import promote, register
from components.snapshot_data import nothing_to_train, snapshot_data
from components.stage_model import stage_model
from components.train_lora import train_lora
from components.validate_data import validate_data, validate_regression
from pipelines.config import TRAIN_SERVING, Config, ConfigError, train_settings
from pipelines.shapes import SCHEDULING, boot_disk_type

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
TARGETS = ("vertex", "local", "gke")

# Every run-time setting: (pipeline parameter, config path). Named `<section>_<key>`;
# the exceptions are whole sections: `swift_args` (the `swift` section) and `eval_settings`
# (the `eval` section but its compile-time keys). The order is the pipeline function's signature order.
RUN_PARAMETERS: tuple[tuple[str, str], ...] = (
    ("model_source", "model.source"),
    ("model_cache", "model.cache"),
    ("model_revision", "model.revision"),
    ("model_token_from", "model.token_from"),
    ("model_allow", "model.allow"),
    ("model_ignore", "model.ignore"),
    ("data_train", "data.train"),
    ("data_eval", "data.eval"),
    ("data_eval_fraction", "data.eval_fraction"),
    ("data_max_invalid_fraction", "data.max_invalid_fraction"),
    ("data_split_seed", "data.split_seed"),
    ("data_task", "data.task"),
    ("data_box_convention", "data.box_convention"),
    ("data_leakage", "data.leakage"),
    ("swift_args", "swift"),
    ("eval_settings", "eval"),
)


def pipeline_arguments(cfg: Config) -> dict[str, Any]:
    """Returns the pipeline's parameter values for a config (what a run passes).

    Args:
        cfg: The validated config.

    Returns:
        {parameter name: the config's value}, one entry per `RUN_PARAMETERS` row (lists and
        mappings copied).
    """
    return {name: _config_value(cfg, path) for name, path in RUN_PARAMETERS}


def _config_value(cfg: Config, path: str) -> Any:
    """Returns the value at a dotted config path (`eval.metric`), lists and mappings copied."""
    value: Any = cfg
    for part in path.split("."):
        value = getattr(value, part)
    if isinstance(value, EvalSettings):  # evaluate's settings, less what decides which tasks exist
        return value.run_settings()
    if isinstance(value, (list, dict)):
        return type(value)(value)
    return value


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
        ConfigError: `eval.reference` names a local folder and the target is Vertex, or
            (Vertex) a default image is needed and its tag is unknown (`components.images`).
    """
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; use one of {', '.join(TARGETS)}")
    return _define_pipeline(_plan_for(cfg, target), pipeline_arguments(cfg))


@dataclass(frozen=True)
class _Plan:
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
        return _exec_python(_with_image(train_lora, images["train"]))
    from components.train_lora.component import train_lora_jobset

    return _with_image(train_lora_jobset, images["light"])


def _plan_for(cfg: Config, target: str) -> _Plan:
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
    return _Plan(
        cfg=cfg,
        vertex=vertex,
        gke=gke,
        images=images,
        train_op=(_gke_training(cfg, images) if gke else _training_job(cfg, images["train"])) if vertex else train_lora,
        register_op=_with_image(register, images["light"]) if registering else None,
        deploy_op=_with_image(deploy, images["light"]) if registering and cfg.deploy.endpoint else None,
        promote_op=_with_image(promote, images["light"]) if registering and cfg.deploy.endpoint else None,
        reference=reference,
        reference_uri=reference_uri,
    )


# The pipeline function's docstring: KFP reads each parameter's description (the console's
# "Create run" form shows it) from its Args.
PIPELINE_DOC = """Fine-tunes a vision-language model with LoRA and gates it on held-out data.

Args:
    model_source: Base model: hf://org/name, ms://org/name, gs://bucket/prefix or a folder.
    model_cache: Model cache root (folder or gs://bucket/models).
    model_revision: Branch, tag or commit of a hub model ("" = default branch).
    model_token_from: Gated-model token reference: env:VAR or a Secret Manager
        secret name (never the token itself; "" = none).
    model_allow: Only stage model files matching these globs ([] = all).
    model_ignore: Skip model files matching these globs.
    data_train: ms-swift JSONL data: files, folders / prefixes, globs (local or
        gs://), comma-separated; snapshot-data resolves them to exact files.
    data_eval: Held-out JSONL data, the same forms; empty = split data_train.
    data_eval_fraction: Held-out fraction when data_eval is empty.
    data_max_invalid_fraction: Largest tolerated fraction of invalid data lines.
    data_split_seed: Salt of the deterministic train/eval hash split.
    data_task: Answer check in validation: "", "json" or "detection".
    data_box_convention: What the data's boxes mean: "pixel", "norm1000",
        "resized_pixel" or "auto" (the staged model family's own).
    data_leakage: An eval row sharing an image or a prompt with a train row:
        "quarantine" (E_LEAK), "error" or "warn".
    swift_args: `swift sft` arguments (ms-swift names).
    eval_settings: Evaluation and the promotion gate: the config's `eval` section as JSON
        (max_new_tokens, batch_size, max_samples (0 = all), iou_threshold, metric,
        min_value, min_margin (over the reference model), regression_max_drop (per kind
        and overall), quantization ("none", "nf4", "int8"), gate_on ("point" or
        "lower_bound")); keys left out take their defaults.

Returns:
    Whether the tuned model passed the gate (False when nothing was trained: the
    champion was trained on this very data with these settings).
"""


def _define_pipeline(plan: _Plan, a: dict[str, Any]) -> Any:
    """Defines the `@dsl.pipeline` function: the parameters (defaults `a`), then the DAG in task order."""
    root = plan.cfg.pipeline.root

    def vlm_lora_pipeline(
        model_source: str = a["model_source"],
        model_cache: str = a["model_cache"],
        model_revision: str = a["model_revision"],
        model_token_from: str = a["model_token_from"],
        model_allow: list = a["model_allow"],
        model_ignore: list = a["model_ignore"],
        data_train: str = a["data_train"],
        data_eval: str = a["data_eval"],
        data_eval_fraction: float = a["data_eval_fraction"],
        data_max_invalid_fraction: float = a["data_max_invalid_fraction"],
        data_split_seed: str = a["data_split_seed"],
        data_task: str = a["data_task"],
        data_box_convention: str = a["data_box_convention"],
        data_leakage: str = a["data_leakage"],
        swift_args: dict = a["swift_args"],
        eval_settings: dict = a["eval_settings"],
    ) -> bool:
        return _dag(plan, dict(locals()))

    vlm_lora_pipeline.__doc__ = PIPELINE_DOC  # KFP reads the parameters' descriptions from it
    return dsl.pipeline(
        name=plan.cfg.pipeline.name,
        description="Stage a Qwen-VL model, validate ms-swift data, LoRA-tune with ms-swift, merge, evaluate and gate.",
        pipeline_root=root if plan.vertex and root.startswith("gs://") else None,
    )(vlm_lora_pipeline)


def _dag(plan: _Plan, p: dict[str, Any]) -> Any:
    """The DAG in task order, from the pipeline's parameters `p` (by name); returns whether the gate passed."""
    champion, reference_args = _reference_task(plan)  # first (fail fast): the registry's champion
    snapshot = _snapshot_task(plan, p, champion)  # never cached: the exact data of this run
    if champion is None:  # no champion: unchanged data is a cache hit from validate-data on
        return _train_and_gate(plan, p, snapshot, champion, reference_args)
    with dsl.If(snapshot.outputs["up_to_date"] == False, name="new-data-or-settings"):  # noqa: E712
        passed = _train_and_gate(plan, p, snapshot, champion, reference_args)
    with dsl.Else(name="champion-up-to-date"):  # the champion was trained on this data: no GPU job
        skipped = _light(
            nothing_to_train(
                fingerprint=snapshot.outputs["fingerprint"], training_key=snapshot.outputs["training_key"]
            ),
            NOTHING_TASK,
            plan,
        )
    return dsl.OneOf(passed, skipped.output)


def _snapshot_task(plan: _Plan, p: dict[str, Any], champion: Any) -> Any:
    """Adds snapshot-data: resolves the data sources to exact files; never cached (data changes behind names)."""
    task = _light(
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


def _train_and_gate(plan: _Plan, p: dict[str, Any], snapshot: Any, champion: Any, reference_args: dict) -> Any:
    """Adds stage-model -> validate-data -> train-lora -> merge-export -> evaluate (-> register); returns `passed`.

    No task here takes a per-run value (job id, name, time): with the same snapshot and
    settings, every one of them is a cache hit.
    """
    stage = _stage_task(plan, p, snapshot)
    data = _validate_task(plan, p, snapshot, stage, champion)
    regression = _regression_task(plan, p, snapshot, stage)
    train = _train_task(plan, stage, data, p["swift_args"], champion)
    if regression is not None:  # a regression set that quarantines to nothing stops the run before the GPU job
        train.after(regression)
    merge = _gpu(
        merge_export(base_model=stage.outputs["model"], adapter=train.outputs["adapter"]),
        "merge-export",
        plan,
    )
    evaluation = _evaluate_task(plan, p, stage, data, merge, reference_args, regression)
    _register_task(plan, merge, evaluation, champion, data.outputs["eval_dataset"], p)
    return evaluation.outputs["passed"]


def _stage_task(plan: _Plan, p: dict[str, Any], snapshot: Any) -> Any:
    """Adds stage-model: the base model into the model cache, verified (a hit copies nothing)."""
    return _light(
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


def _validate_task(plan: _Plan, p: dict[str, Any], snapshot: Any, stage: Any, champion: Any) -> Any:
    """Adds validate-data: the snapshot's rows checked, split into train / eval, the rest quarantined."""
    return _light(
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


def _evaluate_task(
    plan: _Plan, p: dict[str, Any], stage: Any, data: Any, merge: Any, reference_args: dict, regression: Any
) -> Any:
    """Adds evaluate: base (or reference) and tuned model on the held-out rows, the gate, the regression rule."""
    regression_args = {}
    if regression is not None:
        regression_args = {"regression_dataset": regression.outputs["regression_dataset"]}
    return _gpu(
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


def _regression_task(plan: _Plan, p: dict[str, Any], snapshot: Any, stage: Any) -> Any:
    """Adds validate-regression when the config has a regression set (else None); cached like validate-data."""
    if not plan.cfg.eval.regression:
        return None
    return _light(
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


# Light tasks that only read (listings, downloads, the registry's champion) are retried on
# Vertex when they fail: a transient API or network error should not end a scheduled run.
# register, deploy and promote change state and are not retried (a lost reply to an upload
# would otherwise add a second version).
RETRIED_TASKS = ("snapshot-data", "stage-model", "validate-data", "validate-regression", "find-champion")
RETRY_POLICY = {"num_retries": 2, "backoff_duration": "60s", "backoff_factor": 2.0, "backoff_max_duration": "600s"}


def _light(task: Any, name: str, plan: _Plan) -> Any:
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


def _gpu(task: Any, name: str, plan: _Plan) -> Any:
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


def _reference_task(plan: _Plan) -> tuple[Any, dict[str, Any]]:
    """Adds find-champion when evaluate compares with the registry's champion.

    Returns:
        (the find-champion task, or None; evaluate's reference arguments: none for the
        base model, the folder's URI, or the champion's URI and version from find-champion).
    """
    if plan.reference != CHAMPION:
        return None, ({"reference_uri": plan.reference_uri} if plan.reference_uri else {})
    cfg = plan.cfg
    champion = _light(
        find_champion(
            model_id=cfg.register.model_id or cfg.pipeline.name,
            alias=cfg.register.alias,
        ),
        CHAMPION_TASK,
        plan,
    )
    champion.set_caching_options(False)  # the registry's champion changes between runs
    return champion, {"reference_uri": champion.outputs["uri"], "reference_version": champion.outputs["version_id"]}


def _train_task(plan: _Plan, stage: Any, data: Any, swift_args: Any, champion: Any) -> Any:
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


def _tracking_args(cfg: Config) -> dict[str, Any]:
    """evaluate's and register's `tracking` argument (MLflow, W&B); nothing when the config names neither."""
    param = cfg.tracking.param(cfg.pipeline.name)
    return {"tracking": param} if param else {}


def _register_task(
    plan: _Plan, merge: Any, evaluation: Any, champion: Any, eval_dataset: Any, p: dict[str, Any]
) -> None:
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
    plan: _Plan, merge: Any, evaluation: Any, check: dict, p: dict[str, Any], promote: bool
) -> Any:
    """Adds register: the merged model as a new registry version; `promote` also moves the alias to it."""
    cfg, reg = plan.cfg, plan.cfg.register
    return _light(
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


def _deploy_and_promote(plan: _Plan, registered: Any, eval_dataset: Any, check: dict) -> None:
    """Adds deploy (beside the old version, smoke test, traffic share), then promote (alias, default version)."""
    cfg, reg = plan.cfg, plan.cfg.register
    deployed = _light(
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
    promoted = _light(
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
    raise RuntimeError(
        "the KFP component command no longer contains "
        f"{_EXECUTOR!r}; update pipelines.pipeline._exec_python for this kfp version"
    )


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
    # No per-run value (job id) here: it would be part of train-lora's cache key and make
    # every run retrain. Each job writes TensorBoard events to a subfolder of its own id.
    output_dir = f"{root}/custom-jobs/{cfg.pipeline.name}" if root.startswith("gs://") else ""
    return create_custom_training_job_from_component(
        _exec_python(_with_image(train_lora, image)),
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
