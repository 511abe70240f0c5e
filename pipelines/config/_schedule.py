"""The `schedule` section: the recurring run of `python -m pipelines.schedule`, with its checks."""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.config._cron import cron_problem
from pipelines.config._errors import Check, ConfigError, Where


@dataclass(frozen=True)
class ScheduleSection:
    """The recurring run created by `python -m pipelines.schedule create`.

    Attributes:
        cron: Five-field cron expression, e.g. "0 3 * * 1" (Mondays 03:00). Default "".
        time_zone: IANA time zone the cron is read in. Default UTC.
        max_concurrent_runs: Runs of this schedule at the same time. Default 1.
        start_time: First possible run, RFC 3339 (e.g. 2026-01-01T00:00:00Z); "" = now.
        end_time: No runs after this, RFC 3339; "" = never.
    """

    cron: str = ""
    time_zone: str = "UTC"
    max_concurrent_runs: int = 1
    start_time: str = ""
    end_time: str = ""


def schedule_checks(s: ScheduleSection) -> list[Check]:
    """The `schedule` fields' own checks."""
    return [("schedule.max_concurrent_runs", s.max_concurrent_runs >= 1, "a positive integer")]


def check_cron(s: ScheduleSection, where: Where) -> None:
    """Refuses a `schedule.cron` that is not a five-field cron expression (`cron_problem`)."""
    if s.cron:
        problem = cron_problem(s.cron)
        if problem:
            raise ConfigError(f"{where('schedule.cron')}: 'schedule.cron' {s.cron!r}: {problem}")
