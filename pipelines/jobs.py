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

The pure part (filters, rows, lines, which artifacts to fetch) is `pipelines.job_views`: it
takes and returns dicts, the REST form of the resources. This module, the I/O part, uses
google-cloud-aiplatform for pipeline jobs, google-auth's AuthorizedSession for Cloud Logging
and google-cloud-storage for fetch, with Application Default Credentials; credentials and API errors are one line with the fix.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from components.common import cli_numbers
from pipelines.cli import program
from pipelines.config import Config, load_config, parse_overrides
from pipelines.job_views import (
    DEFAULT_KINDS,
    ENDED,
    KINDS,
    format_entry,
    format_runs,
    format_show,
    job_names_by_id,
    job_resource_name,
    list_filter,
    log_filter,
    output_artifacts,
    parse_kinds,
    short_state,
    task_pending,
    timestamp_key,
)
from pipelines.vertex import PLACEHOLDER_MARKERS, VertexError, command_errors, console_link, init_vertex

LOGGING_ENDPOINT = "https://logging.googleapis.com"
CLOUD_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


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
    return sorted(found, key=lambda j: timestamp_key(j.get("create_time") or ""), reverse=True)


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
        raise VertexError(f"run {job.resource_name.rsplit('/', 1)[-1]} already ended ({short_state(state)})")
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
            last = max(last, entry.get("timestamp") or "", key=timestamp_key)

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
            print(f"(run {short_state(job.get('state', ''))})", file=out, flush=True)
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
    out = out or sys.stdout
    job = get_run(cfg, run, credentials=credentials, api_endpoint=api_endpoint)
    root = Path(dest or Path("runs") / job.get("name", "run").rsplit("/", 1)[-1]).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    client = _storage_client(cfg.vertex.project, credentials)
    artifacts = output_artifacts(job, kinds)
    for art in artifacts:
        _fetch_artifact(client, art, root, out, progress_min_bytes)
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


def _fetch_artifact(client: Any, art: dict[str, Any], root: Path, out: Any, progress_min_bytes: int) -> None:
    """Downloads one artifact into ROOT/<task>/<output> (a Metrics artifact's figures to <output>.json too).

    Fills in the artifact's `local`, `files`, `bytes` and `skipped` (files already there).
    """
    folder = root / art["task"] / art["output"]
    art.update(local=str(folder), files=0, bytes=0, skipped=0)
    if art["kind"] == "metrics":
        meta_file = root / art["task"] / f"{art['output']}.json"
        meta_file.parent.mkdir(parents=True, exist_ok=True)
        meta_file.write_text(json.dumps(art["metadata"], indent=1, sort_keys=True) + "\n")
    if not art["uri"].startswith("gs://"):
        return
    pairs = _artifact_files(client, art, folder)
    if not pairs:
        print(f"{art['task']}/{art['output']}: nothing at {art['uri']}", file=out, flush=True)
        return
    _download(pairs, art, out, progress_min_bytes)


def _artifact_files(client: Any, art: dict[str, Any], folder: Path) -> list[tuple[Any, Path]]:
    """(blob, local path) of each file of an artifact: the objects under its URI, else the one object at it.

    A single object keeps its name in the folder; a report's gets its extension instead
    (`<output>.html`, `<output>.md`) and `local` names that file.
    """
    from components.common.retry import gcs_retry
    from components.common.storage import split_gs

    bucket_name, prefix = split_gs(art["uri"])
    bucket = client.bucket(bucket_name)
    blobs = [b for b in client.list_blobs(bucket, prefix=prefix + "/", retry=gcs_retry(art["uri"]))]
    if blobs:
        return [(b, folder / b.name[len(prefix) + 1 :]) for b in blobs if not b.name.endswith("/")]
    blob = bucket.get_blob(prefix, retry=gcs_retry(art["uri"]))
    suffix = {"system.HTML": ".html", "system.Markdown": ".md"}.get(art["schema"])
    path = folder.with_name(folder.name + suffix) if suffix else folder / Path(prefix).name
    art["local"] = str(path)
    return [(blob, path)] if blob is not None else []


def _download(pairs: list[tuple[Any, Path]], art: dict[str, Any], out: Any, progress_min_bytes: int) -> None:
    """Downloads the files not already there (same size and crc32c) through a `.part` file each, with progress."""
    from components.common.progress import Progress
    from components.common.retry import gcs_retry
    from components.common.storage import split_gs

    bucket_name = split_gs(art["uri"])[0]
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
        return _unknown_action(args_in[0])
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
        _act(cfg, args, where, logging_endpoint)
    return outcome.code


def _unknown_action(word: str) -> int:
    """Says that `word` is no action (with the closest one and the list); returns the exit code 2."""
    close = difflib.get_close_matches(word, ACTIONS, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    lines = [f"  {name:<7} {summary}" for name, summary in ACTIONS.items()]
    print(
        f"vlm-lora jobs: unknown action '{word}'{hint}\n\nusage: vlm-lora jobs ACTION --config F [RUN]\n\n"
        "actions:\n" + "\n".join(lines),
        file=sys.stderr,
    )
    return 2


def _act(cfg: Config, args: argparse.Namespace, where: dict[str, Any], logging_endpoint: str) -> None:
    """Does the parsed action and prints its outcome (`where`: the clients' credentials and endpoint)."""
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
        _print_fetched(fetch_outputs(cfg, args.run, args.dest, kinds=parse_kinds(args.only), **where))


def _print_fetched(result: dict[str, Any]) -> None:
    """The `jobs fetch` lines: how many artifacts, then each one's files and source."""
    got = [a for a in result["artifacts"] if a["files"]]
    print(f"fetched {len(got)} artifacts of {result['run'].rsplit('/', 1)[-1]} into {result['dest']}")
    width = max((len(a["task"]) + len(a["output"]) + 1 for a in result["artifacts"]), default=0)
    for art in result["artifacts"]:
        note = f"{art['files']} files" + (f", {art['skipped']} already there" if art["skipped"] else "")
        which = f"{art['task']}/{art['output']}".ljust(width)
        print(f"  {which}  {art['kind']:<11} {note:<24} <- {art['uri']}")


def _now() -> datetime:

    return datetime.now(UTC)


if __name__ == "__main__":
    sys.exit(main())
