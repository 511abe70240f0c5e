"""Find the current champion in the Vertex AI Model Registry: the model to beat.

The champion is the version of the parent model `register.model_id` that carries the
alias `register.alias` (default `champion`); register moves that alias to every model
that passes the gate. `find_champion` asks the registry for
`projects/P/locations/R/models/MODEL_ID@ALIAS` and returns the version's artifact URI
(the merged model folder on Cloud Storage) and version ID, so that evaluate compares the
newly tuned model with the champion instead of the base model.

No champion yet (first run: the parent model or the alias does not exist) is not an
error: the result is empty and says why, and evaluate falls back to the base model. Every
other failure (permission, network, a champion without a gs:// artifact) is a
`ChampionLookupError` with a message that says what to fix.

The registry is reached through a `fetch` function (`vertex_fetch` builds the real one on
`google.cloud.aiplatform`), so the logic is tested without Vertex.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# resource name -> {"resource_name", "version_id", "artifact_uri", "version_aliases"}, or None
# when the registry answers NOT_FOUND; any other failure raises.
FetchFn = Callable[[str], dict[str, Any] | None]

# Hints for API errors, by exception class name (google.api_core.exceptions and google.auth).
_HINTS = {
    "PermissionDenied": "the pipeline's service account needs roles/aiplatform.user (aiplatform.models.get) "
    "in the project",
    "Forbidden": "the pipeline's service account needs roles/aiplatform.user (aiplatform.models.get) in the project",
    "Unauthenticated": "no valid credentials; run with a service account or `gcloud auth application-default login`",
    "Unauthorized": "no valid credentials; run with a service account or `gcloud auth application-default login`",
    "DefaultCredentialsError": "no Application Default Credentials; run with a service account or "
    "`gcloud auth application-default login`",
    "InvalidArgument": "check register.model_id and register.alias in the config",
    "BadRequest": "check register.model_id and register.alias in the config",
    "ServiceUnavailable": "the Vertex AI API is unreachable; retry the run",
    "DeadlineExceeded": "the Vertex AI API did not answer in time; retry the run",
}


class ChampionLookupError(RuntimeError):
    """The registry could not be asked, or its answer is unusable; the message says what to fix."""


@dataclass(frozen=True)
class Champion:
    """The model the tuned model must beat.

    Attributes:
        uri: gs:// folder of the champion's merged model; "" = no champion (use the base model).
        version_id: The champion's version ID, e.g. "3"; "" = no champion.
        resource_name: `projects/P/locations/R/models/ID@VERSION`; "" = no champion.
        message: What was found, for the log (also why there is no champion).
    """

    uri: str
    version_id: str
    resource_name: str
    message: str


def model_name(project: str, location: str, model_id: str, alias: str = "") -> str:
    """Returns `projects/P/locations/R/models/ID`, with `@ALIAS` when an alias is given (pure)."""
    name = f"projects/{project}/locations/{location}/models/{model_id}"
    return f"{name}@{alias}" if alias else name


def _ask(fetch: FetchFn, name: str) -> dict[str, Any] | None:
    try:
        return fetch(name)
    except ChampionLookupError:
        raise
    except Exception as exc:  # any API / transport error: named, with a hint, no stack trace
        kind = type(exc).__name__
        hint = _HINTS.get(kind, "check the project, region and the Vertex AI API")
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else "(no message)"
        raise ChampionLookupError(f"cannot look up {name} in the Model Registry: {kind}: {detail}; {hint}") from None


def find_champion(project: str, location: str, model_id: str, alias: str, fetch: FetchFn) -> Champion:
    """Looks up the version of `model_id` that carries `alias`.

    Args:
        project: Google Cloud project ID.
        location: Vertex region, e.g. us-central1.
        model_id: ID of the parent model (the config's `register.model_id`).
        alias: Version alias of the champion (the config's `register.alias`), e.g. champion.
        fetch: Asks the registry for one resource name; returns the model version as a dict
            (`vertex_fetch` for the real registry) or None when it does not exist.

    Returns:
        The Champion; empty uri and version_id when the parent model or the alias does not
        exist yet (the message says which).

    Raises:
        ChampionLookupError: An argument is empty, the registry call failed (permission,
            network, ...), or the champion has no gs:// artifact URI to evaluate.
    """
    for key, value in (
        ("project", project),
        ("location", location),
        ("register.model_id", model_id),
        ("register.alias", alias),
    ):
        if not value:
            raise ChampionLookupError(f"{key} is empty; the champion cannot be looked up without it")
    name = model_name(project, location, model_id, alias)
    found = _ask(fetch, name)
    if found is None:
        parent = model_name(project, location, model_id)
        if _ask(fetch, parent) is None:
            why = f"no model {parent} in the Model Registry yet (first registration)"
        else:
            why = f"model {parent} has no version with alias {alias!r} yet"
        return Champion("", "", "", f"{why}: no champion, comparing with the base model")
    version = str(found.get("version_id") or "")
    uri = str(found.get("artifact_uri") or "").rstrip("/")
    versioned = f"{model_name(project, location, model_id)}@{version}" if version else name
    if not uri.startswith("gs://"):
        raise ChampionLookupError(
            f"champion {versioned} has artifact URI {uri or '(none)'!r}, not a gs:// folder that evaluate can read; "
            f"move the alias {alias!r} to a version with a gs:// artifact, or set eval.reference: base"
        )
    return Champion(uri, version, versioned, f"champion is {versioned} ({uri})")


def vertex_fetch(project: str, location: str, credentials: Any = None) -> FetchFn:
    """Returns a FetchFn on `google.cloud.aiplatform` (the endpoint set by `aiplatform.init`, if any).

    Args:
        project: Google Cloud project ID.
        location: Vertex region.
        credentials: google-auth credentials. Default: Application Default Credentials.
    """

    def fetch(name: str) -> dict[str, Any] | None:
        from google.api_core import exceptions
        from google.cloud import aiplatform

        try:
            model = aiplatform.Model(name, project=project, location=location, credentials=credentials)
        except exceptions.NotFound:
            return None
        gca = model.gca_resource
        return {
            "resource_name": model.resource_name,
            "version_id": str(gca.version_id),
            "artifact_uri": gca.artifact_uri,
            "version_aliases": list(gca.version_aliases),
        }

    return fetch
