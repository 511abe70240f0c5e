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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from markupsafe import Markup, escape

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

# Unicode categories a browser cannot show as text (control, format, surrogate, private use,
# unassigned): drawn as tofu boxes or nothing at all. Newline and tab stay (they are layout).
_UNPRINTABLE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn"})
_LAYOUT = frozenset("\n\t")
MAX_ESCAPES_IN_A_ROW = 3  # a longer run of unprintable characters is summarised, not spelt out


def _is_unprintable(char: str) -> bool:
    return char not in _LAYOUT and unicodedata.category(char) in _UNPRINTABLE


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
    becomes its Python escape (`\x07`, `\u200b`) in a `<span class="ctl">`; a run of more
    than MAX_ESCAPES_IN_A_ROW becomes one summary, `⟨12 control characters: \x07 \x01 \x1b …⟩`.
    Newlines and tabs are kept. Templates use it as the `readable` filter.

    Args:
        text: Any text (None reads as "").

    Returns:
        Markup safe to put in a template (everything else escaped).
    """
    out, run = [], []

    def flush() -> None:
        if len(run) > MAX_ESCAPES_IN_A_ROW:
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
