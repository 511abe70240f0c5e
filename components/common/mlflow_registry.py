"""MLflow's model registry: the evaluated adapter as a version of a registered model, tagged with the gate's decision.

With `tracking.register_model: true` the adapter's MLflow run (`components.common.tracking`) becomes a
version of the registered model `tracking.model_name` (default: pipeline.name). The version's source is
the run's `adapter/` artifacts (uploaded by `tracking.record`; the run's root when the adapter was not
readable), and its tags hold the run's lineage (`vlm_lora.adapter`, `.merged_model`, `.base_model`,
`.training_key`, `.data_snapshot`) and the gate's decision: `vlm_lora.gate` passed / failed, the metric,
the margin (tuned - reference) and its bootstrap interval, the reason.

evaluate makes the version; register (Vertex, after a passed gate) finds it and adds the Vertex Model
Registry version. Why not register alone: it runs only on Vertex and only after a passed gate, so a
version made there could never say `failed`, and a local run would register nothing. One version per
run: a second call (register after evaluate, a re-run on a cached adapter) finds the version by its run
ID and updates its tags.

A server that refuses (or went away after `tracking.record` reached it) is `tracking.unreachable`: a
TrackingError when tracking is required, else one WARNING line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from components.common.tracking import ENV_NO_TELEMETRY, Settings, probe, redact_uri, scrub, unreachable

GATE_TAG = "vlm_lora.gate"  # "passed" or "failed"
LINEAGE_PREFIX = "vlm_lora."  # the run's lineage tags copied onto the version
_RUN_ONLY = ("vlm_lora.task", "vlm_lora.evaluate.", "vlm_lora.register.")  # task tags stay on the run
ADAPTER_FOLDER = "adapter"  # where `tracking.record` uploads the adapter's files


def gate_tags(metrics: Mapping[str, Any], metric: str, reason: str = "", gate_on: str = "") -> dict[str, str]:
    """The gate's decision as model-version tags, read from evaluate's Metrics entries (pure).

    Args:
        metrics: evaluate's Metrics entries (`passed`, `tuned_<metric>`, `base_<metric>`,
            `margin_<metric>_ci_low` / `_ci_high`).
        metric: The gate's metric (`eval.metric`, e.g. "f1"); "" = only passed / failed.
        reason: The gate's decision in words. Default "".
        gate_on: What the gate compared ("point" or "lower_bound"); "" = not recorded. Default "".

    Returns:
        {"vlm_lora.gate": "passed" | "failed", "vlm_lora.gate.metric", "vlm_lora.gate.margin" (4 decimals),
        "vlm_lora.gate.margin_ci_low" / "_ci_high", "vlm_lora.gate.on", "vlm_lora.gate.reason"}, the
        entries the Metrics hold.
    """
    out = {GATE_TAG: "passed" if bool(metrics.get("passed")) else "failed"}
    tuned, base = metrics.get(f"tuned_{metric}"), metrics.get(f"base_{metric}")
    if metric:
        out[f"{GATE_TAG}.metric"] = metric
    if _is_number(tuned) and _is_number(base):
        out[f"{GATE_TAG}.margin"] = f"{float(tuned) - float(base):.4f}"
    for end in ("low", "high"):
        bound = metrics.get(f"margin_{metric}_ci_{end}")
        if metric and _is_number(bound):
            out[f"{GATE_TAG}.margin_ci_{end}"] = f"{float(bound):.4f}"
    if gate_on:
        out[f"{GATE_TAG}.on"] = gate_on
    if reason:
        out[f"{GATE_TAG}.reason"] = reason[:5000]  # MLflow keeps 5000 characters of a tag value
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def register_version(settings: Mapping[str, Any] | None, run_id: str, task: str, tags: Mapping[str, str]) -> str:
    """Makes (or finds) the run's version of the registered model and sets `tags` and the run's lineage on it.

    Args:
        settings: The component's tracking parameter (`Settings.as_param`); nothing happens without
            `register_model` in it.
        run_id: The adapter's MLflow run (`tracking.record`'s answer); "" = nothing to register.
        task: The calling task ("evaluate", "register"), for messages.
        tags: Tags to set on the version (`gate_tags`, the Vertex version, ...).

    Returns:
        The version number ("" when registering is off, there is no run, or the server refused and
        tracking is not required).

    Raises:
        TrackingError: The server refused or went away and tracking is required.
    """
    s = Settings.from_param(settings)
    if not (s.uri and s.model_name and run_id):
        return ""
    problem = probe(s.uri)  # the server may have gone away since the run was written
    if problem:
        unreachable(s, problem, task)
        return ""
    os.environ.setdefault(ENV_NO_TELEMETRY, "true")
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        client = MlflowClient(s.uri)
        _ensure_model(client, s.model_name)
        version = _version_of_run(client, s.model_name, run_id) or _new_version(client, s.model_name, run_id)
        run_tags = client.get_run(run_id).data.tags
        lineage = {k: v for k, v in run_tags.items() if k.startswith(LINEAGE_PREFIX) and not k.startswith(_RUN_ONLY)}
        for key, value in sorted(scrub({**lineage, **tags}).items()):
            client.set_model_version_tag(s.model_name, version, key, str(value))
    except (MlflowException, OSError) as exc:
        unreachable(s, f"refused the model version ({str(exc).splitlines()[0][:200]})", task)
        return ""
    print(
        f"{task}: MLflow: model {s.model_name!r} version {version} (run {run_id}, {GATE_TAG} "
        f"{tags.get(GATE_TAG, run_tags.get(GATE_TAG, '-'))}) at {redact_uri(s.uri)}",
        flush=True,
    )
    return version


def _ensure_model(client: Any, name: str) -> None:
    """Creates the registered model unless it exists (another task may create it meanwhile)."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        try:
            client.create_registered_model(name, description="LoRA adapters of vlm-lora runs (docs/tracking.md)")
        except MlflowException as again:
            if again.error_code != "RESOURCE_ALREADY_EXISTS":
                raise


def _version_of_run(client: Any, name: str, run_id: str) -> str:
    """The newest version of `name` made from `run_id` ("" when there is none)."""
    if "'" in name:
        return ""
    found = client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
    return str(max(int(v.version) for v in found)) if found else ""


def _new_version(client: Any, name: str, run_id: str) -> str:
    """A new version whose source is the run's adapter artifacts (the run's root without them)."""
    root = client.get_run(run_id).info.artifact_uri.rstrip("/")
    source = f"{root}/{ADAPTER_FOLDER}" if client.list_artifacts(run_id, ADAPTER_FOLDER) else root
    return str(client.create_model_version(name, source, run_id=run_id).version)
