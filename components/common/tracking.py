"""MLflow tracking: where training curves, evaluation figures, the data snapshot and the lineage land.

One MLflow run per trained adapter. train-lora's `swift sft` opens it through transformers'
`MLflowCallback` (`report_to mlflow`, `prepare_training`), with tags naming the adapter, the
training key and the data snapshot; evaluate and register find that run by the adapter tag and
add their figures and lineage to it (`record`). Why not a parent run per pipeline run with the
training nested: train-lora and evaluate are cached on their inputs, and a per-run value in
their parameters would break the cache, so the one identity every task already shares is the
adapter. A re-run that reuses a cached adapter adds to the same run; a task that finds no run
(the training was logged nowhere) opens one with the same tags.

Settings travel as plain values: the job environment's MLFLOW_TRACKING_URI,
MLFLOW_EXPERIMENT_NAME and VLM_LORA_TRACKING_REQUIRED for train-lora (`job_env`), a dict for
the other components (`Settings.as_param`). No credentials travel: a URI with a user or password
is refused (`uri_problem`); a server that needs them reads them from the task's own environment
(MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME / _PASSWORD), which is never logged.

An unreachable server is named in one line at first use (`probe`): with `required` the task
stops (train-lora before `swift sft` starts), else it goes on without MLflow.

`mlflow` (the `tracking` extra: mlflow-skinny) is imported only when a run is written.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from base64 import b64encode
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from components.common import secrets
from components.common.snapshot import LINEAGE_FILE
from components.common.storage import from_fuse_path

ENV_URI = "MLFLOW_TRACKING_URI"
ENV_EXPERIMENT = "MLFLOW_EXPERIMENT_NAME"
ENV_REQUIRED = "VLM_LORA_TRACKING_REQUIRED"  # "0": train on without MLflow when the server cannot be reached
ENV_TAGS = "MLFLOW_TAGS"  # transformers' MLflowCallback sets these tags on the run it opens
# MLflow's client sends usage telemetry to MLflow's own servers unless this is "true": `swift sft` gets
# it with the tracking settings, and `record` sets it in its process unless the environment has it.
ENV_NO_TELEMETRY = "MLFLOW_DISABLE_TELEMETRY"
DEFAULT_EXPERIMENT = "Default"  # MLflow's own, where a run without an experiment name goes
# The run's identity and lineage tags.
ADAPTER_TAG = "vlm_lora.adapter"
TRAINING_KEY_TAG = "vlm_lora.training_key"
SNAPSHOT_TAG = "vlm_lora.data_snapshot"
# `swift sft`'s own default when the config sets no report_to (ms-swift 4.x TrainArguments).
SWIFT_DEFAULT_REPORT_TO = ("tensorboard",)
# report_to values the project's images can serve: TensorBoard, MLflow and W&B are in the lock.
SUPPORTED_REPORT_TO = ("tensorboard", "mlflow", "wandb", "none")
PROBE_TIMEOUT_S = 10.0
MODEL_LINEAGE_FILE = "lineage.json"  # merge-export's record of base model, adapter and run
START_SERVER = "mlflow server --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 --port 5000"

_SECRET_PREFIXES = ("hf_", "ghp_", "gho_", "github_pat_", "sk-", "AKIA", "ya29.", "xox", "AIza", "-----BEGIN", "dapi")
_SECRET_KEY = re.compile(r"(?i)(token|secret|password|passwd|api_?key|credential)")
_TOKEN_LIKE = re.compile(r"[A-Za-z0-9_\-+/=.]{32,}")
REDACTED = "<redacted>"


class TrackingError(Exception):
    """The tracking server cannot be used and tracking is required; the message names the URI and the fix."""


@dataclass(frozen=True)
class Settings:
    """Where results are tracked.

    Attributes:
        uri: MLflow tracking server, http(s)://host[:port][/path]; "" = no MLflow.
        experiment: MLflow experiment name. Default "Default" (MLflow's own).
        required: Stop the task when the server cannot be reached (true), or go on without
            MLflow (false). Default true.
        model_name: Registered model in MLflow's model registry that evaluate and register add the
            adapter's version to (`components.common.mlflow_registry`); "" = none. Default "".
    """

    uri: str = ""
    experiment: str = DEFAULT_EXPERIMENT
    required: bool = True
    model_name: str = ""

    @classmethod
    def from_param(cls, param: Mapping[str, Any] | None) -> Settings:
        """Reads the component parameter `as_param` wrote ({} or None = no MLflow)."""
        p = dict(param or {})
        return cls(
            str(p.get("mlflow_uri") or ""),
            str(p.get("experiment") or DEFAULT_EXPERIMENT),
            p.get("required", True) is not False,
            str(p.get("register_model") or ""),
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Reads the training job's environment (`job_env`)."""
        return cls(
            env.get(ENV_URI, ""), env.get(ENV_EXPERIMENT) or DEFAULT_EXPERIMENT, env.get(ENV_REQUIRED, "1") != "0"
        )

    def as_param(self) -> dict[str, Any]:
        """The settings as a component parameter ({} when there is no server)."""
        if not self.uri:
            return {}
        out = {"mlflow_uri": self.uri, "experiment": self.experiment, "required": self.required}
        return {**out, "register_model": self.model_name} if self.model_name else out

    def job_env(self) -> dict[str, str]:
        """The settings as the training job's environment variables ({} when there is no server)."""
        if not self.uri:
            return {}
        return {ENV_URI: self.uri, ENV_EXPERIMENT: self.experiment, ENV_REQUIRED: "1" if self.required else "0"}


# ---------------------------------------------------------------- checks at config load (pure, no network)


def uri_problem(uri: str) -> str:
    """Why `uri` cannot be a tracking server for the pipeline ("" when it can).

    Only http(s) servers: a local file or sqlite store would stay on the task's machine. A user
    or password in the URI would end up in pipeline parameters and logs.
    """
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return (
            f"{redact_uri(uri)!r} is not an MLflow server URI: use http(s)://host[:port] of a tracking server "
            f"(locally: `{START_SERVER}`, then http://127.0.0.1:5000)"
        )
    if parts.username or parts.password:
        return (
            "the URI holds credentials (not echoed); remove them: a server that needs them reads "
            "MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD from the task's "
            "environment, never from the config"
        )
    return ""


def report_to_problem(report_to: Any, mlflow_uri: str, wandb_project: str = "") -> str:
    """Why `swift.report_to` cannot run in the training job ("" when it can).

    SwanLab and the other integrations are refused here rather than inside the GPU job: their packages
    are not in the lock or the images, and their keys are not allowed in the job environment. `mlflow`
    needs `tracking.mlflow_uri` (else the runs would land in the task's scratch folder), `wandb` a
    `tracking.wandb` section (its project, and where the key is read: `components.common.wandb_tracking`).
    """
    values = [report_to] if isinstance(report_to, str) else report_to
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        return f"must be one of {', '.join(SUPPORTED_REPORT_TO)} or a list of them, got {report_to!r}"
    for value in values:
        if value == "mlflow" and not mlflow_uri:
            return "names mlflow but tracking.mlflow_uri is not set: set it to your MLflow server (http://host:port)"
        if value == "wandb" and not wandb_project:
            return (
                "names wandb but tracking.wandb is not set: add tracking.wandb.project (and api_key_from: "
                "env:VAR or projects/P/secrets/S, never the key; docs/tracking.md)"
            )
        if value not in SUPPORTED_REPORT_TO:
            return (
                f"{value!r} is not supported: its package is not in the project's lock or training image and its "
                f"keys are not allowed in the job environment, so it would fail inside the GPU job; use "
                f"{', '.join(SUPPORTED_REPORT_TO)} (MLflow: set tracking.mlflow_uri; W&B: tracking.wandb)"
            )
    return ""


# ---------------------------------------------------------------- values that may be secrets


def redact_uri(uri: str) -> str:
    """`uri` without a user or password (for messages)."""
    parts = urlsplit(uri)
    if not (parts.username or parts.password):
        return uri
    host = parts.hostname or ""
    return urlunsplit(parts._replace(netloc=f"{REDACTED}@{host}" + (f":{parts.port}" if parts.port else "")))


def _looks_secret(value: str) -> bool:
    mixed = any(c.isdigit() for c in value) and any(c.isupper() for c in value) and any(c.islower() for c in value)
    found = secrets.find_secret(value)  # the one detector: prefixes, URL query tokens (user info: redact_uri)
    if found and not found[0].startswith("credentials in a URL (user"):
        return True
    return value.startswith(_SECRET_PREFIXES) or (bool(_TOKEN_LIKE.fullmatch(value)) and mixed and "/" not in value)


def scrub(value: Any, key: str = "") -> Any:
    """Returns `value` with secret-looking parts replaced by "<redacted>" (nested dicts and lists too).

    A key named like a secret (token, secret, password, api_key, credential), a token-like string
    (a known key prefix, or 32+ mixed letters and digits) and a URI's user and password are redacted.
    """
    if isinstance(value, Mapping):
        return {str(k): scrub(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub(v, key) for v in value]
    if not isinstance(value, str):
        return value
    if (key and _SECRET_KEY.search(key)) or _looks_secret(value):
        return REDACTED
    return redact_uri(value) if "://" in value else value


# ---------------------------------------------------------------- reachability (first use)


def probe(uri: str, timeout_s: float = PROBE_TIMEOUT_S, environ: Mapping[str, str] | None = None) -> str:
    """Asks the MLflow server at `uri` for one experiment; returns why it cannot be used ("" when it answers).

    Args:
        uri: The tracking server.
        timeout_s: Seconds to wait for the answer. Default 10.
        environ: Where MLFLOW_TRACKING_TOKEN / _USERNAME / _PASSWORD are read. Default os.environ.
    """
    env = os.environ if environ is None else environ
    request = urllib.request.Request(uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1")
    if env.get("MLFLOW_TRACKING_TOKEN"):
        request.add_header("Authorization", f"Bearer {env['MLFLOW_TRACKING_TOKEN']}")
    elif env.get("MLFLOW_TRACKING_USERNAME"):
        pair = f"{env['MLFLOW_TRACKING_USERNAME']}:{env.get('MLFLOW_TRACKING_PASSWORD', '')}".encode()
        request.add_header("Authorization", f"Basic {b64encode(pair).decode()}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            json.loads(answer.read() or b"{}")
        return ""
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            return f"answers {exc.code} (not authorised): give the task MLFLOW_TRACKING_TOKEN or USERNAME / PASSWORD"
        return f"answers {exc.code} to MLflow's REST API: is it an MLflow tracking server?"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"cannot be reached ({getattr(reason, 'strerror', None) or reason})"
    except ValueError:
        return "answers, but not with JSON: is it an MLflow tracking server?"


def refuse_or_warn(required: bool, where: str, problem: str, fix: str, task: str, tracker: str) -> None:
    """A tracker that cannot be used: TrackingError naming `where`, the problem and the fix when tracking is
    required; else one WARNING line, and the task goes on without `tracker` (MLflow, W&B)."""
    if required:
        raise TrackingError(f"{where} {problem}; {fix}")
    print(f"{task}: WARNING: {where} {problem}; going on without {tracker} (tracking.required is false)", flush=True)


def unreachable(settings: Settings, problem: str, task: str) -> None:
    """Raises TrackingError when tracking is required; else prints one warning line."""
    where = f"MLflow server {redact_uri(settings.uri)} (tracking.mlflow_uri)"
    fix = f"start it (`{START_SERVER}`) or correct the URI, or set tracking.required: false to go on without MLflow"
    refuse_or_warn(settings.required, where, problem, fix, task, "MLflow")


# ---------------------------------------------------------------- train-lora: `swift sft` reports to MLflow


def adapter_key(uri_or_path: str) -> str:
    """The adapter's identity in tags: its URI (a /gcs/ path as gs://), without a trailing slash."""
    return from_fuse_path(str(uri_or_path).rstrip("/"))


def training_tags(train_dir: str, adapter_out: str) -> dict[str, str]:
    """Tags of the training run: the adapter, and the training key and data snapshot of validate-data's lineage."""
    tags = {ADAPTER_TAG: adapter_key(adapter_out), "vlm_lora.task": "train-lora"}
    lineage = _read_json(Path(train_dir) / LINEAGE_FILE) if train_dir else {}
    if lineage.get("training_key"):
        tags[TRAINING_KEY_TAG] = str(lineage["training_key"])
    fingerprint = (
        (lineage.get("snapshot") or {}).get("fingerprint") if isinstance(lineage.get("snapshot"), dict) else ""
    )
    if fingerprint:
        tags[SNAPSHOT_TAG] = str(fingerprint)
    return tags


def report_args(args: Mapping[str, Any], job_env: Mapping[str, str], tags: Mapping[str, str]) -> tuple[dict, dict]:
    """The `swift sft` arguments and extra environment that send the training curves to MLflow (pure).

    With MLFLOW_TRACKING_URI in the job environment, `mlflow` joins report_to (the config's list, or
    ms-swift's default `tensorboard`; `none` becomes just `mlflow`), and MLFLOW_TAGS names the run's
    adapter and data for transformers' MLflowCallback; MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_NAME
    reach `swift sft` with the rest of the job environment. Without it: the arguments unchanged.

    Args:
        args: The run's swift arguments.
        job_env: The training job's environment variables.
        tags: The run's tags (`training_tags`).

    Returns:
        (swift arguments, environment variables to add to the job's).
    """
    settings = Settings.from_env(job_env)
    if not settings.uri:
        return dict(args), {}
    current = args.get("report_to", list(SWIFT_DEFAULT_REPORT_TO))
    report = [v for v in ([current] if isinstance(current, str) else list(current)) if v not in ("none", "mlflow")]
    out = {**args, "report_to": [*report, "mlflow"]}
    name = tags.get(TRAINING_KEY_TAG) or tags.get(ADAPTER_TAG)
    if "run_name" not in args and name:  # else ms-swift names the run after its scratch folder
        out["run_name"] = f"train-lora {name}"
    env = {ENV_TAGS: json.dumps(scrub(dict(tags)), sort_keys=True), ENV_NO_TELEMETRY: "true"}
    if ENV_EXPERIMENT not in job_env:
        env[ENV_EXPERIMENT] = settings.experiment
    return out, env


def prepare_training(
    args: Mapping[str, Any], job_env: Mapping[str, str], train_dir: str = "", adapter_out: str = ""
) -> tuple[dict, dict]:
    """Checks the tracking server, then returns `report_args` (train-lora calls it before `swift sft`).

    Args:
        args: The run's swift arguments.
        job_env: The training job's environment variables (MLFLOW_TRACKING_URI turns tracking on).
        train_dir: The validated training dataset (its lineage names the data). Default "".
        adapter_out: Where the adapter is written (the run's identity). Default "".

    Returns:
        (swift arguments, environment variables to add); unchanged and {} without a server, or when
        it cannot be reached and tracking is not required (`mlflow` then leaves report_to).

    Raises:
        TrackingError: The server cannot be reached and tracking is required (one line: the URI and the fix).
    """
    settings = Settings.from_env(job_env)
    if not settings.uri:
        return dict(args), {}
    problem = probe(settings.uri)
    if problem:
        unreachable(settings, problem, "train-lora")
        out = dict(args)
        if "report_to" in out:
            current = out["report_to"]
            out["report_to"] = [
                v for v in ([current] if isinstance(current, str) else current) if v != "mlflow"
            ] or "none"
        return out, {}
    out, env = report_args(args, job_env, training_tags(train_dir, adapter_out))
    print(
        f"train-lora: MLflow: training curves to {redact_uri(settings.uri)}, experiment {settings.experiment!r} "
        f"(report_to {' '.join(out['report_to'])})",
        flush=True,
    )
    return out, env


# ---------------------------------------------------------------- evaluate, register: figures and lineage


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path`; {} when the file is missing or is not a JSON object."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def numeric_figures(metrics: Mapping[str, Any], prefix: str) -> dict[str, float]:
    """The numeric entries of `metrics` (booleans as 0 / 1), keys prefixed; text and NaN left out."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, bool | int | float) and value == value:
            out[f"{prefix}{key}"] = float(value)
    return out


def lineage_record(model_uri: str, model_dir: str, model_meta: Mapping[str, Any]) -> tuple[dict, dict, dict]:
    """(tags, metrics, artifacts) of a merged model's lineage: base model, adapter, data snapshot, pipeline run."""
    data = _read_json(Path(model_dir) / LINEAGE_FILE) if model_dir else {}
    model = _read_json(Path(model_dir) / MODEL_LINEAGE_FILE) if model_dir else {}
    snapshot = data.get("snapshot") if isinstance(data.get("snapshot"), dict) else {}
    tags = {
        "vlm_lora.merged_model": model_uri,
        "vlm_lora.base_model": str(model_meta.get("base_model") or ""),
        ADAPTER_TAG: adapter_key(str(model_meta.get("adapter") or model.get("adapter") or "")),
        TRAINING_KEY_TAG: str(model_meta.get("training_key") or data.get("training_key") or ""),
        SNAPSHOT_TAG: str(snapshot.get("fingerprint") or model_meta.get("data_snapshot") or ""),  # the fingerprint
        "vlm_lora.pipeline_run": str(model_meta.get("run_id") or model.get("run_id") or ""),
    }
    counts = {f"data/{k}": float(data[k]) for k in ("n_rows", "n_train", "n_eval") if isinstance(data.get(k), int)}
    artifacts = {name: content for name, content in (("data_snapshot.json", data), ("lineage.json", model)) if content}
    return {k: v for k, v in tags.items() if v}, counts, artifacts


PARAM_PREFIX = "vlm_lora."  # beside the trainer's own parameters (MLflowCallback's), never one of their names
_MAX_PARAM = 6000  # characters MLflow keeps of a parameter value


def training_params(model_dir: str) -> dict[str, str]:
    """The LoRA and plan settings a merged model was trained with (lineage.json's training hyper-parameters:
    lora_rank, lora_alpha, target_modules, the planned micro-batch and accumulation, ...), as MLflow parameters."""
    model = _read_json(Path(model_dir) / MODEL_LINEAGE_FILE) if model_dir else {}
    training = model.get("training") if isinstance(model.get("training"), dict) else {}
    hyper = training.get("hyperparameters") if isinstance(training.get("hyperparameters"), dict) else {}
    return {f"{PARAM_PREFIX}{k}": str(v)[:_MAX_PARAM] for k, v in sorted(hyper.items())}


def adapter_files(model_dir: str) -> dict[str, Path]:
    """The adapter's top-level files (weights, adapter_config.json, args.json), named by lineage.json, as
    `adapter/<name>` artifacts; {} when the folder is not readable here (checkpoints are not included)."""
    model = _read_json(Path(model_dir) / MODEL_LINEAGE_FILE) if model_dir else {}
    folder = Path(str(model.get("adapter") or ""))
    if not model.get("adapter") or not (folder / "adapter_config.json").is_file():
        return {}
    return {f"adapter/{p.name}": p for p in sorted(folder.iterdir()) if p.is_file() and not p.is_symlink()}


def _experiment_id(client: Any, name: str) -> str:
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException:  # another task created it meanwhile
        return client.get_experiment_by_name(name).experiment_id


def _run_for(client: Any, experiment_id: str, tags: Mapping[str, str], task: str) -> str:
    """The newest run of the adapter (train-lora's, when it reported), else a new run with the lineage tags."""
    key = tags.get(ADAPTER_TAG, "")
    if key and "'" not in key:
        runs = client.search_runs(
            [experiment_id], f"tags.`{ADAPTER_TAG}` = '{key}'", order_by=["attributes.start_time DESC"], max_results=1
        )
        if runs:
            return runs[0].info.run_id
    name = f"{task} {tags.get(TRAINING_KEY_TAG) or Path(key).name or 'model'}"
    run = client.create_run(experiment_id, run_name=name, tags=dict(tags))
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def record(
    settings: Mapping[str, Any] | None,
    task: str,
    *,
    model_uri: str,
    model_dir: str,
    model_meta: Mapping[str, Any],
    metrics: Mapping[str, Any] | None = None,
    tags: Mapping[str, Any] | None = None,
    files: Mapping[str, str | Path] | None = None,
) -> str:
    """Adds a task's figures, the data snapshot and the lineage to the adapter's MLflow run, with the LoRA and
    plan settings as parameters (`training_params`) and the adapter's files as artifacts (`adapter_files`).

    Args:
        settings: The component's tracking parameter (`Settings.as_param`); {} or None = no MLflow.
        task: The recording task ("evaluate", "register"): metric prefix and artifact folder.
        model_uri: The merged model's URI.
        model_dir: The merged model's local (or /gcs/) folder: its data_snapshot.json and lineage.json.
        model_meta: The merged model's metadata (adapter, base_model, training_key, data_snapshot, run_id).
        metrics: Figures to log as `<task>/<name>` (text values are left out). Default none.
        tags: Extra tags, e.g. the registered version. Default none.
        files: Local files to upload, {artifact path ("evaluate/report.html"): file}; a missing one is left
            out. Default none.

    Returns:
        The MLflow run ID ("" when there is no server, or it cannot be reached and tracking is not required).

    Raises:
        TrackingError: The server cannot be reached (or refuses a write) and tracking is required.
    """
    s = Settings.from_param(settings)
    if not s.uri:
        return ""
    problem = probe(s.uri)
    if problem:
        unreachable(s, problem, task)
        return ""
    os.environ.setdefault(ENV_NO_TELEMETRY, "true")
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.exceptions import MlflowException

    lineage_tags, counts, artifacts = lineage_record(model_uri, model_dir, model_meta)
    all_tags = scrub({**lineage_tags, **{f"vlm_lora.{task}.{k}": str(v) for k, v in (tags or {}).items()}})
    figures = {**counts, **numeric_figures(metrics or {}, f"{task}/")}
    try:
        client = MlflowClient(s.uri)
        run_id = _run_for(client, _experiment_id(client, s.experiment), lineage_tags, task)
        stamp = _now_ms()
        items = [Metric(k, v, stamp, 0) for k, v in sorted(figures.items())]
        tag_items = [RunTag(k, v) for k, v in sorted(all_tags.items())]
        for i in range(0, max(len(items), len(tag_items)), 100):  # MLflow takes at most 1000 per call, 100 tags
            client.log_batch(run_id, metrics=items[i : i + 100], tags=tag_items[i : i + 100])
        params = [Param(k, str(scrub(v, k))) for k, v in training_params(model_dir).items()]
        for i in range(0, len(params), 100):  # the same values again on a second record: MLflow accepts them
            client.log_batch(run_id, params=params[i : i + 100])
        for name, content in artifacts.items():
            client.log_dict(run_id, scrub(content), f"lineage/{name}")
        uploads = {**adapter_files(model_dir), **{k: Path(v) for k, v in (files or {}).items()}}
        for name, path in uploads.items():
            if path.is_file():
                folder, _, leaf = name.rpartition("/")
                _log_file(client, run_id, path, folder, leaf)
        if metrics:
            client.log_dict(run_id, scrub(dict(metrics)), f"{task}/metrics.json")
    except MlflowException as exc:
        unreachable(s, f"refused the write ({str(exc).splitlines()[0][:200]})", task)
        return ""
    print(f"{task}: MLflow: recorded in run {run_id} of experiment {s.experiment!r} at {redact_uri(s.uri)}", flush=True)
    return run_id


def attach_files(
    settings: Mapping[str, Any] | None, adapter_out: str, files: Mapping[str, str | Path], task: str
) -> str:
    """Uploads a task's files (train-lora's loss-curve report) into the adapter's MLflow run.

    Args:
        settings: The tracking parameter (`Settings.as_param`); {} or None = no MLflow.
        adapter_out: The adapter's folder or URI (the run's ADAPTER_TAG).
        files: {artifact path: local file}; a missing file is left out.
        task: The uploading task, for messages and a run opened when none exists.

    Returns:
        The run ID ("" without a server, or when it cannot be reached and tracking is not required).

    Raises:
        TrackingError: The server cannot be reached (or refuses the write) and tracking is required.
    """
    s = Settings.from_param(settings)
    if not s.uri:
        return ""
    problem = probe(s.uri)
    if problem:
        unreachable(s, problem, task)
        return ""
    os.environ.setdefault(ENV_NO_TELEMETRY, "true")
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        client = MlflowClient(s.uri)
        run_id = _run_for(client, _experiment_id(client, s.experiment), {ADAPTER_TAG: adapter_key(adapter_out)}, task)
        for name, path in files.items():
            if Path(path).is_file():
                folder, _, leaf = name.rpartition("/")
                _log_file(client, run_id, Path(path), folder, leaf)
    except MlflowException as exc:
        unreachable(s, f"refused the write ({str(exc).splitlines()[0][:200]})", task)
        return ""
    return run_id


def _log_file(client: Any, run_id: str, path: Path, folder: str, leaf: str) -> None:
    """Uploads one file as `folder/leaf` (a copy under its artifact name when the file's own name differs)."""
    if path.name == leaf:
        client.log_artifact(run_id, str(path), folder or None)
        return
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory(prefix="vlm-lora-artifact-") as tmp:
        copy = Path(tmp) / leaf
        shutil.copyfile(path, copy)
        client.log_artifact(run_id, str(copy), folder or None)


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)
