"""The validate-data HTML report: one self-contained file (inline CSS, SVG figures and thumbnails).

The page is `report.html.jinja` (package data beside this module); the figures are drawn
with matplotlib (`components.common.report`) as inline SVG. No scripts and no external
resources, so it renders the same in the Vertex AI console's HTML artifact viewer, a browser
opened on the file, and headless Chromium in the tests.

What it shows: the verdict, counts per check, train/eval leakage (each eval row that shares
an image or a prompt with train rows, with both rows' `file:line` and what the leakage setting
did with it), the token length per row over the data's own
range (max_length marked, or named at the edge when it lies beyond the data), image sizes
(width x height with the count of each size written beside it, readable when every image
has one size), and the first rejected lines of each check with their `file:line` (and the
user's original `file:line` when the row carries one), thumbnails of their readable images
and the whole raw line in a scrollable block.

Also a preview of the first valid rows (image thumbnail with the expected boxes drawn and
numbered, prompt, answer; key_value: the answer's fields), and what the answers hold: for
detection, boxes per label and rows per number of boxes, each for train and eval; for
key_value, how many rows carry each field. Notes are styled by what they are: neutral (info)
for a fine state such as max_length beyond the longest row, amber for a warning (leaked rows
kept in eval), red only for an error.
"""

from __future__ import annotations

import io
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

from PIL import Image

from components.common.boxes import BoxError, ResizeRule
from components.common.files import write_text_atomic
from components.common.provenance import where
from components.common.report import (
    BLUE,
    GREY,
    draw_shapes,
    figure_svg,
    jpeg_data_uri,
    legend,
    png_data_uri,
    render_template,
)
from components.common.tasks import Geometry, Shape, get_task, parse_json
from components.validate_data._formats import FORMS
from components.validate_data.types import (
    CODES,
    MAX_IMAGE_PIXELS,
    CheckedRow,
    Issue,
    ValidationResult,
    invalid_fraction,
)

EXAMPLES_PER_CODE = 3
THUMBS_PER_EXAMPLE = 4
THUMB_PX = 96
MAX_BINS = 30
MAX_LEAKS_SHOWN = 50  # leaked eval rows listed in the leakage section (all are in stats and the quarantine)
LIMIT_IN_RANGE = 1.25  # max_length within this factor of the longest row: widen the axis to draw it
PREVIEW_ROWS = 4  # valid rows previewed
PREVIEW_PX = 240  # longest side of a preview drawing, px
PREVIEW_CHARS = 800  # prompt / answer characters shown per previewed row
MAX_BREAKDOWN_ROWS = 40  # labels or fields listed (most frequent first)


def _thumb(path: Path) -> dict[str, str]:
    """Returns a thumbnail of an image as {"name", "uri"} (a base64 JPEG), or {"name", "note"} when none.

    Memory stays bounded: a JPEG decodes at a reduced scale (`Image.draft`), and an image
    still above MAX_IMAGE_PIXELS (the largest that validation decodes) is not decoded.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                img.draft(None, (THUMB_PX * 2, THUMB_PX * 2))  # JPEG only: decode at 1/2 .. 1/8 scale
                if img.width * img.height > MAX_IMAGE_PIXELS:
                    w, h = img.size
                    return {"name": path.name, "note": f"{w}×{h} px, too large to preview"}
                img.thumbnail((THUMB_PX, THUMB_PX))
                buf = io.BytesIO()
                img.convert("RGB").save(buf, "JPEG", quality=70)
        return {"name": path.name, "uri": jpeg_data_uri(buf.getvalue())}
    except Exception:  # noqa: BLE001 - a thumbnail never breaks the report
        return {"name": path.name, "note": "no preview: the image cannot be read"}


def _bins(lo: int, hi: int) -> list[float]:
    """Returns histogram bin edges over [lo, hi]: at most MAX_BINS, each a whole number of tokens wide."""
    width = max(1, -(-(hi - lo + 1) // MAX_BINS))
    edges = [lo - 0.5 + width * i for i in range((hi - lo) // width + 2)]
    return edges


def _histogram_svg(values: list[int], limit: int = 0) -> Any:
    """Returns the token-length histogram as inline SVG (the data's own range; `limit` marked).

    The x axis spans the rows' lengths. max_length (`limit` > 0) is a dashed grey line when it
    lies within LIMIT_IN_RANGE x the longest row (the axis is widened to it); further out it is
    named above the plot's right edge, so a few short rows are not squeezed into one bar. Grey,
    not red: every valid row fits max_length (a longer one is an E_TOKENS error, listed below).
    """
    if not values:
        return None
    lo, hi = min(values), max(values)

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        ax.hist(values, bins=_bins(lo, hi), color=BLUE, edgecolor="white", linewidth=0.5)
        ax.set_xlabel("tokens per row (text + image tokens, as ms-swift encodes the row)")
        ax.set_ylabel("rows")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.yaxis.get_major_locator().set_params(integer=True)
        if lo == hi:  # one length: a bar in a readable range, not a zero-width axis
            ax.set_xlim(lo - 10, hi + 10)
        if limit and limit <= hi * LIMIT_IN_RANGE:
            ax.axvline(limit, color=GREY, linestyle="--", linewidth=1.2)
            ax.annotate(f"max_length {limit}", (limit, 1), xycoords=("data", "axes fraction"), xytext=(-4, -4),
                        textcoords="offset points", ha="right", va="top", color=GREY)  # fmt: skip
            ax.set_xlim(right=limit + max(1, (limit - lo) * 0.03))
        elif limit:  # named above the plot, clear of the bars
            ax.set_title(f"max_length {limit} → beyond the longest row ({hi})", loc="right", color=GREY, fontsize=8)

    return figure_svg(draw, (7.0, 2.6), "tokens")


def _sizes_svg(sizes: list[tuple[int, int]]) -> Any:
    """Returns a scatter of image width vs height (px) as inline SVG: dot area by count, counts written beside.

    Limits start at 0 and reach 15 % past the largest side, so one shared size is a labelled
    dot inside the axes (not a dot in a corner of a zero-width range).
    """
    if not sizes:
        return None
    counts = Counter(sizes)
    top = counts.most_common(2000)
    max_w, max_h = max(w for w, _ in counts), max(h for _, h in counts)

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        xs, ys, ns = [w for (w, _), _ in top], [h for (_, h), _ in top], [n for _, n in top]
        biggest = max(ns)
        ax.scatter(xs, ys, s=[20 + 180 * n / biggest for n in ns], color=BLUE, alpha=0.55, edgecolors="none")
        for (w, h), n in top[:8]:
            right = w > 0.6 * max_w * 1.15  # a label on the right half goes left of its dot, inside the axes
            ax.annotate(f"{w}×{h}: {n} image{'s' if n != 1 else ''}", (w, h), xytext=(-8 if right else 8, 4),
                        textcoords="offset points", ha="right" if right else "left", fontsize=8, color=GREY)  # fmt: skip
        ax.set_xlim(0, max_w * 1.15)
        ax.set_ylim(0, max_h * 1.15)
        ax.set_xlabel("width (px)")
        ax.set_ylabel("height (px)")

    return figure_svg(draw, (4.2, 3.4), "sizes")


def _token_summary(stats: dict[str, Any]) -> dict[str, Any] | None:
    """Returns the token figures the page states (median, p95, max, what counted them), None without rows."""
    tokens = sorted(stats.get("token_counts", []))
    if not tokens:
        return None
    return {
        "n": len(tokens),
        "median": tokens[len(tokens) // 2],
        "p95": tokens[min(len(tokens) - 1, int(len(tokens) * 0.95))],
        "max": tokens[-1],
        "model": stats.get("token_model") or "",
        "model_dir": stats.get("token_model_dir") or "",
        "max_pixels": int(stats.get("max_pixels") or 0),
    }


def _since(stats: dict[str, Any]) -> dict[str, Any] | None:
    """Returns what changed since the champion's data, with row counts per file, for the Data section."""
    since = stats.get("since")
    if since is None:
        return None
    before, now = since.get("file_rows_before") or {}, (stats.get("lineage") or {}).get("files") or {}

    def rows(name: str) -> str:
        a, b = before.get(name), (now.get(name) or {}).get("rows")
        if a is not None and b is not None:
            return f" ({a} → {b} rows)"
        return f" ({b} rows)" if a is None and b else ""

    groups = [
        {"label": label, "files": [n + rows(n) for n in since[label][:20]], "more": max(0, len(since[label]) - 20)}
        for label in ("added", "removed", "changed")
        if since[label]
    ]
    return {**since, "delta": since["rows_now"] - since["rows_before"], "groups": groups}


def _examples(issues: list[tuple[Issue, list[Path]]]) -> list[dict[str, Any]]:
    """Returns the first EXAMPLES_PER_CODE rejected lines of each check, in check order, with thumbnails."""
    by_code: dict[str, list[tuple[Issue, list[Path]]]] = {}
    for issue, paths in issues:
        by_code.setdefault(issue.code, []).append((issue, paths))
    out = []
    for code in CODES:
        if code in by_code:
            shown = [
                {"issue": issue, "thumbs": [_thumb(p) for p in paths[:THUMBS_PER_EXAMPLE]]}
                for issue, paths in by_code[code][:EXAMPLES_PER_CODE]
            ]
            out.append({"code": code, "count": len(by_code[code]), "shown": shown})
    return out


def _prompt_and_answer(row: dict[str, Any]) -> tuple[str, str]:
    """Returns a row's first user message and its last assistant message (the gold answer)."""
    messages = row.get("messages") or []
    prompt = next((m["content"] for m in messages if m.get("role") == "user"), "")
    answer = next((m["content"] for m in reversed(messages) if m.get("role") == "assistant"), "")
    return prompt, answer


def _expected_shapes(answer: str, size: tuple[int, int], boxes: tuple[str, ResizeRule] | None) -> list[Shape]:
    """The answer's boxes in pixels of the image (`boxes`: the run's convention and resize rule; None = none)."""
    if boxes is None:
        return []
    try:
        return get_task("detection").shapes(answer, Geometry(boxes[0], size, boxes[1]))
    except BoxError:
        return []


def _fields(answer: str) -> list[tuple[str, str]]:
    """A key_value answer's fields as written, in order ([] when it is not a JSON object)."""
    data, _ = parse_json(answer)
    return [(str(k), str(v)) for k, v in data.items()] if isinstance(data, dict) else []


def _preview(rows: list[CheckedRow], task: str, boxes: tuple[str, ResizeRule] | None) -> list[dict[str, Any]]:
    """Returns the first PREVIEW_ROWS valid rows as the page shows them: where, image with boxes, prompt, answer.

    Args:
        rows: The valid rows (train, then eval), as validated.
        task: The run's task; detection rows get their expected boxes drawn and numbered (one
            image per row: with several, box coordinates do not say which image they are on).
        boxes: The detection boxes' convention and resize rule; None = no boxes drawn.
    """
    out = []
    for checked in rows[:PREVIEW_ROWS]:
        prompt, answer = _prompt_and_answer(checked.row)
        first = checked.images[0] if checked.images else None
        shapes = []
        if first is not None and task == "detection" and len(checked.images) == 1:
            shapes = _expected_shapes(answer, (first.width, first.height), boxes)
        out.append({
            "where": where(checked.origin) or f"{checked.file}:{checked.line}",
            "split": "eval" if checked.is_eval else "train",
            "uri": png_data_uri(draw_shapes(first.path, shapes, [], size=PREVIEW_PX)) if first else "",
            "more_images": max(0, len(checked.images) - 1),
            "legend": legend(shapes, [], "expected"),
            "prompt": prompt[:PREVIEW_CHARS],
            "answer": answer[:PREVIEW_CHARS],
            "fields": _fields(answer) if task == "key_value" else [],
        })  # fmt: skip
    return out


def _bars(counts: dict[Any, list[int]], key: str, order: list[Any]) -> list[dict[str, Any]]:
    """Table rows {key, train, eval, total, width}: width is the total as a percentage of the largest."""
    top = max((sum(v) for v in counts.values()), default=0) or 1
    return [{key: k, "train": counts[k][0], "eval": counts[k][1], "total": sum(counts[k]),
             "width": round(100 * sum(counts[k]) / top, 1)} for k in order]  # fmt: skip


def _breakdown(rows: list[CheckedRow], task: str) -> dict[str, Any] | None:
    """What the valid rows' answers hold, per split (train, eval); None for a task without labels or fields.

    Detection: boxes per label and rows per number of boxes in the answer. key_value: rows
    carrying each field (names as written). The answer is each row's last assistant message.
    """
    if task not in ("detection", "key_value"):
        return None
    parse = get_task(task).parse
    labels: dict[str, list[int]] = {}
    per_row: dict[int, list[int]] = {}
    for checked in rows:
        split = 1 if checked.is_eval else 0
        _, answer = _prompt_and_answer(checked.row)
        if task == "detection":
            findings = parse(answer)[0] or []
            per_row.setdefault(len(findings), [0, 0])[split] += 1
            names = [str(f["label"]) for f in findings]
        else:
            names = list(dict.fromkeys(k for k, _ in _fields(answer)))
        for name in names:
            labels.setdefault(name, [0, 0])[split] += 1
    order = sorted(labels, key=lambda k: (-sum(labels[k]), k))
    return {
        "task": task,
        "n_rows": len(rows),
        "n_labels": len(labels),
        "n_boxes": sum(sum(v) for v in labels.values()) if task == "detection" else 0,
        "labels": _bars(labels, "label", order[:MAX_BREAKDOWN_ROWS]),
        "more": max(0, len(order) - MAX_BREAKDOWN_ROWS),
        "per_row": _bars(per_row, "n", sorted(per_row)),
    }


def _passed(c: dict[str, int], fraction_ok: bool, leakage: str) -> bool:
    """Whether the run passes: invalid lines within the limit, both sets non-empty, no leak with leakage "error"."""
    return fraction_ok and c["n_train"] > 0 and c["n_eval"] > 0 and not (leakage == "error" and c.get("n_leaked"))


def render_report(
    result: ValidationResult,
    issues: list[tuple[Issue, list[Path]]],
    valid: list[CheckedRow] | None = None,
    task: str = "",
    boxes: tuple[str, ResizeRule] | None = None,
) -> str:
    """Returns the report's HTML.

    Args:
        result: The validation result (counts and stats).
        issues: The rejected lines with their readable local images (for thumbnails).
        valid: The valid rows (train, then eval), for the preview and the label / field
            counts; None = neither shown. Default None.
        task: The run's task (`components.common.tasks`). Default "" (free text).
        boxes: The detection boxes' convention and resize rule, to draw the preview's boxes;
            None = not drawn. Default None.

    Returns:
        One self-contained HTML page.
    """
    c, stats = result.counts, result.stats
    allowed = stats.get("max_invalid_fraction", 0.0)
    fraction = invalid_fraction(c)
    leakage = stats.get("leakage", "quarantine")
    sizes = stats.get("image_sizes", [])
    tokens = stats.get("token_counts", [])
    return render_template(
        Path(__file__).parent,
        "report.html.jinja",
        c=c,
        codes=CODES,
        passed=_passed(c, fraction <= allowed, leakage),
        leakage=leakage,
        leaks=stats.get("leaks", [])[:MAX_LEAKS_SHOWN],
        n_leaked=c.get("n_leaked", 0),
        fraction=fraction,
        allowed=allowed,
        lineage=stats.get("lineage"),
        since=_since(stats),
        tokens=_token_summary(stats),
        histogram=_histogram_svg(tokens, limit=stats.get("max_length") or 0),
        sizes=sizes,
        common_sizes=Counter(sizes).most_common(8),
        sizes_svg=_sizes_svg(sizes),
        examples=_examples(issues),
        quarantine=result.quarantine,
        task=task,
        preview=_preview(valid or [], task, boxes),
        breakdown=_breakdown(valid, task) if valid else None,
        forms=[(form, c[f"n_form_{form}"]) for form in FORMS if c.get(f"n_form_{form}")],
    )


def write_report(path: str, result: ValidationResult, issues: list[tuple[Issue, list[Path]]], **kwargs: Any) -> None:
    """Writes the HTML report to `path` (parent folders created); `kwargs` are `render_report`'s."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, render_report(result, issues, **kwargs))  # whole, never through a planted link
