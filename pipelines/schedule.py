"""Run the pipeline on a schedule (Vertex AI PipelineJobSchedule).

    python -m pipelines.schedule create --config F [--cron "0 3 * * 1"] [--time-zone Europe/Berlin]
                                        [--max-concurrent N] [--start RFC3339] [--end RFC3339]
    python -m pipelines.schedule list   --config F
    python -m pipelines.schedule pause | resume | delete --config F --name SCHEDULE

Cron, time zone, concurrency and start/end default to the config's `schedule` section.
The cron expression, project and buckets are checked before anything is created.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from components.common import cli_numbers
from pipelines.cli import program
from pipelines.config import Config, cron_problem, load_config, parse_overrides
from pipelines.vertex import VertexError, command_errors, console_link, init_vertex, pipeline_job, preflight


def schedule_cron(cron: str, time_zone: str) -> str:
    """Returns the cron string Vertex takes: `TZ=<zone> <cron>` (plain cron for UTC).

    Raises:
        VertexError: The cron expression or the time zone is invalid.
    """
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    problem = cron_problem(cron)
    if problem:
        raise VertexError(f"cron {cron!r}: {problem}")
    try:
        ZoneInfo(time_zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise VertexError(f"time zone {time_zone!r} is not an IANA time zone (e.g. UTC, Europe/Berlin)") from None
    return cron if time_zone == "UTC" else f"TZ={time_zone} {cron}"


def _schedule_name(cfg: Config, name: str) -> str:
    if name.startswith("projects/"):
        return name
    return f"projects/{cfg.vertex.project}/locations/{cfg.vertex.region}/schedules/{name}"


def create_schedule(cfg: Config, *, credentials: Any = None, api_endpoint: str | None = None) -> Any:
    """Compiles the config for Vertex and creates a PipelineJobSchedule from its `schedule` section.

    Args:
        cfg: The validated config (`schedule.cron` set, `vertex.project`, gs:// root).
        credentials: google-auth credentials; default ADC.
        api_endpoint: Vertex API endpoint override (tests).

    Returns:
        The created `aiplatform.PipelineJobSchedule`.

    Raises:
        VertexError: No cron, a bad cron or time zone, end before start, or what
            `pipelines.vertex.preflight` finds; raised before anything is created.
    """
    import tempfile
    from pathlib import Path

    from google.cloud import aiplatform
    from kfp import compiler

    from pipelines.pipeline import build_pipeline, pipeline_arguments

    s, v = cfg.schedule, cfg.vertex
    if not s.cron:
        raise VertexError(f"{cfg.path}: schedule.cron is empty; set it in the config or pass --cron")
    cron = schedule_cron(s.cron, s.time_zone)
    if s.start_time and s.end_time and s.end_time <= s.start_time:
        raise VertexError(f"{cfg.path}: schedule.end_time {s.end_time} is not after start_time {s.start_time}")
    preflight(cfg, credentials)
    init_vertex(v.project, v.region, credentials=credentials, api_endpoint=api_endpoint)
    with tempfile.TemporaryDirectory(prefix="vlm-lora-") as tmp:
        template = str(Path(tmp) / "pipeline.yaml")
        compiler.Compiler().compile(build_pipeline(cfg, "vertex"), package_path=template)
        job = pipeline_job(cfg, template, pipeline_arguments(cfg), credentials=credentials)
        schedule = aiplatform.PipelineJobSchedule(
            pipeline_job=job,
            display_name=f"{cfg.pipeline.name}-schedule",
            credentials=credentials,
            project=v.project,
            location=v.region,
        )
        schedule.create(
            cron=cron,
            max_concurrent_run_count=s.max_concurrent_runs,
            start_time=s.start_time or None,
            end_time=s.end_time or None,
            service_account=v.service_account or None,
            network=v.network or None,
        )
    return schedule


def list_schedules(cfg: Config, *, credentials: Any = None, api_endpoint: str | None = None) -> list[Any]:
    """Returns the project's pipeline schedules in the config's region."""
    from google.cloud import aiplatform

    init_vertex(cfg.vertex.project, cfg.vertex.region, credentials=credentials, api_endpoint=api_endpoint)
    return aiplatform.PipelineJobSchedule.list(
        project=cfg.vertex.project, location=cfg.vertex.region, credentials=credentials
    )


def change_schedule(
    cfg: Config, action: str, name: str, *, credentials: Any = None, api_endpoint: str | None = None
) -> str:
    """Pauses, resumes or deletes a schedule.

    Args:
        cfg: The config (project and region).
        action: "pause", "resume" or "delete".
        name: Schedule ID or resource name.
        credentials: google-auth credentials; default ADC.
        api_endpoint: Vertex API endpoint override (tests).

    Returns:
        The schedule's resource name.
    """
    from google.cloud import aiplatform

    init_vertex(cfg.vertex.project, cfg.vertex.region, credentials=credentials, api_endpoint=api_endpoint)
    schedule = aiplatform.PipelineJobSchedule.get(
        _schedule_name(cfg, name), project=cfg.vertex.project, location=cfg.vertex.region, credentials=credentials
    )
    getattr(schedule, action)()
    return schedule.resource_name if action != "delete" else _schedule_name(cfg, name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=program("python -m pipelines.schedule"), description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("create", "list", "pause", "resume", "delete"))
    parser.add_argument("--config", required=True, help="config YAML")
    parser.add_argument("--name", default=None, help="schedule ID or resource name (pause/resume/delete)")
    parser.add_argument("--cron", default=None, help="cron expression (default: the config's schedule.cron)")
    parser.add_argument("--time-zone", default=None, help="IANA time zone (default: schedule.time_zone)")
    parser.add_argument("--max-concurrent", type=cli_numbers.positive(int), default=None, help="runs at the same time")
    parser.add_argument("--start", default=None, help="first run not before, RFC 3339")
    parser.add_argument("--end", default=None, help="no run after, RFC 3339")
    parser.add_argument("--project", default=None, help="project ID (default: the config's vertex.project)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    args = parser.parse_args(argv)
    with command_errors() as outcome:
        cfg = load_config(args.config, parse_overrides(args.overrides))
        overrides = {
            k: v
            for k, v in (
                ("cron", args.cron),
                ("time_zone", args.time_zone),
                ("max_concurrent_runs", args.max_concurrent),
                ("start_time", args.start),
                ("end_time", args.end),
            )
            if v is not None
        }
        cfg = dataclasses.replace(cfg, schedule=dataclasses.replace(cfg.schedule, **overrides))
        if args.project:
            cfg = dataclasses.replace(cfg, vertex=dataclasses.replace(cfg.vertex, project=args.project))
        if args.action == "create":
            schedule = create_schedule(cfg)
            print(
                f"created {schedule.resource_name} ({schedule.cron})\nconsole: {console_link(schedule.resource_name)}"
            )
        elif args.action == "list":
            if not cfg.vertex.project:
                raise VertexError(f"{cfg.path}: vertex.project is not set (or pass --project)")
            for schedule in list_schedules(cfg):
                print(f"{schedule.resource_name}  {schedule.state.name}  {schedule.cron}  {schedule.display_name}")
        else:
            if not args.name:
                raise VertexError(f"{args.action} needs --name SCHEDULE (see `list`)")
            print(f"{args.action}: {change_schedule(cfg, args.action, args.name)}")
    return outcome.code


if __name__ == "__main__":
    sys.exit(main())
