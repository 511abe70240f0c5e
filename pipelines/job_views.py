"""What `vlm-lora jobs` reads out of a run: dicts in (the REST form of the resources), dicts and strings out.

The pure part of `pipelines.jobs`: which jobs are a config's runs (`list_filter`), the
`ls` table and the `show` text (rows, states, durations, console / CustomJob / Logs
Explorer links), the Cloud Logging filter of a run or a task and how an entry prints, and
which output artifacts `fetch` downloads (`output_artifacts`, `KINDS`). No I/O here.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import urllib.parse
from datetime import datetime
from typing import Any

from pipelines.config import Config
from pipelines.vertex import VertexError, console_link

ENDED = {"PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED", "PIPELINE_STATE_CANCELLED"}
PIPELINE_RESOURCE = "aiplatform.googleapis.com/PipelineJob"
STAGE_TASK = "stage-model"  # its Model is the base model's cache entry, not a run output
# What `fetch` can download, by kind; the default leaves out "data" (the validated train / eval copies).
KINDS = ("model", "report", "metrics", "predictions", "data")
DEFAULT_KINDS = ("model", "report", "metrics", "predictions")


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


def short_state(state: str) -> str:
    return state.replace("PIPELINE_STATE_", "").replace("JOB_STATE_", "")


def run_row(job: dict[str, Any], now: datetime | None = None) -> dict[str, Any]:
    """One line's worth of a pipeline job: id, state, created, duration, labels, console link."""
    name = job.get("name", "")
    return {
        "id": name.rsplit("/", 1)[-1],
        "name": name,
        "state": short_state(job.get("state", "")),
        "created": _clock(job.get("create_time")),
        "duration": _span(duration_s(job.get("start_time"), job.get("end_time"), now)),
        "config": (job.get("labels") or {}).get("config", ""),
        "link": console_link(name),
    }


def format_runs(jobs: list[dict[str, Any]], now: datetime | None = None) -> str:
    """The `jobs ls` table: newest first."""
    rows = [
        run_row(j, now) for j in sorted(jobs, key=lambda j: timestamp_key(j.get("create_time") or ""), reverse=True)
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


def timestamp_key(stamp: str) -> str:
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
