"""The pipeline: snapshot-data -> stage-model -> validate-data -> train-lora -> merge-export -> evaluate.

`build_pipeline(cfg, target)` returns the pipeline function with the config's values as
the parameters' defaults, so a run from the Vertex console (or `kfp.local`) needs no typing.
Its parts, one module each: `pipelines.run_parameters` (what a run can change: the parameters,
their naming rule and descriptions), `pipelines.targets` (what a target decides: each task's
op and image, the reference) and `pipelines.task_builders` (one function per task); this
module wires them into the DAG.

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

from typing import Any

from kfp import dsl

from pipelines.config import Config
from pipelines.run_parameters import PIPELINE_DOC, RUN_PARAMETERS, pipeline_arguments
from pipelines.targets import TARGETS, Plan, plan_for, reference_plan
from pipelines.task_builders import (
    CHAMPION_TASK,
    DEPLOY_TASK,
    NOTHING_TASK,
    PROMOTE_TASK,
    REGISTER_TASK,
    REGRESSION_TASK,
    SNAPSHOT_TASK,
    TASK_ORDER,
    evaluate_task,
    merge_task,
    nothing_task,
    reference_task,
    register_task,
    regression_task,
    snapshot_task,
    stage_task,
    train_task,
    validate_task,
)

# The pipeline's API; the task names, the run parameters and the reference plan live in their own modules.
__all__ = [
    "CHAMPION_TASK",
    "DEPLOY_TASK",
    "NOTHING_TASK",
    "PROMOTE_TASK",
    "REGISTER_TASK",
    "REGRESSION_TASK",
    "RUN_PARAMETERS",
    "SNAPSHOT_TASK",
    "TARGETS",
    "TASK_ORDER",
    "build_pipeline",
    "pipeline_arguments",
    "reference_plan",
]


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
    return _define_pipeline(plan_for(cfg, target), pipeline_arguments(cfg))


def _define_pipeline(plan: Plan, a: dict[str, Any]) -> Any:
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


def _dag(plan: Plan, p: dict[str, Any]) -> Any:
    """The DAG in task order, from the pipeline's parameters `p` (by name); returns whether the gate passed."""
    champion, reference_args = reference_task(plan)  # first (fail fast): the registry's champion
    snapshot = snapshot_task(plan, p, champion)  # never cached: the exact data of this run
    if champion is None:  # no champion: unchanged data is a cache hit from validate-data on
        return _train_and_gate(plan, p, snapshot, champion, reference_args)
    with dsl.If(snapshot.outputs["up_to_date"] == False, name="new-data-or-settings"):  # noqa: E712
        passed = _train_and_gate(plan, p, snapshot, champion, reference_args)
    with dsl.Else(name="champion-up-to-date"):  # the champion was trained on this data: no GPU job
        skipped = nothing_task(plan, snapshot)
    return dsl.OneOf(passed, skipped.output)


def _train_and_gate(plan: Plan, p: dict[str, Any], snapshot: Any, champion: Any, reference_args: dict) -> Any:
    """Adds stage-model -> validate-data -> train-lora -> merge-export -> evaluate (-> register); returns `passed`.

    No task here takes a per-run value (job id, name, time): with the same snapshot and
    settings, every one of them is a cache hit.
    """
    stage = stage_task(plan, p, snapshot)
    data = validate_task(plan, p, snapshot, stage, champion)
    regression = regression_task(plan, p, snapshot, stage)
    train = train_task(plan, stage, data, p["swift_args"], champion)
    if regression is not None:  # a regression set that quarantines to nothing stops the run before the GPU job
        train.after(regression)
    merge = merge_task(plan, stage, train)
    evaluation = evaluate_task(plan, p, stage, data, merge, reference_args, regression)
    register_task(plan, merge, evaluation, champion, data.outputs["eval_dataset"], p)
    return evaluation.outputs["passed"]
