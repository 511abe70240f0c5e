"""The ModelEvaluation that register imports for a registered version (the console's Evaluate tab).

Pure: `build_evaluation` turns plain dicts (evaluate's metrics, the gate, the lineage, the report
URI) into the fields of one `ModelEvaluation` and its `ModelEvaluationSlice`s, as
`google.cloud.aiplatform_v1.types` spells them; `components.register.core.import_evaluation` sends
them. What goes where:

- metrics: the tuned model's task figures (evaluate's `tuned_*`: f1, precision, recall,
  json_valid_rate, exact_match_rate, tp, fp, fn, n, ...) and, with a regression set, its figures
  overall and per kind (`regression.overall`, `regression.kinds`).
- metadata: the run (`pipeline_job_id`, the key GCPC's evaluation importer uses), the evaluate
  report's URI, the reference evaluate compared with (its name, version and figures, and tuned
  minus reference), the gate (passed, its reason and rules), the lineage (data snapshot, training
  key, base model, adapter, merged model), the generation speed, and notes on what was left out.
- slices: one per label (detection) or field (key_value) with dimension `annotationSpec`, the
  dimension the console lists labels by; one per regression kind with dimension `slice` and a
  slice spec `regression_kind`. Each holds the tuned figures with `reference` and `delta` (a slice
  has no metadata of its own).

evaluate's metrics (the Metrics artifact's metadata): `base_<figure>` (the reference, also when it
is the champion), `tuned_<figure>`, `passed`, `reference_is_champion`, `reference_version`, the
string `reference` (base, champion@3 or a folder) and, when present, the nested blocks
`labels` ({label: {"reference": {...}, "tuned": {...}}}, as `per_label` counts them) and
`regression` ({"overall": {"reference", "tuned", "delta"}, "kinds": {kind: {...}}}; its flat
copies `tuned_regression_*` are not read twice), the regression rule `regression_max_drop` and
the failed rules `gate_failed`. A block that is absent makes no slices; a value that is not a
finite number is left out and named in the notes, so an odd figure never stops a registration.

metrics_schema_uri: the project's own schema (`vlm_lora_metrics_1.0.0.yaml`, beside this module;
register copies it next to its output). aiplatform ships no model-evaluation schema constants,
and Google's predefined schemas (GCPC's importer: classification, regression, forecasting, text
generation, question answering, summarization, embedding; AutoML's image object detection with
confidence curves and mean average precision) describe none of this: a generative model gives
boxes without confidence scores, scored at one IoU threshold against a reference model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_FILE = "vlm_lora_metrics_1.0.0.yaml"
# Generation speed: hardware figures, recorded in the metadata rather than as the model's metrics.
SPEED_FIGURES = ("samples_per_second", "generated_tokens_per_second", "generate_seconds")
LABEL_DIMENSION = "annotationSpec"  # Vertex's well-known dimension: the console lists labels by it
KIND_DIMENSION = "slice"  # Vertex's dimension for a slice its SliceSpec defines
DISPLAY_NAME_MAX = 128


@dataclass(frozen=True)
class EvaluationRequest:
    """What register imports for one version.

    Attributes:
        evaluation: `ModelEvaluation` fields: display_name, metrics_schema_uri, metrics,
            metadata, slice_dimensions.
        slices: `ModelEvaluationSlice` fields each: metrics_schema_uri, metrics, slice_
            (dimension, value, and a slice_spec for a regression kind).
    """

    evaluation: dict[str, Any]
    slices: list[dict[str, Any]] = field(default_factory=list)


def schema_path() -> Path:
    """The shipped metrics schema (OpenAPI 3.0.2 Schema Object, YAML)."""
    return Path(__file__).with_name(SCHEMA_FILE)


def build_evaluation(
    metrics: dict[str, Any],
    run_name: str,
    schema_uri: str,
    gate: dict[str, Any] | None = None,
    lineage: dict[str, Any] | None = None,
    report_uri: str = "",
) -> EvaluationRequest:
    """Builds the ModelEvaluation and its slices for one registered version.

    Args:
        metrics: evaluate's metrics (see the module docstring for the keys read).
        run_name: The pipeline job's name; names the evaluation and is its `pipeline_job_id`.
        schema_uri: Where the metrics schema lies (gs:// on Vertex, a path in tests).
        gate: The gate's reason and rules ({"reason": str, "metric": str, "min_value": x,
            "min_margin": x, ...}); numbers given as text are read as numbers. Default none.
        lineage: Which data and models made the version ({"data_snapshot", "training_key",
            "base_model", "adapter", "merged_model"}); empty values are left out. Default none.
        report_uri: The evaluate report (gs:// or a path); "" = none. Default "".

    Returns:
        The EvaluationRequest (no call made).
    """
    notes: list[str] = []
    tuned = _prefixed(metrics, "tuned_", notes)
    reference = _prefixed(metrics, "base_", notes)
    speed = {
        "tuned": {k: tuned.pop(k) for k in SPEED_FIGURES if k in tuned},
        "reference": {k: reference.pop(k) for k in SPEED_FIGURES if k in reference},
    }
    name = str(metrics.get("reference") or "")
    version = _number(metrics.get("reference_version"))
    metadata: dict[str, Any] = {
        "pipeline_job_id": run_name,
        "reference": {
            "name": name,
            "is_champion": bool(_number(metrics.get("reference_is_champion"))),
            "version": str(int(version)) if version else "",
            "metrics": reference,
            "delta": _delta(tuned, reference),
        },
        "gate": _gate(metrics, gate or {}),
        "lineage": {str(k): str(v) for k, v in (lineage or {}).items() if v},
    }
    if speed["tuned"] or speed["reference"]:
        metadata["speed"] = speed
    if report_uri:
        metadata["evaluation_report"] = report_uri
    out_metrics: dict[str, Any] = dict(tuned)
    slices = _label_slices(metrics.get("labels"), schema_uri, notes)
    regression = metrics.get("regression")
    if regression is not None:
        tuned_part, compared, kind_slices = _regression(regression, schema_uri, notes)
        out_metrics["regression"] = tuned_part
        metadata["regression"] = compared
        slices += kind_slices
    if notes:
        metadata["notes"] = notes
    evaluation = {
        "display_name": (f"{run_name} vs {name}" if name else run_name)[:DISPLAY_NAME_MAX],
        "metrics_schema_uri": schema_uri,
        "metrics": out_metrics,
        "metadata": metadata,
        "slice_dimensions": sorted({s["slice_"]["dimension"] for s in slices}),
    }
    return EvaluationRequest(evaluation, slices)


def _number(value: Any) -> float | int | None:
    """`value` when it is a finite number (bools are not), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def _figures(values: Any, where: str, notes: list[str]) -> dict[str, float | int]:
    """The finite numbers of a dict of figures; anything else is left out and noted."""
    if not isinstance(values, dict):
        notes.append(f"{where} is not an object of figures ({type(values).__name__}); left out")
        return {}
    out = {}
    for key, value in values.items():
        number = _number(value)
        if number is None:
            notes.append(f"{where}.{key} = {value!r} is not a finite number; left out")
        else:
            out[str(key)] = number
    return out


def _prefixed(metrics: dict[str, Any], prefix: str, notes: list[str]) -> dict[str, float | int]:
    """evaluate's `<prefix><figure>` entries as {figure: value}, without the flat regression copies
    (`<prefix>regression_<kind>_<figure>`: the nested `regression` block is read instead)."""
    picked = {
        k[len(prefix) :]: v
        for k, v in metrics.items()
        if k.startswith(prefix) and not k.startswith(f"{prefix}regression_")
    }
    return _figures(picked, prefix.rstrip("_"), notes)


def _delta(tuned: dict[str, Any], reference: dict[str, Any]) -> dict[str, float]:
    """Tuned minus reference for each figure both have."""
    return {k: tuned[k] - reference[k] for k in tuned if k in reference}


def _compared(block: Any, where: str, notes: list[str]) -> tuple[dict, dict, dict]:
    """(tuned, reference, delta) of one {"reference", "tuned"[, "delta"]} block; delta computed when absent."""
    if not isinstance(block, dict):
        notes.append(f"{where} is not an object; left out")
        return {}, {}, {}
    tuned = _figures(block.get("tuned", {}), f"{where}.tuned", notes)
    reference = _figures(block.get("reference", {}), f"{where}.reference", notes)
    if "delta" in block:
        return tuned, reference, _figures(block["delta"], f"{where}.delta", notes)
    return tuned, reference, _delta(tuned, reference)


def _slice(schema_uri: str, compared: tuple[dict, dict, dict], slice_: dict[str, Any]) -> dict[str, Any]:
    tuned, reference, delta = compared
    return {
        "metrics_schema_uri": schema_uri,
        "metrics": {**tuned, "reference": reference, "delta": delta},
        "slice_": slice_,
    }


def _label_slices(labels: Any, schema_uri: str, notes: list[str]) -> list[dict[str, Any]]:
    """One annotationSpec slice per label (detection) or field (key_value)."""
    if labels is None:
        notes.append("evaluate's metrics carry no per-label figures (key 'labels'): no label slices")
        return []
    if not isinstance(labels, dict):
        notes.append(f"labels is not an object ({type(labels).__name__}): no label slices")
        return []
    return [
        _slice(schema_uri, _compared(block, f"labels.{label}", notes), {"dimension": LABEL_DIMENSION, "value": label})
        for label, block in sorted(labels.items())
    ]


def _regression(regression: Any, schema_uri: str, notes: list[str]) -> tuple[dict, dict, list[dict]]:
    """(the tuned figures for metrics, reference + delta for metadata, one slice per kind)."""
    if not isinstance(regression, dict):
        notes.append(f"regression is not an object ({type(regression).__name__}); left out")
        return {}, {}, []
    tuned, reference, delta = _compared(regression.get("overall", {}), "regression.overall", notes)
    tuned_part: dict[str, Any] = {"overall": tuned, "kinds": {}}
    compared: dict[str, Any] = {"overall": {"reference": reference, "delta": delta}, "kinds": {}}
    kinds = regression.get("kinds", {})
    if not isinstance(kinds, dict):
        notes.append(f"regression.kinds is not an object ({type(kinds).__name__}); no kind slices")
        kinds = {}
    slices = []
    for kind, block in sorted(kinds.items()):
        figures = _compared(block, f"regression.kinds.{kind}", notes)
        tuned_part["kinds"][kind] = figures[0]
        compared["kinds"][kind] = {"reference": figures[1], "delta": figures[2]}
        spec = {"configs": {"regression_kind": {"value": {"string_value": str(kind)}}}}
        slices.append(
            _slice(schema_uri, figures, {"dimension": KIND_DIMENSION, "value": str(kind), "slice_spec": spec})
        )
    return tuned_part, compared, slices


def _gate(metrics: dict[str, Any], gate: dict[str, Any]) -> dict[str, Any]:
    """The gate's decision (evaluate's `passed`), its reason and its rules (numbers as numbers)."""
    rules = {}
    for key, value in gate.items():
        if key == "reason":
            continue
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                rules[key] = value
                continue
            value = number if math.isfinite(number) else value
        rules[key] = value
    if isinstance(metrics.get("regression_max_drop"), dict):  # the regression rule, as evaluate applied it
        rules.setdefault("regression_max_drop", metrics["regression_max_drop"])
    passed = metrics.get("passed")
    out = {
        "passed": bool(passed) if passed is not None else None,
        "reason": str(gate.get("reason") or ""),
        "rules": rules,
    }
    if isinstance(metrics.get("gate_failed"), list):
        out["failed"] = [str(rule) for rule in metrics["gate_failed"]]
    return out
