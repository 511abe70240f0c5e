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
import inspect
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.common import regression as reg

# The reference model is decided in one shared place; evaluate's component resolves it through this module.
from components.common.boxes import CONVENTIONS, ResizeRule
from components.common.dataset import checked_rows_file
from components.common.manifest import ManifestError
from components.common.progress import Progress
from components.common.provenance import make_origin, origin_of
from components.common.quantization import QUANTIZATIONS, check_runnable, swift_quant_args
from components.common.reference import Reference, resolve_reference  # noqa: F401 (evaluate's API)
from components.common.storage import to_fuse_path
from components.common.tasks import PIXEL, Geometry
from components.evaluate._interval import intervals
from components.evaluate.metrics import aggregate, gate, gate_with_regression, score_sample

# (model_dir, model_type, rows, batch_size, max_new_tokens) -> (answers, generated tokens); a generator
# that also takes `progress_label` logs its own progress (rows done / total, rows/s, ETA) under that label;
# one that loads models quantised takes `quantization` and `timings` (it sets timings["quantized_layers"])
GenerateFn = Callable[[str, str, list[dict[str, Any]], int, int], tuple[list[str], int]]


class EvalError(ValueError):
    """Evaluation cannot run; the message says what is wrong."""


@dataclass
class EvalResult:
    """What evaluation produced.

    Attributes:
        passed: Whether the tuned model passed the gate.
        reason: Human-readable gate decision.
        tuned: Aggregate metrics of the tuned model (plus speed figures).
        reference: Aggregate metrics of the reference model (plus speed figures).
        predictions: Path of the per-sample predictions JSONL.
        samples: The held-out rows' records (gold, both answers and scores).
        regression: The regression figures (`components.common.regression.summarize`), None
            without a regression set.
        regression_samples: The regression rows' records (kind, gold, both answers and scores).
        drops: The regression rule's checks, one per kind and overall (`regression.check_drops`).
        failed_rules: The gate rules that failed: "task" and / or "regression:<kind or overall>".
        quantization: How both models were loaded for generation: "none" (bf16; float32 on a
            CPU), "nf4" or "int8" (bitsandbytes).
        intervals: Bootstrap intervals over rows of both models' figures and the margin
            (`_interval.intervals`); {} without rows.
    """

    passed: bool
    reason: str
    tuned: dict[str, float]
    reference: dict[str, float]
    predictions: str
    samples: list[dict[str, Any]] = field(default_factory=list)
    regression: dict[str, Any] | None = None
    regression_samples: list[dict[str, Any]] = field(default_factory=list)
    drops: list[reg.Drop] = field(default_factory=list)
    failed_rules: list[str] = field(default_factory=list)
    quantization: str = "none"
    intervals: dict[str, Any] = field(default_factory=dict)


def load_eval_rows(dataset_dir: str | Path, max_samples: int = 0, expected_marker: str = "") -> list[dict[str, Any]]:
    """Reads a validated dataset's rows as prompts and gold answers.

    Args:
        dataset_dir: Validated dataset folder (data.jsonl + images/).
        max_samples: Keep the first N rows; 0 = all. Default 0.
        expected_marker: The sha256 of its completion marker as validate-data recorded it (the
            artifact's `manifest_sha256`). Default "" (checked when the folder has a marker).

    Returns:
        Rows {"messages": prompt messages (without the final answer), "images": absolute
        paths, "gold": the reference answer text, "line": line number in data.jsonl, "origin":
        the user's file, line and image names (`components.common.provenance`; this file's
        own when the row carries none)}.

    Raises:
        EvalError: No data.jsonl, its files differ from the folder's completion marker
            (`components.common.manifest`), or no rows.
    """
    rows = _read_rows(dataset_dir, max_samples, expected_marker)
    if not rows:
        raise EvalError(
            f"{Path(dataset_dir) / 'data.jsonl'}: eval set is empty; provide held-out rows (data.eval or a larger "
            "data.eval_fraction)"
        )
    return rows


def load_regression_rows(dataset_dir: str | Path, expected_marker: str = "") -> list[dict[str, Any]]:
    """Reads a validated regression set (validate-regression's output): rows as `load_eval_rows`, each with its kind.

    Args:
        dataset_dir: The regression dataset folder.
        expected_marker: The sha256 of its completion marker (the artifact's `manifest_sha256`).
            Default "" (checked when the folder has a marker).

    Returns:
        Rows of `load_eval_rows`, each with "kind" (one of `regression.KIND_NAMES`).

    Raises:
        EvalError: As `load_eval_rows`, no rows, or a row without a known kind (a folder
            validate-regression did not write).
    """
    rows = _read_rows(dataset_dir, 0, expected_marker)
    if not rows:
        raise EvalError(f"{Path(dataset_dir) / 'data.jsonl'}: the regression set is empty; run validate-regression")
    for row in rows:
        if row["kind"] not in reg.KINDS:
            raise EvalError(
                f"{Path(dataset_dir) / 'data.jsonl'}:{row['line']}: regression row of kind {row['kind']!r}, not one of "
                f"{', '.join(reg.KIND_NAMES)}; pass the dataset validate-regression wrote"
            )
    return rows


def _read_rows(dataset_dir: str | Path, max_samples: int, expected_marker: str) -> list[dict[str, Any]]:
    """The rows of a validated dataset folder, as `load_eval_rows` returns them (possibly none)."""
    try:  # the rows validate-data wrote: a gate never decides on a truncated copy
        src = checked_rows_file(dataset_dir, expected_marker)
    except ManifestError as exc:
        raise EvalError(str(exc)) from None
    rows = []
    with open(src, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            row = json.loads(line)
            messages = row["messages"]
            rows.append(
                {
                    "messages": messages[:-1],
                    "gold": messages[-1]["content"],
                    "images": [str((Path(dataset_dir) / p).resolve()) for p in row.get("images", [])],
                    "line": number,
                    # the user's file:line and image names (validate-data's provenance); else this file's
                    "origin": origin_of(row) or make_origin(str(src), number, row.get("images", [])),
                    "kind": row.get(reg.KIND_KEY, ""),  # a regression row's kind ("" for a task row)
                }
            )
            if max_samples and len(rows) >= max_samples:
                break
    return rows


def image_size(path: str | Path) -> tuple[int, int]:
    """Returns (width, height) of an image, px, from its header (the pixels are not decoded).

    Raises:
        EvalError: The file is missing or not an image.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return image.size
    except (OSError, UnidentifiedImageError) as exc:
        raise EvalError(f"image {path}: cannot read its size ({exc})") from None


def row_geometries(
    rows: list[dict[str, Any]], box_convention: str = "pixel", rule: ResizeRule | None = None
) -> list[Geometry]:
    """Returns each row's box geometry: the convention and the size of its first image.

    Args:
        rows: Rows of `load_eval_rows`.
        box_convention: Convention of the dataset's boxes, one of `boxes.CONVENTIONS`. Default
            "pixel" (no image is read).
        rule: Smart-resize settings for resized_pixel; None = Qwen2.5-VL's defaults. Default None.

    Raises:
        EvalError: An unknown convention ("auto" must be resolved before), or a row without a
            readable image when the convention needs its size.
    """
    if box_convention not in CONVENTIONS:
        raise EvalError(
            f"box_convention {box_convention!r} is not one of {', '.join(CONVENTIONS)} "
            "(resolve 'auto' with components.common.boxes.resolve_convention first)"
        )
    rule = rule or ResizeRule()
    if box_convention == "pixel":
        return [Geometry("pixel", None, rule) for _ in rows]
    out = []
    for row in rows:
        if not row["images"]:
            raise EvalError(f"eval row {row['line']}: no image, so its {box_convention} boxes cannot be read in pixels")
        out.append(Geometry(box_convention, image_size(row["images"][0]), rule))
    return out


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


def swift_generate(
    model_dir: str,
    model_type: str,
    rows: list[dict[str, Any]],
    batch_size: int,
    max_new_tokens: int,
    timings: dict[str, float] | None = None,
    max_pixels: int = 0,
    progress_label: str = "",
    quantization: str = "none",
) -> tuple[list[str], int]:
    """Generates greedy answers with ms-swift's TransformersEngine (batched, KV cache).

    Args:
        timings: If given, receives load_s and generate_s (seconds) and, quantised,
            quantized_layers (the loaded model's bitsandbytes layers). Default None.
        max_pixels: The training run's `swift.max_pixels`: images are shrunk as in training
            (the template's own rescale); 0 = full size. Default 0.
        progress_label: With a label, logs the load time, then rows done / total, rows/s and
            the ETA after each batch, at most one line per 5 % or 30 s (whichever comes later;
            `components.common.progress`). "" = silent. Default "".
        quantization: "none" (bf16; float32 on a CPU), or "nf4" / "int8": loaded quantised by
            bitsandbytes (`swift_quantization_config`). Default "none".

    Returns:
        (answers in row order, number of generated tokens).
    """
    import torch
    from swift.infer_engine import InferRequest, RequestConfig, TransformersEngine

    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    start = time.time()
    quantized = {}
    if quantization != "none":
        quantized["quantization_config"] = swift_quantization_config(model_dir, model_type, dtype, quantization)
    engine = TransformersEngine(
        model_dir, model_type=model_type or None, torch_dtype=dtype, max_batch_size=batch_size, **quantized
    )
    if max_pixels:
        engine.template.max_pixels = int(max_pixels)  # what `swift sft --max_pixels` set on training's template
    loaded = time.time()
    if progress_label:
        print(f"{progress_label}: loaded in {loaded - start:.1f} s", file=sys.stderr, flush=True)
    requests = [InferRequest(messages=r["messages"], images=r["images"]) for r in rows]
    config = RequestConfig(max_tokens=max_new_tokens, temperature=0.0)
    step = max(1, batch_size)
    responses = []
    with Progress(progress_label, len(requests), "rows", enabled=bool(progress_label)) as progress:
        for i in range(0, len(requests), step):  # one batch at a time, as the engine would: progress per batch
            responses += engine.infer(requests[i : i + step], config, use_tqdm=False)
            progress.update(len(requests[i : i + step]))
    answers = [resp.choices[0].message.content or "" for resp in responses]
    generated = sum(resp.usage.completion_tokens for resp in responses)
    if timings is not None:
        timings.update(load_s=loaded - start, generate_s=time.time() - loaded)
        if quantization != "none":
            timings["quantized_layers"] = quantized_layers(engine.model)
    del engine
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return answers, generated


def swift_quantization_config(model_dir: str, model_type: str, dtype: Any, quantization: str) -> Any:
    """The `BitsAndBytesConfig` ms-swift loads a model with for `--quant_method bnb` (`swift infer` as `swift sft`).

    ms-swift's own argument handling (`BaseArguments.get_quantization_config`, what `swift infer
    --infer_backend transformers` passes to its TransformersEngine) from `swift_quant_args`: for
    Qwen3-VL its `llm_int8_skip_modules` keep the vision tower, its mergers and `lm_head` unquantised
    (a bare `BitsAndBytesConfig` would quantise the vision tower's linear layers too). The folder's
    own `args.json` (a merged model keeps its training's) is not read: the setting alone decides.

    Args:
        model_dir: The model folder.
        model_type: ms-swift model_type ("" = from the folder's config).
        dtype: The torch dtype the unquantised layers load in.
        quantization: "nf4" or "int8".

    Returns:
        The transformers BitsAndBytesConfig.
    """
    from swift.arguments import BaseArguments

    dtype_name = str(dtype).removeprefix("torch.")
    args = BaseArguments(
        model=model_dir,
        model_type=model_type or None,
        torch_dtype=dtype_name,
        load_args=False,  # a merged model's training args.json would force its own bnb_4bit_* settings
        **swift_quant_args(quantization),
    )
    return args.get_quantization_config()


def quantized_layers(model: Any) -> int:
    """How many bitsandbytes layers (`Linear4bit`, `Linear8bitLt`) a loaded model holds."""
    import bitsandbytes as bnb

    return sum(isinstance(m, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)) for m in model.modules())


def _takes(fn: Callable, name: str) -> bool:
    """Whether a generator takes the keyword `name` (progress_label, quantization, timings)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _generate(
    name: str,
    model_dir: str,
    model_type: str,
    rows: list[dict[str, Any]],
    batch_size: int,
    max_new_tokens: int,
    generate_fn: GenerateFn,
    quantization: str = "none",
) -> tuple[list[str], dict[str, float]]:
    """One model's answers to every row (held-out and regression, one call), and its figures.

    Returns:
        (answers, {samples_per_second, generated_tokens_per_second, generate_seconds}, and
        quantised also quantized_layers: the loaded model's bitsandbytes layers).

    Raises:
        EvalError: The model returned another number of answers than rows; quantised, a generator
            that cannot load models quantised, or a model loaded without any bitsandbytes layer.
    """
    label = f"evaluate: {name} model"
    loaded: dict[str, float] = {}
    extra: dict[str, Any] = {}
    if quantization != "none":
        if not (_takes(generate_fn, "quantization") and _takes(generate_fn, "timings")):
            raise EvalError(
                f"eval.quantization {quantization}: the generator {getattr(generate_fn, '__name__', generate_fn)!r} "
                "cannot load models quantised (it takes no quantization / timings); use swift_generate"
            )
        extra = {"quantization": quantization, "timings": loaded}
    start = time.time()
    if _takes(generate_fn, "progress_label"):
        answers, generated = generate_fn(
            model_dir, model_type, rows, batch_size, max_new_tokens, progress_label=label, **extra
        )
    else:  # a generator that logs nothing itself: a line before, a line after
        with Progress(label, len(rows), "rows") as progress:
            answers, generated = generate_fn(model_dir, model_type, rows, batch_size, max_new_tokens, **extra)
            progress.update(len(answers))
    seconds = max(time.time() - start, 1e-9)
    if len(answers) != len(rows):
        raise EvalError(f"{name} model returned {len(answers)} answers for {len(rows)} prompts")
    figures = {
        "samples_per_second": len(rows) / seconds,
        "generated_tokens_per_second": generated / seconds,
        "generate_seconds": seconds,
    }
    if quantization != "none":
        layers = int(loaded.get("quantized_layers") or 0)
        if layers <= 0:
            raise EvalError(
                f"eval.quantization {quantization}: the {name} model {model_dir} was loaded without any bitsandbytes "
                "layer, so its scores would not be those of a quantised model; set eval.quantization: none"
            )
        figures["quantized_layers"] = float(layers)
    return answers, figures


def _task_scores(
    answers: list[str],
    rows: list[dict[str, Any]],
    geometries: list[Geometry],
    pred_geometries: list[Geometry],
    iou_threshold: float,
    task: str,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Scores one model's answers to the held-out rows with the task's definition: (aggregate, per-row scores)."""
    scores = [
        score_sample(answer, row["gold"], iou_threshold, geometry=geometry, pred_geometry=pred_geometry, task=task)
        for answer, row, geometry, pred_geometry in zip(answers, rows, geometries, pred_geometries)
    ]
    return aggregate(scores), scores


def _geometries(
    rows: list[dict[str, Any]], box_convention: str, reference_box_convention: str, rule: ResizeRule | None
) -> tuple[list[Geometry], list[Geometry]]:
    """Each row's geometry for the gold (and the tuned model's answers), and for the reference's answers."""
    geometries = row_geometries(rows, box_convention, rule)
    if reference_box_convention == box_convention:
        return geometries, geometries
    return geometries, row_geometries(rows, reference_box_convention, rule)


def _regression_geometries(
    rows: list[dict[str, Any]], box_convention: str, reference_box_convention: str, rule: ResizeRule | None
) -> tuple[list[Geometry], list[Geometry]]:
    """As `_geometries` for regression rows: only grounding rows have boxes (the others get PIXEL, unread)."""
    boxed = [r for r in rows if r["kind"] == "grounding"]
    gold, ref = (iter(g) for g in _geometries(boxed, box_convention, reference_box_convention, rule))
    pairs = [(next(gold), next(ref)) if r["kind"] == "grounding" else (PIXEL, PIXEL) for r in rows]
    return [g for g, _ in pairs], [r for _, r in pairs]


def _regression(
    rows: list[dict[str, Any]],
    reference_answers: list[str],
    tuned_answers: list[str],
    geometries: tuple[list[Geometry], list[Geometry]],
    max_drop: dict[str, float] | None,
) -> tuple[dict[str, Any], list[reg.Drop], list[dict[str, Any]]]:
    """Scores both models on the regression rows; returns (the figures, the rule's checks, the row records)."""
    gold_geometries, ref_geometries = geometries
    samples = []
    for row, geometry, ref_geometry, r_ans, t_ans in zip(
        rows, gold_geometries, ref_geometries, reference_answers, tuned_answers
    ):
        samples.append(
            {
                "set": "regression",
                "kind": row["kind"],
                "line": row["line"],
                "origin": row["origin"],
                "images": row["images"],
                "question": reg.question_text(row["messages"]),
                "box_convention": geometry.convention,
                "image_size": list(geometry.image_size) if geometry.image_size else None,
                "gold": row["gold"],
                "tuned": t_ans,
                "tuned_score": reg.score_row(row["kind"], t_ans, row["gold"], geometry),
                "reference": r_ans,
                "reference_score": reg.score_row(row["kind"], r_ans, row["gold"], geometry, ref_geometry),
            }
        )
    summary = reg.summarize(
        [s["kind"] for s in samples], [s["reference_score"] for s in samples], [s["tuned_score"] for s in samples]
    )
    return summary, reg.check_drops(summary, max_drop), samples


def _write_predictions(path: str, samples: list[dict[str, Any]]) -> None:
    """Writes the per-row records (held-out, then regression) as JSONL."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for sample in samples:
            f.write(json.dumps(sample, ensure_ascii=False) + "\n")


def evaluate(
    tuned_dir: str,
    reference_dir: str,
    model_type: str,
    dataset_dir: str,
    predictions_out: str,
    max_new_tokens: int = 512,
    batch_size: int = 8,
    max_samples: int = 0,
    iou_threshold: float = 0.5,
    gate_metric: str = "f1",
    gate_min_value: float = 0.0,
    gate_min_margin: float = 0.0,
    generate_fn: GenerateFn = swift_generate,
    box_convention: str = "pixel",
    resize_rule: ResizeRule | None = None,
    reference_box_convention: str = "",
    task: str = "detection",
    max_pixels: int = 0,
    dataset_marker: str = "",
    regression_dir: str = "",
    regression_marker: str = "",
    regression_max_drop: dict[str, float] | None = None,
    quantization: str = "none",
    gate_on: str = "point",
) -> EvalResult:
    """Scores the tuned and the reference model on held-out rows (and the regression set) and applies the gate.

    Args:
        tuned_dir: Merged (tuned) model folder.
        reference_dir: Reference model folder (the base model, or the current champion).
        model_type: ms-swift model_type of both models.
        dataset_dir: Validated held-out dataset folder.
        predictions_out: JSONL file for per-sample predictions and scores (held-out rows, then
            the regression rows with "set": "regression").
        max_new_tokens: Generation budget per sample, tokens. Default 512.
        batch_size: Samples generated together. Default 8.
        max_samples: Evaluate the first N held-out rows; 0 = all (the regression set is always
            whole). Default 0.
        iou_threshold: Box match threshold. Default 0.5.
        gate_metric: Metric compared by the gate. Default "f1".
        gate_min_value: Minimum tuned value. Default 0.0.
        gate_min_margin: Minimum tuned - reference difference. Default 0.0.
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
        regression_max_drop: {"overall" or kind: absolute drop allowed}; names left out take
            `regression.DEFAULT_MAX_DROP`. Default None (all defaults).
        quantization: How both models are loaded for generation (`eval.quantization`): "none"
            (bf16; float32 on a CPU), or "nf4" / "int8": both quantised by bitsandbytes, like with
            like, after a probe that bitsandbytes runs here. Default "none".
        gate_on: What the gate compares with min_value / min_margin (`eval.gate_on`): "point" (the
            figures) or "lower_bound" (the lower bounds of their bootstrap intervals over rows).
            Default "point".

    Returns:
        The EvalResult.

    When the reference is the tuned model itself (a cached merge that an earlier run
    already registered as the champion), it is generated once and the gate fails: there
    is nothing new to promote.

    Raises:
        EvalError: Empty eval or regression set, missing dataset, a model folder that is missing
            (with the real generator), a model returned too few answers, an unknown
            box_convention, or (not pixel) a row whose image size cannot be read.
        ValueError: Unknown gate metric, or an invalid regression_max_drop.
        QuantizationUnavailable: quantised, and bitsandbytes is missing or cannot run here.
    """
    max_drop = reg.max_drops(regression_max_drop)  # an invalid rule fails before any model is loaded
    _check_quantization(quantization)
    itself = same_model(tuned_dir, reference_dir)
    if generate_fn is swift_generate:  # fakes in tests take names, not folders
        reference_dir = check_model_dir(reference_dir, "reference")
        tuned_dir = check_model_dir(tuned_dir, "tuned")
        if max_pixels:
            generate_fn = functools.partial(swift_generate, max_pixels=max_pixels)
    rows = load_eval_rows(dataset_dir, max_samples, dataset_marker)
    reg_rows = load_regression_rows(regression_dir, regression_marker) if regression_dir else []
    reference_box_convention = reference_box_convention or box_convention
    conventions = (box_convention, reference_box_convention, resize_rule)
    geometries, ref_geometries = _geometries(rows, *conventions)
    reg_geometries = _regression_geometries(reg_rows, *conventions)

    generate = functools.partial(_generate, model_type=model_type, rows=rows + reg_rows, batch_size=batch_size,
                                 max_new_tokens=max_new_tokens, generate_fn=generate_fn,
                                 quantization=quantization)  # fmt: skip
    ref_answers, ref_speed = generate("reference", reference_dir)
    tuned_answers, tuned_speed = (ref_answers, dict(ref_speed)) if itself else generate("tuned", tuned_dir)
    if quantization != "none":
        _say_quantized(quantization, ref_speed, tuned_speed)
    n = len(rows)
    ref_metrics, ref_scores = _task_scores(ref_answers[:n], rows, geometries, ref_geometries, iou_threshold, task)
    tuned_metrics, tuned_scores = _task_scores(tuned_answers[:n], rows, geometries, geometries, iou_threshold, task)
    ref_metrics.update(ref_speed)
    tuned_metrics.update(tuned_speed)

    ci = intervals(tuned_scores, ref_scores)  # over rows, paired: every figure and the margin
    passed, reason = gate(
        tuned_metrics, ref_metrics, gate_metric, gate_min_value, gate_min_margin, gate_on=gate_on, ci=ci
    )
    failed = [] if passed else ["task"]
    summary, drops, reg_samples = None, [], []
    if reg_rows:
        summary, drops, reg_samples = _regression(
            reg_rows, ref_answers[n:], tuned_answers[n:], reg_geometries, max_drop
        )
        for drop in drops:  # the task's log says it kind by kind
            print(f"evaluate: regression {drop.describe()}", file=sys.stderr, flush=True)
        passed, reason, failed = gate_with_regression(passed, reason, drops)
    if itself:
        passed, failed = False, ["itself"]
        reason = (
            f"FAIL: the tuned model {tuned_dir} is the reference model itself "
            "(e.g. a cached merge already registered as the champion); nothing new to promote"
        )
    samples = _sample_records(rows, geometries, reference_box_convention, (tuned_answers, tuned_scores),
                              (ref_answers, ref_scores))  # fmt: skip
    _write_predictions(predictions_out, samples + reg_samples)
    return EvalResult(passed, reason, tuned_metrics, ref_metrics, predictions_out, samples, summary, reg_samples,
                      drops, failed, quantization, ci)  # fmt: skip


def _say_quantized(quantization: str, ref_speed: dict[str, float], tuned_speed: dict[str, float]) -> None:
    print(
        f"evaluate: both models were loaded in {quantization} (bitsandbytes; quantised layers: reference "
        f"{ref_speed['quantized_layers']:.0f}, tuned {tuned_speed['quantized_layers']:.0f}): the scores are "
        f"those of an {quantization} deployment, not of the bf16 merged model",
        file=sys.stderr,
        flush=True,
    )


def _sample_records(
    rows: list[dict[str, Any]],
    geometries: list[Any],
    reference_box_convention: str,
    tuned: tuple[list[str], list[Any]],
    reference: tuple[list[str], list[Any]],
) -> list[dict[str, Any]]:
    """One predictions record per held-out row: the row, its geometry, each model's answer and score."""
    return [
        {
            "line": row["line"],
            "origin": row["origin"],
            "images": row["images"],
            "box_convention": geometry.convention,
            "reference_box_convention": reference_box_convention,
            "image_size": list(geometry.image_size) if geometry.image_size else None,
            "gold": row["gold"],
            "tuned": t_ans,
            "tuned_score": t_score,
            "reference": r_ans,
            "reference_score": r_score,
        }
        for row, geometry, t_ans, t_score, r_ans, r_score in zip(rows, geometries, *tuned, *reference)
    ]


def _check_quantization(quantization: str) -> None:
    """Refuses an unknown setting; quantised, probes that bitsandbytes runs on this machine (before any load).

    Raises:
        EvalError: Not one of QUANTIZATIONS.
        QuantizationUnavailable: bitsandbytes is missing or cannot quantise and run a layer here.
    """
    if quantization not in QUANTIZATIONS:
        raise EvalError(f"eval.quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}")
    check_runnable(quantization, "eval.quantization", "resources.eval_accelerator_type")


def regression_metrics(result: EvalResult, max_drop: dict[str, float] | None = None) -> tuple[dict, dict]:
    """The regression figures as evaluate's Metrics records them: (flat entries, metadata).

    Args:
        result: An EvalResult with a regression set.
        max_drop: The rule's max drops as configured (names left out: the default). Default None.

    Returns:
        (flat: {"base_regression_<kind>_<figure>", "tuned_regression_<kind>_<figure>" per kind,
        "base_regression_score" and "tuned_regression_score" overall, "regression_<kind or
        overall>_drop", "regression_passed"}; metadata: {"regression": the `summarize` shape,
        "regression_max_drop": the rule in full, "gate_failed": the failed rules}); ({}, {})
        without a regression set.
    """
    if result.regression is None:
        return {}, {}
    flat: dict[str, float] = {}
    sides = (("base", "reference"), ("tuned", "tuned"))
    for kind, entry in (result.regression or {}).get("kinds", {}).items():
        for prefix, side in sides:
            flat.update({f"{prefix}_regression_{kind}_{key}": value for key, value in entry[side].items()})
    for prefix, side in sides:
        flat[f"{prefix}_regression_score"] = result.regression[reg.OVERALL][side]["score"]
    flat.update({f"regression_{drop.name}_drop": drop.drop for drop in result.drops})
    flat["regression_passed"] = float(all(drop.ok for drop in result.drops))
    meta = {"regression": result.regression, "regression_max_drop": reg.max_drops(max_drop),
            "gate_failed": list(result.failed_rules)}  # fmt: skip
    return flat, meta


def label_metrics(
    result: EvalResult, task: str, iou_threshold: float, rule: ResizeRule | None
) -> dict[str, dict[str, dict[str, float]]]:
    """Per-label figures of both models on the held-out rows, as evaluate's Metrics metadata records them.

    Args:
        result: The EvalResult (its per-sample records).
        task: The task ("detection", "key_value"; others have no labels: {}).
        iou_threshold: The IoU at which a box counts as a hit.
        rule: The resize rule the boxes were scored under.

    Returns:
        {label: {"reference": {tp, fp, fn, n_gold, precision, recall, f1}, "tuned": {...}}}, labels sorted; what
        register imports as one Model Registry evaluation slice per label.
    """
    from components.evaluate._labels import per_label

    ref = per_label(result.samples, "reference", task, iou_threshold, rule)
    new = per_label(result.samples, "tuned", task, iou_threshold, rule)
    return {k: {"reference": ref.get(k, {}), "tuned": new.get(k, {})} for k in sorted(set(ref) | set(new))}
