"""The validate-data HTML report: one self-contained file (inline CSS, SVG and thumbnails).

No scripts and no external resources, so it renders the same in the Vertex AI console's
HTML artifact viewer, a browser opened on the file, and headless Chromium in the tests.
"""

from __future__ import annotations

import base64
import io
import math
import warnings
from collections import Counter
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image

if TYPE_CHECKING:
    from components.validate_data.core import Issue, ValidationResult

EXAMPLES_PER_CODE = 3
THUMBS_PER_EXAMPLE = 4
THUMB_PX = 96

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#202124;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dadce0;padding-bottom:4px}
.verdict{display:inline-block;padding:4px 10px;border-radius:4px;font-weight:600;margin:8px 0}
.ok{background:#e6f4ea;color:#137333} .bad{background:#fce8e6;color:#a50e0e}
.cards{display:flex;gap:12px;flex-wrap:wrap} .card{border:1px solid #dadce0;border-radius:8px;padding:10px 16px;min-width:90px}
.card b{display:block;font-size:22px} .card span{color:#5f6368;font-size:12px}
table{border-collapse:collapse;font-size:13px} td,th{border:1px solid #dadce0;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f1f3f4} td.n{text-align:right;font-variant-numeric:tabular-nums} tr.zero td{color:#9aa0a6}
code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
pre{white-space:pre-wrap;word-break:break-all;background:#f8f9fa;padding:6px;margin:4px 0;max-height:7em;overflow:hidden}
.ex{border:1px solid #dadce0;border-radius:6px;padding:8px;margin:6px 0} .loc{font-weight:600}
.thumbs img{border:1px solid #dadce0;margin:2px 4px 0 0;max-width:96px;max-height:96px} .muted{color:#5f6368;font-size:12px}
"""


def _thumb(path: Path) -> str:
    """Returns an <img> with a base64 JPEG thumbnail, or a note when it cannot be made.

    Memory stays bounded: a JPEG decodes at a reduced scale (`Image.draft`), and an image
    still above MAX_IMAGE_PIXELS (the largest that validation decodes) is not decoded.
    """
    from components.validate_data.core import MAX_IMAGE_PIXELS

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                img.draft(None, (THUMB_PX * 2, THUMB_PX * 2))  # JPEG only: decode at 1/2 .. 1/8 scale
                if img.width * img.height > MAX_IMAGE_PIXELS:
                    w, h = img.size
                    return f'<span class="muted">({escape(path.name)}: {w}×{h} px, too large to preview)</span>'
                img.thumbnail((THUMB_PX, THUMB_PX))
                buf = io.BytesIO()
                img.convert("RGB").save(buf, "JPEG", quality=70)
        data = base64.b64encode(buf.getvalue()).decode("ascii")
        return f'<img alt="{escape(path.name)}" src="data:image/jpeg;base64,{data}">'
    except Exception:  # noqa: BLE001 - a thumbnail never breaks the report
        return '<span class="muted">(no preview)</span>'


def _histogram_svg(values: list[int], bins: int = 24, limit: int = 0, width: int = 640, height: int = 180) -> str:
    """Returns an SVG bar histogram of values, with a red line at `limit` when > 0."""
    if not values:
        return '<p class="muted">no valid rows</p>'
    lo, hi = min(values), max(max(values), limit or 0)
    step = max(1, math.ceil((hi - lo + 1) / bins))
    counts = Counter((v - lo) // step for v in values)
    n_bins = (hi - lo) // step + 1
    top = max(counts.values())
    pad, plot_h = 40, height - 40
    bar_w = (width - pad - 10) / n_bins
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">']
    parts.append(f'<line x1="{pad}" y1="{plot_h}" x2="{width - 10}" y2="{plot_h}" stroke="#5f6368"/>')
    for b in range(n_bins):
        c = counts.get(b, 0)
        h = 0 if not c else max(1.0, (plot_h - 10) * c / top)
        x = pad + b * bar_w
        parts.append(
            f'<rect x="{x:.1f}" y="{plot_h - h:.1f}" width="{max(1.0, bar_w - 1):.1f}" height="{h:.1f}" fill="#1a73e8">'
            f"<title>{lo + b * step}–{lo + (b + 1) * step - 1}: {c}</title></rect>"
        )
    parts.append(f'<text x="{pad}" y="{height - 22}" font-size="11" fill="#5f6368">{lo}</text>')
    parts.append(
        f'<text x="{width - 10}" y="{height - 22}" font-size="11" fill="#5f6368" text-anchor="end">{hi}</text>'
    )
    parts.append(f'<text x="4" y="14" font-size="11" fill="#5f6368">{top}</text>')
    if limit:
        x = pad + (limit - lo) / step * bar_w
        parts.append(f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{plot_h}" stroke="#d93025" stroke-dasharray="4 3"/>')
        parts.append(
            f'<text x="{x - 4:.1f}" y="12" font-size="11" fill="#d93025" text-anchor="end">max_length {limit}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _sizes_svg(sizes: list[tuple[int, int]], side: int = 260) -> str:
    """Returns an SVG scatter of image width (x) vs height (y), dot area by count."""
    if not sizes:
        return '<p class="muted">no images</p>'
    counts = Counter(sizes)
    top = max(max(w, h) for w, h in counts) or 1
    pad = 34
    scale = (side - pad - 10) / top
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{side}" height="{side}" role="img">']
    parts.append(
        f'<rect x="{pad}" y="10" width="{side - pad - 10}" height="{side - pad - 10}" fill="none" stroke="#dadce0"/>'
    )
    for (w, h), c in counts.most_common(2000):
        r = min(12.0, 2.5 + math.sqrt(c))
        parts.append(
            f'<circle cx="{pad + w * scale:.1f}" cy="{side - pad - h * scale:.1f}" r="{r:.1f}" fill="#1a73e8" '
            f'fill-opacity="0.5"><title>{w}x{h}: {c}</title></circle>'
        )
    parts.append(
        f'<text x="{side - 10}" y="{side - 18}" font-size="11" fill="#5f6368" text-anchor="end">width {top} px</text>'
    )
    parts.append(f'<text x="{pad}" y="{side - 18}" font-size="11" fill="#5f6368">0</text>')
    parts.append(f'<text x="2" y="20" font-size="11" fill="#5f6368">h {top}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _data_section(stats: dict) -> str:
    """Returns the 'Data' section: this run's snapshot and what changed since the champion's data."""
    lineage = stats.get("lineage")
    if not lineage:
        return ""
    s = lineage["snapshot"]
    out = [
        "<h2>Data</h2>",
        f'<p class="muted">snapshot <code>{escape(s["fingerprint"])}</code>: {len(s["train"])} train file(s), '
        f"{len(s['eval'])} eval file(s), {lineage['n_rows']} rows</p>",
    ]
    since = stats.get("since")
    if since is None:
        out.append(
            '<p class="muted">Since the champion\'s data: not known (no champion, or it has no data lineage)</p>'
        )
        return "".join(out)
    delta = since["rows_now"] - since["rows_before"]
    out.append(
        f"<h3>Since the champion's data (snapshot <code>{escape(since['fingerprint'])}</code>)</h3>"
        f"<p>{len(since['added'])} file(s) added, {len(since['removed'])} removed, {len(since['changed'])} changed, "
        f"{since['unchanged']} unchanged; {delta:+d} rows ({since['rows_before']} → {since['rows_now']})</p>"
    )
    before, now = since.get("file_rows_before") or {}, lineage.get("files") or {}

    def rows(name: str) -> str:
        a, b = before.get(name), (now.get(name) or {}).get("rows")
        return "".join(
            [f" ({a} → {b} rows)" if a is not None and b is not None else "", f" ({b} rows)" if a is None and b else ""]
        )

    for label in ("added", "removed", "changed"):
        names = since[label]
        if names:
            shown = "".join(f"<li><code>{escape(n)}</code>{rows(n)}</li>" for n in names[:20])
            more = f"<li>… and {len(names) - 20} more</li>" if len(names) > 20 else ""
            out.append(f"<p>{label}:</p><ul>{shown}{more}</ul>")
    return "".join(out)


def render_report(result: ValidationResult, issues: list[tuple[Issue, list[Path]]]) -> str:
    """Returns the report's HTML.

    Args:
        result: The validation result (counts and stats).
        issues: The rejected lines with their readable local images (for thumbnails).
    """
    from components.validate_data.core import CODES

    c, stats = result.counts, result.stats
    allowed = stats.get("max_invalid_fraction", 0.0)
    fraction = c["n_invalid"] / c["n_lines"] if c["n_lines"] else 0.0
    passed = fraction <= allowed and c["n_train"] > 0 and c["n_eval"] > 0
    verdict = (
        f'<div class="verdict ok">PASSED: {fraction:.1%} invalid ≤ max_invalid_fraction {allowed:.1%}</div>'
        if passed
        else f'<div class="verdict bad">FAILED: {fraction:.1%} invalid (max_invalid_fraction {allowed:.1%}), '
        f"{c['n_train']} train / {c['n_eval']} eval rows</div>"
    )
    cards = "".join(
        f'<div class="card"><b>{c[k]}</b><span>{label}</span></div>'
        for k, label in (
            ("n_lines", "lines"),
            ("n_valid", "valid"),
            ("n_train", "train"),
            ("n_eval", "eval"),
            ("n_invalid", "quarantined"),
            ("n_images", "images written"),
        )
    )
    rows = "".join(
        f'<tr class="{"" if c.get(code) else "zero"}"><td><code>{code}</code></td><td class="n">{c.get(code, 0)}</td>'
        f"<td>{escape(desc)}</td></tr>"
        for code, desc in CODES.items()
    )
    tokens = sorted(stats.get("token_counts", []))
    token_line = (
        f"{len(tokens)} valid rows; median {tokens[len(tokens) // 2]}, p95 "
        f"{tokens[min(len(tokens) - 1, int(len(tokens) * 0.95))]}, max {tokens[-1]} tokens; counted with "
        f"<code>{escape(str(stats.get('token_source', 'approx')))}</code>, images resized as ms-swift does with "
        f"max_pixels <code>{int(stats.get('max_pixels') or 0) or 'none'}</code>"
        if tokens
        else "no valid rows"
    )
    sizes = stats.get("image_sizes", [])
    common = "".join(f"<tr><td>{w}×{h}</td><td class='n'>{n}</td></tr>" for (w, h), n in Counter(sizes).most_common(8))
    by_code: dict[str, list[tuple[Issue, list[Path]]]] = {}
    for issue, paths in issues:
        by_code.setdefault(issue.code, []).append((issue, paths))
    examples = []
    for code in CODES:
        if code not in by_code:
            continue
        shown = by_code[code][:EXAMPLES_PER_CODE]
        examples.append(f"<h3><code>{code}</code> — {len(by_code[code])} line(s)</h3>")
        for issue, paths in shown:
            thumbs = "".join(_thumb(p) for p in paths[:THUMBS_PER_EXAMPLE])
            examples.append(
                f'<div class="ex"><div class="loc">{escape(issue.file)}:{issue.line}</div>'
                f"<div>{escape(issue.message)}</div><pre>{escape(issue.raw[:400])}</pre>"
                f'<div class="thumbs">{thumbs}</div></div>'
            )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>validate-data report</title><style>{_CSS}</style></head>
<body>
<h1>validate-data report</h1>
{verdict}
<div class="cards">{cards}</div>
{_data_section(stats)}
<h2>Checks</h2>
<table><tr><th>code</th><th>lines</th><th>check</th></tr>{rows}</table>
<h2>Token length per row</h2>
<p class="muted">{token_line}</p>
{_histogram_svg(tokens, limit=stats.get("max_length") or 0)}
<h2>Image sizes</h2>
<p class="muted">{len(sizes)} distinct images in the clean sets (width × height, px)</p>
<div style="display:flex;gap:24px;align-items:flex-start">{_sizes_svg(sizes)}
<table><tr><th>size</th><th>images</th></tr>{common}</table></div>
<h2>First errors</h2>
{"".join(examples) or '<p class="muted">none: every line passed</p>'}
<p class="muted">All rejected lines: <code>{escape(result.quarantine)}</code></p>
</body></html>
"""


def write_report(path: str, result: ValidationResult, issues: list[tuple[Issue, list[Path]]]) -> None:
    """Writes the HTML report to `path` (parent folders created)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_report(result, issues), encoding="utf-8")
