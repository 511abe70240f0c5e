"""KFP wrapper of the evaluate core."""

from typing import NamedTuple

from kfp import dsl

from components.images import TRAIN_IMAGE


@dsl.component(base_image=TRAIN_IMAGE, install_kfp_package=False)
def evaluate(
    base_model: dsl.Input[dsl.Model],
    tuned_model: dsl.Input[dsl.Model],
    eval_dataset: dsl.Input[dsl.Dataset],
    max_new_tokens: int,
    batch_size: int,
    max_samples: int,
    iou_threshold: float,
    gate_metric: str,
    gate_min_value: float,
    gate_min_margin: float,
    metrics: dsl.Output[dsl.Metrics],
    predictions: dsl.Output[dsl.Dataset],
) -> NamedTuple("Outputs", [("passed", bool), ("reason", str)]):
    """Generates on the held-out set with the base and the tuned model, scores, gates.

    Args:
        base_model: Reference model (the staged base).
        tuned_model: Merged model from merge-export.
        eval_dataset: Clean held-out set.
        max_new_tokens: Greedy generation budget per sample.
        batch_size: Samples generated together.
        max_samples: Evaluate at most this many samples (0 = all).
        iou_threshold: IoU at which boxes match.
        gate_metric: Metric the gate compares.
        gate_min_value: Minimum tuned value of the metric.
        gate_min_margin: Minimum improvement over the base model.
        metrics: Output: base_* and tuned_* metrics, speed figures.
        predictions: Output: per-sample answers and scores (JSONL).
    """
    from collections import namedtuple

    from components.evaluate.core import EvalError, evaluate as run_eval

    try:
        result = run_eval(
            tuned_model.path, base_model.path, base_model.metadata.get("model_type", ""), eval_dataset.path,
            predictions.path, max_new_tokens, batch_size, max_samples, iou_threshold,
            gate_metric, gate_min_value, gate_min_margin,
        )
    except (EvalError, ValueError) as exc:
        raise SystemExit(f"evaluate: {exc}") from None
    for prefix, values in (("base", result.reference), ("tuned", result.tuned)):
        for key, value in values.items():
            metrics.log_metric(f"{prefix}_{key}", value)
    metrics.log_metric("passed", float(result.passed))
    print(f"evaluate: {result.reason}")
    return namedtuple("Outputs", ["passed", "reason"])(result.passed, result.reason)
