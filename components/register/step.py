"""The register step as its KFP wrapper runs it (pure: no kfp): upload, import the evaluation, record.

`register_step` builds the ModelEvaluation (`evaluation.build_evaluation`) and the upload request
(`core.build_upload_request`) from evaluate's Metrics, registers the version (`core.register_model`),
attaches the evaluation (a failed import is a WARNING line, the version stays), records to MLflow
and returns the `StepOutputs` (`components.common.kfp_outputs`) the wrapper writes onto
`registered_model`: its URI (the version's REST name) and metadata. A refusal ends it with
SystemExit("register: ..."). `promote_step` moves the alias after deploy's smoke test.
"""

from __future__ import annotations

import sys

from components.common import wandb_tracking
from components.common.kfp_outputs import ArtifactLike, StepOutputs
from components.common.mlflow_registry import gate_tags, register_version
from components.common.tracking import TrackingError, record
from components.register.core import (
    RegisterError,
    attach_evaluation,
    build_upload_request,
    promote_version,
    register_model,
)
from components.register.evaluation import SCHEMA_FILE, build_evaluation


def register_step(
    merged_model: ArtifactLike, eval_metrics: ArtifactLike, registered_model: ArtifactLike, *, model_id: str,
    display_name: str, serving_image: str, alias: str, labels: dict, run_name: str, serving_container: dict,
    project: str, location: str, check_champion: bool = False, champion_version: str = "", promote: bool = True,
    tracking: dict | None = None, eval_report: ArtifactLike | None = None, gate_reason: str = "",
    gate_rules: dict | None = None,
) -> StepOutputs:  # fmt: skip
    """Runs the register step; the arguments are the component's (see `components.register.component`).

    Returns:
        uris and metadata of "registered_model".

    Raises:
        SystemExit: The registry refused, or MLflow failed while required ("register: ...").
    """
    metrics = dict(eval_metrics.metadata)
    lineage = {
        k: str(merged_model.metadata.get(k, "")) for k in ("data_snapshot", "training_key", "base_model", "adapter")
    }
    rules = _gate_record(gate_rules)
    gate_metric = rules.get("metric", "")
    folder, folder_uri = registered_model.path, registered_model.uri.rstrip("/")  # before uri names the version
    evaluation = build_evaluation(
        metrics, run_name, f"{folder_uri}/{SCHEMA_FILE}", gate={"reason": gate_reason, **rules},
        lineage={**lineage, "merged_model": merged_model.uri},
        report_uri=eval_report.uri if eval_report is not None else "",
    )  # fmt: skip
    try:
        request = build_upload_request(
            merged_model.uri, model_id, display_name, serving_image, run_name, metrics, alias, labels,
            data_lineage={k: lineage[k] for k in ("data_snapshot", "training_key")},
            container=dict(serving_container), promote=promote,
        )  # fmt: skip
        result = register_model(
            request, project, location, expected_champion=champion_version if check_champion else None, alias=alias
        )
    except RegisterError as exc:
        raise SystemExit(f"register: {exc}") from None
    version = f"{result.resource_name}@{result.version_id}"
    outcome = attach_evaluation(folder, version, evaluation, location)
    kept = "registered and promoted" if promote and alias else "registered"
    for line in outcome.warnings:
        print(f"register: WARNING: {line}; {version} stays {kept}", file=sys.stderr, flush=True)
    uri = f"https://{location}-aiplatform.googleapis.com/v1/{version}"
    metadata = {
        "resourceName": result.resource_name,
        "version_id": result.version_id,
        "created_parent": result.created_parent,
        "aliases": [alias, "default"] if promote and alias else [],
        **outcome.metadata(),
    }
    try:
        _to_trackers(tracking, merged_model, uri, run_name, gate_tags(metrics, gate_metric, gate_reason))
    except TrackingError as exc:
        raise SystemExit(f"register: {exc}; {version} is registered") from None
    return StepOutputs(metadata={"registered_model": metadata}, uris={"registered_model": uri})


def _gate_record(gate_rules: dict | None) -> dict:
    """The gate's rules as the evaluation record keeps them; {} without a gate metric. evaluate checked these
    settings (keys left out: their defaults) before the gate."""
    gate = dict(gate_rules or {})
    metric = str(gate.get("metric") or "")
    if not metric:
        return {}
    return {"metric": metric, "min_value": float(gate.get("min_value", 0.0)),
            "min_margin": float(gate.get("min_margin", 0.0))}  # fmt: skip


def _to_trackers(tracking: dict | None, merged_model: ArtifactLike, uri: str, run_name: str, decision: dict) -> None:
    """The registered version in MLflow (a run, and the model version tagged with the gate's decision, the same as
    evaluate's, were its version lost) and in W&B."""
    run_id = record(
        tracking, "register", model_uri=merged_model.uri, model_dir=merged_model.path,
        model_meta=dict(merged_model.metadata), tags={"version": uri, "run_name": run_name},
    )  # fmt: skip
    register_version(tracking, run_id, "register", {**decision, "vlm_lora.vertex_model_version": uri})
    wandb_tracking.record(
        tracking, "register", model_uri=merged_model.uri, model_dir=merged_model.path,
        model_meta=dict(merged_model.metadata), metrics={"version": uri, "run_name": run_name},
    )  # fmt: skip


def promote_step(
    registered_model: ArtifactLike, deployment: ArtifactLike, *, alias: str, project: str, location: str,
    check_champion: bool = False, champion_version: str = "",
) -> StepOutputs:  # fmt: skip
    """Moves the alias to the registered version (`core.promote_version`); see `components.register.component.promote`.

    Returns:
        uris and metadata of "promoted_model".

    Raises:
        SystemExit: The registry refused ("promote: ...").
    """
    meta = registered_model.metadata
    try:
        moved = promote_version(
            meta["resourceName"],
            str(meta["version_id"]),
            alias,
            project,
            location,
            expected_champion=champion_version if check_champion else None,
        )
    except RegisterError as exc:
        raise SystemExit(f"promote: {exc}") from None
    print(f"promote: {meta['resourceName']}@{meta['version_id']} is now {alias!r}", flush=True)
    promoted = {
        "resourceName": meta["resourceName"],
        "version_id": meta["version_id"],
        "aliases": moved,
        "endpoint": deployment.metadata.get("resourceName", ""),
    }
    return StepOutputs(metadata={"promoted_model": promoted}, uris={"promoted_model": registered_model.uri})
