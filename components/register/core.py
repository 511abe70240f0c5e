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

Once the version exists, `attach_evaluation` imports its ModelEvaluation and slices
(`components.register.evaluation` builds them; `import_evaluation` is the Vertex call). The
version is registered (perhaps promoted) by then, so a refused import is reported, not raised.

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
from pathlib import Path
from typing import Any

from components.common.metrics import REGISTRY_LABELS
from components.common.registry import ChampionChanged, alias_version, check_champion
from components.register.evaluation import SCHEMA_FILE, EvaluationRequest, schema_path

_LABEL_RE = re.compile(r"[^a-z0-9_-]+")
# Metrics copied into version labels (all metrics go into the version description).
LABEL_METRICS = (*REGISTRY_LABELS, "passed")  # components.common.metrics: which figures label a version


# The default serving container: the project's image, its own entry point (components.deploy.container).
DEFAULT_SERVING_COMMAND = ("python3", "-m", "components.deploy.container")
DEFAULT_SERVING_PORT = 8080
DEFAULT_PREDICT_ROUTE = "/v1/chat/completions"
DEFAULT_HEALTH_ROUTE = "/health"
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HTTP_PREFIX_RE = re.compile(r"^[A-Z]+ https?://\S+: ")


class RegisterError(RuntimeError):
    """The model cannot be registered; the message says what and how to fix it."""


class EvaluationImportError(RuntimeError):
    """The evaluation or its slices were not imported; the message is one line: what, why, the fix.

    Attributes:
        evaluation: The imported evaluation's resource name when only its slices failed, else "".
        slices: The slices imported before the failure.
    """

    def __init__(self, message: str, evaluation: str = "", slices: list[str] | None = None):
        super().__init__(message)
        self.evaluation = evaluation
        self.slices = list(slices or [])


@dataclass(frozen=True)
class ImportedEvaluation:
    """An imported ModelEvaluation.

    Attributes:
        name: `projects/P/locations/R/models/ID@VERSION/evaluations/EVAL` (as Vertex names it).
        slices: The imported slices' resource names.
    """

    name: str
    slices: list[str]


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
    scalars = {k: v for k, v in metrics.items() if not isinstance(v, (dict, list))}
    out_labels.update({label_value(k): label_value(v) for k, v in data.items()})
    request: dict[str, Any] = {
        "display_name": display_name or model_id,
        "artifact_uri": artifact_uri.rstrip("/"),
        "serving_container_image_uri": serving_image,
        "labels": out_labels,
        "version_aliases": [alias] if alias and promote else [],
        "is_default_version": bool(promote),
        # scalar figures only: the nested blocks (per label, regression) go to the imported evaluation
        # and would be cut mid-JSON at Vertex's 2048 characters
        "version_description": json.dumps({"run": run_name, "data": data, "metrics": scalars}, sort_keys=True)[:2048],
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


# BatchImportModelEvaluationSlices takes at most 50 slices a call (GCPC's importer batches the same).
SLICE_BATCH = 50
EVALUATION_FILE = "evaluation.json"


def write_evaluation_files(folder: str, version_name: str, request: EvaluationRequest) -> None:
    """Writes the metrics schema and the request (what an import by hand reads) into `folder`.

    Args:
        folder: register's own output folder (`/gcs/...` on Vertex).
        version_name: `projects/P/locations/R/models/ID@VERSION`, the evaluation's parent.
        request: `build_evaluation(...)`.

    Raises:
        OSError: The folder cannot be written.
    """
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    (out / SCHEMA_FILE).write_bytes(schema_path().read_bytes())
    saved = {"parent": version_name, "evaluation": request.evaluation, "slices": request.slices}
    (out / EVALUATION_FILE).write_text(json.dumps(saved, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def import_evaluation(
    version_name: str, request: EvaluationRequest, location: str, credentials: Any = None, saved: str = ""
) -> ImportedEvaluation:
    """Imports the ModelEvaluation into a model version, then its slices (50 a call).

    Args:
        version_name: `projects/P/locations/R/models/ID@VERSION`.
        request: `components.register.evaluation.build_evaluation(...)`.
        location: Vertex region (the regional endpoint, unless `aiplatform.init` set another).
        credentials: google-auth credentials; default ADC.
        saved: Where `write_evaluation_files` saved the request, for the error's fix; "" = not
            saved. Default "".

    Returns:
        The evaluation's and its slices' resource names.

    Raises:
        EvaluationImportError: An API error (permission, invalid argument, unavailable) on
            either call; the message names the version and the permission the call needs.
    """
    from google.api_core import exceptions
    from google.cloud.aiplatform import initializer, utils
    from google.cloud.aiplatform_v1.types import ModelEvaluation, ModelEvaluationSlice

    failures = (exceptions.GoogleAPICallError, exceptions.RetryError)
    client = initializer.global_config.create_client(
        client_class=utils.ModelClientWithOverride, credentials=credentials, location_override=location
    )
    try:
        evaluation = client.import_model_evaluation(
            parent=version_name, model_evaluation=ModelEvaluation(**request.evaluation)
        )
    except failures as exc:
        what = f"the evaluation was not imported into {version_name}"
        raise EvaluationImportError(_import_failed(what, exc, "aiplatform.modelEvaluations.import", saved)) from None
    names: list[str] = []
    for start in range(0, len(request.slices), SLICE_BATCH):
        batch = [ModelEvaluationSlice(**s) for s in request.slices[start : start + SLICE_BATCH]]
        try:
            response = client.batch_import_model_evaluation_slices(
                parent=evaluation.name, model_evaluation_slices=batch
            )
        except failures as exc:
            what = (
                f"evaluation {evaluation.name} was imported but {len(request.slices) - len(names)} of its "
                f"{len(request.slices)} slices were not"
            )
            message = _import_failed(what, exc, "aiplatform.modelEvaluationSlices.import", saved)
            raise EvaluationImportError(message, evaluation.name, names) from None
        names.extend(response.imported_model_evaluation_slices)
    return ImportedEvaluation(evaluation.name, names)


@dataclass(frozen=True)
class EvaluationOutcome:
    """What became of a version's evaluation.

    Attributes:
        imported: The evaluation and all its slices were imported.
        evaluation: The evaluation's resource name ("" = none was imported).
        slices: Slices imported.
        warnings: One line each: what went wrong, the fix.
    """

    imported: bool
    evaluation: str
    slices: int
    warnings: list[str]

    def metadata(self) -> dict[str, Any]:
        """The keys register's output records."""
        return {"evaluation_imported": self.imported, "evaluation": self.evaluation, "evaluation_slices": self.slices}


def attach_evaluation(
    folder: str, version_name: str, request: EvaluationRequest, location: str, credentials: Any = None
) -> EvaluationOutcome:
    """Writes the schema and the request into `folder`, then imports the evaluation; never raises.

    The version is already registered (and perhaps promoted) when this runs, so a failure is
    reported, not raised: the registry keeps the version, its labels and its description.

    Args:
        folder: register's own output folder; `request`'s metrics_schema_uri points into it.
        version_name: `projects/P/locations/R/models/ID@VERSION`.
        request: `build_evaluation(...)`.
        location: Vertex region.
        credentials: google-auth credentials; default ADC.

    Returns:
        The outcome, with a warning line per failure.
    """
    warnings = []
    saved = request.evaluation["metrics_schema_uri"].rsplit("/", 1)[0] + "/" + EVALUATION_FILE  # its URI
    try:
        write_evaluation_files(folder, version_name, request)
    except OSError as exc:
        saved = ""
        warnings.append(
            f"the metrics schema and {EVALUATION_FILE} were not written to {folder} ({exc.strerror or exc}); "
            f"the evaluation of {version_name} names a schema that is not there"
        )
    try:
        done = import_evaluation(version_name, request, location, credentials, saved)
    except EvaluationImportError as exc:
        return EvaluationOutcome(False, exc.evaluation, len(exc.slices), [*warnings, str(exc)])
    return EvaluationOutcome(True, done.name, len(done.slices), warnings)


def _import_failed(what: str, exc: Exception, permission: str, saved: str) -> str:
    """One line: what was not imported, the API's answer, the permission to grant."""
    answer = " ".join(str(getattr(exc, "message", None) or exc).split())
    answer = _HTTP_PREFIX_RE.sub("", answer)[:300]  # the REST transport's "POST http://...: "
    code = getattr(exc, "code", None)  # HTTP status over gRPC and REST alike (403 PermissionDenied / Forbidden)
    status = f"{int(code)} {type(exc).__name__}" if code else type(exc).__name__
    return (
        f"{what} ({status}: {answer}); grant the pipeline's service account {permission} on the model, "
        f"then import {saved or 'the evaluation'} by hand (docs/vertex.md, Evaluations in the Model Registry)"
    )
