"""train-lora's training-curve page: the log history drawn with matplotlib, in one self-contained HTML file.

`render_curves` (what `core.loss_curve_html` returns) reads the trainer's log history, as
ms-swift logs it (`loss`, `grad_norm`, `learning_rate`, `token_acc`, `eval_loss`,
`eval_token_acc`, `epoch`, `global_step/max_steps`, ...), and draws one panel per quantity
that is present, against the optimizer step:

- loss: train loss as a line, eval loss as points (a single evaluation is still a point), on
  a log-scale y axis with plain-number ticks;
- learning rate (the schedule), grad norm (log scale when it spans more than 20x), token
  accuracy (train line, eval points).

The page (`loss_curve.html.jinja`) adds a table of each quantity's last value and its best one,
"best" following the quantity's direction (`BETTER`: the lowest loss, the highest token
accuracy; none for the learning rate and the grad norm, which are not better high or low). No
scripts and no external resources (the Vertex console's HTML artifact view shows it as is).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from components.common.report import BLUE, GREEN, GREY, ORANGE, figure_svg, render_template

# (panel title, y axis title, [(log key, legend, colour, drawn as points)], log-scale y)
PANELS: tuple[tuple[str, str, tuple[tuple[str, str, str, bool], ...], bool], ...] = (
    ("loss", "loss (log scale)", (("loss", "train loss", BLUE, False), ("eval_loss", "eval loss", ORANGE, True)), True),
    ("learning rate", "learning rate", (("learning_rate", "learning rate", GREEN, False),), False),
    ("grad norm", "gradient norm", (("grad_norm", "grad norm", GREY, False),), False),
    (
        "token accuracy",
        "token accuracy (fraction of answer tokens)",
        (("token_acc", "train token acc", BLUE, False), ("eval_token_acc", "eval token acc", ORANGE, True)),
        False,
    ),
)


# Which way is better, per logged quantity: "min" (loss), "max" (accuracy); absent = neither.
BETTER: dict[str, str] = {"loss": "min", "eval_loss": "min", "token_acc": "max", "eval_token_acc": "max"}


def step_of(entry: dict[str, Any], index: int) -> float:
    """The optimizer step of a log entry: `step`, else `global_step/max_steps`'s first number, else index + 1."""
    if "step" in entry:
        return float(entry["step"])
    gs = entry.get("global_step/max_steps")
    return float(str(gs).split("/")[0]) if gs else float(index + 1)


def series_of(log_history: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    """Returns (step, value) of every entry that logged `key` as a finite number."""
    out = []
    for i, entry in enumerate(log_history):
        value = entry.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out.append((step_of(entry, i), float(value)))
    return out


def _log_axis(ax: Any, values: list[float]) -> None:
    """Puts a log scale on y with plain-number ticks (0.5, 1, 2 ... not 10^0), at least two in view."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    lo, hi = min(values), max(values)
    ratio = hi / lo
    subs = (1.0,) if ratio > 1e4 else (1.0, 2.0, 5.0) if ratio > 10 else (1.0, 2.0, 3.0, 5.0) if ratio > 3 else None
    subs = subs or tuple(float(s) for s in range(1, 10))  # a narrow range: every integer multiple
    pad = 1.6 if ratio < 3 else 1.15
    ax.set_yscale("log")
    ax.set_ylim(lo / pad, hi * pad)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs, numticks=15))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _panel(ax: Any, log_history: list[dict[str, Any]], panel: tuple) -> None:
    """Draws one panel: its series (lines, or points for evaluations), axis titles, legend, scale."""
    title, y_title, keys, log_y = panel
    values = []
    for key, legend, colour, as_points in keys:
        points = series_of(log_history, key)
        if not points:
            continue
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        values += ys
        style = {"marker": "o", "markersize": 6, "linestyle": "--" if len(points) > 1 else "none"}
        line = ax.plot(xs, ys, color=colour, linewidth=1.4, label=f"{legend} (last {ys[-1]:.4g})",
                       **(style if as_points else {}))[0]  # fmt: skip
        line.set_gid(key)  # the SVG group id: what the tests look for
    ax.set_title(title)
    ax.set_xlabel("optimizer step")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel(y_title)
    positive = values and min(values) > 0
    if log_y and positive:
        _log_axis(ax, values)
    elif title == "grad norm" and positive and max(values) / min(values) > 20:
        _log_axis(ax, values)
        ax.set_ylabel("gradient norm (log scale)")
    elif title == "learning rate":
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax.legend(loc="best", fontsize=8, frameon=False)


def panels_present(log_history: list[dict[str, Any]]) -> list[tuple]:
    """Returns the PANELS that have at least one logged value."""
    return [p for p in PANELS if any(series_of(log_history, key) for key, *_ in p[2])]


def _summary(log_history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Returns a row per logged quantity of the panels: points, last value and its step, best value and its step.

    The best value follows `BETTER` (the lowest loss, the highest accuracy); a quantity with no
    direction (learning rate, grad norm) has `best` None, and the page shows no best for it.
    """
    rows = []
    for _, _, keys, _ in PANELS:
        for key, legend, *_ in keys:
            points = series_of(log_history, key)
            if not points:
                continue
            last_step, last = points[-1]
            direction = BETTER.get(key)
            best = None
            if direction:
                pick = min if direction == "min" else max
                best_step, best_value = pick(points, key=lambda p: p[1])
                best = {"value": best_value, "step": best_step, "how": "lowest" if direction == "min" else "highest"}
            rows.append({"key": key, "legend": legend, "n": len(points), "last": last, "step": last_step, "best": best})
    return rows


def render_curves(
    log_history: list[dict[str, Any]], title: str = "train-lora", speedups: list[dict[str, Any]] | None = None
) -> str:
    """Returns the training-curve page (see the module docstring).

    Args:
        log_history: The trainer's log entries, in order.
        title: Page title. Default "train-lora".
        speedups: The speed-ups' start-up table rows (number, name, applied, outcome), drawn as a table under the
            curves. Default None (no table).

    Returns:
        One self-contained HTML page; "No loss was logged." when nothing is drawable.
    """
    panels = panels_present(log_history)
    figure = None
    if panels:
        cols = 2 if len(panels) > 1 else 1
        rows = -(-len(panels) // cols)

        def draw(fig: Any) -> None:
            for i, panel in enumerate(panels):
                _panel(fig.add_subplot(rows, cols, i + 1), log_history, panel)

        figure = figure_svg(draw, (5.2 * cols, 3.3 * rows), "curves")
    epochs = series_of(log_history, "epoch")
    max_steps = next(
        (str(e["global_step/max_steps"]) for e in reversed(log_history) if "global_step/max_steps" in e), ""
    )
    return render_template(
        Path(__file__).parent,
        "loss_curve.html.jinja",
        title=title,
        figure=figure,
        has_loss=bool(series_of(log_history, "loss") or series_of(log_history, "eval_loss")),
        summary=_summary(log_history),
        last_epoch=epochs[-1][1] if epochs else None,
        progress=max_steps,
        speedups=speedups or [],
    )
