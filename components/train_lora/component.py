"""KFP wrappers of the train-lora core: the task itself, and (GKE, several nodes) the JobSet launcher."""

from kfp import dsl

from components.images import LIGHT_IMAGE, TRAIN_IMAGE


@dsl.component(base_image=TRAIN_IMAGE, install_kfp_package=False)
def train_lora(
    base_model: dsl.Input[dsl.Model],
    train_dataset: dsl.Input[dsl.Dataset],
    eval_dataset: dsl.Input[dsl.Dataset],
    swift_args: dict,
    settings: dict,
    adapter: dsl.Output[dsl.Model],
    metrics: dsl.Output[dsl.Metrics],
    loss_curve: dsl.Output[dsl.HTML],
):
    """Trains a LoRA adapter with `swift sft` on the staged model and the clean datasets.

    Args:
        base_model: Staged base model (metadata model_type, revision, source).
        train_dataset: Clean training set from validate-data.
        eval_dataset: Clean held-out set from validate-data.
        swift_args: `swift sft` arguments in ms-swift's names.
        settings: The step's own settings as a mapping (`components.train_lora.settings.TrainSettings`,
            built from the config by `pipelines.config.train_settings`): preflight ("fail", "warn" or
            "off": the GPU and interconnect check on every node before training; its figures
            preflight_tflops_min, preflight_busbw_gbps, preflight_seconds, preflight_gpus go into
            `metrics`), accelerator_count (GPUs per node the profile asks for; 0 = no check),
            checkpoint_root (durable checkpoints under `<checkpoint_root>/<key>/train-lora`, the key a
            hash of the input artifacts' URIs and swift_args; "" = none), checkpoint_dir (a durable
            folder used as is; "" = checkpoint_root's), ddp_timeout_s (NCCL timeout when
            swift.ddp_timeout is unset; 0 = 1 hour), job_env (extra environment of the preflight and
            `swift sft`: NCCL_*, TORCH_NCCL_*, ...; other names and secrets are refused). Keys left out
            take their defaults; a value its checks refuse ends the task, naming the config field.
        adapter: Output: adapter weights + config, args.json, base_model.json.
        metrics: Output: losses, steps, samples/s, peak memory, wall time, preflight figures.
        loss_curve: Output: training / eval loss per step (HTML, inline SVG).

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
            base_model, train_dataset, eval_dataset, adapter, swift_args=swift_args, settings=settings
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
    settings: dict,
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
        settings: train_lora's `settings` (`TrainSettings`): every node gets the preflight mode, the GPU
            check and the job environment; the durable checkpoints go under checkpoint_root (shared by
            the JobSet's restarts and a retried task).

    The JobSet's name is a hash of the inputs, so a retried task follows the JobSet already
    there (one that failed is replaced); a cancelled run deletes it (SIGTERM). A failed JobSet
    fails the task with the failed pod's last log lines.
    """
    from components.common.kfp_outputs import write_outputs
    from components.train_lora.step import jobset_step

    write_outputs(
        jobset_step(
            base_model, train_dataset, eval_dataset, adapter, swift_args=swift_args, jobset=jobset, settings=settings
        ),
        metrics,
        adapter=adapter,
        loss_curve=loss_curve,
    )  # fmt: skip
