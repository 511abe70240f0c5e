"""The evaluate task's HTML report (pure): metric table, speed, worst samples drawn.

`render_report` returns one self-contained HTML page (inline CSS, images as base64 PNG
`data:` URIs, no scripts, no external requests), which the Vertex AI console shows for an
`Output[HTML]` artifact. The worst samples (invalid JSON first, then lowest tuned F1) are
drawn as thumbnails with the expected boxes in green and the tuned model's boxes in red.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from components.common.answers import parse_findings

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


def _boxes(text: str) -> list[dict[str, Any]]:
    findings, _ = parse_findings(text)
    return findings or []


def draw_thumbnail(image_path: str | Path | None, gold: list[dict], pred: list[dict], size: int = THUMB_SIZE) -> bytes:
    """Draws gold (green) and predicted (red) boxes on the image, scaled to fit `size`; PNG bytes.

    Boxes are in pixels of the original image; if every coordinate lies in [0, 1000] and
    some exceed the image, they are read as Qwen's 0-1000 normalised coordinates. A missing
    or unreadable image becomes a grey canvas (the boxes are still drawn).
    """
    from PIL import Image, ImageDraw

    try:
        image = Image.open(image_path).convert("RGB") if image_path else None
    except OSError:
        image = None
    if image is None:
        image = Image.new("RGB", (size, size), (200, 200, 200))
    width, height = image.size
    coords = [float(v) for f in gold + pred for v in f["bbox"]]
    norm = bool(coords) and max(coords) <= 1000 and max(coords) > max(width, height)
    sx, sy = (width / 1000, height / 1000) if norm else (1.0, 1.0)
    scale = min(1.0, size / max(width, height))
    if scale < 1.0:
        image = image.resize((max(1, round(width * scale)), max(1, round(height * scale))))
    draw = ImageDraw.Draw(image)
    for findings, color in ((gold, GOLD_COLOR), (pred, PRED_COLOR)):
        for finding in findings:
            x1, y1, x2, y2 = (float(v) for v in finding["bbox"])
            box = [x1 * sx * scale, y1 * sy * scale, x2 * sx * scale, y2 * sy * scale]
            box = [min(box[0], box[2]), min(box[1], box[3]), max(box[0], box[2]), max(box[1], box[3])]
            draw.rectangle(box, outline=color, width=2)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


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


def _sample_card(sample: dict[str, Any]) -> str:
    gold, pred = _boxes(sample["gold"]), _boxes(sample["tuned"])
    images = sample.get("images") or [None]
    png = draw_thumbnail(images[0], gold, pred)
    uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    score = sample["tuned_score"]
    status = "valid JSON" if score.get("json_valid") else f"invalid: {score.get('error') or 'no JSON'}"
    ref_score = sample.get("reference_score") or {}
    return (
        '<div class="sample">'
        f'<img src="{uri}" alt="line {sample.get("line")}">'
        f"<div><b>line {sample.get('line')}</b> · tuned F1 {sample_f1(score):.3f} "
        f"(tp {score.get('tp', 0)}, fp {score.get('fp', 0)}, fn {score.get('fn', 0)}) · {html.escape(status)}"
        f" · reference F1 {sample_f1(ref_score) if ref_score else 0.0:.3f}"
        f'<div class="label gold">expected ({len(gold)})</div><pre>{html.escape(sample["gold"][:1500])}</pre>'
        f'<div class="label pred">tuned ({len(pred)})</div><pre>{html.escape(sample["tuned"][:1500])}</pre>'
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
        parts.append(
            f"<h2>Worst {len(worst)} of {len(samples)} samples (tuned model; {n_invalid} with invalid JSON)</h2>"
            '<p>Boxes: <span class="gold">■ expected</span> · <span class="pred">■ tuned prediction</span></p>'
        )
        parts.extend(_sample_card(s) for s in worst)
    parts.append("</body></html>")
    return "".join(parts)


def write_report(path: str | Path, *args: Any, **kwargs: Any) -> str:
    """Renders the report (`render_report` arguments) into `path`; returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_report(*args, **kwargs), encoding="utf-8")
    return str(out)
