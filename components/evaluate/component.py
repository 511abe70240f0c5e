"""KFP wrapper of the evaluate core."""

from typing import NamedTuple

from kfp import dsl

from components.images import TRAIN_IMAGE


@dsl.component(base_image=TRAIN_IMAGE, install_kfp_package=False)
def evaluate(
    base_model: dsl.Input[dsl.Model],
    tuned_model: dsl.Input[dsl.Model],
    eval_dataset: dsl.Input[dsl.Dataset],
    settings: dict,
    swift_args: dict,
    metrics: dsl.Output[dsl.Metrics],
    predictions: dsl.Output[dsl.Dataset],
    report: dsl.Output[dsl.HTML],
    reference_uri: str = "",
    reference_version: str = "",
    box_convention: str = "pixel",
    base_box_convention: str = "auto",
    task: str = "",
    regression_dataset: dsl.Input[dsl.Dataset] = None,
    tracking: dict = None,
    data_report: dsl.Input[dsl.HTML] = None,
) -> NamedTuple("Outputs", [("passed", bool), ("reason", str)]):
    """Generates on the held-out set with the reference and the tuned model, scores, gates.

    Args:
        base_model: Staged base model; the reference unless reference_uri is set.
        tuned_model: Merged model from merge-export.
        eval_dataset: Clean held-out set.
        settings: The run's `eval` section as a mapping (`components.evaluate.settings.EvalSettings`,
            without the compile-time reference and regression): max_new_tokens, batch_size,
            max_samples (0 = all), iou_threshold, metric, min_value, min_margin, regression_max_drop
            ({"overall" or kind: absolute drop allowed}; names left out take 0.05), quantization
            ("none" (bf16), "nf4" or "int8": both models quantised by bitsandbytes, as a QLoRA base:
            what a 4-bit deployment would score), gate_on ("point" or "lower_bound"); keys left out
            take their defaults. A value its checks refuse ends the task, naming eval.<field>.
        swift_args: The run's `swift sft` arguments; `max_pixels` (as in training) shrinks the
            images both models see and sets the resized_pixel box rule.
        metrics: Output: base_* (the reference's, also when it is the champion) and tuned_*
            metrics, speed figures, reference_is_champion, reference_version (0 = none),
            and the metadata key "reference" (base, champion@VERSION or the folder). With a
            regression set: base_regression_<kind>_<figure> / tuned_regression_<kind>_<figure>
            per kind (and base_ / tuned_regression_score overall), regression_<kind>_drop and
            regression_overall_drop, regression_passed; the metadata keys "regression" ({"overall":
            {"reference", "tuned", "delta"}, "kinds": {kind: {"reference", "tuned", "delta"}}}),
            "regression_max_drop" and "gate_failed" (the rules that failed). Quantised: base_ /
            tuned_quantized_layers (the bitsandbytes layers in each loaded model) and the metadata
            key "quantization" ("nf4" or "int8"). Bootstrap intervals over rows (95 %):
            base_ / tuned_ / margin_<figure>_ci_low and _ci_high.
        predictions: Output: per-sample answers and scores (JSONL).
        report: Output: HTML report (metric table, speed, worst samples with boxes drawn).
        reference_uri: Model to compare against instead of the base model: the champion's
            or a configured merged model folder, a path or gs:// URI (read through the /gcs
            mount). "" = the base model (also when find-champion found none). Default "".
        reference_version: The champion's registry version ID when reference_uri is the
            champion; "" otherwise. Default "".
        box_convention: Convention of the eval dataset's boxes: "pixel", "norm1000",
            "resized_pixel" or "auto" (the staged model family's own, from its metadata;
            components.common.boxes). Boxes are scored in pixels of each original image;
            resized_pixel uses the base model's preprocessor_config.json. Default "pixel".
        base_box_convention: Convention the untuned base model answers in; used for the
            reference's answers when the reference is the base model. "auto" = its family's
            (Qwen2-VL / Qwen3-VL norm1000, Qwen2.5-VL resized_pixel); "" = box_convention.
            Default "auto".
        task: How answers are scored (components.common.tasks): "detection" (boxes),
            "key_value" (fields), "json"; "" = detection. Default "".
        regression_dataset: The validated regression set (validate-regression); both models answer
            it and the gate's regression rule (settings' regression_max_drop) applies. None = no
            regression set. Default None.
        tracking: MLflow settings ({"mlflow_uri", "experiment", "required", "register_model"};
            components.common.tracking): the metrics, the data snapshot and the lineage go to the adapter's
            MLflow run; with register_model (a model name) the run becomes a version of that registered
            model, tagged with the gate's decision. Default None (no MLflow).
        data_report: validate-data's report, uploaded to MLflow with evaluate's own. Default None.
    """
    from components.common.kfp_outputs import write_outputs
    from components.evaluate.step import run_step

    return write_outputs(
        run_step(
            base_model, tuned_model, eval_dataset, predictions, report, settings=settings, swift_args=swift_args,
            reference_uri=reference_uri, reference_version=reference_version, box_convention=box_convention,
            base_box_convention=base_box_convention, task=task, regression_dataset=regression_dataset,
            tracking=tracking, data_report=data_report,
        ),
        metrics,
        ("passed", "reason"),
        report=report,
    )  # fmt: skip
