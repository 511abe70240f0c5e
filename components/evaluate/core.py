"""Evaluate the tuned model against a reference model on held-out data, and gate it.

Both models answer every held-out prompt with greedy, batched, KV-cached generation
through ms-swift's TransformersEngine, so prompts are formatted by the same chat
template that training used. Answers are scored with the task's definition
(`components.common.tasks`, through `components.evaluate.metrics`: JSON validity,
detection precision/recall/F1 at an IoU threshold, exact match), and the gate compares
the tuned model with the reference.

Boxes are scored in pixels of the original image: the dataset's boxes (and so the
models' answers, trained on them) are in one convention (`box_convention`: pixel,
norm1000 or resized_pixel, see `components.common.boxes`), and each row's boxes are
converted with the size of the row's first image (read from the image header only).

With a regression set (`eval.regression`, validated by validate-regression), both models
also answer its rows, in the same generation call as the held-out rows, and each row is
scored by its kind's metric (`components.common.regression`: vqa, ocr, grounding). The gate
then has a second rule: no kind, and not the overall score, may drop by more than
`regression_max_drop`; its decision names the rule that failed (the task metric, or the
regression kind and by how much).

With `quantization` nf4 or int8 (`eval.quantization`), both models are loaded quantised by
bitsandbytes with the `BitsAndBytesConfig` ms-swift builds from the same arguments as a QLoRA
base (`components.common.quantization.swift_quant_args`; the vision tower and `lm_head` stay
unquantised), like with like, so the gate compares fairly: the scores are what a 4-bit deployment
would get, not the bf16 merged model's. Each model's metrics then carry `quantized_layers`, the
bitsandbytes layers counted in the loaded model (none is a named error), and the result says
`quantization`.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

from components.common import regression as reg
from components.common.boxes import ResizeRule
from components.common.reference import Reference, resolve_reference
from components.common.storage import to_fuse_path
from components.evaluate._interval import intervals
from components.evaluate.figures import label_metrics, regression_metrics
from components.evaluate.generation import GenerateFn, check_quantization, generate_answers, swift_generate
from components.evaluate.metrics import gate, gate_with_regression
from components.evaluate.result import EvalError, EvalResult
from components.evaluate.rows import (
    image_size,
    load_eval_rows,
    load_regression_rows,
    paired_geometries,
    regression_paired_geometries,
    row_geometries,
)
from components.evaluate.scoring import regression_scores, sample_records, task_scores, write_predictions
from components.evaluate.settings import EvalSettings

# evaluate's API: the entry and its types here; the parts it is made of importable from here too (their
# own modules: rows, generation, scoring, figures). The reference is decided in components.common.reference.
__all__ = [
    "EvalError",
    "EvalResult",
    "GenerateFn",
    "Reference",
    "check_model_dir",
    "evaluate",
    "image_size",
    "label_metrics",
    "load_eval_rows",
    "load_regression_rows",
    "regression_metrics",
    "resolve_reference",
    "row_geometries",
    "same_model",
    "swift_generate",
]


def same_model(a: str, b: str) -> bool:
    """Whether two model locations (paths, gs:// URIs or /gcs/ paths) name the same folder."""

    def norm(x: str) -> str:
        return str(Path(to_fuse_path(x.rstrip("/"))).expanduser().absolute()) if x else ""

    return bool(a) and norm(a) == norm(b)


def check_model_dir(model_dir: str, role: str) -> str:
    """Checks that a model folder exists and holds a config.json; returns it.

    Args:
        model_dir: The folder (a local path; gs:// URIs are mapped to the /gcs FUSE mount).
        role: "tuned" or "reference", for the message.

    Raises:
        EvalError: Empty path, missing folder, or no config.json in it.
    """
    if not model_dir:
        raise EvalError(f"{role} model: no path given")
    model_dir = to_fuse_path(model_dir)  # gs://b/p is read as /gcs/b/p on Vertex
    folder = Path(model_dir)
    if not folder.is_dir():
        raise EvalError(f"{role} model {model_dir}: folder not found")
    if not (folder / "config.json").is_file():
        raise EvalError(f"{role} model {model_dir}: no config.json, not a model folder")
    return str(folder)


def evaluate(
    tuned_dir: str,
    reference_dir: str,
    model_type: str,
    dataset_dir: str,
    predictions_out: str,
    settings: EvalSettings | None = None,
    generate_fn: GenerateFn = swift_generate,
    box_convention: str = "pixel",
    resize_rule: ResizeRule | None = None,
    reference_box_convention: str = "",
    task: str = "detection",
    max_pixels: int = 0,
    dataset_marker: str = "",
    regression_dir: str = "",
    regression_marker: str = "",
) -> EvalResult:
    """Scores the tuned and the reference model on held-out rows (and the regression set) and applies the gate.

    Args:
        tuned_dir: Merged (tuned) model folder.
        reference_dir: Reference model folder (the base model, or the current champion).
        model_type: ms-swift model_type of both models.
        dataset_dir: Validated held-out dataset folder.
        predictions_out: JSONL file for per-sample predictions and scores (held-out rows, then
            the regression rows with "set": "regression").
        settings: The run's `eval` section (`components.evaluate.settings.EvalSettings`, read here
            whole): the generation budget and batch, max_samples (of the held-out rows; the
            regression set is always whole), the IoU threshold, the gate (metric, min_value,
            min_margin, gate_on), regression_max_drop and quantization (both models loaded alike,
            after a probe that bitsandbytes runs here). Default None (`EvalSettings()`).
        generate_fn: The generator (tests pass a fake). Default ms-swift's engine.
        box_convention: Convention of the dataset's boxes (resolved: "pixel", "norm1000" or
            "resized_pixel"); gold and answers are converted to pixels of each row's original
            image before IoU. Default "pixel".
        resize_rule: Smart-resize settings of the base model's processor (for resized_pixel,
            `ResizeRule.from_model(base model folder)`); None = Qwen2.5-VL's defaults.
            Default None.
        reference_box_convention: Convention the reference model answers in, when it is
            not the dataset's: the untuned base model answers in its family's convention
            (`boxes.convention_for_model`), while a champion was tuned on the dataset's.
            "" = box_convention. Default "".
        max_pixels: The training run's `swift.max_pixels`; both models see images shrunk as
            in training (and `resize_rule` should carry the same value). 0 = full size. Default 0.
        dataset_marker: The sha256 of the eval set's completion marker as validate-data recorded it
            (the artifact's `manifest_sha256`): a marker removed or edited since is a named error.
            Default "" (checked when the folder has a marker).
        regression_dir: The validated regression set (validate-regression's output); its rows are
            generated in the same call as the held-out rows and scored by kind. Default "" (none).
        regression_marker: The sha256 of its completion marker. Default "".

    Returns:
        The EvalResult.

    When the reference is the tuned model itself (a cached merge that an earlier run
    already registered as the champion), it is generated once and the gate fails: there
    is nothing new to promote.

    Raises:
        EvalError: Empty eval or regression set, missing dataset, a model folder that is missing
            (with the real generator), a model returned too few answers, an unknown
            box_convention, or (not pixel) a row whose image size cannot be read.
        ValueError: Unknown gate metric or gate_on, or an invalid regression_max_drop.
        QuantizationUnavailable: quantised, and bitsandbytes is missing or cannot run here.
    """
    s = settings or EvalSettings()
    max_drop = reg.max_drops(s.regression_max_drop)  # an invalid rule fails before any model is loaded
    check_quantization(s.quantization)
    itself = same_model(tuned_dir, reference_dir)
    if generate_fn is swift_generate:  # fakes in tests take names, not folders
        reference_dir = check_model_dir(reference_dir, "reference")
        tuned_dir = check_model_dir(tuned_dir, "tuned")
        if max_pixels:
            generate_fn = functools.partial(swift_generate, max_pixels=max_pixels)
    rows = load_eval_rows(dataset_dir, s.max_samples, dataset_marker)
    reg_rows = load_regression_rows(regression_dir, regression_marker) if regression_dir else []
    reference_box_convention = reference_box_convention or box_convention
    conventions = (box_convention, reference_box_convention, resize_rule)
    geometries, ref_geometries = paired_geometries(rows, *conventions)
    reg_geometries = regression_paired_geometries(reg_rows, *conventions)

    generate = functools.partial(generate_answers, model_type=model_type, rows=rows + reg_rows,
                                 batch_size=s.batch_size, max_new_tokens=s.max_new_tokens, generate_fn=generate_fn,
                                 quantization=s.quantization)  # fmt: skip
    ref_answers, ref_speed = generate("reference", reference_dir)
    tuned_answers, tuned_speed = (ref_answers, dict(ref_speed)) if itself else generate("tuned", tuned_dir)
    if s.quantization != "none":
        _say_quantized(s.quantization, ref_speed, tuned_speed)
    n = len(rows)
    ref_metrics, ref_scores = task_scores(ref_answers[:n], rows, geometries, ref_geometries, s.iou_threshold, task)
    tuned_metrics, tuned_scores = task_scores(tuned_answers[:n], rows, geometries, geometries, s.iou_threshold, task)
    ref_metrics.update(ref_speed)
    tuned_metrics.update(tuned_speed)

    ci = intervals(tuned_scores, ref_scores)  # over rows, paired: every figure and the margin
    passed, reason = gate(tuned_metrics, ref_metrics, s.metric, s.min_value, s.min_margin, gate_on=s.gate_on, ci=ci)
    passed, reason, failed, summary, drops, reg_samples = _with_regression(
        passed, reason, reg_rows, ref_answers[n:], tuned_answers[n:], reg_geometries, max_drop
    )
    if itself:
        passed, failed = False, ["itself"]
        reason = (
            f"FAIL: the tuned model {tuned_dir} is the reference model itself "
            "(e.g. a cached merge already registered as the champion); nothing new to promote"
        )
    samples = sample_records(rows, geometries, reference_box_convention, (tuned_answers, tuned_scores),
                              (ref_answers, ref_scores))  # fmt: skip
    write_predictions(predictions_out, samples + reg_samples)
    return EvalResult(passed, reason, tuned_metrics, ref_metrics, predictions_out, samples, summary, reg_samples,
                      drops, failed, s.quantization, ci)  # fmt: skip


def _with_regression(passed, reason, reg_rows, ref_answers, tuned_answers, reg_geometries, max_drop) -> tuple:
    """The task gate's verdict with the regression set's (passed, reason, failed, summary, drops, samples); the
    verdict as it was, failed naming "task" or nothing, without a regression set."""
    failed = [] if passed else ["task"]
    if not reg_rows:
        return passed, reason, failed, None, [], []
    summary, drops, reg_samples = regression_scores(reg_rows, ref_answers, tuned_answers, reg_geometries, max_drop)
    for drop in drops:  # the task's log says it kind by kind
        print(f"evaluate: regression {drop.describe()}", file=sys.stderr, flush=True)
    passed, reason, failed = gate_with_regression(passed, reason, drops)
    return passed, reason, failed, summary, drops, reg_samples


def _say_quantized(quantization: str, ref_speed: dict[str, float], tuned_speed: dict[str, float]) -> None:
    print(
        f"evaluate: both models were loaded in {quantization} (bitsandbytes; quantised layers: reference "
        f"{ref_speed['quantized_layers']:.0f}, tuned {tuned_speed['quantized_layers']:.0f}): the scores are "
        f"those of an {quantization} deployment, not of the bf16 merged model",
        file=sys.stderr,
        flush=True,
    )
