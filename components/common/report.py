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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from markupsafe import Markup

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


@functools.cache
def _environment(folder: str) -> Any:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(folder),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render_template(folder: str | Path, name: str, **context: Any) -> str:
    """Renders a jinja2 template of a package folder, with autoescaping.

    Args:
        folder: The folder holding the template (e.g. `Path(__file__).parent`).
        name: The template's file name (`*.jinja`, shipped as package data).
        **context: The template's variables; a name the template uses but the context
            lacks is an error (StrictUndefined), not an empty string.

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
