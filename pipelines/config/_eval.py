"""The `eval` section: held-out evaluation and the promotion gate, with its checks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from components.common.metrics import GATE_METRICS
from components.common.quantization import QUANTIZATIONS
from components.common.reference import CHAMPION, reference_problem
from components.common.regression import max_drop_problem, max_drops
from pipelines._load_checks import budget_problem, gate_problem
from pipelines.config._errors import Check, ConfigError, Where


@dataclass(frozen=True)
class EvalSection:
    """Held-out evaluation and the promotion gate.

    Attributes:
        max_new_tokens: Greedy generation budget per sample, tokens. Default 512.
        batch_size: Samples generated together. Default 8.
        max_samples: Evaluate at most this many held-out samples; 0 = all. Default 0.
        iou_threshold: A predicted box matches a gold box of the same label at IoU >= this.
            Default 0.5.
        metric: Gate metric: one of f1, precision, recall, json_valid_rate,
            exact_match_rate. Default f1.
        min_value: The tuned model's metric must be at least this. Default 0.0.
        min_margin: ... and beat the reference model by at least this (a positive value
            demands a strict improvement). Default 0.0.
        reference: The model the tuned model is compared with:
            `auto` (default): on the Vertex target the champion when the config names a
            registry model (`register.model_id` or `register.serving_image` set), else the
            base model; on the local target always the base model.
            `champion`: the Model Registry version `register.model_id@register.alias`,
            looked up at run time by the find-champion task; the base model when none
            exists yet (first run). Vertex only; the local target has no registry and
            uses the base model.
            `base`: the staged base model.
            A merged model folder: `gs://bucket/prefix` (read through /gcs/ on Vertex) or,
            for local runs, a local folder with a config.json.
        regression: The regression set: general rows that guard what the model already knew
            (`components.common.regression`: each row's `kind` is vqa, ocr or grounding), in
            the forms of `data.train` (files, folders / prefixes, globs; local or gs://,
            comma-separated). Checked by a validate-regression task before training, scored
            for both models by evaluate. Fixed when the pipeline is compiled (it decides
            whether that task exists). Default "" (none).
        regression_max_drop: The regression rule of the gate: the absolute drop allowed per
            kind and `overall` (the mean of the kinds' scores); a CER rise counts as a drop.
            Names left out take 0.05; an unknown name is refused. Default 0.05 for each.
        quantization: How evaluate loads both models (the reference and the tuned one) for
            generation: `none` (bf16), `nf4` or `int8` (both quantised by bitsandbytes, with the
            settings of `model.quantization`): the scores a 4-bit deployment would get, not the
            bf16 merged model's. Default `none`.
        gate_on: What the gate compares with min_value and min_margin: `point` (the figures, as
            measured) or `lower_bound` (the lower bounds of their 95 % bootstrap intervals over the
            held-out rows: promote only what is better beyond the rows' noise). Default `point`.
    """

    max_new_tokens: int = 512
    batch_size: int = 8
    max_samples: int = 0
    iou_threshold: float = 0.5
    metric: str = "f1"
    min_value: float = 0.0
    min_margin: float = 0.0
    reference: str = "auto"
    regression: str = ""
    regression_max_drop: dict[str, float] = field(default_factory=max_drops)
    quantization: str = "none"
    gate_on: str = "point"

    def __post_init__(self) -> None:
        # the rule is whole wherever it goes (the pipeline's parameter, the run form): left-out names take the default
        if not max_drop_problem(self.regression_max_drop):
            object.__setattr__(self, "regression_max_drop", max_drops(self.regression_max_drop))


# The metrics `eval.metric` may gate on.
_GATE_METRICS = GATE_METRICS  # components.common.metrics: the one record of the figures


def eval_checks(e: EvalSection) -> list[Check]:
    """The `eval` fields' own checks (generation budget, batch, IoU, gate metric, quantisation)."""
    return [
        ("eval.max_new_tokens", e.max_new_tokens > 0, "a positive integer"),
        ("eval.batch_size", e.batch_size > 0, "a positive integer"),
        ("eval.max_samples", e.max_samples >= 0, "0 (all) or a positive integer"),
        ("eval.iou_threshold", 0.0 < e.iou_threshold <= 1.0, "a number in (0, 1]"),
        ("eval.metric", e.metric in _GATE_METRICS, "one of " + ", ".join(_GATE_METRICS)),
        ("eval.quantization", e.quantization in QUANTIZATIONS, "one of " + ", ".join(QUANTIZATIONS)),
        ("eval.gate_on", e.gate_on in ("point", "lower_bound"), "point or lower_bound"),
    ]


def check_gate(e: EvalSection, swift: Mapping[str, Any], alias: str, where: Where) -> None:
    """Checks the gate's thresholds, the generation budget, the reference model and the regression rule.

    Args:
        e: The `eval` section.
        swift: The `swift` section (its `max_length` bounds `eval.max_new_tokens`).
        alias: `register.alias` (`eval.reference: champion` needs one).
        where: `file:line` of a dotted key.

    Raises:
        ConfigError: The first of these that is wrong.
    """
    for found in (gate_problem(e.metric, e.min_value, e.min_margin), budget_problem(e.max_new_tokens, swift)):
        if found:
            raise ConfigError(f"{where(found[0])}: {found[1]}")
    problem = reference_problem(e.reference)
    if problem:
        raise ConfigError(f"{where('eval.reference')}: 'eval.reference' {e.reference!r}: {problem}")
    if problem := max_drop_problem(e.regression_max_drop):
        raise ConfigError(f"{where('eval.regression_max_drop')}: 'eval.regression_max_drop' {problem}")
    if e.reference == CHAMPION and not alias:
        raise ConfigError(
            f"{where('eval.reference')}: 'eval.reference' is 'champion' but 'register.alias' is empty; "
            "set register.alias (the alias that marks the champion, e.g. champion)"
        )
