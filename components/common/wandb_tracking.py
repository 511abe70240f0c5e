"""Weights & Biases: the contents MLflow gets (`components.common.tracking`), in one W&B run per adapter.

train-lora's `swift sft` reports through transformers' `WandbCallback` (`report_to wandb`): the job
environment carries WANDB_PROJECT / WANDB_ENTITY (`WandbSettings.job_env`), and `prepare_training` adds
WANDB_RUN_ID (`run_id`: derived from the adapter, as MLflow's run is found by its adapter tag) and
WANDB_RESUME=allow. evaluate and register open the same run by that ID (`record`) and add their figures
(summary `<task>/<name>`), the LoRA and plan settings (config `vlm_lora.<name>`), the lineage (config
`vlm_lora.lineage`; files `lineage/*.json`), the reports (files) and the adapter (an artifact of type
`model`). A re-run that reuses a cached adapter adds to the same run.

The API key is never a parameter, a log line or an environment value of the job spec: `api_key_from`
names it (`env:VAR` or a Secret Manager version, `components.common.model_sources.read_token`), and the
task reads it at run time into its own process environment (WANDB_API_KEY), where `swift sft` inherits it.
Without `api_key_from`, W&B's own login (WANDB_API_KEY in the task's environment, ~/.netrc) applies.

An unreachable W&B server (WANDB_BASE_URL, default https://api.wandb.ai) is `tracking.unreachable`:
with tracking.required the task stops (train-lora before `swift sft`), else one WARNING line and the run
goes on without W&B. WANDB_MODE=offline (or disabled) skips the check: the run is written to WANDB_DIR
for a later `wandb sync`.

`wandb` (the `tracking` extra) is imported only when a run is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.common import tracking
from components.common.tracking import ENV_REQUIRED, TrackingError, adapter_key, scrub

ENV_PROJECT = "WANDB_PROJECT"  # transformers' WandbCallback reads it (default "huggingface")
ENV_ENTITY = "WANDB_ENTITY"
ENV_LOGIN_FROM = "VLM_LORA_WANDB_LOGIN_FROM"  # where the API key is read (a reference, never the key)
ENV_API_KEY = "WANDB_API_KEY"  # set in the task's own process only
ENV_RUN_ID = "WANDB_RUN_ID"
ENV_RESUME = "WANDB_RESUME"
# wandb reports its own errors to Sentry unless this is "false": `swift sft` gets it with the run ID, and
# `record` sets it in its process unless the environment has it (as MLflow's telemetry is turned off).
ENV_NO_ERROR_REPORTS = "WANDB_ERROR_REPORTING"
DEFAULT_BASE_URL = "https://api.wandb.ai"
_OFFLINE = ("offline", "dryrun", "disabled")
RUN_ID_HEX = 24  # hex digits of sha256(adapter) in the run ID: W&B IDs take [a-z0-9], 64 characters at most


@dataclass(frozen=True)
class WandbSettings:
    """Where W&B results go.

    Attributes:
        project: W&B project; "" = no W&B.
        entity: W&B entity (team or user); "" = the API key's default. Default "".
        api_key_from: Where the key is read at run time: "env:VAR" or "projects/P/secrets/S[/versions/V]";
            "" = W&B's own login. Default "".
        required: Stop the task when W&B cannot be reached (tracking.required). Default true.
    """

    project: str = ""
    entity: str = ""
    api_key_from: str = ""
    required: bool = True

    @classmethod
    def from_param(cls, param: Mapping[str, Any] | None) -> WandbSettings:
        """Reads the `wandb` entry of the component's tracking parameter ({} or None = no W&B)."""
        p = dict((param or {}).get("wandb") or {})
        return cls(str(p.get("project") or ""), str(p.get("entity") or ""), str(p.get("api_key_from") or ""),
                   p.get("required", True) is not False)  # fmt: skip

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WandbSettings:
        """Reads the training job's environment (`job_env`)."""
        return cls(env.get(ENV_PROJECT, ""), env.get(ENV_ENTITY, ""), env.get(ENV_LOGIN_FROM, ""),
                   env.get(ENV_REQUIRED, "1") != "0")  # fmt: skip

    def as_param(self) -> dict[str, Any]:
        """The `wandb` entry of the component's tracking parameter ({} without a project)."""
        if not self.project:
            return {}
        return {"project": self.project, "entity": self.entity, "api_key_from": self.api_key_from,
                "required": self.required}  # fmt: skip

    def job_env(self) -> dict[str, str]:
        """The training job's environment variables ({} without a project)."""
        if not self.project:
            return {}
        env = {ENV_PROJECT: self.project, ENV_REQUIRED: "1" if self.required else "0"}
        env.update({k: v for k, v in ((ENV_ENTITY, self.entity), (ENV_LOGIN_FROM, self.api_key_from)) if v})
        return env


def run_id(adapter: str) -> str:
    """The W&B run ID of an adapter: "vlm" + the first RUN_ID_HEX hex digits of sha256(its URI)."""
    return "vlm" + hashlib.sha256(adapter_key(adapter).encode()).hexdigest()[:RUN_ID_HEX]


def base_url(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return (env.get("WANDB_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")


def probe(timeout_s: float = tracking.PROBE_TIMEOUT_S, environ: Mapping[str, str] | None = None) -> str:
    """Why W&B's server cannot be reached ("" when it answers, or WANDB_MODE is offline / disabled).

    Any HTTP answer counts (the key is checked by W&B itself); only a failed connection is a problem.
    """
    env = os.environ if environ is None else environ
    if env.get("WANDB_MODE", "").lower() in _OFFLINE:
        return ""
    try:
        with urllib.request.urlopen(base_url(env) + "/healthz", timeout=timeout_s):
            return ""
    except urllib.error.HTTPError:
        return ""
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"cannot be reached ({getattr(reason, 'strerror', None) or reason})"


def _unreachable(s: WandbSettings, problem: str, task: str) -> None:
    """Raises TrackingError when tracking is required, else one WARNING line (W&B's server named)."""
    where = f"W&B server {base_url()} (tracking.wandb, WANDB_BASE_URL)"
    fix = (
        "check the network or WANDB_BASE_URL, set WANDB_MODE=offline to write the run for a later `wandb sync`, "
        "or set tracking.required: false to go on without W&B"
    )
    tracking.refuse_or_warn(s.required, where, problem, fix, task, "W&B")


def login(s: WandbSettings) -> None:
    """Reads the API key from `api_key_from` into this process's WANDB_API_KEY (unless it is set already).

    Raises:
        TrackingError: The reference cannot be read (the message names the reference, never a key).
    """
    if not s.api_key_from or os.environ.get(ENV_API_KEY):
        return
    from components.common.model_sources import SourceError, read_token

    try:
        key = read_token(s.api_key_from, ENV_API_KEY)
    except SourceError as exc:
        raise TrackingError(f"W&B API key (tracking.wandb.api_key_from): {exc}") from None
    if key:
        os.environ[ENV_API_KEY] = key


def ready(s: WandbSettings, task: str) -> bool:
    """Checks W&B's server and reads the key (`probe`, `login`); turns wandb's Sentry reports off in this process.

    Returns:
        True to write to W&B; False after one WARNING line when it cannot be used and tracking is not required.

    Raises:
        TrackingError: The server cannot be reached or the key not read, and tracking is required.
    """
    problem = probe()
    if not problem:
        try:
            login(s)
        except TrackingError as exc:
            problem = f"cannot be used: {exc}"
    if problem:
        _unreachable(s, problem, task)
        return False
    os.environ.setdefault(ENV_NO_ERROR_REPORTS, "false")
    return True


# ---------------------------------------------------------------- train-lora: `swift sft` reports to W&B


def prepare_training(
    args: Mapping[str, Any], job_env: Mapping[str, str], adapter_out: str = "", tags: Mapping[str, str] | None = None
) -> tuple[dict, dict]:
    """Checks W&B, reads the key, and returns the `swift sft` arguments and environment that report to it.

    With WANDB_PROJECT in the job environment, `wandb` joins report_to (`none` becomes just `wandb`), and
    WANDB_RUN_ID (`run_id(adapter_out)`) and WANDB_RESUME=allow make transformers' WandbCallback open the
    adapter's run. Without it: the arguments unchanged.

    Args:
        args: The run's swift arguments (after `tracking.prepare_training`).
        job_env: The training job's environment variables.
        adapter_out: Where the adapter is written (the run's identity). Default "".
        tags: The run's lineage tags (`tracking.training_tags`), for the run's name. Default none.

    Returns:
        (swift arguments, environment variables to add); unchanged and {} without a project, or when W&B
        cannot be reached and tracking is not required (`wandb` then leaves report_to).

    Raises:
        TrackingError: W&B cannot be reached (or the key not read) and tracking is required.
    """
    s = WandbSettings.from_env(job_env)
    current = args.get("report_to", list(tracking.SWIFT_DEFAULT_REPORT_TO))
    others = [v for v in ([current] if isinstance(current, str) else list(current)) if v not in ("none", "wandb")]
    if not s.project:
        return dict(args), {}
    if not ready(s, "train-lora"):
        return ({**args, "report_to": others or "none"} if "report_to" in args else dict(args)), {}
    out = {**args, "report_to": [*others, "wandb"]}
    name = (tags or {}).get(tracking.TRAINING_KEY_TAG) or adapter_key(adapter_out)
    if "run_name" not in out and name:
        out["run_name"] = f"train-lora {name}"
    print(f"train-lora: W&B: training curves to project {s.project!r}, run {run_id(adapter_out)}", flush=True)
    return out, {ENV_RUN_ID: run_id(adapter_out), ENV_RESUME: "allow", ENV_NO_ERROR_REPORTS: "false"}


# ---------------------------------------------------------------- evaluate, register: figures and lineage


def record(
    settings: Mapping[str, Any] | None, task: str, *, model_uri: str, model_dir: str, model_meta: Mapping[str, Any],
    metrics: Mapping[str, Any] | None = None, files: Mapping[str, str | Path] | None = None,
) -> str:  # fmt: skip
    """Adds a task's figures, the lineage, the LoRA and plan settings, its files and the adapter to the adapter's
    W&B run (the same contents as `tracking.record` gives MLflow).

    Args:
        settings: The component's tracking parameter; its `wandb` entry (`WandbSettings.as_param`) turns W&B on.
        task: The recording task ("evaluate", "register"): summary prefix and file folder.
        model_uri: The merged model's URI.
        model_dir: The merged model's local (or /gcs/) folder.
        model_meta: The merged model's metadata (adapter, base_model, training_key, data_snapshot, run_id).
        metrics: Figures for the run's summary as `<task>/<name>` (text left out). Default none.
        files: {file name in the run ("evaluate/report.html"): local file}; a missing one is left out. Default none.

    Returns:
        The W&B run ID ("" without W&B, or when it cannot be reached and tracking is not required).

    Raises:
        TrackingError: W&B cannot be reached (or the key not read) and tracking is required.
    """
    s = WandbSettings.from_param(settings)
    if not s.project:
        return ""
    if not ready(s, task):
        return ""
    tags, counts, lineage_files = tracking.lineage_record(model_uri, model_dir, model_meta)
    ident = run_id(tags.get(tracking.ADAPTER_TAG) or model_uri)
    config = {**tracking.training_params(model_dir), "vlm_lora.lineage": tags}
    figures = {**counts, **tracking.numeric_figures(metrics or {}, f"{task}/")}
    try:
        run = _open_run(s, ident, task, tags)
    except Exception as exc:  # noqa: BLE001 - wandb's errors (a refused key, a server error) are one message
        _unreachable(s, f"refused the run ({exc.__class__.__name__}: {str(exc).splitlines()[0][:200]})", task)
        return ""
    try:
        run.config.update(scrub(config), allow_val_change=True)
        run.summary.update(figures)
        blobs = {f"lineage/{name}": json.dumps(scrub(c), indent=1) for name, c in lineage_files.items()}
        if metrics:
            blobs[f"{task}/metrics.json"] = json.dumps(scrub(dict(metrics)), indent=1, default=str)
        _save_files(run, blobs, {k: Path(v) for k, v in (files or {}).items()})
        _log_adapter(run, ident, tracking.adapter_files(model_dir))
    finally:
        run.finish()
        _teardown()
    print(f"{task}: W&B: recorded in run {ident} of project {s.project!r}", flush=True)
    return ident


def attach_files(
    settings: Mapping[str, Any] | None, adapter_out: str, files: Mapping[str, str | Path], task: str
) -> str:
    """Saves a task's files (train-lora's loss-curve report) into the adapter's W&B run.

    Args:
        settings: A tracking parameter with a `wandb` entry; none = no W&B.
        adapter_out: The adapter's folder or URI (the run's ID, `run_id`).
        files: {file name in the run: local file}; a missing file is left out.
        task: The saving task, for messages.

    Returns:
        The run ID ("" without W&B, or when it cannot be reached and tracking is not required).

    Raises:
        TrackingError: W&B cannot be reached (or the key not read) and tracking is required.
    """
    s = WandbSettings.from_param(settings)
    if not s.project:
        return ""
    if not ready(s, task):
        return ""
    ident = run_id(adapter_out)
    try:
        run = _open_run(s, ident, task, {})
    except Exception as exc:  # noqa: BLE001 - wandb's errors are one message
        _unreachable(s, f"refused the run ({exc.__class__.__name__}: {str(exc).splitlines()[0][:200]})", task)
        return ""
    try:
        _save_files(run, {}, {k: Path(v) for k, v in files.items()})
    finally:
        run.finish()
        _teardown()
    return ident


def wait_for_free_offline_folder(ident: str, root: Path | None = None) -> None:
    """Offline, wandb names a run's folder `offline-run-<local second>-<id>`: a second record of the same run within
    the same second would write into the first one's folder and one of the two would be lost. Waits (at most 3 s)
    until this second's folder name is free."""
    if os.environ.get("WANDB_MODE") != "offline":
        return
    base = root or Path(os.environ.get("WANDB_DIR") or ".") / "wandb"
    for _ in range(3):
        if not (base / f"offline-run-{time.strftime('%Y%m%d_%H%M%S')}-{ident}").exists():
            return
        time.sleep(1.0 - time.time() % 1.0 + 0.01)


def _open_run(s: WandbSettings, ident: str, task: str, tags: Mapping[str, str]) -> Any:
    """Opens (or resumes) run `ident`; named after the training key when the tags hold it, else unrenamed."""
    import wandb

    wait_for_free_offline_folder(ident)

    key = tags.get(tracking.TRAINING_KEY_TAG)
    name = f"train-lora {key}" if key else None
    return wandb.init(
        project=s.project, entity=s.entity or None, id=ident, resume="allow", name=name, job_type=task,
        settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
    )  # fmt: skip


def _save_files(run: Any, blobs: Mapping[str, str], files: Mapping[str, Path]) -> None:
    """Writes `blobs` and copies `files` into the run's folder under their names, then saves them to the run."""
    root = Path(run.dir)
    for name, text in blobs.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
        run.save(str(root / name), base_path=str(root), policy="now")
    for name, path in files.items():
        if path.is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, root / name)
            run.save(str(root / name), base_path=str(root), policy="now")


def _log_adapter(run: Any, ident: str, adapter: Mapping[str, Path]) -> None:
    """Logs the adapter's files as a W&B artifact of type `model` ("adapter-<run ID>"); nothing when unreadable."""
    if not adapter:
        return
    import wandb

    artifact = wandb.Artifact(f"adapter-{ident}", type="model", metadata={"files": sorted(adapter)})
    for name, path in adapter.items():
        artifact.add_file(str(path), name=name.removeprefix("adapter/"))
    run.log_artifact(artifact)


def _teardown() -> None:
    """Stops this process's wandb service once its run is written (offline: the run file complete on disk), and
    drops WANDB_SERVICE from the environment, so a later child process (`swift sft`) starts its own."""
    import wandb

    wandb.teardown()
