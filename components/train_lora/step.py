"""The train-lora steps as their KFP wrappers run them (pure: no kfp): train here, or as a GKE JobSet.

Both first rebuild the task's `settings` (`TrainSettings.from_dict`) and refuse what their checks
find (`checked_settings`). `train_step` runs `core.train_lora` on the input artifacts' paths, writes the loss-curve report,
attaches it to the adapter's MLflow and W&B runs and returns the `StepOutputs`
(`components.common.kfp_outputs`): the metrics, the adapter's metadata and the report to copy
onto `loss_curve`. A worker node of a multi-node job prints one line and exits 0, so the KFP
executor writes no outputs from it. `jobset_step` starts (or follows) the training JobSet and
returns the chief's record of the run the same way. A refused run ends either with
SystemExit("train-lora: ...").
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from components.common import jobset as js
from components.common import tracking, wandb_tracking
from components.common.kfp_outputs import ArtifactLike, StepOutputs
from components.common.kube_jobs import JobSetFailed, follow_jobset, in_cluster_client
from components.train_lora.core import TrainError, durable_checkpoint_dir, loss_curve_html, train_lora
from components.train_lora.settings import TrainSettings, TrainSettingsError

MODEL_REF = ("source", "revision", "architecture", "model_type")
"""The staged model's metadata keys the adapter's metadata repeats (and `base_model.json` records)."""

CURVE_NAME = "train-lora/loss_curve.html"
"""The loss-curve report's name in the adapter's MLflow and W&B runs."""


def _inputs(base_model: ArtifactLike, train: ArtifactLike, eval_: ArtifactLike, swift_args: dict) -> tuple:
    """What keys a run's durable checkpoints (and its JobSet): the inputs' URIs and the swift arguments."""
    return (base_model.uri, train.uri, eval_.uri, dict(swift_args))


def checked_settings(settings: dict) -> TrainSettings:
    """The train-lora task's `settings` rebuilt and checked, or SystemExit naming the config field and the fix.

    Raises:
        SystemExit: An unknown key, a value of the wrong type, or one `TrainSettings.problems` finds.
    """
    try:
        rebuilt = TrainSettings.from_dict(settings)
        problems = rebuilt.problems()
        if problems:
            raise TrainSettingsError(problems[0])
    except TrainSettingsError as exc:
        raise SystemExit(
            f"train-lora: settings: {exc}; correct it in the config (resources, pipeline.root, environment, "
            "tracking) and compile the pipeline again"
        ) from None
    return rebuilt


def train_step(
    base_model: ArtifactLike, train_dataset: ArtifactLike, eval_dataset: ArtifactLike, adapter: ArtifactLike, *,
    swift_args: dict, settings: dict,
) -> StepOutputs:  # fmt: skip
    """Runs the train-lora step; the arguments are the component's (see `components.train_lora.component`).

    Returns:
        metrics; metadata of "adapter"; files: the loss-curve report for "loss_curve".

    Raises:
        SystemExit: Refused settings, a refused run or a required tracker out of reach ("train-lora: ..."); 0 on a
            worker node.
    """
    s = checked_settings(settings)
    job_env = dict(s.job_env)
    ref = {k: base_model.metadata.get(k) for k in MODEL_REF}
    checkpoint_dir = s.checkpoint_dir or durable_checkpoint_dir(
        s.checkpoint_root, *_inputs(base_model, train_dataset, eval_dataset, swift_args)
    )
    work_dir = tempfile.mkdtemp(prefix="train-lora-")
    try:
        result = train_lora(
            model_dir=base_model.path, model_type=base_model.metadata.get("model_type", ""),
            train_dir=train_dataset.path, eval_dir=eval_dataset.path, swift_args=swift_args, adapter_out=adapter.path,
            work_dir=work_dir, base_model_ref={**ref, "uri": base_model.uri}, checkpoint_dir=checkpoint_dir or None,
            expected_gpus=s.accelerator_count, ddp_timeout_s=s.ddp_timeout_s or None, preflight=s.preflight,
            job_env=job_env,
            dataset_markers={d.path: d.metadata.get("manifest_sha256", "") for d in (train_dataset, eval_dataset)},
        )  # fmt: skip
    except TrainError as exc:
        raise SystemExit(f"train-lora: {exc}") from None
    if not result.is_chief:
        print("train-lora: worker node done; the chief writes the outputs", flush=True)
        raise SystemExit(0)
    curve = Path(work_dir) / "loss_curve.html"
    curve.write_text(loss_curve_html(result.log_history, speedups=result.speedups), encoding="utf-8")
    attach_report(adapter.path, str(curve), job_env)
    meta = {
        "base_model": base_model.uri, **ref, "checkpoint": result.checkpoint.rsplit("/", 1)[-1],
        "strategy": result.strategy, "resumed_from": result.resumed_from,
        "data_snapshot": train_dataset.metadata.get("data_snapshot", ""), "manifest_sha256": result.manifest_sha256,
    }  # fmt: skip
    return StepOutputs(metrics=dict(result.metrics), metadata={"adapter": meta}, files={"loss_curve": str(curve)})


def attach_report(adapter_path: str, curve: str, job_env: dict) -> None:
    """Attaches the loss-curve report to the adapter's MLflow and W&B runs (beside the curves they already have).

    Raises:
        SystemExit: A required tracker cannot be reached ("train-lora: ...").
    """
    files = {CURVE_NAME: curve}
    try:
        tracking.attach_files(tracking.Settings.from_env(job_env).as_param(), adapter_path, files, "train-lora")
        wandb = {"wandb": wandb_tracking.WandbSettings.from_env(job_env).as_param()}
        wandb_tracking.attach_files(wandb, adapter_path, files, "train-lora")
    except tracking.TrackingError as exc:
        raise SystemExit(f"train-lora: {exc}") from None


def jobset_step(
    base_model: ArtifactLike, train_dataset: ArtifactLike, eval_dataset: ArtifactLike, adapter: ArtifactLike, *,
    swift_args: dict, jobset: dict, settings: dict,
) -> StepOutputs:  # fmt: skip
    """Runs train-lora as a JobSet and waits; the arguments are the component's (`train_lora_jobset`).

    Returns:
        The chief's metrics; metadata of "adapter"; files: its loss-curve report for "loss_curve".

    Raises:
        SystemExit: Refused settings, or the JobSet failed ("train-lora: ..." with the failed pod's last log lines).
    """
    s = checked_settings(settings)
    inputs = _inputs(base_model, train_dataset, eval_dataset, swift_args)
    checkpoints = s.checkpoint_dir or durable_checkpoint_dir(s.checkpoint_root, *inputs)
    name = "vlm-lora-" + durable_checkpoint_dir("k", *inputs).split("/")[1]  # the inputs' key: one JobSet per inputs
    _, args = js.training_command(
        base_model.uri, train_dataset.uri, eval_dataset.uri, adapter.uri, checkpoints, dict(swift_args),
        s.accelerator_count, s.preflight, dict(s.job_env), base_model.metadata.get("model_type", ""),
    )  # fmt: skip
    try:
        follow_jobset(in_cluster_client(), js.with_run(jobset, name, args))
    except JobSetFailed as exc:
        raise SystemExit(f"train-lora: {exc}") from None
    return jobset_outputs(js.result_path(adapter.uri), base_model.uri)


def jobset_outputs(result: str, base_model_uri: str) -> StepOutputs:
    """The outputs of a finished JobSet from the chief's record (`<adapter>.run.json`) and report (`.html`)."""
    with open(result, encoding="utf-8") as f:
        record = json.load(f)
    meta = {"base_model": base_model_uri, **{k: record[k] for k in ("checkpoint", "strategy", "resumed_from")}}
    return StepOutputs(metrics=record["metrics"], metadata={"adapter": meta}, files={"loss_curve": result + ".html"})
