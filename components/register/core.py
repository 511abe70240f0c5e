"""Register a merged model in the Vertex AI Model Registry as a new version of one model.

`build_upload_request` is pure (what tests assert on); `register_model` looks up the parent
model and calls `aiplatform.Model.upload` once. The first registration creates the parent
model under `model_id`; every later one adds a version to it. The alias (default
`champion`) moves to the newest version, which also becomes the default version.

When evaluate compared with the champion, `register_model` first checks that the alias
still points at the version evaluate compared with (`expected_champion`): if another run
promoted a model in the meantime, this one was never compared with it and is refused.

With a deploy step the order is register (no alias: a version nobody serves and no run
compares with) → deploy + smoke test → `promote_version` (the same champion check again, then
the alias and the default version move). A failed deploy leaves the alias where it was.

The serving container (`serving_container_args`) is what Vertex starts for a deployment: by
default the project's image running `python3 -m components.deploy.container` (it copies the
model from `AIP_STORAGE_URI` and runs `swift deploy` on `AIP_HTTP_PORT`), OpenAI chat on
`/v1/chat/completions`, health on `/health`, every route reachable through the endpoint's
per-deployed-model `invoke` method (the deploy step's smoke test uses it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from components.common.registry import ChampionChanged, alias_version, check_champion

_LABEL_RE = re.compile(r"[^a-z0-9_-]+")
# Metrics copied into version labels (all metrics go into the version description).
LABEL_METRICS = ("tuned_f1", "tuned_json_valid_rate", "base_f1", "passed")


# The default serving container: the project's image, its own entry point (components.deploy.container).
DEFAULT_SERVING_COMMAND = ("python3", "-m", "components.deploy.container")
DEFAULT_SERVING_PORT = 8080
DEFAULT_PREDICT_ROUTE = "/v1/chat/completions"
DEFAULT_HEALTH_ROUTE = "/health"
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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


def serving_container_args(container: dict[str, Any] | None) -> dict[str, Any]:
    """Returns the `serving_container_*` keywords of `aiplatform.Model.upload` for a container spec.

    Args:
        container: {"command": [...], "args": [...], "port": int, "predict_route": str,
            "health_route": str, "env": {NAME: value}}; missing keys take the defaults (the
            project's `components.deploy.container` entry point, port 8080, OpenAI chat route,
            `/health`). None or {} = all defaults.

    Returns:
        Keywords: command, args, ports, predict and health routes, environment, and the invoke
        route prefix "/*" (so the smoke test can reach a deployed model before it takes traffic).

    Raises:
        RegisterError: A route not starting with "/", a port outside 1..65535, an env name that is
            not a variable name, or a non-string command / args item.
    """
    spec = dict(container or {})
    unknown = set(spec) - {"command", "args", "port", "predict_route", "health_route", "env"}
    if unknown:
        raise RegisterError(f"serving container: unknown keys {sorted(unknown)}")
    command = list(spec.get("command") or DEFAULT_SERVING_COMMAND)
    args = list(spec.get("args") or [])
    if not all(isinstance(x, str) for x in command + args):
        raise RegisterError("serving container: command and args must be lists of strings")
    port = int(spec.get("port") or DEFAULT_SERVING_PORT)
    if not 1 <= port <= 65535:
        raise RegisterError(f"serving container: port {port} is outside 1..65535")
    routes = {
        k: str(spec.get(k) or d)
        for k, d in (("predict_route", DEFAULT_PREDICT_ROUTE), ("health_route", DEFAULT_HEALTH_ROUTE))
    }
    for key, route in routes.items():
        if not route.startswith("/"):
            raise RegisterError(f"serving container: {key} {route!r} must start with '/'")
    env = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
    bad = [k for k in env if not _ENV_NAME_RE.match(k)]
    if bad:
        raise RegisterError(f"serving container: environment names {bad} are not variable names")
    return {
        "serving_container_command": command,
        "serving_container_args": args,
        "serving_container_ports": [port],
        "serving_container_predict_route": routes["predict_route"],
        "serving_container_health_route": routes["health_route"],
        "serving_container_environment_variables": env,
        "serving_container_invoke_route_prefix": "/*",
    }


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
    container: dict[str, Any] | None = None,
    promote: bool = True,
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
        container: Serving container spec (`serving_container_args`); None = the defaults.
        promote: Move `alias` to this version and make it the default version now; False
            = no alias, not the default (a deploy step promotes it after its smoke test).
            Default True.

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
        "version_aliases": [alias] if alias and promote else [],
        "is_default_version": bool(promote),
        "version_description": json.dumps({"run": run_name, "data": data, "metrics": metrics}, sort_keys=True)[:2048],
        "sync": True,
        **serving_container_args(container),
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
    alias: str = "",
) -> Registered:
    """Uploads the model as a new version of `model_id` (creating it the first time).

    Args:
        request_args: `build_upload_request(...)` without `parent_model`.
        project: Google Cloud project ID.
        location: Vertex region.
        credentials: google-auth credentials; default ADC.
        expected_champion: Version ID the alias must still point at (the champion evaluate
            compared with); "" = there must still be no champion; None = no check. Default None.
        alias: The champion alias checked; "" = the request's alias. Default "".

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
    checked = alias or next(iter(request.get("version_aliases") or []), "")
    if expected_champion is not None and checked:
        current = alias_version(parent, checked, project, location, credentials) if existing is not None else ""
        _checked(parent, checked, expected_champion, current)
    if existing is not None:
        request.pop("model_id", None)
        request["parent_model"] = existing.resource_name
    model = aiplatform.Model.upload(project=project, location=location, credentials=credentials, **request)
    return Registered(model.resource_name, str(model.version_id), existing is None)


def promote_version(
    model_name: str,
    version_id: str,
    alias: str,
    project: str,
    location: str,
    credentials: Any = None,
    expected_champion: str | None = None,
) -> list[str]:
    """Moves `alias` (and the default version) to a registered version, after the same champion check.

    Called after a deploy step's smoke test passed; nothing else changes the registry.

    Args:
        model_name: Parent model resource name, `projects/P/locations/R/models/ID`.
        version_id: The version that passed.
        alias: The champion alias, e.g. champion.
        project: Google Cloud project ID.
        location: Vertex region.
        credentials: google-auth credentials; default ADC.
        expected_champion: Version ID the alias must still point at; "" = still no champion;
            None = no check. Default None.

    Returns:
        The aliases moved (`[alias, "default"]`).

    Raises:
        RegisterError: No alias given, or the alias moved since evaluate looked it up.
    """
    from google.cloud.aiplatform.models import ModelRegistry

    if not alias:
        raise RegisterError("register.alias is empty: there is no alias to promote the version with")
    if expected_champion is not None:
        current = alias_version(model_name, alias, project, location, credentials)
        _checked(model_name, alias, expected_champion, current)
    registry = ModelRegistry(model_name, project=project, location=location, credentials=credentials)
    moved = [alias, "default"]
    registry.add_version_aliases(moved, version_id)
    return moved


def _checked(parent: str, alias: str, expected: str, current: str) -> None:
    try:
        check_champion(parent, alias, expected, current)
    except ChampionChanged as exc:
        raise RegisterError(str(exc)) from None
