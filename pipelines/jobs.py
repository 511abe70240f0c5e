"""Operate on a config's Vertex AI pipeline runs: list, show, stream logs, cancel, fetch outputs.

    vlm-lora jobs ls     --config F [--limit N]
    vlm-lora jobs show   --config F [RUN]
    vlm-lora jobs logs   --config F [RUN] [--task NAME] [--follow] [--lines N]
    vlm-lora jobs cancel --config F RUN
    vlm-lora jobs fetch  --config F [RUN] [--dest DIR] [--only model,report,metrics,predictions,data]

RUN is a pipeline job ID (`vlm-lora jobs ls` lists them) or its resource name; without it,
the config's newest run. A config's runs are the pipeline jobs labelled with its pipeline
name (`pipeline=<pipeline.name>`, the label `vlm-lora run` and `schedule` put on every job);
project and region come from the config (or `--project` / `vertex.project=...`).

* `show`: each task's state, start, duration, and links to its page in the console, its
  CustomJob and its logs.
* `logs`: the run's log entries from Cloud Logging (entries:list): the containers of every
  task (`resource.type="ml_job"`, the CustomJobs the tasks ran as, train-lora's own CustomJob
  included) and the pipeline's own events; `--task` keeps one task's. `--follow` polls every
  `--poll` seconds until the run ends (then reads once more), at most `--follow-for` seconds.
* `cancel`: asks Vertex to cancel a run that has not ended.
* `fetch`: downloads the run's output artifacts from Cloud Storage into DEST/<task>/<output>/
  (merged model and adapter, reports, metrics, predictions; `--only data` adds the validated
  datasets), writes each Metrics artifact's figures to DEST/<task>/<output>.json and the
  whole run (tasks, artifacts, URIs, metadata) to DEST/run.json. Files already there with the
  same size and crc32c are not downloaded again. The staged base model (a model-cache entry,
  not a run output) is left out.

The pure part (filters, rows, lines, which artifacts to fetch) takes and returns dicts: the
REST form of the resources. The I/O part uses google-cloud-aiplatform for pipeline jobs,
google-auth's AuthorizedSession for Cloud Logging and google-cloud-storage for fetch, with
Application Default Credentials; credentials and API errors are one line with the fix.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import sys
import time
import urllib.parse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from components.common import cli_numbers
from pipelines.cli import program
from pipelines.config import Config, load_config, parse_overrides
from pipelines.vertex import PLACEHOLDER_MARKERS, VertexError, command_errors, console_link, init_vertex

ENDED = {"PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED", "PIPELINE_STATE_CANCELLED"}
LOGGING_ENDPOINT = "https://logging.googleapis.com"
CLOUD_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
PIPELINE_RESOURCE = "aiplatform.googleapis.com/PipelineJob"
STAGE_TASK = "stage-model"  # its Model is the base model's cache entry, not a run output
# What `fetch` can download, by kind; the default leaves out "data" (the validated train / eval copies).
KINDS = ("model", "report", "metrics", "predictions", "data")
DEFAULT_KINDS = ("model", "report", "metrics", "predictions")


# --- the pure part: dicts in, dicts and strings out -----------------------------------


def pipeline_label(cfg: Config) -> str:
    """The `pipeline` label value `vlm-lora run` puts on a config's jobs (`pipelines.vertex.run_labels`)."""
    from pipelines.vertex import run_labels

    return run_labels(dataclasses.replace(cfg, vertex=dataclasses.replace(cfg.vertex, labels={})))["pipeline"]


def list_filter(cfg: Config) -> str:
    """The pipelineJobs.list filter that selects a config's runs."""
    return f'labels.pipeline="{pipeline_label(cfg)}"'


def job_resource_name(cfg: Config, run: str) -> str:
    """A pipeline job's resource name from its ID, resource name or console URL, in the config's project / region."""
    run = run.strip().rstrip("/")
    if run.startswith("projects/"):
        return run
    if run.startswith("https://"):
        run = urllib.parse.urlsplit(run).path.rstrip("/").rsplit("/", 1)[-1]
    return f"projects/{cfg.vertex.project}/locations/{cfg.vertex.region}/pipelineJobs/{run}"


def _time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _clock(value: str | None) -> str:
    """An RFC 3339 time as 'YYYY-MM-DD HH:MM:SS' (UTC as given); '-' when absent."""
    moment = _time(value)
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else "-"


def duration_s(start: str | None, end: str | None, now: datetime | None = None) -> float | None:
    """Seconds from start to end (to `now` while running); None without a start."""
    begin = _time(start)
    if begin is None:
        return None
    finish = _time(end) or now
    return (finish - begin).total_seconds() if finish else None


def _span(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _short_state(state: str) -> str:
    return state.replace("PIPELINE_STATE_", "").replace("JOB_STATE_", "")


def run_row(job: dict[str, Any], now: datetime | None = None) -> dict[str, Any]:
    """One line's worth of a pipeline job: id, state, created, duration, labels, console link."""
    name = job.get("name", "")
    return {
        "id": name.rsplit("/", 1)[-1],
        "name": name,
        "state": _short_state(job.get("state", "")),
        "created": _clock(job.get("create_time")),
        "duration": _span(duration_s(job.get("start_time"), job.get("end_time"), now)),
        "config": (job.get("labels") or {}).get("config", ""),
        "link": console_link(name),
    }


def format_runs(jobs: list[dict[str, Any]], now: datetime | None = None) -> str:
    """The `jobs ls` table: newest first."""
    rows = [
        run_row(j, now) for j in sorted(jobs, key=lambda j: _timestamp_key(j.get("create_time") or ""), reverse=True)
    ]
    if not rows:
        return ""
    width = max(len(r["id"]) for r in rows)
    lines = [f"{'RUN'.ljust(width)}  {'STATE':<10} {'CREATED (UTC)':<19}  {'TIME':>9}  CONFIG"]
    lines += [
        f"{r['id'].ljust(width)}  {r['state']:<10} {r['created']:<19}  {r['duration']:>9}  {r['config']}" for r in rows
    ]
    return "\n".join(lines)


def _custom_job_ids(uris: list[str]) -> list[str]:
    return [u.rstrip("/").rsplit("/", 1)[-1] for u in uris if "/customJobs/" in u]


def task_job_ids(task: dict[str, Any]) -> list[str]:
    """The CustomJob IDs a task ran as: its container's job (and failed attempts), a custom-job task's
    job, and the CustomJob a GCPC launcher created (its `gcp_resources` output: train-lora on Vertex)."""
    detail = task.get("executor_detail") or {}
    container = detail.get("container_detail") or {}
    custom = detail.get("custom_job_detail") or {}
    uris = [container.get("main_job", ""), *(container.get("failed_main_jobs") or [])]
    uris += [custom.get("job", ""), *(custom.get("failed_jobs") or [])]
    metadata = (task.get("execution") or {}).get("metadata") or {}
    raw = metadata.get("output:gcp_resources") or ""
    try:
        resources = json.loads(raw).get("resources", []) if raw else []
    except (ValueError, AttributeError):
        resources = []
    uris += [r.get("resourceUri", "") for r in resources if r.get("resourceType") == "CustomJob"]
    ids = _custom_job_ids([u for u in uris if u])
    return list(dict.fromkeys(ids))


def pipeline_tasks(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The job's tasks without the root DAG task (the one that is every other task's parent)."""
    tasks = list((job.get("job_detail") or {}).get("task_details") or [])

    def parent(task: dict[str, Any]) -> str:
        return str(task.get("parent_task_id") or "0")  # int64 fields come as strings in the REST form

    parents = {parent(t) for t in tasks} - {"0"}
    return [t for t in tasks if not (parent(t) == "0" and str(t.get("task_id")) in parents)]


def custom_job_link(project: str, region: str, job_id: str) -> str:
    """The console page of a CustomJob."""
    return f"https://console.cloud.google.com/vertex-ai/locations/{region}/training/{job_id}/cpu?project={project}"


def logs_link(project: str, log_filter: str) -> str:
    """The Logs Explorer URL of a filter."""
    return (
        f"https://console.cloud.google.com/logs/query;query={urllib.parse.quote(log_filter, safe='')}?project={project}"
    )


def log_filter(job: dict[str, Any], task: str | None = None, after: str | None = None) -> str:
    """The Cloud Logging filter of a run's entries (one task's with `task`), from `after` or the job's creation.

    Raises:
        VertexError: `task` is not one of the run's tasks, or it has not started a job yet.
    """
    job_id = job.get("name", "").rsplit("/", 1)[-1]
    tasks = pipeline_tasks(job)
    if task:
        chosen = [t for t in tasks if t.get("task_name") == task]
        if not chosen:
            names = [t.get("task_name", "") for t in tasks]
            close = difflib.get_close_matches(task, names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f" (tasks: {', '.join(names) or 'none yet'})"
            raise VertexError(f"run {job_id} has no task '{task}'{hint}")
        ids = task_job_ids(chosen[0])
        if not ids:
            raise VertexError(
                f"task '{task}' of run {job_id} has not started a job yet (state {_task_state(chosen[0])})"
            )
        clause = _ml_jobs_clause(ids)
    else:
        ids = [i for t in tasks for i in task_job_ids(t)]
        pipeline = f'(resource.type="{PIPELINE_RESOURCE}" AND resource.labels.pipeline_job_id="{job_id}")'
        clause = f"({_ml_jobs_clause(ids)} OR {pipeline})" if ids else pipeline
    since = after or job.get("create_time") or ""
    # entries:list reads only the last 24 hours unless the filter names a time
    return f'{clause} AND timestamp>="{since}"' if since else clause


def task_pending(job: dict[str, Any], task: str | None) -> bool:
    """True while a run that has not ended has yet to start `task`'s job: the task is there without a
    job, or not there yet and not a misspelling of a task that is (that one is an error at once)."""
    if not task or job.get("state") in ENDED:
        return False
    tasks = {t.get("task_name", ""): t for t in pipeline_tasks(job)}
    if task in tasks:
        return not task_job_ids(tasks[task])
    return not difflib.get_close_matches(task, list(tasks), n=1)


def _timestamp_key(stamp: str) -> str:
    """An RFC 3339 UTC time ('...:05Z', '...:05.12Z', nanoseconds) as a string that sorts in time order."""
    if len(stamp) < 19:
        return stamp
    fraction = stamp[19:].rstrip("Z").lstrip(".")
    return stamp[:19] + fraction.ljust(9, "0")


def _ml_jobs_clause(ids: list[str]) -> str:
    return '(resource.type="ml_job" AND resource.labels.job_id=(' + " OR ".join(f'"{i}"' for i in ids) + "))"


def _task_state(task: dict[str, Any]) -> str:
    return str(task.get("state") or "PENDING")


def task_rows(job: dict[str, Any], now: datetime | None = None) -> list[dict[str, Any]]:
    """Each task of a run: name, state, start, duration, CustomJob IDs and console links, in start order."""
    fields = dict(zip(job.get("name", "").split("/")[::2], job.get("name", "").split("/")[1::2]))
    project, region = fields.get("projects", ""), fields.get("locations", "")
    rows = []
    for task in pipeline_tasks(job):
        ids = task_job_ids(task)
        error = ((task.get("error") or {}).get("message") or "").strip()
        rows.append(
            {
                "task": task.get("task_name", ""),
                "state": _task_state(task),
                "start": _clock(task.get("start_time")),
                "start_raw": task.get("start_time") or "",
                "duration": _span(duration_s(task.get("start_time"), task.get("end_time"), now)),
                "jobs": ids,
                "job_links": [custom_job_link(project, region, i) for i in ids],
                "logs_link": logs_link(project, _ml_jobs_clause(ids)) if ids else "",
                "error": error.splitlines()[0] if error else "",
            }
        )
    rows.sort(key=lambda r: (r.pop("start_raw") or "~", r["task"]))  # not started yet: last
    return rows


def format_show(job: dict[str, Any], now: datetime | None = None) -> str:
    """The `jobs show` text: the run, then one block per task with its links."""
    run = run_row(job, now)
    lines = [
        f"run:     {run['id']} ({job.get('display_name', '')})",
        f"state:   {run['state']}",
        f"created: {run['created']} UTC, ran {run['duration']}",
        f"console: {run['link']}",
    ]
    error = ((job.get("error") or {}).get("message") or "").strip()
    if error:
        lines.append(f"error:   {error.splitlines()[0][:300]}")
    rows = task_rows(job, now)
    if not rows:
        lines.append("tasks:   none started yet")
        return "\n".join(lines)
    width = max(len(r["task"]) for r in rows)
    lines += ["", f"{'TASK'.ljust(width)}  {'STATE':<14} {'STARTED (UTC)':<19}  {'TIME':>9}"]
    for r in rows:
        lines.append(f"{r['task'].ljust(width)}  {r['state']:<14} {r['start']:<19}  {r['duration']:>9}")
        if r["error"]:
            lines.append(f"    error: {r['error'][:300]}")
        for link in r["job_links"]:
            lines.append(f"    job:  {link}")
        if r["logs_link"]:
            lines.append(f"    logs: {r['logs_link']}")
    return "\n".join(lines)


def job_names_by_id(job: dict[str, Any]) -> dict[str, str]:
    """{CustomJob ID: task name} of a run, to label log lines."""
    return {i: t.get("task_name", "") for t in pipeline_tasks(job) for i in task_job_ids(t)}


def format_entry(entry: dict[str, Any], tasks: dict[str, str]) -> str:
    """One log entry as 'TIME TASK [SEVERITY] text' (severity shown from WARNING up)."""
    resource = entry.get("resource") or {}
    labels = resource.get("labels") or {}
    who = tasks.get(labels.get("job_id", ""), "") or ("pipeline" if resource.get("type") == PIPELINE_RESOURCE else "")
    payload = entry.get("jsonPayload") or {}
    text = entry.get("textPayload")
    if text is None:
        text = payload.get("message") if isinstance(payload.get("message"), str) else json.dumps(payload)
    severity = entry.get("severity", "")
    marker = f" {severity}" if severity in ("WARNING", "ERROR", "CRITICAL", "ALERT", "EMERGENCY") else ""
    stamp = (entry.get("timestamp") or "")[:19].replace("T", " ")
    return f"{stamp} {who or '-'}{marker} {str(text).rstrip()}"


def artifact_kind(task: str, output: str, schema: str) -> str | None:
    """What an output artifact is for `fetch` (one of KINDS), or None when fetch leaves it out."""
    if schema == "system.Model":
        return None if task == STAGE_TASK else "model"
    if schema in ("system.HTML", "system.Markdown"):
        return "report"
    if schema.endswith("Metrics"):
        return "metrics"
    if schema == "system.Dataset":
        return "predictions" if "prediction" in output else "data"
    if schema == "system.Artifact":
        return "data"
    return None  # google.VertexModel and other resources that are not files


def output_artifacts(job: dict[str, Any], kinds: tuple[str | None, ...] = DEFAULT_KINDS) -> list[dict[str, Any]]:
    """The run's output artifacts of the given kinds (None in `kinds`: also those fetch leaves out), one per
    (task, output): task, output, kind, schema, uri, metadata."""
    found = []
    for task in pipeline_tasks(job):
        for output, listing in sorted((task.get("outputs") or {}).items()):
            for artifact in (listing or {}).get("artifacts") or []:
                schema = artifact.get("schema_title", "")
                kind = artifact_kind(task.get("task_name", ""), output, schema)
                if kind in kinds:
                    found.append(
                        {
                            "task": task.get("task_name", ""),
                            "output": output,
                            "kind": kind,
                            "schema": schema,
                            "uri": artifact.get("uri", ""),
                            "metadata": artifact.get("metadata") or {},
                        }
                    )
    return found


def parse_kinds(text: str) -> tuple[str, ...]:
    """`--only` value: comma-separated KINDS.

    Raises:
        VertexError: An unknown kind (with the closest).
    """
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    for kind in kinds:
        if kind not in KINDS:
            close = difflib.get_close_matches(kind, KINDS, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise VertexError(f"--only: unknown kind '{kind}'; {hint}kinds: {', '.join(KINDS)}")
    return kinds or DEFAULT_KINDS


# --- the I/O part ---------------------------------------------------------------------


def _as_dict(message: Any) -> dict[str, Any]:
    """A proto-plus message as a dict (snake_case fields, enum names, RFC 3339 times)."""
    return type(message).to_dict(message, use_integers_for_enums=False, preserving_proto_field_name=True)


def _init(cfg: Config, credentials: Any, api_endpoint: str | None) -> None:
    v = cfg.vertex
    if not v.project or v.project in PLACEHOLDER_MARKERS:
        raise VertexError(f"{cfg.path or 'config'}: vertex.project is not set; set it (or pass --project)")
    init_vertex(v.project, v.region, credentials=credentials, api_endpoint=api_endpoint)


def list_runs(cfg: Config, *, credentials: Any = None, api_endpoint: str | None = None) -> list[dict[str, Any]]:
    """Returns the config's pipeline runs (REST form, as dicts), newest first."""
    from google.cloud import aiplatform

    _init(cfg, credentials, api_endpoint)
    jobs = aiplatform.PipelineJob.list(
        filter=list_filter(cfg),
        order_by="create_time desc",
        project=cfg.vertex.project,
        location=cfg.vertex.region,
        credentials=credentials,
    )
    found = [_as_dict(j._gca_resource) for j in jobs]
    return sorted(found, key=lambda j: _timestamp_key(j.get("create_time") or ""), reverse=True)


def get_run(
    cfg: Config, run: str | None = None, *, credentials: Any = None, api_endpoint: str | None = None
) -> dict[str, Any]:
    """Returns one pipeline run as a dict: RUN (ID, resource name or console URL), or the config's newest.

    Raises:
        VertexError: No run of the config yet.
    """
    from google.cloud import aiplatform

    if not run:
        runs = list_runs(cfg, credentials=credentials, api_endpoint=api_endpoint)
        if not runs:
            raise VertexError(f"no runs of {cfg.pipeline.name} in {cfg.vertex.project}/{cfg.vertex.region} yet")
        run = runs[0]["name"]
    _init(cfg, credentials, api_endpoint)
    job = aiplatform.PipelineJob.get(
        job_resource_name(cfg, run), project=cfg.vertex.project, location=cfg.vertex.region, credentials=credentials
    )
    return _as_dict(job._gca_resource)


def cancel_run(cfg: Config, run: str, *, credentials: Any = None, api_endpoint: str | None = None) -> str:
    """Asks Vertex to cancel a run; returns its resource name.

    Raises:
        VertexError: The run has already ended.
    """
    from google.cloud import aiplatform

    _init(cfg, credentials, api_endpoint)
    job = aiplatform.PipelineJob.get(
        job_resource_name(cfg, run), project=cfg.vertex.project, location=cfg.vertex.region, credentials=credentials
    )
    state = job._gca_resource.state.name
    if state in ENDED:
        raise VertexError(f"run {job.resource_name.rsplit('/', 1)[-1]} already ended ({_short_state(state)})")
    job.cancel()
    return job.resource_name


def _session(credentials: Any) -> Any:
    import google.auth
    from google.auth.transport.requests import AuthorizedSession

    if credentials is None:
        credentials, _ = google.auth.default(scopes=[CLOUD_SCOPE])
    return AuthorizedSession(credentials)


def read_entries(
    session: Any, project: str, log_filter_text: str, *, newest: int = 0, endpoint: str = LOGGING_ENDPOINT
) -> list[dict[str, Any]]:
    """Cloud Logging entries:list of a filter, oldest first; `newest` > 0 = only the newest that many.

    Raises:
        google.api_core.exceptions.GoogleAPICallError: The API refused (403, 400, ...).
    """
    from google.api_core import exceptions

    body: dict[str, Any] = {
        "resourceNames": [f"projects/{project}"],
        "filter": log_filter_text,
        "orderBy": "timestamp desc" if newest else "timestamp asc",
        "pageSize": min(newest, 1000) if newest else 1000,
    }
    entries: list[dict[str, Any]] = []
    while True:
        response = session.post(f"{endpoint.rstrip('/')}/v2/entries:list", json=body, timeout=60)
        if response.status_code >= 400:
            raise exceptions.from_http_response(response)
        data = response.json()
        entries += data.get("entries") or []
        token = data.get("nextPageToken")
        if not token or (newest and len(entries) >= newest):
            break
        body["pageToken"] = token
    return list(reversed(entries[:newest])) if newest else entries


def stream_logs(
    cfg: Config,
    run: str | None = None,
    *,
    task: str | None = None,
    follow: bool = False,
    lines: int = 100,
    poll_s: float = 10.0,
    follow_for_s: float = 6 * 3600,
    credentials: Any = None,
    api_endpoint: str | None = None,
    logging_endpoint: str = LOGGING_ENDPOINT,
    out: Any = None,
    sleep: Any = time.sleep,
    clock: Any = time.monotonic,
) -> int:
    """Prints a run's (or one task's) log entries; with `follow`, keeps polling until the run ends.

    Args:
        cfg: The config (project, region, pipeline name).
        run: Run ID / resource name; default the config's newest run.
        task: Only this task's entries (its CustomJobs). Default all tasks and the pipeline's events.
        follow: Poll for new entries every `poll_s` until the run ends (then once more), at most
            `follow_for_s` seconds. Default false.
        lines: The newest entries printed first (0 = all since the run started). Default 100.
        poll_s: Seconds between polls with `follow`. Default 10.
        follow_for_s: Longest follow, seconds. Default 6 h.
        credentials: google-auth credentials; default ADC.
        api_endpoint: Vertex endpoint override (tests). logging_endpoint: Cloud Logging's (tests).
        out: Stream for the lines. Default stdout.
        sleep / clock: Injected in tests.

    Returns:
        Entries printed.

    Raises:
        VertexError: No such run or task.
    """
    out = out or sys.stdout
    job = get_run(cfg, run, credentials=credentials, api_endpoint=api_endpoint)
    session = _session(credentials)
    project = cfg.vertex.project
    seen: set[str] = set()
    printed = 0
    last = ""

    def emit(entries: list[dict[str, Any]], names: dict[str, str]) -> None:
        nonlocal printed, last
        for entry in entries:
            key = entry.get("insertId") or json.dumps(entry, sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            print(format_entry(entry, names), file=out, flush=True)
            printed += 1
            last = max(last, entry.get("timestamp") or "", key=_timestamp_key)

    def read(newest: int = 0) -> None:
        if follow and task_pending(job, task):  # follow a task the run has not reached yet: wait for it
            if "waiting" not in seen_notes:
                seen_notes.add("waiting")
                print(f"(waiting for task {task} to start)", file=out, flush=True)
            return
        flt = log_filter(job, task, after=last or None)
        emit(read_entries(session, project, flt, newest=newest, endpoint=logging_endpoint), job_names_by_id(job))

    seen_notes: set[str] = set()
    read(newest=lines)
    if not follow:
        return printed
    deadline = clock() + follow_for_s
    while True:
        ended = job.get("state") in ENDED
        if not ended and clock() + poll_s > deadline:
            print(f"(stopped following after {follow_for_s:.0f} s; the run is {job.get('state')})", file=out)
            return printed
        if not ended:
            sleep(poll_s)
            job = get_run(cfg, job["name"], credentials=credentials, api_endpoint=api_endpoint)
        read()
        if ended:
            print(f"(run {_short_state(job.get('state', ''))})", file=out, flush=True)
            return printed


def _storage_client(project: str, credentials: Any) -> Any:
    import os

    from google.cloud import storage

    from components.common.storage import client

    if credentials is None or os.environ.get("STORAGE_EMULATOR_HOST"):
        return client() if os.environ.get("STORAGE_EMULATOR_HOST") else storage.Client(project=project)
    return storage.Client(project=project, credentials=credentials)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size if path.is_file() else 0
    except OSError:
        return 0


def _same_file(path: Path, blob: Any) -> bool:
    if not path.is_file() or path.stat().st_size != (blob.size or 0):
        return False
    if not blob.crc32c:
        return False
    import base64

    import google_crc32c

    checksum = google_crc32c.Checksum()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            checksum.update(chunk)
    return base64.b64encode(checksum.digest()).decode() == blob.crc32c


def fetch_outputs(
    cfg: Config,
    run: str | None,
    dest: str | Path | None = None,
    *,
    kinds: tuple[str, ...] = DEFAULT_KINDS,
    credentials: Any = None,
    api_endpoint: str | None = None,
    out: Any = None,
    progress_min_bytes: int = 50_000_000,
) -> dict[str, Any]:
    """Downloads a run's output artifacts into DEST/<task>/<output>/ (see the module docstring).

    Args:
        cfg: The config (project, region).
        run: Run ID / resource name; default the config's newest run.
        dest: Local folder (created). Default ./runs/<run id>.
        kinds: Which artifacts (KINDS). Default model, report, metrics, predictions.
        credentials: google-auth credentials; default ADC.
        api_endpoint: Vertex endpoint override (tests).
        out: Stream for the progress lines of artifacts of at least `progress_min_bytes` (bytes done /
            total, rate, ETA; one line per 5 % or 30 s). Default stdout.
        progress_min_bytes: Smaller artifacts download without progress lines. Default 50 MB.

    Returns:
        {"run", "state", "link", "dest", "artifacts": [{task, output, kind, schema, uri, metadata,
        local, files, bytes, skipped}], "outputs": every output artifact of the run, fetched or not};
        also written to DEST/run.json.
    """
    from components.common.progress import Progress
    from components.common.retry import gcs_retry
    from components.common.storage import split_gs

    out = out or sys.stdout
    job = get_run(cfg, run, credentials=credentials, api_endpoint=api_endpoint)
    root = Path(dest or Path("runs") / job.get("name", "run").rsplit("/", 1)[-1]).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    client = _storage_client(cfg.vertex.project, credentials)
    artifacts = output_artifacts(job, kinds)
    for art in artifacts:
        folder = root / art["task"] / art["output"]
        art.update(local=str(folder), files=0, bytes=0, skipped=0)
        if art["kind"] == "metrics":
            meta_file = root / art["task"] / f"{art['output']}.json"
            meta_file.parent.mkdir(parents=True, exist_ok=True)
            meta_file.write_text(json.dumps(art["metadata"], indent=1, sort_keys=True) + "\n")
        if not art["uri"].startswith("gs://"):
            continue
        bucket_name, prefix = split_gs(art["uri"])
        bucket = client.bucket(bucket_name)
        blobs = [b for b in client.list_blobs(bucket, prefix=prefix + "/", retry=gcs_retry(art["uri"]))]
        if blobs:
            pairs = [(b, folder / b.name[len(prefix) + 1 :]) for b in blobs if not b.name.endswith("/")]
        else:
            blob = bucket.get_blob(prefix, retry=gcs_retry(art["uri"]))
            suffix = {"system.HTML": ".html", "system.Markdown": ".md"}.get(art["schema"])
            path = folder.with_name(folder.name + suffix) if suffix else folder / Path(prefix).name
            pairs = [(blob, path)] if blob is not None else []
            art["local"] = str(path)
        if not pairs:
            print(f"{art['task']}/{art['output']}: nothing at {art['uri']}", file=out, flush=True)
            continue
        total = sum(b.size or 0 for b, _ in pairs)
        label = f"fetch {art['task']}/{art['output']}"
        bar = Progress(label, total, "bytes", emit=lambda s: print(s, file=out), enabled=total >= progress_min_bytes)
        current = {"partial": Path()}  # the file being downloaded: a large one shows progress as its .part grows
        with bar, bar.watching(lambda a=art, c=current: a["bytes"] + _size(c["partial"])):
            for blob, path in pairs:
                path.parent.mkdir(parents=True, exist_ok=True)
                if _same_file(path, blob):
                    art["skipped"] += 1
                else:
                    current["partial"] = partial = path.with_name(path.name + ".part")
                    where = f"gs://{bucket_name}/{blob.name}"
                    blob.download_to_filename(str(partial), retry=gcs_retry(where), checksum="crc32c")
                    partial.replace(path)
                art["files"] += 1
                art["bytes"] += blob.size or 0
                bar.set(art["bytes"])
    result = {
        "run": job.get("name", ""),
        "state": job.get("state", ""),
        "link": console_link(job.get("name", "")),
        "dest": str(root),
        "artifacts": artifacts,
        # every output, fetched or not (the staged base model, the registered Vertex model, datasets)
        "outputs": output_artifacts(job, (*KINDS, None)),
    }
    (root / "run.json").write_text(json.dumps(result, indent=1, sort_keys=True, default=str) + "\n")
    return result


# --- the command line -----------------------------------------------------------------

ACTIONS = {
    "ls": "list the config's runs, newest first",
    "show": "a run's tasks: state, start, duration, console / job / log links",
    "logs": "a run's (or --task's) log entries; --follow until it ends",
    "cancel": "cancel a run that has not ended",
    "fetch": "download a run's outputs (models, reports, metrics, predictions) to --dest",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=program("python -m pipelines.jobs"), description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True, metavar="{" + ",".join(ACTIONS) + "}")
    for action, summary in ACTIONS.items():
        p = sub.add_parser(action, help=summary, description=summary)
        p.add_argument("--config", required=True, help="config YAML or shipped config name")
        p.add_argument("--project", default=None, help="project ID (default: the config's vertex.project)")
        if action == "ls":
            p.add_argument(
                "--limit", type=cli_numbers.non_negative(int), default=20, help="newest N runs (default 20; 0 = all)"
            )
        else:
            p.add_argument("run", nargs="?", default=None, help="run ID or resource name (default: the newest run)")
        if action == "logs":
            p.add_argument("--task", default=None, help="only this task's entries (e.g. train-lora)")
            p.add_argument("--follow", "-f", action="store_true", help="keep printing new entries until the run ends")
            p.add_argument(
                "--lines",
                type=cli_numbers.non_negative(int),
                default=100,
                help="newest N entries first (default 100; 0 = all)",
            )
            p.add_argument(
                "--poll",
                type=cli_numbers.positive(float, "a positive number of seconds"),
                default=10.0,
                help="seconds between polls with --follow (default 10)",
            )
            p.add_argument(
                "--follow-for",
                type=cli_numbers.positive(float, "a positive number of seconds"),
                default=6 * 3600,
                help="longest follow, s (default 21600)",
            )
        if action == "fetch":
            p.add_argument("--dest", default=None, help="local folder (default: ./runs/<run id>)")
            p.add_argument("--only", default=",".join(DEFAULT_KINDS), help=f"comma-separated: {', '.join(KINDS)}")
        p.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    return parser


def main(
    argv: list[str] | None = None,
    *,
    credentials: Any = None,
    api_endpoint: str | None = None,
    logging_endpoint: str = LOGGING_ENDPOINT,
) -> int:
    """`vlm-lora jobs ACTION ...`; the keyword arguments point the clients elsewhere (tests). Returns the exit code."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in and not args_in[0].startswith("-") and args_in[0] not in ACTIONS:
        close = difflib.get_close_matches(args_in[0], ACTIONS, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        lines = [f"  {name:<7} {summary}" for name, summary in ACTIONS.items()]
        print(
            f"vlm-lora jobs: unknown action '{args_in[0]}'{hint}\n\nusage: vlm-lora jobs ACTION --config F [RUN]\n\n"
            "actions:\n" + "\n".join(lines),
            file=sys.stderr,
        )
        return 2
    args = _parser().parse_args(args_in)
    run = getattr(args, "run", None)
    if run and "=" in run:  # a run ID has no '=': the first word was an override
        args.overrides.insert(0, run)
        args.run = None
    where = {"credentials": credentials, "api_endpoint": api_endpoint}
    with command_errors() as outcome:
        cfg = load_config(args.config, parse_overrides(args.overrides))
        if args.project:
            cfg = dataclasses.replace(cfg, vertex=dataclasses.replace(cfg.vertex, project=args.project))
        if args.action == "ls":
            runs = list_runs(cfg, **where)
            if not runs:
                print(f"no runs of {cfg.pipeline.name} in {cfg.vertex.project}/{cfg.vertex.region}")
            else:
                print(format_runs(runs[: args.limit] if args.limit else runs, now=_now()))
        elif args.action == "show":
            print(format_show(get_run(cfg, args.run, **where), now=_now()))
        elif args.action == "logs":
            stream_logs(
                cfg,
                args.run,
                task=args.task,
                follow=args.follow,
                lines=args.lines,
                poll_s=args.poll,
                follow_for_s=args.follow_for,
                logging_endpoint=logging_endpoint,
                **where,
            )
        elif args.action == "cancel":
            if not args.run:
                raise VertexError("cancel needs the run ID (see `vlm-lora jobs ls`)")
            name = cancel_run(cfg, args.run, **where)
            print(f"cancel requested: {name}\nconsole: {console_link(name)}")
        else:
            result = fetch_outputs(cfg, args.run, args.dest, kinds=parse_kinds(args.only), **where)
            got = [a for a in result["artifacts"] if a["files"]]
            print(f"fetched {len(got)} artifacts of {result['run'].rsplit('/', 1)[-1]} into {result['dest']}")
            width = max((len(a["task"]) + len(a["output"]) + 1 for a in result["artifacts"]), default=0)
            for art in result["artifacts"]:
                note = f"{art['files']} files" + (f", {art['skipped']} already there" if art["skipped"] else "")
                which = f"{art['task']}/{art['output']}".ljust(width)
                print(f"  {which}  {art['kind']:<11} {note:<24} <- {art['uri']}")
    return outcome.code


def _now() -> datetime:

    return datetime.now(UTC)


if __name__ == "__main__":
    sys.exit(main())
