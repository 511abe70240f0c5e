"""What evaluation returns (`EvalResult`) and the error it raises when it cannot run (`EvalError`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from components.common import regression as reg


class EvalError(ValueError):
    """Evaluation cannot run; the message says what is wrong."""


@dataclass
class EvalResult:
    """What evaluation produced.

    Attributes:
        passed: Whether the tuned model passed the gate.
        reason: Human-readable gate decision.
        tuned: Aggregate metrics of the tuned model (plus speed figures).
        reference: Aggregate metrics of the reference model (plus speed figures).
        predictions: Path of the per-sample predictions JSONL.
        samples: The held-out rows' records (gold, both answers and scores).
        regression: The regression figures (`components.common.regression.summarize`), None
            without a regression set.
        regression_samples: The regression rows' records (kind, gold, both answers and scores).
        drops: The regression rule's checks, one per kind and overall (`regression.check_drops`).
        failed_rules: The gate rules that failed: "task" and / or "regression:<kind or overall>".
        quantization: How both models were loaded for generation: "none" (bf16; float32 on a
            CPU), "nf4" or "int8" (bitsandbytes).
        intervals: Bootstrap intervals over rows of both models' figures and the margin
            (`_interval.intervals`); {} without rows.
    """

    passed: bool
    reason: str
    tuned: dict[str, float]
    reference: dict[str, float]
    predictions: str
    samples: list[dict[str, Any]] = field(default_factory=list)
    regression: dict[str, Any] | None = None
    regression_samples: list[dict[str, Any]] = field(default_factory=list)
    drops: list[reg.Drop] = field(default_factory=list)
    failed_rules: list[str] = field(default_factory=list)
    quantization: str = "none"
    intervals: dict[str, Any] = field(default_factory=dict)
