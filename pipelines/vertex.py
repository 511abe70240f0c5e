"""Vertex AI client calls shared by run, schedule and upload.

* `init_vertex`: one place that points `google.cloud.aiplatform` at a project and region
  (and, in tests, at a local recording server).
* `preflight` / `check_bucket`: project, pipeline root and buckets are checked before
  anything is submitted.
* `pipeline_job`: the `aiplatform.PipelineJob` of a config, with the parameter values its
  caller passes (`pipelines.run_parameters.pipeline_arguments`).

The machine-shape and region tables are pure data and live in `pipelines.shapes`.
No project, region or bucket is hard-coded here: they come from the config.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from pipelines.config import Config


class VertexError(RuntimeError):
    """A Vertex request cannot be made; the message says what, where and how to fix it."""


def console_link(resource_name: str) -> str:
    """Returns the Cloud console URL of a pipeline job or schedule resource name."""
    parts = resource_name.split("/")
    fields = dict(zip(parts[::2], parts[1::2]))
    project, region = fields.get("projects", ""), fields.get("locations", "")
    if "pipelineJobs" in fields:
        return (
            f"https://console.cloud.google.com/vertex-ai/locations/{region}/pipelines/runs/"
            f"{fields['pipelineJobs']}?project={project}"
        )
    if "schedules" in fields:
        return f"https://console.cloud.google.com/vertex-ai/pipelines/schedules?project={project}"
    return f"https://console.cloud.google.com/vertex-ai?project={project}"


def init_vertex(
    project: str,
    region: str,
    *,
    credentials: Any = None,
    api_endpoint: str | None = None,
    staging_bucket: str | None = None,
    service_account: str | None = None,
    encryption_key: str | None = None,
) -> None:
    """Points `google.cloud.aiplatform` at a project and region.

    Args:
        project: Google Cloud project ID.
        region: Vertex region, e.g. `us-central1`.
        credentials: google-auth credentials; default Application Default Credentials.
        api_endpoint: Override of the regional endpoint (tests: `http://127.0.0.1:PORT`,
            which also selects the REST transport). Default: the regional endpoint, gRPC.
        staging_bucket: `gs://` bucket for staging. Default none.
        service_account: Default service account of jobs. Default none.
        encryption_key: Default CMEK key name. Default none.
    """
    from google.cloud import aiplatform

    kwargs: dict[str, Any] = {"project": project, "location": region}
    if credentials is not None:
        kwargs["credentials"] = credentials
    if api_endpoint:
        kwargs["api_endpoint"] = api_endpoint
        kwargs["api_transport"] = "rest"
    if staging_bucket:
        kwargs["staging_bucket"] = staging_bucket
    if service_account:
        kwargs["service_account"] = service_account
    if encryption_key:
        kwargs["encryption_spec_key_name"] = encryption_key
    aiplatform.init(**kwargs)


def bucket_of(uri: str) -> str:
    """Returns the bucket name of a `gs://bucket/...` URI ("" if it is not one)."""
    return uri[len("gs://") :].split("/", 1)[0] if uri.startswith("gs://") else ""


def check_bucket(uri: str, project: str, key: str, credentials: Any = None) -> None:
    """Checks that the bucket of a `gs://` URI exists (and is readable with our credentials).

    Args:
        uri: `gs://bucket/prefix`.
        project: Project billed for the check.
        key: Config key the URI came from (named in the error).
        credentials: google-auth credentials; default ADC.

    Raises:
        VertexError: Not a gs:// URI, or the bucket does not exist.
    """
    from google.api_core import exceptions
    from google.cloud import storage

    bucket = bucket_of(uri)
    if not bucket:
        raise VertexError(f"{key}: {uri!r} is not a gs://bucket/prefix URI; Vertex needs a Cloud Storage location")
    client = storage.Client(project=project, credentials=credentials)
    try:
        exists = client.bucket(bucket).exists(retry=None, timeout=30)
    except exceptions.Forbidden:
        raise VertexError(f"{key}: no permission to read bucket gs://{bucket} (see docs/setup.md)") from None
    if not exists:
        raise VertexError(
            f"{key}: bucket gs://{bucket} does not exist; create it first (docs/setup.md) "
            "or point the config at an existing bucket"
        )


PLACEHOLDER_MARKERS = ("YOUR_PROJECT", "YOUR_BUCKET")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    """Removes terminal colour codes (some libraries colour their messages) from error text."""
    return _ANSI.sub("", text)


class command_errors:  # noqa: N801 - used as a context manager, like contextlib's
    """For a command's `main`: the errors a user can act on become one line and an exit code.

        with command_errors(failures=(RunError,)) as outcome:
            ...
        return outcome.code

    ConfigError / VertexError (the config or an argument): `error: ...`, code 2; `failures`
    (the work itself failed, its message says why): code 1; credentials / Google API errors:
    one line with the fix (`google_error_message`), code 1. Anything else is not caught (a bug
    keeps its traceback). `code` is 0 when the block finished.
    """

    def __init__(self, failures: tuple[type[BaseException], ...] = ()):
        self.failures = failures
        self.code = 0

    def __enter__(self) -> command_errors:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        from pipelines.config import ConfigError

        if exc is None or not isinstance(exc, Exception):
            return False
        if isinstance(exc, (ConfigError, VertexError)):
            message, self.code = str(exc), 2
        elif isinstance(exc, self.failures):
            message, self.code = str(exc), 1
        else:
            message = google_error_message(exc)
            if message is None:
                return False
            self.code = 1
        print(f"error: {message}", file=sys.stderr)
        return True


def google_error_message(exc: BaseException) -> str | None:
    """One line, with the fix, for a credentials or Google API error; None for any other exception.

    Used by the command-line entry points instead of a traceback.
    """
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth

    first = strip_ansi(str(exc)).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, auth.DefaultCredentialsError):
        return (
            "no Google Cloud credentials found: run `gcloud auth application-default login`, or set "
            f"GOOGLE_APPLICATION_CREDENTIALS to a service account key file ({first[:200]})"
        )
    if isinstance(exc, auth.RefreshError):
        return (
            "Google Cloud credentials could not be refreshed (expired or revoked): run "
            f"`gcloud auth application-default login` again ({first[:200]})"
        )
    if isinstance(exc, auth.GoogleAuthError):
        return f"Google Cloud authentication failed: {first[:300]}"
    if isinstance(exc, (api.Forbidden, api.PermissionDenied)):
        return (
            f"permission denied: {first[:300]}; the account needs roles/aiplatform.user and read/write access to "
            "the pipeline root's bucket (docs/setup.md)"
        )
    if isinstance(exc, api.Unauthenticated):
        return f"not authenticated: {first[:300]}; run `gcloud auth application-default login`"
    if isinstance(exc, (api.ServiceUnavailable, api.DeadlineExceeded)):
        return f"Google Cloud API unavailable or too slow ({first[:300]}); try again in a few minutes"
    if isinstance(exc, api.GoogleAPICallError):
        return f"Google Cloud API error: {first[:300]}"
    return None


def placeholder_values(cfg: Config) -> list[tuple[str, str]]:
    """Every value the job would carry that still holds YOUR_PROJECT / YOUR_BUCKET, as (key, value).

    Looks at every config value (all sections, nested lists and mappings) and at the task
    images the job would run (the config's or the defaults), including the serving image
    register would upload (`register.serving_image: train` = the training image).

    Raises:
        VertexError: A default image is needed and its tag is unknown (no source tree here).
    """
    from components.images import ImageTagError, resolve_images

    found: list[tuple[str, str]] = []

    def walk(value: Any, key: str) -> None:
        if isinstance(value, str):
            if any(marker in value for marker in PLACEHOLDER_MARKERS):
                found.append((key, value))
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{key}[{i}]")

    data = cfg.to_dict()
    data["vertex"].pop("template_repo", None)  # not sent with a run (upload checks it)
    walk(data, "")
    try:
        images = resolve_images(cfg.images.light, cfg.images.train)
    except ImageTagError as exc:
        raise VertexError(f"{cfg.path or 'config'}: {exc}") from None
    walk({"light": images["light"], "train": images["train"]}, "images")
    if cfg.register.serving_image == "train":
        walk(images["train"], "register.serving_image (the training image)")
    seen: set[tuple[str, str]] = set()
    return [kv for kv in found if not (kv in seen or seen.add(kv))]


def submission_problems(cfg: Config) -> list[str]:
    """Every setting that stops a config from being submitted to Vertex, without credentials or network.

    Args:
        cfg: The validated `Config`.

    Returns:
        One line per problem ("KEY still holds the placeholder 'VALUE'; FIX", a missing
        project, a pipeline root that is not gs://), all of them; [] when it can be submitted.

    Raises:
        VertexError: A default image is needed and its tag is unknown (no source tree here).
    """
    problems = []
    project, root = cfg.vertex.project, cfg.pipeline.root
    if not project or project in PLACEHOLDER_MARKERS:
        problems.append("vertex.project is not set; set it to your Google Cloud project ID (or pass --project)")
    if not root.startswith("gs://"):
        problems.append(f"pipeline.root {root!r} must be gs://bucket/prefix on Vertex")
    for key, value in placeholder_values(cfg):
        if key == "vertex.project" and problems[:1] and problems[0].startswith("vertex.project"):
            continue
        fix = "set your bucket" if "gs://" in value else "set your project / bucket"
        if key.startswith("images."):
            fix = "set images.light / images.train in the config (or VLM_LORA_LIGHT_IMAGE / VLM_LORA_TRAIN_IMAGE)"
        elif key.startswith("register.serving_image"):
            fix = "set images.train (register serves the training image)"
        problems.append(f"{key} still holds the placeholder {value!r}; {fix}")
    return problems


def preflight(cfg: Config, credentials: Any = None, check_buckets: bool = True) -> None:
    """Checks a config can be submitted to Vertex, before anything is created.

    Args:
        cfg: The validated `Config` (shapes, regions and cron were checked at load).
        credentials: google-auth credentials for the bucket check; default ADC.
        check_buckets: Also check that the pipeline root's bucket exists. Default true.

    Raises:
        VertexError: Missing or placeholder project, a pipeline root that is not gs://,
            placeholder values left in the config (all of them in one message,
            `submission_problems`), a default image whose tag is unknown, or a bucket that
            does not exist.
    """
    where = cfg.path or "config"
    problems = submission_problems(cfg)
    if len(problems) == 1:
        raise VertexError(f"{where}: {problems[0]}")
    if problems:
        raise VertexError(
            f"{where}: {len(problems)} settings to fill in before a run can be submitted "
            "(edit the config, or pass section.key=value words):\n" + "\n".join(f"  {p}" for p in problems)
        )
    project, root = cfg.vertex.project, cfg.pipeline.root
    if check_buckets:
        check_bucket(root, project, "pipeline.root", credentials)
        if cfg.model.cache.startswith("gs://") and bucket_of(cfg.model.cache) != bucket_of(root):
            check_bucket(cfg.model.cache, project, "model.cache", credentials)


def run_labels(cfg: Config) -> dict[str, str]:
    """Returns the labels of a run: the config's `vertex.labels` plus the pipeline and config names."""

    def clean(text: str) -> str:
        return "".join(c if c.isalnum() or c in "_-" else "-" for c in text.lower())[:63]

    labels = {str(k): str(v) for k, v in cfg.vertex.labels.items()}
    labels.setdefault("pipeline", clean(cfg.pipeline.name))
    if cfg.path:
        labels.setdefault("config", clean(Path(cfg.path).stem))
    return labels


def pipeline_job(
    cfg: Config,
    template_path: str,
    parameter_values: dict[str, Any],
    *,
    enable_caching: bool | None = None,
    credentials: Any = None,
    job_id: str | None = None,
) -> Any:
    """Returns an `aiplatform.PipelineJob` for a config (not yet submitted).

    Args:
        cfg: The validated config.
        template_path: Compiled pipeline YAML (or an Artifact Registry template URL).
        parameter_values: The run's pipeline parameters by name
            (`pipelines.run_parameters.pipeline_arguments(cfg)`).
        enable_caching: Reuse unchanged tasks; default the config's `pipeline.enable_caching`.
            On, the compiled per-task settings apply (every task caches except
            find-champion, whose answer changes between runs); off, no task caches.
        credentials: google-auth credentials; default the ones given to `init_vertex`.
        job_id: Pipeline job ID; default `<pipeline name>-<timestamp>`.

    Returns:
        The job, with `parameter_values` as its run's parameters.
    """
    from google.cloud import aiplatform

    caching = cfg.pipeline.enable_caching if enable_caching is None else enable_caching

    return aiplatform.PipelineJob(
        display_name=cfg.pipeline.name,
        template_path=template_path,
        job_id=job_id,
        pipeline_root=cfg.pipeline.root,
        parameter_values=parameter_values,
        # True would force caching onto every task, find-champion included; None keeps the compiled settings
        enable_caching=None if caching else False,
        encryption_spec_key_name=cfg.vertex.encryption_key or None,
        labels=run_labels(cfg),
        credentials=credentials,
        project=cfg.vertex.project,
        location=cfg.vertex.region,
    )
