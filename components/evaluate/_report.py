"""The evaluate task's HTML report (pure): metric table, per-label scores, worst samples drawn.

`render_report` returns one self-contained HTML page (`report.html.jinja`: inline CSS,
figures as inline matplotlib SVG, images as base64 PNG `data:` URIs, no scripts, no external
requests), which the Vertex AI console shows for an `Output[HTML]` artifact.

- Metrics: reference, tuned and the difference; the gate decision; the IoU threshold. With
  `eval.quantization` nf4 / int8, a line saying both models were loaded quantised (the scores of a
  4-bit deployment, not of the bf16 merged model) and each model's bitsandbytes layer count.
- Per label (detection) or field (key_value): precision / recall / F1 of both models, counted
  as the metric counts (`_labels.per_label`), as a table and a bar chart of F1.
- The worst samples (invalid JSON first, then lowest tuned F1), each named by the user's
  `file:line` and image (validate-data's provenance), drawn twice side by side: expected boxes
  in green with the tuned model's in red, and with the reference model's in blue, each box
  with a number tag placed clear of the others (`components.common.report.place_tags`) and a
  numbered legend of labels under the drawing (labels written on a small image overlap), then
  the three answers, with characters a browser cannot show (a base model's raw control
  characters) written as `\x07` escapes or one summary per run, and counted. Boxes are drawn as the metric scores them
  (`components.common.tasks`): in pixels of the original image, converted from the dataset's
  convention (the reference's answers from its own); a box with x2 <= x1 or y2 <= y1 has zero
  area and never matches, so it is drawn as a small cross marked "invalid", never as a
  rectangle spanning its corners. Sample images are drawn with PIL (exact pixels, tested).
- The regression set (when there is one): per kind and overall, the reference's and the tuned
  model's figures, the difference, the drop the gate compared with its max_drop and whether
  that rule held; then the rows that got most worse (tuned row score below the reference's,
  largest drop first), each with its question and the reference answer, the tuned answer and
  the gold side by side (grounding rows drawn: gold green, tuned red).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from components.common import regression as reg
from components.common.boxes import BoxError, ResizeRule
from components.common.metrics import METRICS
from components.common.provenance import where
from components.common.report import (
    BLUE,
    GOLD_COLOR,
    GREY,
    PRED_COLOR,
    count_unprintable,
    draw_shapes,
    figure_svg,
    legend,
    png_data_uri,
    render_template,
)
from components.common.tasks import Geometry, Shape, detection_shapes, get_task, key_value_rows
from components.evaluate._labels import per_label

# GOLD_COLOR and PRED_COLOR are components.common.report's, named here for the report's readers and tests.
__all__ = ["GOLD_COLOR", "PRED_COLOR", "REF_COLOR", "draw_shapes", "draw_thumbnail", "render_report", "sample_f1",
           "worst_samples", "write_report"]  # fmt: skip

REF_COLOR = (30, 90, 230)  # the reference model's boxes
MAX_LABELS = 40  # per-label rows shown (most gold boxes first)
THUMB_SIZE = 320  # as components.common.report.THUMB_SIZE
# (key, label, format) rows of the metric table, in order: every figure of components.common.metrics.
METRIC_ROWS = tuple((m.name, m.label, m.fmt) for m in METRICS)


def sample_f1(score: dict[str, Any]) -> float:
    """F1 of one sample's score (1.0 when there is nothing to find and nothing predicted)."""
    tp, fp, fn = score.get("tp", 0), score.get("fp", 0), score.get("fn", 0)
    if not score.get("json_valid", True):
        return 0.0
    return 1.0 if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)


def worst_samples(samples: Sequence[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The n samples the tuned model did worst on: invalid JSON first, then lowest F1 (stable)."""
    ranked = sorted(samples, key=lambda s: (bool(s["tuned_score"].get("json_valid")), sample_f1(s["tuned_score"])))
    return ranked[:n]


def _image_size(image_path: str | Path | None) -> tuple[int, int] | None:
    from PIL import Image

    try:
        with Image.open(image_path) as image:
            return image.size
    except (OSError, ValueError, AttributeError, TypeError):
        return None


def _finding_shapes(findings: list[dict], geometry: Geometry) -> list[Shape]:
    out = []
    for finding in findings:
        x1, y1, x2, y2 = geometry.to_pixels(finding["bbox"])
        out.append(Shape(finding["label"], (x1, y1, x2, y2), x2 > x1 and y2 > y1))
    return out


def draw_thumbnail(
    image_path: str | Path | None,
    gold: list[dict],
    pred: list[dict],
    size: int = THUMB_SIZE,
    convention: str | None = None,
    rule: ResizeRule | None = None,
) -> bytes:
    """Draws gold (green) and predicted (red) findings on the image, scaled to fit `size`; PNG bytes.

    Args:
        image_path: The sample's image; missing or unreadable = a grey canvas.
        gold: Gold findings ``{"label", "bbox"}`` in `convention`.
        pred: Predicted findings in `convention`.
        size: Longest side of the thumbnail, px. Default THUMB_SIZE.
        convention: Box convention of the findings (`components.common.boxes`); None = a guess
            for records that do not say: 0-1000 if every coordinate lies in [0, 1000] and some
            exceed the image, else pixels. Default None.
        rule: Smart-resize settings (resized_pixel); None = Qwen2.5-VL's. Default None.
    """
    image_size = _image_size(image_path) or (size, size)
    if convention is None:
        coords = [float(v) for f in gold + pred for v in f["bbox"]]
        convention = "norm1000" if coords and max(coords) <= 1000 and max(coords) > max(image_size) else "pixel"
    geometry = Geometry(convention, image_size, rule or ResizeRule())
    return draw_shapes(image_path, _finding_shapes(gold, geometry), _finding_shapes(pred, geometry), size)


def _fmt(fmt: str, value: Any) -> str:
    return fmt.format(value) if isinstance(value, (int, float)) else "—"


def _ci(bounds: list[float] | None, signed: bool = False) -> str:
    """An interval at the figures' meaningful precision (3 decimals: a row of 16 moves a rate by 0.06)."""
    if not bounds:
        return ""
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"[{f.format(bounds[0])}, {f.format(bounds[1])}]"


def _metric_rows(tuned: dict, reference: dict, ci: dict[str, Any] | None = None) -> list[dict[str, str]]:
    """Returns the metric table's rows: label, reference, tuned and the difference, formatted, each with its
    bootstrap interval where `ci` has one ("" else)."""
    ci = ci or {}
    rows = []
    for key, label, fmt in METRIC_ROWS:
        if key not in tuned and key not in reference:
            continue
        t, r = tuned.get(key), reference.get(key)
        signed = fmt.replace("{:", "{:+")  # the difference at the figure's own precision: +53.2 tokens/s, samples +0
        delta = _fmt(signed, t - r) if isinstance(t, (int, float)) and isinstance(r, (int, float)) else "—"
        rows.append({"label": label, "reference": _fmt(fmt, r), "tuned": _fmt(fmt, t), "delta": delta,
                     "reference_ci": _ci(ci.get("reference", {}).get(key)), "tuned_ci": _ci(ci.get("tuned", {}).get(key)),
                     "delta_ci": _ci(ci.get("margin", {}).get(key), signed=True)})  # fmt: skip
    return rows


def _describe(shapes: Sequence[Shape]) -> str:
    invalid = sum(not shape.valid for shape in shapes)
    return f"{len(shapes)}" + (f", {invalid} invalid: x2 ≤ x1 or y2 ≤ y1, never matches" if invalid else "")


def _status(score: dict[str, Any]) -> str:
    return "valid JSON" if score.get("json_valid") else f"invalid: {score.get('error') or 'no JSON'}"


def _drawn(sample: dict[str, Any], answer_key: str, task: str, rule: ResizeRule, draw: bool = True) -> dict[str, Any]:
    """One model's side of a sample card: its answer drawn over the expected boxes (`draw`), its score and text."""
    images = sample.get("images") or [None]
    size = sample.get("image_size") or _image_size(images[0])
    size = tuple(size) if size else None
    convention = sample.get("box_convention") or "pixel"
    pred_convention = (
        (sample.get("reference_box_convention") or convention) if answer_key == "reference" else convention
    )
    text = sample.get(answer_key) or ""
    score = sample.get(f"{answer_key}_score") or {}
    shapes_of, gold, pred, problem = get_task(task).shapes, [], [], ""
    if task != "key_value":
        try:
            gold = shapes_of(sample["gold"], Geometry(convention, size, rule))
            pred = shapes_of(text, Geometry(pred_convention, size, rule))
        except BoxError as exc:
            gold, pred, problem = [], [], f"boxes not drawn: {exc}"
    color = REF_COLOR if answer_key == "reference" else PRED_COLOR
    return {
        "uri": png_data_uri(draw_shapes(images[0], gold, pred, pred_color=color)) if draw else "",
        "legend": legend(gold, pred, answer_key) if draw else [],
        "f1": sample_f1(score) if score else 0.0,
        "score": {k: score.get(k, 0) for k in ("tp", "fp", "fn")},
        "status": _status(score) if score else "not scored",
        "describe": _describe(pred),
        "gold_describe": _describe(gold),
        "problem": problem,
        "text": text[:1500],
        "unprintable": count_unprintable(text[:1500]),
        "convention": pred_convention,
    }


def _sample_view(sample: dict[str, Any], task: str, rule: ResizeRule) -> dict[str, Any]:
    """A sample card: where it came from (the user's file:line and image), both models' sides, the fields."""
    origin = sample.get("origin") or None
    images = sample.get("images") or []
    names = (origin or {}).get("images") or [Path(p).name for p in images if p]
    fields = []
    if task == "key_value":
        fields = [
            {"name": n, "gold": g, "pred": p, "match": m}
            for n, g, p, m in key_value_rows(sample["gold"], sample["tuned"])
        ]
    return {
        "line": sample.get("line"),
        "where": where(origin),
        "images": names,
        "gold": sample["gold"][:1500],
        "tuned": _drawn(sample, "tuned", task, rule),
        "reference": _drawn(sample, "reference", task, rule, draw=task != "key_value"),  # key_value: one image
        "fields": fields,
    }


def _per_label_view(samples: Sequence[dict[str, Any]], task: str, iou: float, rule: ResizeRule) -> list[dict]:
    """Per-label rows of both models (most gold boxes first, at most MAX_LABELS)."""
    tuned = per_label(samples, "tuned", task, iou, rule)
    reference = per_label(samples, "reference", task, iou, rule)
    labels = sorted(set(tuned) | set(reference), key=lambda k: (-(tuned.get(k) or reference[k])["n_gold"], k))
    empty = {"tp": 0, "fp": 0, "fn": 0, "n_gold": 0, "precision": 0.0, "recall": 0.0, "f1": 0.0}
    return [
        {"label": k, "n_gold": (tuned.get(k) or reference[k])["n_gold"], "tuned": tuned.get(k, empty),
         "reference": reference.get(k, empty)}
        for k in labels[:MAX_LABELS]
    ]  # fmt: skip


def _per_label_svg(rows: list[dict], reference_name: str, task: str = "detection") -> Any:
    """Returns a horizontal bar chart of F1 per label (per field for key_value; reference vs tuned) as inline SVG,
    None without rows; its axis says what the task counts."""
    if not rows:
        return None

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        ys = list(range(len(rows)))
        ax.barh(
            [y + 0.2 for y in ys], [r["reference"]["f1"] for r in rows], height=0.4, color=GREY, label=reference_name
        )
        ax.barh([y - 0.2 for y in ys], [r["tuned"]["f1"] for r in rows], height=0.4, color=BLUE, label="tuned")
        ax.set_yticks(ys, [r["label"] for r in rows])
        ax.invert_yaxis()
        ax.set_xlim(0, 1)
        if task == "key_value":
            ax.set_xlabel("F1 (per field, values equal after normalising)")
            ax.set_ylabel("field")
        else:
            ax.set_xlabel("F1 (per label, boxes matched at the IoU threshold)")
            ax.set_ylabel("label")
        ax.legend(loc="lower right", fontsize=8)

    return figure_svg(draw, (6.4, 1.2 + 0.32 * len(rows)), "labels")


REGRESSION_WORST = 6  # regression rows shown side by side


def _regression_rows(summary: dict[str, Any], drops: Sequence[reg.Drop]) -> list[dict[str, Any]]:
    """The regression table: per kind each figure (the gate's first, with its drop and rule), then overall."""
    by_name = {d.name: d for d in drops}
    rows = []
    entries = [(kind, entry, reg.KINDS[kind]) for kind, entry in summary["kinds"].items()]
    for name, entry, spec in [*entries, (reg.OVERALL, summary[reg.OVERALL], None)]:
        metrics = [spec.gate_metric, *[m for m in spec.metrics if m != spec.gate_metric]] if spec else ["score"]
        for i, metric in enumerate(metrics):
            drop = by_name.get(name) if i == 0 else None
            rows.append({
                "name": name if i == 0 else "", "n": entry["tuned"].get("n") if i == 0 else None,
                "metric": metric + (" (lower is better)" if spec and not spec.higher_is_better and i == 0 else ""),
                "reference": f"{entry['reference'][metric]:.3f}", "tuned": f"{entry['tuned'][metric]:.3f}",
                "delta": f"{entry['delta'][metric]:+.3f}",
                "drop": f"{drop.drop:+.3f}" if drop else "", "allowed": f"{drop.allowed:.3f}" if drop else "",
                "ok": drop.ok if drop else None,
            })  # fmt: skip
    return rows


def _regression_card(sample: dict[str, Any], rule: ResizeRule) -> dict[str, Any]:
    """One regression row side by side: question, image (grounding: gold green, tuned red), three answers."""
    images = sample.get("images") or [None]
    gold, tuned = [], []
    if sample["kind"] == "grounding":
        size = tuple(sample["image_size"]) if sample.get("image_size") else _image_size(images[0])
        geometry = Geometry(sample.get("box_convention") or "pixel", size, rule)
        try:
            gold, tuned = detection_shapes(sample["gold"], geometry), detection_shapes(sample["tuned"], geometry)
        except BoxError:
            gold, tuned = [], []
    return {
        "kind": sample["kind"],
        "where": where(sample.get("origin") or None) or f"line {sample.get('line')}",
        "question": sample.get("question", ""),
        "uri": png_data_uri(draw_shapes(images[0], gold, tuned, size=200)),
        "gold": sample["gold"][:600],
        "reference": (sample.get("reference") or "")[:600],
        "tuned": (sample.get("tuned") or "")[:600],
        "reference_score": sample["reference_score"]["score"],
        "tuned_score": sample["tuned_score"]["score"],
    }


def worst_regressions(samples: Sequence[dict[str, Any]], n: int = REGRESSION_WORST) -> list[dict[str, Any]]:
    """The n regression rows whose score fell most from the reference to the tuned model (only rows that fell)."""
    fell = [s for s in samples if s["tuned_score"]["score"] < s["reference_score"]["score"]]
    return sorted(fell, key=lambda s: s["tuned_score"]["score"] - s["reference_score"]["score"])[:n]


def _regression_view(
    summary: dict[str, Any] | None, samples: Sequence[dict[str, Any]], drops: Sequence[reg.Drop], rule: ResizeRule
) -> dict[str, Any] | None:
    """The report's regression section, None without a regression set."""
    if not summary:
        return None
    return {
        "rows": _regression_rows(summary, drops),
        "n": len(samples),
        "failed": [d.describe() for d in drops if not d.ok],
        "cards": [_regression_card(s, rule) for s in worst_regressions(samples)],
        "n_fell": sum(s["tuned_score"]["score"] < s["reference_score"]["score"] for s in samples),
    }


def render_report(
    tuned: dict[str, Any],
    reference: dict[str, Any],
    samples: Sequence[dict[str, Any]],
    passed: bool | None = None,
    reason: str = "",
    reference_name: str = "base",
    reference_detail: str = "",
    worst_n: int = 8,
    title: str = "Evaluation: tuned vs reference",
    iou_threshold: float | None = None,
    resize_rule: ResizeRule | None = None,
    task: str = "detection",
    regression: dict[str, Any] | None = None,
    regression_samples: Sequence[dict[str, Any]] = (),
    drops: Sequence[reg.Drop] = (),
    quantization: str = "none",
    intervals: dict[str, Any] | None = None,
) -> str:
    """Renders the evaluation report (pure apart from reading the sample images).

    Args:
        tuned: Aggregate metrics of the tuned model (EvalResult.tuned).
        reference: Aggregate metrics of the reference model (EvalResult.reference).
        samples: Per-sample records (EvalResult.samples: line, origin, images, gold, tuned,
            tuned_score, reference, reference_score, box conventions, image_size).
        passed: Gate decision; None = not shown. Default None.
        reason: Gate reason text. Default "".
        reference_name: Column name of the reference ("base", "champion@VERSION" or a
            folder). Default "base".
        reference_detail: Where the reference model came from (URI), shown under the
            gate decision. Default "" (not shown).
        worst_n: How many worst samples to draw. Default 8.
        title: Page title. Default "Evaluation: tuned vs reference".
        iou_threshold: The IoU at which boxes matched, stated on the page and used for the
            per-label table; None = not stated, and per-label figures at 0.5. Default None.
        resize_rule: Smart-resize settings for samples whose box_convention is
            resized_pixel; None = Qwen2.5-VL's. Default None.
        task: The task the answers were scored with (`components.common.tasks`);
            "key_value" draws each sample's fields as a table instead of boxes. Default
            "detection".
        regression: The regression figures (EvalResult.regression); None = no section. Default None.
        regression_samples: The regression rows' records (EvalResult.regression_samples). Default ().
        drops: The regression rule's checks (EvalResult.drops). Default ().
        quantization: How both models were loaded (EvalResult.quantization); "nf4" / "int8" is
            stated above the metrics. Default "none" (nothing stated).
        intervals: Bootstrap intervals over rows (EvalResult.intervals): each figure's and the
            margin's interval beside its value. Default None (not shown).

    Returns:
        A self-contained HTML document.
    """
    rule = resize_rule or ResizeRule()
    worst = worst_samples(samples, worst_n)
    labels = _per_label_view(samples, task, 0.5 if iou_threshold is None else iou_threshold, rule)
    return render_template(
        Path(__file__).parent,
        "report.html.jinja",
        title=title,
        passed=passed,
        reason=reason,
        reference_name=reference_name,
        reference_detail=reference_detail,
        metrics=_metric_rows(tuned, reference, intervals or {}),
        ci=intervals or {},
        task=task,
        iou_threshold=iou_threshold,
        labels=labels,
        labels_svg=_per_label_svg(labels, reference_name, task),
        n_samples=len(samples),
        n_invalid=sum(1 for s in samples if not s["tuned_score"].get("json_valid")),
        conventions=sorted({s.get("box_convention") or "pixel" for s in worst}),
        cards=[_sample_view(s, task, rule) for s in worst],
        regression=_regression_view(regression, regression_samples, drops, rule),
        quantization=quantization,
    )


def write_report(path: str | Path, *args: Any, **kwargs: Any) -> str:
    """Renders the report (`render_report` arguments) into `path`; returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_report(*args, **kwargs), encoding="utf-8")
    return str(out)
