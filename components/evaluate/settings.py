"""The evaluate step's settings: the config's `eval` section, one frozen type with its checks.

`pipelines.config` builds `EvalSettings` from the YAML's `eval:` mapping and refuses a config
whose `checks()` fail (file, line, key); the pipeline hands the run-time part (`run_settings()`:
every key but `reference` and `regression`, which decide at compile time which tasks exist) to
the evaluate task as one run parameter, `eval_settings`; the task rebuilds it with `from_dict`
and refuses what `problems()` finds (a value edited in the console's run form). Pure: no kfp.

What needs more than the section (the generation budget against `swift.max_length`, a
champion reference without `register.alias`, a reference folder that must exist) is checked
by the config, which has the other sections.

Adding a setting: its field (with its docstring line) and its check here, and the code that
reads it where it acts; `core.evaluate` and the step take the settings whole, the config, the
pipeline parameter and the console form follow from the fields. README.md's config table is
where users look it up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from components.common.metrics import GATE_METRIC_RANGES, GATE_METRICS
from components.common.quantization import QUANTIZATIONS
from components.common.regression import max_drop_problem, max_drops
from components.common.settings_fields import rebuild

# (dotted key, whether its value is fine, what it must be): the config's field-check form.
Check = tuple[str, bool, str]

# Keys fixed when the pipeline is compiled (they decide whether find-champion and
# validate-regression exist): never part of the `eval_settings` run parameter.
COMPILE_TIME_KEYS = ("reference", "regression")
GATE_ON = ("point", "lower_bound")


class EvalSettingsError(ValueError):
    """An `eval` setting the evaluate step cannot take (unknown key, wrong type, failed check)."""


@dataclass(frozen=True)
class EvalSettings:
    """Held-out evaluation and the promotion gate.

    Attributes:
        max_new_tokens: Greedy generation budget per sample, tokens. Default 512.
        batch_size: Samples generated together. Default 8.
        max_samples: Evaluate at most this many held-out samples; 0 = all. Default 0.
        iou_threshold: A predicted box matches a gold box of the same label at IoU >= this.
            Default 0.5.
        metric: Gate metric: a gateable figure of `components.common.metrics` (`GATE_METRICS`;
            a wrong name is refused with the list). Default f1.
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
            Fixed when the pipeline is compiled (it decides whether find-champion exists).
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

    def checks(self) -> list[Check]:
        """The section's own field checks, in the order they are reported.

        Returns:
            (`eval.<field>`, ok, what it must be) for each check; `problems()` words the failed ones.
        """
        low, high = GATE_METRIC_RANGES.get(self.metric, (float("-inf"), float("inf")))
        span = high - low
        drop_problem = max_drop_problem(self.regression_max_drop)
        return [
            ("eval.max_new_tokens", self.max_new_tokens > 0, "a positive integer"),
            ("eval.batch_size", self.batch_size > 0, "a positive integer"),
            ("eval.max_samples", self.max_samples >= 0, "0 (all) or a positive integer"),
            ("eval.iou_threshold", 0.0 < self.iou_threshold <= 1.0, "a number in (0, 1]"),
            ("eval.metric", self.metric in GATE_METRICS, "one of " + ", ".join(GATE_METRICS)),
            ("eval.quantization", self.quantization in QUANTIZATIONS, "one of " + ", ".join(QUANTIZATIONS)),
            ("eval.gate_on", self.gate_on in GATE_ON, "point or lower_bound"),
            (
                "eval.min_value",
                low <= self.min_value <= high,
                f"within the range of eval.metric {self.metric!r} ({low:g} to {high:g}; outside it no model "
                "could pass the gate)",
            ),
            (
                "eval.min_margin",
                -span <= self.min_margin <= span,
                f"within what eval.metric {self.metric!r} ({low:g} to {high:g}) can differ by ({-span:g} to "
                f"{span:g}; negative tolerates a small drop)",
            ),
            (
                "eval.regression_max_drop",
                not drop_problem,
                f"a mapping of overall and kind names to drops >= 0 (this one {drop_problem})",
            ),
        ]

    def problems(self) -> list[str]:
        """Returns "'eval.<field>' must be <what>, got <value>" for each failed check, in order."""
        return [
            f"'{key}' must be {expected}, got {getattr(self, key.split('.')[1])!r}"
            for key, ok, expected in self.checks()
            if not ok
        ]

    def run_settings(self) -> dict[str, Any]:
        """The pipeline's `eval_settings` run parameter: every field but `COMPILE_TIME_KEYS` (mappings copied)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in COMPILE_TIME_KEYS}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> EvalSettings:
        """Rebuilds the settings from `dataclasses.asdict` or `run_settings()` (the evaluate task's `settings`).

        A whole number that arrives as a float (a JSON struct carries numbers as doubles) is
        taken as the integer it is; an integer where a number is wanted is taken as that number.
        Keys left out take their defaults. The values' own checks are `problems()`.

        Raises:
            EvalSettingsError: A key the settings do not have, or a value of the wrong type.
        """
        return rebuild(
            cls, values, EvalSettingsError,
            unknown=lambda key, names: f"unknown eval setting 'eval.{key}'; the eval section has: {', '.join(names)}",
            wrong=lambda name, wanted, value: f"'eval.{name}' must be {wanted}, got {value!r}",
        )  # fmt: skip
