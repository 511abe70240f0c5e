"""Shared building blocks of the HTML reports: jinja2 templates, matplotlib figures, inline images.

Every report is one self-contained HTML file (inline CSS, figures as inline SVG, images as
base64 `data:` URIs, no scripts, no external requests), so it renders the same in the Vertex
AI console's HTML artifact viewer, a browser opened on the file, and headless Chromium in
the tests. Templates (`*.jinja`) are package data next to the module that renders them.

Figures are drawn with matplotlib's object API (`matplotlib.figure.Figure`, no pyplot, so no
global backend state and no display), saved as SVG with text kept as `<text>` (searchable,
small) and without metadata (no creator URL, no date: the same data gives the same bytes).
"""

from __future__ import annotations

import base64
import functools
import io
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from markupsafe import Markup, escape

from components.common.tasks import Shape

# matplotlib settings of every report figure: readable small text, text kept as text in the SVG.
_RC = {
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Arial", "Helvetica", "sans-serif"],
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "axes.grid": True,
    "grid.color": "#e0e0e0",
    "grid.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
_NO_METADATA = {"Creator": None, "Date": None, "Format": None, "Type": None}

BLUE = "#1a73e8"
ORANGE = "#e8710a"
RED = "#d93025"
GREEN = "#188038"
GREY = "#5f6368"

# Box drawings (evaluate's samples, validate-data's preview): exact RGB, which the tests read back.
GOLD_COLOR = (0, 170, 0)  # expected boxes
PRED_COLOR = (220, 0, 0)  # a model's boxes
INVALID_MARK = 4  # half-size of the cross drawn for an invalid box, thumbnail px
LABEL_FONT_PX = 11  # the number tags' digits
THUMB_SIZE = 320  # longest side of a drawing, px

# Unicode categories a browser cannot show as text (control, format, surrogate, private use,
# unassigned): drawn as tofu boxes or nothing at all. Newline and tab stay (they are layout).
_UNPRINTABLE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn"})
_LAYOUT = frozenset("\n\t")
MAX_ESCAPES_IN_A_ROW = 3  # a longer run of unprintable characters is summarised, not spelt out


REPLACEMENT = "\ufffd"  # what a decoder writes for bytes that are not UTF-8: shown as its escape, not a glyph


def _is_unprintable(char: str) -> bool:
    return char == REPLACEMENT or (char not in _LAYOUT and unicodedata.category(char) in _UNPRINTABLE)


def _escape_char(char: str) -> str:
    """`\x07`, `\u200b` or `\U000f0000`: how Python writes the character in a string literal."""
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def count_unprintable(text: str) -> int:
    """Returns how many characters of `text` a browser cannot show as text (`readable_text` escapes them)."""
    return sum(_is_unprintable(char) for char in text)


def readable_text(text: str) -> Markup:
    """Returns `text` HTML-escaped, with characters a browser cannot show made visible.

    A model's raw output (a base model's first answers especially) can hold control
    characters, which a browser draws as a line of tofu boxes or not at all. Each one
    becomes its Python escape (`\x07`, `\u200b`) in a `<span class="ctl">`, and so does U+FFFD, the mark a
    decoder leaves for bytes that were not UTF-8 (a base model's stray byte tokens), never a row of glyphs; a run of more
    than MAX_ESCAPES_IN_A_ROW becomes one summary, `⟨12 control characters: \x07 \x01 \x1b …⟩`.
    Newlines and tabs are kept. Templates use it as the `readable` filter.

    Args:
        text: Any text (None reads as "").

    Returns:
        Markup safe to put in a template (everything else escaped).
    """
    out, run = [], []

    def flush() -> None:
        if len(run) > MAX_ESCAPES_IN_A_ROW and set(run) == {REPLACEMENT}:
            out.append(f'<span class="ctl">⟨{len(run)} undecodable byte sequences: \\ufffd …⟩</span>')
        elif len(run) > MAX_ESCAPES_IN_A_ROW:
            shown = " ".join(_escape_char(c) for c in run[:MAX_ESCAPES_IN_A_ROW])
            out.append(f'<span class="ctl">⟨{len(run)} control characters: {shown} …⟩</span>')
        elif run:
            out.append(f'<span class="ctl">{"".join(_escape_char(c) for c in run)}</span>')
        run.clear()

    for char in text or "":
        if _is_unprintable(char):
            run.append(char)
            continue
        flush()
        out.append(str(escape(char)))
    flush()
    return Markup("".join(out))


@functools.cache
def _environment(folder: str) -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(folder),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["readable"] = readable_text
    return env


def render_template(folder: str | Path, name: str, **context: Any) -> str:
    """Renders a jinja2 template of a package folder, with autoescaping.

    Args:
        folder: The folder holding the template (e.g. `Path(__file__).parent`).
        name: The template's file name (`*.jinja`, shipped as package data).
        **context: The template's variables; a name the template uses but the context
            lacks is an error (StrictUndefined), not an empty string. Templates also get
            the `readable` filter (`readable_text`) for text a model or a user wrote.

    Returns:
        The rendered text.
    """
    return _environment(str(folder)).get_template(name).render(**context)


def figure_svg(draw: Callable[[Any], None], size: tuple[float, float], salt: str) -> Markup:
    """Draws a matplotlib figure and returns it as inline SVG markup.

    Args:
        draw: Called with a fresh `matplotlib.figure.Figure` to draw on.
        size: (width, height) of the figure, inches (the SVG is 72 px per inch).
        salt: Makes the figure's internal ids unique in the page (several SVGs inline in
            one HTML page share one id space); any string distinct per figure.

    Returns:
        The `<svg>` element (no XML prologue), marked safe for a template.
    """
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context({**_RC, "svg.hashsalt": salt}):
        fig = Figure(figsize=size, layout="constrained")
        draw(fig)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata=_NO_METADATA)
    text = buf.getvalue()
    return Markup(text[text.index("<svg") :])


def png_data_uri(png: bytes) -> str:
    """Returns a `data:image/png;base64,...` URI of PNG bytes."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def jpeg_data_uri(jpeg: bytes) -> str:
    """Returns a `data:image/jpeg;base64,...` URI of JPEG bytes."""
    return "data:image/jpeg;base64," + base64.b64encode(jpeg).decode("ascii")


Rect = tuple[float, float, float, float]


def _overlaps(a: Rect, b: Rect) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def place_tags(anchors: Sequence[Rect], tag: tuple[int, int], image: tuple[int, int]) -> list[Rect]:
    """Places one number tag per shape so that no two tags overlap and each lies inside the image.

    Each anchor is a shape's (x1, y1, x2, y2) in thumbnail pixels (an invalid shape's cross
    is a small square). A tag goes above the shape's top-left corner, else inside it, else below
    it, else left of it; when every spot is taken (boxes sharing a corner: a prediction on its
    expected box) it steps right, then down, by a tag's size. Only when the whole image is full
    does a tag overlap another (its shape's number is still in the legend).

    Args:
        anchors: The shapes, in drawing order.
        tag: (width, height) of a tag, px.
        image: (width, height) of the thumbnail, px.

    Returns:
        Each shape's tag rectangle (x1, y1, x2, y2), in the anchors' order.
    """
    tw, th = tag
    w, h = image
    placed: list[Rect] = []
    for x1, y1, _, y2 in anchors:
        spots = [(x1, y1 - th - 1), (x1 + 2, y1 + 2), (x1, y2 + 1), (x1 - tw - 1, y1)]
        spots += [
            (x + dx * (tw + 1), y + dy * (th + 1)) for dy in range(0, 4) for dx in range(1, 8) for x, y in spots[:2]
        ]
        chosen = None
        for x, y in spots:
            x, y = min(max(x, 0), w - tw), min(max(y, 0), h - th)
            rect = (x, y, x + tw, y + th)
            if not any(_overlaps(rect, other) for other in placed):
                chosen = rect
                break
        if chosen is None:  # a full image: scan it row by row for any free spot, else the first spot
            free = (
                (x, y, x + tw, y + th)
                for y in range(0, max(1, h - th + 1), th + 1)
                for x in range(0, max(1, w - tw + 1), tw + 1)
            )
            x, y = min(max(x1, 0), w - tw), min(max(y1 - th - 1, 0), h - th)
            chosen = next((r for r in free if not any(_overlaps(r, o) for o in placed)), (x, y, x + tw, y + th))
        placed.append(chosen)
    return placed


def draw_shapes(
    image_path: str | Path | None,
    gold: Sequence[Shape],
    pred: Sequence[Shape],
    size: int = THUMB_SIZE,
    pred_color: tuple[int, int, int] = PRED_COLOR,
) -> bytes:
    """Draws gold (green) and predicted (`pred_color`, red) shapes, each with a number tag, on the image; PNG bytes.

    Shapes are in pixels of the original image (`Task.shapes`); the image is scaled to fit
    `size`. A valid shape is a rectangle; an invalid one (x2 <= x1 or y2 <= y1, which the
    metric never matches) is a small cross at (x1, y1), clamped into the image. Shapes are
    numbered gold first, from 1 (`legend` lists the same numbers with the labels beside the
    image): labels written on a small image would overlap one another, numbers in tags placed
    apart (`place_tags`) do not. Tags are drawn first, so box outlines keep their colour. A
    missing or unreadable image becomes a grey `size` x `size` canvas (the boxes are still drawn).
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
    font = ImageFont.load_default(size=LABEL_FONT_PX)
    w, h = image.size
    shapes = [(shape, GOLD_COLOR) for shape in gold] + [(shape, pred_color) for shape in pred]
    marks = []  # (colour, rectangle or None, cross centre)
    for shape, color in shapes:
        box = [v * scale for v in shape.box]
        if shape.valid:
            marks.append((color, box, (box[0], box[1])))
        else:
            x = min(max(box[0], INVALID_MARK), w - 1 - INVALID_MARK)
            y = min(max(box[1], INVALID_MARK), h - 1 - INVALID_MARK)
            marks.append((color, None, (x, y)))
    digits = len(str(len(shapes)))
    tag = (round(draw.textlength("8" * digits, font=font)) + 4, LABEL_FONT_PX + 3)
    anchors = [
        tuple(box) if box is not None else (x - INVALID_MARK, y - INVALID_MARK, x + INVALID_MARK, y + INVALID_MARK)
        for _, box, (x, y) in marks
    ]
    for number, ((color, _, _), rect) in enumerate(zip(marks, place_tags(anchors, tag, (w, h))), start=1):
        draw.rectangle(rect, fill=color)
        draw.text(((rect[0] + rect[2]) / 2, (rect[1] + rect[3]) / 2), str(number), fill="white", font=font, anchor="mm")
    for color, box, (x, y) in marks:
        if box is not None:
            draw.rectangle(box, outline=color, width=2)
        else:
            m = INVALID_MARK
            draw.line([(x - m, y - m), (x + m, y + m)], fill=color, width=2)
            draw.line([(x - m, y + m), (x + m, y - m)], fill=color, width=2)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def legend(gold: Sequence[Shape], pred: Sequence[Shape], pred_role: str) -> list[dict[str, Any]]:
    """The numbered legend beside a drawing (`draw_shapes` numbers the shapes the same way: gold first, from 1).

    Args:
        gold: The expected shapes.
        pred: One model's shapes.
        pred_role: Whose predictions: "tuned" or "reference".

    Returns:
        One {"number", "label", "role", "kind", "invalid"} per shape; role is "expected" or
        `pred_role`, kind the colour class ("gold", "pred" for tuned, "ref"), invalid marks a
        zero-area box drawn as a cross.
    """
    kind = "pred" if pred_role == "tuned" else "ref"
    rows = [(shape, "expected", "gold") for shape in gold] + [(shape, pred_role, kind) for shape in pred]
    return [
        {"number": i, "label": shape.label, "role": role, "kind": kind, "invalid": not shape.valid}
        for i, (shape, role, kind) in enumerate(rows, start=1)
    ]
