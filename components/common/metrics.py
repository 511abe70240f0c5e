"""The evaluate figures, each declared once: name, label, format, direction, range, gateable.

`METRICS` is the one list that the gate (`components.evaluate.metrics.GATE_METRICS`), the
config check (`eval.metric`), the bootstrap intervals (`components.evaluate._interval.FIGURES`),
the report's metric table, the end-of-run summary (`pipelines.run.format_summary`), the
registry's version labels (`components.register.core.LABEL_METRICS`) and the tasks
(`components.common.tasks.Task.metrics`) read. Adding a gateable figure: one `Metric` here and
its formula in `components.evaluate.metrics.figures` (which computes every gateable figure from
the summed per-row counts, for the scores and for each bootstrap draw). Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass

RATE = (0.0, 1.0)


@dataclass(frozen=True)
class Metric:
    """One figure evaluate reports.

    Attributes:
        name: Key in evaluate's figures (`base_<name>` / `tuned_<name>` in its Metrics).
        label: How the report's metric table names it.
        fmt: `str.format` spec of its value in the report. Default "{:.4f}".
        higher_is_better: A larger value is a better model. Default True.
        range: (low, high) a value can take (`eval.min_value` must lie in it); None = unbounded.
            Default None.
        gateable: `eval.metric` may name it; it is computed from per-row counts, so it also gets a
            bootstrap interval. The gate compares "tuned >= min_value" and "tuned - reference >=
            min_margin", so a gateable figure is higher-is-better. Default False.
        summary: Its row in the end-of-run summary's eval table (1 first); 0 = not shown. Default 0.
        registry: The sides ("tuned", "base") whose value becomes a label of the registered model
            version. Default none.
    """

    name: str
    label: str
    fmt: str = "{:.4f}"
    higher_is_better: bool = True
    range: tuple[float, float] | None = None
    gateable: bool = False
    summary: int = 0
    registry: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.gateable and (not self.higher_is_better or self.range is None):
            raise ValueError(f"gateable metric {self.name!r} must be higher-is-better with a range")
        if set(self.registry) - {"tuned", "base"}:
            raise ValueError(f"metric {self.name!r}: registry sides are 'tuned' and 'base', got {self.registry}")


METRICS: tuple[Metric, ...] = (
    Metric("f1", "F1", range=RATE, gateable=True, summary=4, registry=("tuned", "base")),
    Metric("precision", "precision", range=RATE, gateable=True, summary=2),
    Metric("recall", "recall", range=RATE, gateable=True, summary=3),
    Metric("json_valid_rate", "JSON valid rate", range=RATE, gateable=True, summary=1, registry=("tuned",)),
    Metric("exact_match_rate", "exact match rate", range=RATE, gateable=True, summary=5),
    Metric("n", "samples", "{:.0f}"),
    Metric("samples_per_second", "samples/s", "{:.3f}"),
    Metric("generated_tokens_per_second", "generated tokens/s", "{:.1f}"),
    Metric("generate_seconds", "generate s", "{:.1f}", higher_is_better=False),
    Metric("quantized_layers", "bitsandbytes layers", "{:.0f}"),  # only when eval.quantization loaded them quantised
)
"""Every figure, in the order of the report's metric table."""

BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}

GATE_METRICS: tuple[str, ...] = tuple(m.name for m in METRICS if m.gateable)
"""The figures `eval.metric` may name, in `METRICS` order."""

GATE_METRIC_RANGES: dict[str, tuple[float, float]] = {m.name: m.range for m in METRICS if m.gateable and m.range}
"""Each gateable figure's range (all rates today: [0, 1])."""

SUMMARY_METRICS: tuple[str, ...] = tuple(m.name for m in sorted(METRICS, key=lambda m: m.summary) if m.summary)
"""The figures of the end-of-run summary's eval table, in its order."""

REGISTRY_LABELS: tuple[str, ...] = tuple(
    f"{side}_{m.name}" for side in ("tuned", "base") for m in METRICS if side in m.registry
)
"""evaluate's Metrics keys copied into the registered version's labels (before "passed")."""


def get_metric(name: str) -> Metric:
    """Returns the figure called name.

    Raises:
        ValueError: No such figure (the message lists them).
    """
    if name not in BY_NAME:
        raise ValueError(f"unknown metric {name!r}; known: {', '.join(BY_NAME)}")
    return BY_NAME[name]
