"""The pipeline: stage-model -> validate-data -> train-lora -> merge-export -> evaluate.

`build_pipeline(cfg)` returns the pipeline function with the config's values as the
parameters' defaults, so a run from the Vertex console (or `kfp.local`) needs no typing.
"""


from typing import Any

from kfp import dsl

from components.evaluate import evaluate
from components.merge_export import merge_export
from components.stage_model import stage_model
from components.train_lora import train_lora
from components.validate_data import validate_data
from pipelines.config import Config

TASK_ORDER = ("stage-model", "validate-data", "train-lora", "merge-export", "evaluate")


def build_pipeline(cfg: Config) -> Any:
    """Builds the pipeline for a config.

    Args:
        cfg: The validated config; its values become the parameters' defaults.

    Returns:
        The `@dsl.pipeline` function (compile it, or call it under `kfp.local`).
    """
    a = pipeline_arguments(cfg)

    @dsl.pipeline(
        name=cfg.pipeline.name,
        description="Stage a Qwen-VL model, validate ms-swift data, LoRA-tune with ms-swift, merge, evaluate and gate.",
    )
    def vlm_lora_pipeline(
        model_source: str = a["model_source"],
        model_cache: str = a["model_cache"],
        model_revision: str = a["model_revision"],
        model_token_from: str = a["model_token_from"],
        model_allow: list = a["model_allow"],
        model_ignore: list = a["model_ignore"],
        train_data: str = a["train_data"],
        eval_data: str = a["eval_data"],
        eval_fraction: float = a["eval_fraction"],
        max_invalid_fraction: float = a["max_invalid_fraction"],
        split_seed: str = a["split_seed"],
        data_task: str = a["data_task"],
        swift_args: dict = a["swift_args"],
        eval_max_new_tokens: int = a["eval_max_new_tokens"],
        eval_batch_size: int = a["eval_batch_size"],
        eval_max_samples: int = a["eval_max_samples"],
        iou_threshold: float = a["iou_threshold"],
        gate_metric: str = a["gate_metric"],
        gate_min_value: float = a["gate_min_value"],
        gate_min_margin: float = a["gate_min_margin"],
    ) -> bool:
        """Fine-tunes a vision-language model with LoRA and gates it on held-out data.

        Args:
            model_source: Base model: hf://org/name, ms://org/name, gs://bucket/prefix or a folder.
            model_cache: Model cache root (folder or gs://bucket/models).
            model_revision: Branch, tag or commit of a hub model ("" = default branch).
            model_token_from: Gated-model token reference: env:VAR or a Secret Manager
                secret name (never the token itself; "" = none).
            model_allow: Only stage model files matching these globs ([] = all).
            model_ignore: Skip model files matching these globs.
            train_data: ms-swift JSONL file(s), comma-separated.
            eval_data: Held-out JSONL file(s), comma-separated; empty = split train_data.
            eval_fraction: Held-out fraction when eval_data is empty.
            max_invalid_fraction: Largest tolerated fraction of invalid data lines.
            split_seed: Salt of the deterministic train/eval hash split.
            data_task: Answer check in validation: "", "json" or "detection".
            swift_args: `swift sft` arguments (ms-swift names).
            eval_max_new_tokens: Greedy generation budget per held-out sample.
            eval_batch_size: Held-out samples generated together.
            eval_max_samples: Evaluate at most this many samples (0 = all).
            iou_threshold: IoU at which a predicted box matches a gold box.
            gate_metric: Metric the promotion gate compares.
            gate_min_value: Minimum value of the gate metric for the tuned model.
            gate_min_margin: Minimum improvement of the gate metric over the base model.

        Returns:
            Whether the tuned model passed the gate.
        """
        stage = stage_model(
            source=model_source,
            cache=model_cache,
            revision=model_revision,
            token_from=model_token_from,
            allow=model_allow,
            ignore=model_ignore,
        ).set_display_name("stage-model")
        data = validate_data(
            train_data=train_data,
            eval_data=eval_data,
            eval_fraction=eval_fraction,
            max_invalid_fraction=max_invalid_fraction,
            split_seed=split_seed,
            base_model=stage.outputs["model"],
            swift_args=swift_args,
            task=data_task,
        ).set_display_name("validate-data")
        train = train_lora(
            base_model=stage.outputs["model"],
            train_dataset=data.outputs["train_dataset"],
            eval_dataset=data.outputs["eval_dataset"],
            swift_args=swift_args,
        ).set_display_name("train-lora")
        merge = merge_export(
            base_model=stage.outputs["model"],
            adapter=train.outputs["adapter"],
        ).set_display_name("merge-export")
        evaluation = evaluate(
            base_model=stage.outputs["model"],
            tuned_model=merge.outputs["merged_model"],
            eval_dataset=data.outputs["eval_dataset"],
            max_new_tokens=eval_max_new_tokens,
            batch_size=eval_batch_size,
            max_samples=eval_max_samples,
            iou_threshold=iou_threshold,
            gate_metric=gate_metric,
            gate_min_value=gate_min_value,
            gate_min_margin=gate_min_margin,
        ).set_display_name("evaluate")
        return evaluation.outputs["passed"]

    return vlm_lora_pipeline


def pipeline_arguments(cfg: Config) -> dict[str, Any]:
    """Returns the pipeline's parameter values for a config (what a run passes)."""
    d, e = cfg.data, cfg.eval
    return {
        "model_source": cfg.model.source,
        "model_cache": cfg.model.cache,
        "model_revision": cfg.model.revision,
        "model_token_from": cfg.model.token_from,
        "model_allow": list(cfg.model.allow),
        "model_ignore": list(cfg.model.ignore),
        "train_data": d.train,
        "eval_data": d.eval,
        "eval_fraction": d.eval_fraction,
        "max_invalid_fraction": d.max_invalid_fraction,
        "split_seed": d.split_seed,
        "data_task": d.task,
        "swift_args": dict(cfg.swift),
        "eval_max_new_tokens": e.max_new_tokens,
        "eval_batch_size": e.batch_size,
        "eval_max_samples": e.max_samples,
        "iou_threshold": e.iou_threshold,
        "gate_metric": e.metric,
        "gate_min_value": e.min_value,
        "gate_min_margin": e.min_margin,
    }
