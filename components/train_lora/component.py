"""KFP wrapper of the train-lora core."""

from kfp import dsl

from components.images import TRAIN_IMAGE


@dsl.component(base_image=TRAIN_IMAGE, install_kfp_package=False)
def train_lora(
    base_model: dsl.Input[dsl.Model],
    train_dataset: dsl.Input[dsl.Dataset],
    eval_dataset: dsl.Input[dsl.Dataset],
    swift_args: dict,
    adapter: dsl.Output[dsl.Model],
    metrics: dsl.Output[dsl.Metrics],
):
    """Trains a LoRA adapter with `swift sft` on the staged model and the clean datasets.

    Args:
        base_model: Staged base model (metadata model_type, revision, source).
        train_dataset: Clean training set from validate-data.
        eval_dataset: Clean held-out set from validate-data.
        swift_args: `swift sft` arguments in ms-swift's names.
        adapter: Output: adapter weights + config, args.json, base_model.json.
        metrics: Output: losses, steps, samples/s, wall time.
    """
    import tempfile

    from components.train_lora.core import TrainError, train_lora as train

    ref = {k: base_model.metadata.get(k) for k in ("source", "revision", "architecture", "model_type")}
    try:
        result = train(
            base_model.path,
            base_model.metadata.get("model_type", ""),
            train_dataset.path,
            eval_dataset.path,
            swift_args,
            adapter.path,
            tempfile.mkdtemp(prefix="train-lora-"),
            base_model_ref={**ref, "uri": base_model.uri},
        )
    except TrainError as exc:
        raise SystemExit(f"train-lora: {exc}") from None
    for key, value in result.metrics.items():
        metrics.log_metric(key, value)
    adapter.metadata.update({"base_model": base_model.uri, **ref, "checkpoint": result.checkpoint.rsplit("/", 1)[-1]})
