"""The evaluate step as its KFP wrapper runs it (pure: no kfp): inputs read, scored, reported, recorded.

`run_step` rebuilds the run's eval settings (`EvalSettings.from_dict`: the `eval_settings` run
parameter, perhaps edited in the console's run form) and refuses what their checks find, resolves
the box conventions and the reference, checks `swift.max_pixels` and builds the resize rule, runs
`core.evaluate` with the settings whole (a setting is read where it acts, not passed on by name),
writes the HTML report, records to MLflow and returns the `StepOutputs`
(`components.common.kfp_outputs`) that the wrapper writes into its Metrics, report and return
values. A refused input or setting ends it with SystemExit("evaluate: ...").
"""

from __future__ import annotations

from typing import Any

from components.common import wandb_tracking
from components.common.boxes import ResizeRule, resolve_convention
from components.common.kfp_outputs import ArtifactLike, StepOutputs
from components.common.mlflow_registry import gate_tags, register_version
from components.common.quantization import QuantizationUnavailable
from components.common.reference import Reference
from components.common.tracking import TrackingError, record
from components.evaluate._interval import flat_metrics
from components.evaluate._report import write_report
from components.evaluate.core import EvalError, EvalResult, label_metrics, regression_metrics, resolve_reference
from components.evaluate.core import evaluate as run_eval
from components.evaluate.settings import COMPILE_TIME_KEYS, EvalSettings, EvalSettingsError


def _max_pixels(swift_args: dict) -> int:
    max_pixels = swift_args.get("max_pixels") or 0
    if not isinstance(max_pixels, int) or isinstance(max_pixels, bool) or max_pixels < 0:
        raise SystemExit(f"evaluate: swift.max_pixels must be a whole number of pixels >= 0, got {max_pixels!r}")
    return max_pixels


def checked_settings(settings: dict) -> EvalSettings:
    """The evaluate task's `settings` rebuilt and checked, or SystemExit naming `eval.<field>` and the fix.

    Raises:
        SystemExit: An unknown or compile-time key, a value of the wrong type, or one `EvalSettings.checks` refuses.
    """
    fixed = [k for k in COMPILE_TIME_KEYS if k in settings]
    try:
        if fixed:
            raise EvalSettingsError(
                f"'eval.{fixed[0]}' is fixed when the pipeline is compiled (it decides which tasks exist); "
                "leave it out of eval_settings and compile the pipeline again with it set in the config"
            )
        rebuilt = EvalSettings.from_dict(settings)
        problems = rebuilt.problems()
        if problems:
            raise EvalSettingsError(problems[0])
    except EvalSettingsError as exc:
        raise SystemExit(
            f"evaluate: eval_settings: {exc}; correct it in the run's eval_settings (or the config's eval section)"
        ) from None
    return rebuilt


def run_step(
    base_model: ArtifactLike, tuned_model: ArtifactLike, eval_dataset: ArtifactLike, predictions: ArtifactLike,
    report: ArtifactLike, *, settings: dict, swift_args: dict, reference_uri: str = "", reference_version: str = "",
    box_convention: str = "pixel", base_box_convention: str = "auto", task: str = "",
    regression_dataset: ArtifactLike | None = None, tracking: dict | None = None,
    data_report: ArtifactLike | None = None,
) -> StepOutputs:  # fmt: skip
    """Runs the evaluate step; the arguments are the component's (see `components.evaluate.component`).

    Returns:
        metrics: the Metrics entries; metadata: the report's; values: (passed, reason).

    Raises:
        SystemExit: A refused setting or input, or MLflow failed while required ("evaluate: ...").
    """
    s = checked_settings(settings)
    family = (base_model.metadata.get("architecture", ""), base_model.metadata.get("model_type", ""))
    box_convention = resolve_convention(box_convention, *family)
    base_box_convention = resolve_convention(base_box_convention, *family) if base_box_convention else ""
    reference = resolve_reference(reference_uri, reference_version, base_model.path)
    max_pixels = _max_pixels(swift_args)
    resize_rule = ResizeRule.from_model(base_model.path, max_pixels=max_pixels)
    task = task or "detection"
    print(f"evaluate: reference model: {reference.label} ({reference_uri or base_model.uri})", flush=True)
    print(
        f"evaluate: boxes: data {box_convention}, base model answers {base_box_convention or box_convention}",
        flush=True,
    )
    try:
        result = run_eval(
            tuned_dir=tuned_model.path, reference_dir=reference.model_dir,
            model_type=base_model.metadata.get("model_type", ""), dataset_dir=eval_dataset.path,
            predictions_out=predictions.path, settings=s, box_convention=box_convention,
            resize_rule=resize_rule, reference_box_convention=base_box_convention if reference.kind == "base" else "",
            task=task, max_pixels=max_pixels, dataset_marker=eval_dataset.metadata.get("manifest_sha256", ""),
            regression_dir=regression_dataset.path if regression_dataset is not None else "",
            regression_marker=regression_dataset.metadata.get("manifest_sha256", "") if regression_dataset else "",
        )  # fmt: skip
    except (EvalError, ValueError, QuantizationUnavailable) as exc:
        raise SystemExit(f"evaluate: {exc}") from None
    figures = metric_entries(result, reference, task, s.iou_threshold, resize_rule, s.regression_max_drop)
    detail = reference_uri or base_model.uri
    write_report(
        report.path, result.tuned, result.reference, result.samples, result.passed, result.reason,
        reference_name=reference.label, reference_detail=detail, iou_threshold=s.iou_threshold,
        resize_rule=resize_rule, task=task, regression=result.regression,
        regression_samples=result.regression_samples, drops=result.drops, quantization=result.quantization,
        intervals=result.intervals,
    )  # fmt: skip
    _record(tracking, result, figures, tuned_model, report, data_report, gate=(s.metric, s.gate_on))
    print(f"evaluate: {result.reason}")
    return StepOutputs(
        metrics=figures,
        metadata={"report": {"reference": reference.label, "reference_uri": detail}},
        values=(result.passed, result.reason),
    )


def metric_entries(
    result: EvalResult, reference: Reference, task: str, iou_threshold: float, resize_rule: ResizeRule,
    regression_max_drop: dict | None,
) -> dict[str, Any]:  # fmt: skip
    """evaluate's Metrics entries, in the order they are written (see the component's `metrics`)."""
    out: dict[str, Any] = {}
    for prefix, values in (("base", result.reference), ("tuned", result.tuned)):
        out.update({f"{prefix}_{key}": value for key, value in values.items()})
    out["passed"] = float(result.passed)
    out.update(flat_metrics(result.intervals))  # bootstrap over rows: every figure and the margin
    out.update(reference.metrics())
    out["reference"] = reference.label
    if result.quantization != "none":  # both models were loaded quantised: the figures are a 4-bit model's
        out["quantization"] = result.quantization
    out["labels"] = label_metrics(result, task, iou_threshold, resize_rule)
    flat, meta = regression_metrics(result, regression_max_drop)  # nothing without a regression set
    out.update(flat)
    out.update(meta)
    return out


def _record(
    tracking: dict | None, result: EvalResult, figures: dict[str, Any], tuned_model: ArtifactLike,
    report: ArtifactLike, data_report: ArtifactLike | None, gate: tuple[str, str] = ("", ""),
) -> None:  # fmt: skip
    """Records the step to the adapter's MLflow run (`components.common.tracking.record`) and W&B run
    (`components.common.wandb_tracking.record`) and, with `register_model` in `tracking`, the MLflow run as
    a model version tagged with the gate's decision (`gate`: metric, gate_on; `components.common.mlflow_registry`)."""
    tags = {"report": report.uri, "passed": result.passed}
    if result.quantization != "none":
        tags["quantization"] = result.quantization
    model = {"model_uri": tuned_model.uri, "model_dir": tuned_model.path, "model_meta": dict(tuned_model.metadata)}
    files = {
        "evaluate/report.html": report.path,
        **({"validate-data/report.html": data_report.path} if data_report is not None else {}),
    }
    try:
        run_id = record(tracking, "evaluate", **model, metrics=dict(figures), tags=tags, files=files)
        register_version(tracking, run_id, "evaluate", gate_tags(figures, gate[0], result.reason, gate[1]))
        wandb_tracking.record(tracking, "evaluate", **model, metrics=dict(figures), files=files)
    except TrackingError as exc:
        raise SystemExit(f"evaluate: {exc}") from None
