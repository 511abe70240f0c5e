"""Register a merged model in the Vertex AI Model Registry as a new version of one model.

`build_upload_request` is pure (what tests assert on); `register_model` looks up the parent
model and calls `aiplatform.Model.upload` once. The first registration creates the parent
model under `model_id`; every later one adds a version to it. The alias (default
`champion`) moves to the newest version, which also becomes the default version.

When evaluate compared with the champion, `register_model` first checks that the alias
still points at the version evaluate compared with (`expected_champion`): if another run
promoted a model in the meantime, this one was never compared with it and is refused.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_LABEL_RE = re.compile(r"[^a-z0-9_-]+")
# Metrics copied into version labels (all metrics go into the version description).
LABEL_METRICS = ("tuned_f1", "tuned_json_valid_rate", "base_f1", "passed")


class RegisterError(RuntimeError):
    """The model cannot be registered; the message says what and how to fix it."""


@dataclass(frozen=True)
class Registered:
    """Result of a registration.

    Attributes:
        resource_name: `projects/P/locations/R/models/ID`.
        version_id: The new version's ID.
        created_parent: True when this registration created the parent model.
    """

    resource_name: str
    version_id: str
    created_parent: bool


def label_value(value: Any) -> str:
    """Returns `value` as a Vertex label value: lowercase, [a-z0-9_-], at most 63 characters.

    Numbers keep 4 decimals with '_' for the point (0.8125 -> "0_8125").
    """
    if isinstance(value, float):
        value = f"{value:.4f}".replace(".", "_")
    return _LABEL_RE.sub("-", str(value).lower())[:63].strip("-")


def build_upload_request(
    artifact_uri: str,
    model_id: str,
    display_name: str,
    serving_image: str,
    run_name: str,
    metrics: dict[str, Any],
    alias: str = "champion",
    labels: dict[str, str] | None = None,
    parent_model: str = "",
    data_lineage: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Builds the keyword arguments of `aiplatform.Model.upload` for one registration.

    Args:
        artifact_uri: gs:// folder of the merged model (safetensors + processor).
        model_id: ID of the parent model; used to create it when `parent_model` is "".
        display_name: Display name of the model.
        serving_image: Serving container image URI.
        run_name: Pipeline job name (lineage; becomes the `run_id` label).
        metrics: Evaluation metrics (base_* and tuned_*).
        alias: Version alias moved to this version. Default "champion".
        labels: Extra labels (the config's `vertex.labels`). Default none.
        parent_model: Resource name of the existing parent model; "" = create it.
        data_lineage: Which data made the model: {"data_snapshot": fingerprint,
            "training_key": key} (merge-export's metadata); become labels of the same names
            and part of the description. Default none.

    Returns:
        The keyword arguments for `aiplatform.Model.upload`.

    Raises:
        RegisterError: The artifact is not on Cloud Storage, or image / IDs are missing.
    """
    if not artifact_uri.startswith("gs://"):
        raise RegisterError(f"merged model {artifact_uri!r} is not on Cloud Storage; the registry needs a gs:// folder")
    if not serving_image:
        raise RegisterError("register.serving_image is empty; set a serving container image in the config")
    if not model_id:
        raise RegisterError("register.model_id is empty")
    out_labels = {k: label_value(v) for k, v in (labels or {}).items()}
    out_labels["run_id"] = label_value(run_name)
    if isinstance(metrics.get("reference"), str) and metrics["reference"]:  # base, champion@3 or a folder
        out_labels["reference"] = label_value(metrics["reference"])
    for key in LABEL_METRICS:
        if key in metrics:
            out_labels[label_value(key)] = label_value(float(metrics[key]))
    data = {k: v for k, v in (data_lineage or {}).items() if v}
    out_labels.update({label_value(k): label_value(v) for k, v in data.items()})
    request: dict[str, Any] = {
        "display_name": display_name or model_id,
        "artifact_uri": artifact_uri.rstrip("/"),
        "serving_container_image_uri": serving_image,
        "labels": out_labels,
        "version_aliases": [alias] if alias else [],
        "is_default_version": True,
        "version_description": json.dumps({"run": run_name, "data": data, "metrics": metrics}, sort_keys=True)[:2048],
        "sync": True,
    }
    if parent_model:
        request["parent_model"] = parent_model
    else:
        request["model_id"] = model_id
    return request


def register_model(
    request_args: dict[str, Any],
    project: str,
    location: str,
    credentials: Any = None,
    expected_champion: str | None = None,
) -> Registered:
    """Uploads the model as a new version of `model_id` (creating it the first time).

    Args:
        request_args: `build_upload_request(...)` without `parent_model`.
        project: Google Cloud project ID.
        location: Vertex region.
        credentials: google-auth credentials; default ADC.
        expected_champion: Version ID the alias must still point at (the champion evaluate
            compared with); "" = there must still be no champion; None = no check. Default None.

    Returns:
        The registered model's resource name and version.

    Raises:
        RegisterError: The alias moved to another version since evaluate looked it up.
    """
    from google.api_core import exceptions
    from google.cloud import aiplatform

    request = dict(request_args)
    model_id = request.get("model_id", "")
    parent = f"projects/{project}/locations/{location}/models/{model_id}"
    try:
        existing = aiplatform.Model(parent, project=project, location=location, credentials=credentials)
    except exceptions.NotFound:
        existing = None
    aliases = request.get("version_aliases") or []
    if expected_champion is not None and aliases:
        current = ""
        if existing is not None:
            try:
                current = str(
                    aiplatform.Model(
                        f"{parent}@{aliases[0]}", project=project, location=location, credentials=credentials
                    ).version_id
                )
            except exceptions.NotFound:
                current = ""
        if current != expected_champion:
            was = f"version {expected_champion}" if expected_champion else "no champion"
            now = f"version {current}" if current else "no version"
            raise RegisterError(
                f"the champion changed during this run: evaluate compared with {was} of {parent}, but alias "
                f"{aliases[0]!r} now points at {now}; this model was not compared with the current champion, "
                "so it is not promoted. Run the pipeline again to evaluate against the new champion"
            )
    if existing is not None:
        request.pop("model_id", None)
        request["parent_model"] = existing.resource_name
    model = aiplatform.Model.upload(project=project, location=location, credentials=credentials, **request)
    return Registered(model.resource_name, str(model.version_id), existing is None)
