"""The evaluate task's HTML report (pure): metric table, speed, worst samples drawn.

`render_report` returns one self-contained HTML page (inline CSS, images as base64 PNG
`data:` URIs, no scripts, no external requests), which the Vertex AI console shows for an
`Output[HTML]` artifact. The worst samples (invalid JSON first, then lowest tuned F1) are
drawn as thumbnails with the expected boxes in green and the tuned model's boxes in red,
each with its label. Boxes are drawn as the metric scores them (`components.common.tasks`):
in pixels of the original image, converted from the dataset's convention; a box with
x2 <= x1 or y2 <= y1 has zero area and never matches, so it is drawn as a small cross
marked "invalid", never as a rectangle spanning its corners.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from components.common.boxes import BoxError, ResizeRule
from components.common.tasks import Geometry, Shape, get_task, key_value_rows

INVALID_MARK = 4  # half-size of the cross drawn for an invalid box, thumbnail px
GOLD_COLOR = (0, 170, 0)
PRED_COLOR = (220, 0, 0)
THUMB_SIZE = 320
# (key, label, format) rows of the metric table, in order.
METRIC_ROWS = (
    ("f1", "F1", "{:.4f}"),
    ("precision", "precision", "{:.4f}"),
    ("recall", "recall", "{:.4f}"),
    ("json_valid_rate", "JSON valid rate", "{:.4f}"),
    ("exact_match_rate", "exact match rate", "{:.4f}"),
    ("n", "samples", "{:.0f}"),
    ("samples_per_second", "samples/s", "{:.3f}"),
    ("generated_tokens_per_second", "generated tokens/s", "{:.1f}"),
    ("generate_seconds", "generate s", "{:.1f}"),
)


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


def _label_origin(box: list[float], text_h: int, height: int) -> tuple[float, float]:
    """Where a box's label goes: above the box, else below it, else inside its top-left corner."""
    x1, y1, _, y2 = box
    if y1 - text_h - 2 >= 0:
        return x1, y1 - text_h - 2
    if y2 + text_h + 2 <= height:
        return x1, y2 + 2
    return x1 + 3, y1 + 3


def draw_shapes(
    image_path: str | Path | None,
    gold: Sequence[Shape],
    pred: Sequence[Shape],
    size: int = THUMB_SIZE,
) -> bytes:
    """Draws gold (green) and predicted (red) shapes with their labels on the image; PNG bytes.

    Shapes are in pixels of the original image (`Task.shapes`); the image is scaled to fit
    `size`. A valid shape is a rectangle; an invalid one (x2 <= x1 or y2 <= y1, which the
    metric never matches) is a small cross at (x1, y1), clamped into the image, labelled
    "<label> (invalid)". Labels are drawn first, so box outlines keep their colour. A missing
    or unreadable image becomes a grey `size` x `size` canvas (the boxes are still drawn).
    """
    from PIL import Image, ImageDraw, ImageFont

    try:
        image = Image.open(image_path).convert("RGB") if image_path else None
    except OSError:
        image = None
    if image is None:
        image = Image.new("RGB", (size, size), (200, 200, 200))
    width, height = image.size
    scale = min(1.0, size / max(width, height))
    if scale < 1.0:
        image = image.resize((max(1, round(width * scale)), max(1, round(height * scale))))
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    text_h = draw.textbbox((0, 0), "Ag", font=font)[3]
    w, h = image.size
    placed = []
    for shapes, color in ((gold, GOLD_COLOR), (pred, PRED_COLOR)):
        for shape in shapes:
            box = [v * scale for v in shape.box]
            if shape.valid:
                placed.append((color, box, shape.label, _label_origin(box, text_h, h)))
            else:
                x = min(max(box[0], INVALID_MARK), w - 1 - INVALID_MARK)
                y = min(max(box[1], INVALID_MARK), h - 1 - INVALID_MARK)
                placed.append((color, None, f"{shape.label} (invalid)", (x + INVALID_MARK + 2, y - text_h // 2), x, y))
    for item in placed:
        draw.text(item[3], item[2], fill=item[0], font=font)
    for item in placed:
        color, box = item[0], item[1]
        if box is not None:
            draw.rectangle(box, outline=color, width=2)
        else:
            x, y, m = item[4], item[5], INVALID_MARK
            draw.line([(x - m, y - m), (x + m, y + m)], fill=color, width=2)
            draw.line([(x - m, y + m), (x + m, y - m)], fill=color, width=2)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


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


def _metric_table(tuned: dict, reference: dict, reference_name: str) -> str:
    rows = []
    for key, label, fmt in METRIC_ROWS:
        if key not in tuned and key not in reference:
            continue
        t, r = tuned.get(key), reference.get(key)
        delta = _fmt("{:+.4f}", t - r) if isinstance(t, (int, float)) and isinstance(r, (int, float)) else "—"
        rows.append(
            f"<tr><th>{html.escape(label)}</th><td>{_fmt(fmt, r)}</td><td>{_fmt(fmt, t)}</td><td>{delta}</td></tr>"
        )
    head = f"<tr><th>metric</th><th>{html.escape(reference_name)}</th><th>tuned</th><th>tuned − {html.escape(reference_name)}</th></tr>"
    return f'<table class="metrics">{head}{"".join(rows)}</table>'


def _describe(shapes: Sequence[Shape]) -> str:
    invalid = sum(not shape.valid for shape in shapes)
    return f"{len(shapes)}" + (f", {invalid} invalid: x2 ≤ x1 or y2 ≤ y1, never matches" if invalid else "")


def _field_table(gold_text: str, pred_text: str) -> str:
    """A key_value sample's fields: field, expected and predicted value, ✓ / ✗ per field."""
    rows = []
    for name, gold, pred, match in key_value_rows(gold_text, pred_text):
        mark = '<td class="gold">✓</td>' if match else '<td class="pred">✗</td>'
        cells = "".join(f"<td>{'—' if v is None else html.escape(v)}</td>" for v in (gold, pred))
        rows.append(f"<tr><th>{html.escape(name)}</th>{cells}{mark}</tr>")
    head = "<tr><th>field</th><th>expected</th><th>tuned</th><th></th></tr>"
    return f'<table class="metrics fields">{head}{"".join(rows)}</table>'


def _key_value_card(sample: dict[str, Any]) -> str:
    """A key_value sample: the image, then the field table and both answers."""
    images = sample.get("images") or [None]
    uri = "data:image/png;base64," + base64.b64encode(draw_shapes(images[0], [], [])).decode("ascii")
    score = sample["tuned_score"]
    status = "valid JSON" if score.get("json_valid") else f"invalid: {score.get('error') or 'no JSON'}"
    ref_score = sample.get("reference_score") or {}
    return (
        '<div class="sample">'
        f'<img src="{uri}" alt="line {sample.get("line")}">'
        f"<div><b>line {sample.get('line')}</b> · tuned field F1 {sample_f1(score):.3f} "
        f"(tp {score.get('tp', 0)}, fp {score.get('fp', 0)}, fn {score.get('fn', 0)}) · {html.escape(status)}"
        f" · reference F1 {sample_f1(ref_score) if ref_score else 0.0:.3f}"
        + _field_table(sample["gold"], sample["tuned"])
        + f'<div class="label pred">tuned answer</div><pre>{html.escape(sample["tuned"][:1500])}</pre>'
        "</div></div>"
    )


def _sample_card(sample: dict[str, Any], task: str = "detection", rule: ResizeRule | None = None) -> str:
    if task == "key_value":
        return _key_value_card(sample)
    images = sample.get("images") or [None]
    convention = sample.get("box_convention") or "pixel"
    size = sample.get("image_size") or _image_size(images[0])
    geometry = Geometry(convention, tuple(size) if size else None, rule or ResizeRule())
    shapes_of = get_task(task).shapes
    try:
        gold, pred = shapes_of(sample["gold"], geometry), shapes_of(sample["tuned"], geometry)
        problem = ""
    except BoxError as exc:
        gold, pred, problem = [], [], f" · boxes not drawn: {exc}"
    png = draw_shapes(images[0], gold, pred)
    uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    score = sample["tuned_score"]
    status = "valid JSON" if score.get("json_valid") else f"invalid: {score.get('error') or 'no JSON'}"
    ref_score = sample.get("reference_score") or {}
    return (
        '<div class="sample">'
        f'<img src="{uri}" alt="line {sample.get("line")}">'
        f"<div><b>line {sample.get('line')}</b> · tuned F1 {sample_f1(score):.3f} "
        f"(tp {score.get('tp', 0)}, fp {score.get('fp', 0)}, fn {score.get('fn', 0)}) · {html.escape(status)}"
        f" · reference F1 {sample_f1(ref_score) if ref_score else 0.0:.3f}{html.escape(problem)}"
        f'<div class="label gold">expected ({_describe(gold)})</div><pre>{html.escape(sample["gold"][:1500])}</pre>'
        f'<div class="label pred">tuned ({html.escape(_describe(pred))})</div>'
        f"<pre>{html.escape(sample['tuned'][:1500])}</pre>"
        "</div></div>"
    )


STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:16px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:24px}
.pass{color:#070;font-weight:bold}.fail{color:#b00;font-weight:bold}
table.metrics{border-collapse:collapse}table.metrics td,table.metrics th{border:1px solid #ccc;padding:4px 10px;text-align:right}
table.metrics th:first-child{text-align:left}
.sample{display:flex;gap:12px;border-top:1px solid #ddd;padding:10px 0}
.sample img{border:1px solid #999;max-width:320px;align-self:flex-start}
pre{white-space:pre-wrap;word-break:break-all;font-size:12px;background:#f6f6f6;padding:6px;margin:2px 0 6px}
.label{font-size:12px;font-weight:bold;margin-top:6px}.gold{color:rgb(0,140,0)}.pred{color:rgb(200,0,0)}
"""


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
) -> str:
    """Renders the evaluation report (pure apart from reading the sample images).

    Args:
        tuned: Aggregate metrics of the tuned model (EvalResult.tuned).
        reference: Aggregate metrics of the reference model (EvalResult.reference).
        samples: Per-sample records (EvalResult.samples: line, images, gold, tuned,
            tuned_score, reference, reference_score).
        passed: Gate decision; None = not shown. Default None.
        reason: Gate reason text. Default "".
        reference_name: Column name of the reference ("base", "champion@VERSION" or a
            folder). Default "base".
        reference_detail: Where the reference model came from (URI), shown under the
            gate decision. Default "" (not shown).
        worst_n: How many worst samples to draw. Default 8.
        title: Page title. Default "Evaluation: tuned vs reference".
        iou_threshold: The IoU at which boxes matched, stated above the samples; None = not
            stated. Default None.
        resize_rule: Smart-resize settings for samples whose box_convention is
            resized_pixel; None = Qwen2.5-VL's. Default None.
        task: The task the answers were scored with (`components.common.tasks`);
            "key_value" draws each sample's fields as a table instead of boxes. Default
            "detection".

    Returns:
        A self-contained HTML document.
    """
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
    ]
    if passed is not None:
        cls = "pass" if passed else "fail"
        parts.append(f'<p class="{cls}">{"PASSED" if passed else "FAILED"} the gate</p>')
    if reason:
        parts.append(f"<p>{html.escape(reason)}</p>")
    if reference_detail:
        parts.append(
            f"<p>Reference model: <b>{html.escape(reference_name)}</b> "
            f"(<code>{html.escape(reference_detail)}</code>)</p>"
        )
    parts.append("<h2>Metrics</h2>" + _metric_table(tuned, reference, reference_name))
    worst = worst_samples(samples, worst_n)
    if worst:
        n_invalid = sum(1 for s in samples if not s["tuned_score"].get("json_valid"))
        if task == "key_value":
            parts.append(
                f"<h2>Worst {len(worst)} of {len(samples)} samples (tuned model; {n_invalid} with invalid JSON)</h2>"
                "<p>Fields compared after stripping, collapsing whitespace and ignoring case: "
                '<span class="gold">✓ tuned value equals the expected one</span> · '
                '<span class="pred">✗ missing, wrong or extra</span>.</p>'
            )
        else:
            conventions = sorted({s.get("box_convention") or "pixel" for s in worst})
            parts.append(
                f"<h2>Worst {len(worst)} of {len(samples)} samples (tuned model; {n_invalid} with invalid JSON)</h2>"
                '<p>Boxes: <span class="gold">■ expected</span> · <span class="pred">■ tuned prediction</span>'
                f", drawn in pixels of the original image (dataset boxes: {html.escape(', '.join(conventions))})"
                + (
                    f"; a prediction matches an expected box of the same label at IoU ≥ {iou_threshold:g}"
                    if iou_threshold is not None
                    else ""
                )
                + "; × = an invalid box (x2 ≤ x1 or y2 ≤ y1), which never matches.</p>"
            )
        parts.extend(_sample_card(s, task, rule=resize_rule) for s in worst)
    parts.append("</body></html>")
    return "".join(parts)


def write_report(path: str | Path, *args: Any, **kwargs: Any) -> str:
    """Renders the report (`render_report` arguments) into `path`; returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_report(*args, **kwargs), encoding="utf-8")
    return str(out)
