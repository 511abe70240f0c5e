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
    from components.common.kfp_outputs import write_outputs
    from components.train_lora.step import train_step

    write_outputs(
        train_step(
            base_model, train_dataset, eval_dataset, adapter, swift_args=swift_args, checkpoint_dir=checkpoint_dir,
            accelerator_count=accelerator_count, ddp_timeout_s=ddp_timeout_s, checkpoint_root=checkpoint_root,
            preflight=preflight, job_env=job_env,
        ),
        metrics,
        adapter=adapter,
        loss_curve=loss_curve,
    )  # fmt: skip


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
    from components.common.kfp_outputs import write_outputs
    from components.train_lora.step import jobset_step

    write_outputs(
        jobset_step(
            base_model, train_dataset, eval_dataset, adapter, swift_args=swift_args, jobset=jobset,
            checkpoint_root=checkpoint_root, accelerator_count=accelerator_count, preflight=preflight, job_env=job_env,
        ),
        metrics,
        adapter=adapter,
        loss_curve=loss_curve,
    )  # fmt: skip
