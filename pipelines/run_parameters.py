"""The pipeline's run parameters: the table of (parameter, config path), their values, their descriptions.

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
  task builders (`pipelines.task_builders`) are the one place that map a parameter to a component input,
  e.g. `data_train` -> snapshot-data's `train_sources`. A stage whose settings type is its
  config section takes it as one value, field for field under the YAML's names: deploy's
  `settings` is the `deploy` section (`components.deploy.settings.DeploySettings`, fixed at
  compile time), evaluate's `settings` the `eval_settings` parameter
  (`components.evaluate.settings.EvalSettings`; register records the gate's rules from it),
  train-lora's `settings` its compile-time keys from `resources`, `pipeline.root` and `environment`
  (`components.train_lora.settings.TrainSettings`, `pipelines.config.train_settings`).
* Everything else is fixed when the pipeline is compiled: `pipeline.*`, `resources`,
  `images`, `register`, `deploy`, `vertex` (task machines, images, the CustomJob, the registry
  entry, labels), `eval.reference` (whether a find-champion task exists), `eval.regression`
  (whether a validate-regression task exists, and its sources) and `tracking` (the MLflow server:
  train-lora's job environment, evaluate's and register's `tracking` argument).
"""

from typing import Any

from components.evaluate.settings import EvalSettings
from pipelines.config import Config

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
