"""The validate-data and validate-regression steps: the cores' results as plain outputs for the KFP wrappers.

Each step runs its core on the artifacts' paths and returns a `StepOutputs` (figures, artifact
metadata, return values) that `components.common.kfp_outputs.write_outputs` writes into KFP. A
refused input ends the step with SystemExit("validate-data: ...") (one line, no stack trace).
"""

from __future__ import annotations

from typing import Any

from components.common.kfp_outputs import ArtifactLike, StepOutputs
from components.common.regression import KIND_NAMES
from components.validate_data._regression import validate_regression_snapshot
from components.validate_data.core import training_max_pixels, validate_snapshot
from components.validate_data.types import DataError, ValidationResult

OUTPUTS = ("n_train", "n_eval")


def validate_step(
    snapshot: str,
    base_model: ArtifactLike,
    train_dataset: ArtifactLike,
    eval_dataset: ArtifactLike,
    quarantine: ArtifactLike,
    report: ArtifactLike,
    swift_args: dict[str, Any],
    max_pixels: int = 0,
    **settings: Any,
) -> StepOutputs:
    """Validates the snapshot's rows into the output datasets (see the component's docstring).

    Args:
        snapshot: snapshot-data's JSON.
        base_model: The staged model (its tokenizer and image processor count tokens).
        train_dataset, eval_dataset, quarantine, report: The output artifacts (their paths are written).
        swift_args: `swift sft` arguments (max_length, max_pixels).
        max_pixels: ms-swift's max_pixels (px); 0 = swift_args'. Default 0.
        **settings: validate_snapshot's other keywords (eval_fraction, max_invalid_fraction,
            split_seed, task, box_convention, training_key, champion_dir, leakage).

    Returns:
        The counts and token figures for Metrics, the datasets' metadata, (n_train, n_eval).

    Raises:
        SystemExit: The data or a setting is refused ("validate-data: ...").
    """
    try:
        max_pixels = training_max_pixels(swift_args, max_pixels)
        result = validate_snapshot(
            snapshot, train_out=train_dataset.path, eval_out=eval_dataset.path, quarantine_out=quarantine.path,
            report_out=report.path, max_length=int(swift_args.get("max_length", 0) or 0), max_pixels=max_pixels,
            model_dir=base_model.path, **settings,
        )  # fmt: skip
    except DataError as exc:
        raise SystemExit(f"validate-data: {exc}") from None
    print(result.summary())
    return StepOutputs(metrics=_figures(result, max_pixels), metadata=_metadata(result), values=_values(result))


def _figures(result: ValidationResult, max_pixels: int) -> dict[str, Any]:
    figures: dict[str, Any] = dict(result.counts)
    figures["max_pixels"] = max_pixels  # the image resize the token counts used (0 = none)
    tokens = sorted(result.stats["token_counts"])
    if tokens:
        figures["tokens_median"] = tokens[len(tokens) // 2]
        figures["tokens_max"] = tokens[-1]
    lineage = result.stats["lineage"]
    figures["data_files"] = len(lineage["files"])
    figures["data_snapshot"] = lineage["snapshot"]["fingerprint"]
    return figures


def _metadata(result: ValidationResult) -> dict[str, dict[str, Any]]:
    fingerprint = result.stats["lineage"]["snapshot"]["fingerprint"]
    manifests = result.stats["manifests"]  # each dataset's completion marker digest: a cache check catches changes
    return {
        "train_dataset": {"rows": result.counts["n_train"], "format": "ms-swift jsonl", "data_snapshot": fingerprint,
                          "manifest_sha256": manifests["train"]},
        "eval_dataset": {"rows": result.counts["n_eval"], "format": "ms-swift jsonl",
                         "manifest_sha256": manifests["eval"]},
        "quarantine": {"rows": result.counts["n_invalid"]},
    }  # fmt: skip


def _values(result: ValidationResult) -> tuple[int, int]:
    return result.counts["n_train"], result.counts["n_eval"]


def regression_step(
    snapshot: str,
    base_model: ArtifactLike,
    regression_dataset: ArtifactLike,
    quarantine: ArtifactLike,
    swift_args: dict[str, Any],
    max_invalid_fraction: float,
    box_convention: str = "pixel",
) -> StepOutputs:
    """Validates the regression set's rows (see the component's docstring).

    Returns:
        The counts for Metrics, the datasets' metadata, (n_valid,).

    Raises:
        SystemExit: The set or a setting is refused ("validate-regression: ...").
    """
    try:
        result = validate_regression_snapshot(
            snapshot, out=regression_dataset.path, quarantine_out=quarantine.path, model_dir=base_model.path,
            box_convention=box_convention, max_pixels=training_max_pixels(swift_args),
            max_invalid_fraction=max_invalid_fraction,
        )  # fmt: skip
    except DataError as exc:
        raise SystemExit(f"validate-regression: {exc}") from None
    print(result.summary())
    kinds = {kind: result.counts[f"n_{kind}"] for kind in KIND_NAMES}
    metadata = {
        "regression_dataset": {"rows": result.counts["n_valid"], "kinds": kinds, "format": "ms-swift jsonl + kind",
                               "manifest_sha256": result.manifest_sha256},
        "quarantine": {"rows": result.counts["n_invalid"]},
    }  # fmt: skip
    return StepOutputs(metrics=dict(result.counts), metadata=metadata, values=(result.counts["n_valid"],))
