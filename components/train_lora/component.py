"""KFP wrappers of the train-lora core: the task itself, and (GKE, several nodes) the JobSet launcher."""

from kfp import dsl

from components.images import LIGHT_IMAGE, TRAIN_IMAGE


@dsl.component(base_image=TRAIN_IMAGE, install_kfp_package=False)
def train_lora(
    base_model: dsl.Input[dsl.Model],
    train_dataset: dsl.Input[dsl.Dataset],
    eval_dataset: dsl.Input[dsl.Dataset],
    swift_args: dict,
    adapter: dsl.Output[dsl.Model],
    metrics: dsl.Output[dsl.Metrics],
    loss_curve: dsl.Output[dsl.HTML],
    checkpoint_dir: str = "",
    accelerator_count: int = 0,
    ddp_timeout_s: int = 0,
    checkpoint_root: str = "",
    preflight: str = "fail",
    job_env: dict = {},  # noqa: B006 - KFP needs a literal default; the body never mutates it
):
    """Trains a LoRA adapter with `swift sft` on the staged model and the clean datasets.

    Args:
        base_model: Staged base model (metadata model_type, revision, source).
        train_dataset: Clean training set from validate-data.
        eval_dataset: Clean held-out set from validate-data.
        swift_args: `swift sft` arguments in ms-swift's names.
        adapter: Output: adapter weights + config, args.json, base_model.json.
        metrics: Output: losses, steps, samples/s, peak memory, wall time, preflight figures.
        loss_curve: Output: training / eval loss per step (HTML, inline SVG).
        checkpoint_dir: Durable folder for verified checkpoints (on Vertex a `/gcs/...`
            path, stable across retries of the job); a restarted job resumes from the
            newest complete one. "" = none (no resume).
        accelerator_count: GPUs per node the resources profile asks for; fewer visible
            GPUs stop the task before training. 0 = no check.
        ddp_timeout_s: NCCL timeout of a distributed run when swift.ddp_timeout is unset;
            0 = the default (1 hour).
        checkpoint_root: Without checkpoint_dir: checkpoints go to
            `<checkpoint_root>/<key>/train-lora`, the key a hash of the input artifacts'
            URIs and swift_args (`core.durable_checkpoint_dir`), so retries of one run share
            the folder and no per-run value breaks the cache. "" = none.
        preflight: GPU and interconnect check on every node before training: "fail"
            (stop on a slow GPU / link or a missing node), "warn" (log and train) or "off".
            Skipped without a GPU. Its figures (preflight_tflops_min, preflight_busbw_gbps,
            preflight_seconds, preflight_gpus) go into `metrics`.
        job_env: Extra environment variables of the training job (NCCL_*, TORCH_NCCL_*,
            TORCH_DISTRIBUTED_DEBUG, CUDA_DEVICE_MAX_CONNECTIONS, ...), applied to the
            preflight and to `swift sft`; other names and secrets are refused. {} = none.

    On a multi-node job (Vertex CLUSTER_SPEC) every node trains; only the chief writes
    the adapter and the metrics. Every node copies its own ranks' checkpoint files to
    checkpoint_dir; the chief marks a checkpoint complete once all nodes have. A worker
    exits with status 0 without returning, so the KFP executor writes no output metadata
    from it. On SIGTERM (preemption) the task stops swift, copies the last finished
    checkpoint and exits non-zero ("preempted: last durable checkpoint is N").
    """
    import tempfile

    from components.common.tracking import Settings, TrackingError, attach_files
    from components.common.wandb_tracking import WandbSettings
    from components.common.wandb_tracking import attach_files as wandb_files
    from components.train_lora.core import TrainError, durable_checkpoint_dir, loss_curve_html
    from components.train_lora.core import train_lora as train

    ref = {k: base_model.metadata.get(k) for k in ("source", "revision", "architecture", "model_type")}
    if not checkpoint_dir:
        inputs = (base_model.uri, train_dataset.uri, eval_dataset.uri, dict(swift_args))
        checkpoint_dir = durable_checkpoint_dir(checkpoint_root, *inputs)
    try:
        result = train(
            model_dir=base_model.path,
            model_type=base_model.metadata.get("model_type", ""),
            train_dir=train_dataset.path,
            eval_dir=eval_dataset.path,
            swift_args=swift_args,
            adapter_out=adapter.path,
            work_dir=tempfile.mkdtemp(prefix="train-lora-"),
            base_model_ref={**ref, "uri": base_model.uri},
            checkpoint_dir=checkpoint_dir or None,
            expected_gpus=accelerator_count,
            ddp_timeout_s=ddp_timeout_s or None,
            preflight=preflight,
            job_env=dict(job_env),
            dataset_markers={d.path: d.metadata.get("manifest_sha256", "") for d in (train_dataset, eval_dataset)},
        )
    except TrainError as exc:
        raise SystemExit(f"train-lora: {exc}") from None
    if not result.is_chief:
        print("train-lora: worker node done; the chief writes the outputs", flush=True)
        raise SystemExit(0)
    for key, value in result.metrics.items():
        metrics.log_metric(key, value)
    with open(loss_curve.path, "w", encoding="utf-8") as f:
        f.write(loss_curve_html(result.log_history, speedups=result.speedups))
    try:  # beside the curves MLflow and W&B already have: the report as the task shows it
        curve = {"train-lora/loss_curve.html": loss_curve.path}
        attach_files(Settings.from_env(dict(job_env)).as_param(), adapter.path, curve, "train-lora")
        wandb_files({"wandb": WandbSettings.from_env(dict(job_env)).as_param()}, adapter.path, curve, "train-lora")
    except TrackingError as exc:
        raise SystemExit(f"train-lora: {exc}") from None
    adapter.metadata.update(
        {
            "base_model": base_model.uri,
            **ref,
            "checkpoint": result.checkpoint.rsplit("/", 1)[-1],
            "strategy": result.strategy,
            "resumed_from": result.resumed_from,
            "data_snapshot": train_dataset.metadata.get("data_snapshot", ""),
            "manifest_sha256": result.manifest_sha256,
        }
    )


@dsl.component(base_image=LIGHT_IMAGE, install_kfp_package=False)
def train_lora_jobset(
    base_model: dsl.Input[dsl.Model],
    train_dataset: dsl.Input[dsl.Dataset],
    eval_dataset: dsl.Input[dsl.Dataset],
    swift_args: dict,
    adapter: dsl.Output[dsl.Model],
    metrics: dsl.Output[dsl.Metrics],
    loss_curve: dsl.Output[dsl.HTML],
    jobset: dict,
    checkpoint_root: str = "",
    accelerator_count: int = 0,
    preflight: str = "fail",
    job_env: dict = {},  # noqa: B006 - KFP needs a literal default; the body never mutates it
):
    """Trains a LoRA adapter as a JobSet of GPU nodes and waits for it (train-lora on GKE, several nodes).

    Args:
        base_model: Staged base model (its gs:// URI is read at /gcs/... by every node).
        train_dataset: Clean training set from validate-data.
        eval_dataset: Clean held-out set from validate-data.
        swift_args: `swift sft` arguments in ms-swift's names.
        adapter: Output: the adapter the chief node writes.
        metrics: Output: the chief's training figures.
        loss_curve: Output: training / eval loss per step (HTML).
        jobset: The JobSet template compiled from the resources profile (`components.common.jobset`).
        checkpoint_root: Durable checkpoints under `<checkpoint_root>/<key>/train-lora` (key: the
            inputs), shared by the JobSet's restarts and a retried task. "" = none.
        accelerator_count: GPUs per node the profile asks for (0 = no check).
        preflight: GPU and interconnect check on every node: fail, warn or off.
        job_env: Extra environment of the training job (NCCL_*, ...).

    The JobSet's name is a hash of the inputs, so a retried task follows the JobSet already
    there (one that failed is replaced); a cancelled run deletes it (SIGTERM). A failed JobSet
    fails the task with the failed pod's last log lines.
    """
    import json
    import shutil

    from components.common import jobset as js
    from components.common.kube_jobs import JobSetFailed, follow_jobset, in_cluster_client
    from components.train_lora.core import durable_checkpoint_dir

    inputs = (base_model.uri, train_dataset.uri, eval_dataset.uri, dict(swift_args))
    checkpoints = durable_checkpoint_dir(checkpoint_root, *inputs)
    name = "vlm-lora-" + durable_checkpoint_dir("k", *inputs).split("/")[1]  # the inputs' key: one JobSet per inputs
    _, args = js.training_command(
        base_model.uri, train_dataset.uri, eval_dataset.uri, adapter.uri, checkpoints, dict(swift_args),
        accelerator_count, preflight, dict(job_env), base_model.metadata.get("model_type", ""),
    )  # fmt: skip
    try:
        follow_jobset(in_cluster_client(), js.with_run(jobset, name, args))
    except JobSetFailed as exc:
        raise SystemExit(f"train-lora: {exc}") from None
    result = js.result_path(adapter.uri)
    with open(result, encoding="utf-8") as f:
        record = json.load(f)
    for key, value in record["metrics"].items():
        metrics.log_metric(key, value)
    shutil.copyfile(result + ".html", loss_curve.path)
    adapter.metadata.update(
        {"base_model": base_model.uri, **{k: record[k] for k in ("checkpoint", "strategy", "resumed_from")}}
    )
