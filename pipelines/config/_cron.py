"""Five-field cron expressions (unix-cron, as Vertex schedules read them)."""

from __future__ import annotations

_CRON_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7))
_CRON_NAMES = {
    "jan": 1,
    "feb": 2,
    "mar": 3,
    "apr": 4,
    "may": 5,
    "jun": 6,
    "jul": 7,
    "aug": 8,
    "sep": 9,
    "oct": 10,
    "nov": 11,
    "dec": 12,
    "sun": 0,
    "mon": 1,
    "tue": 2,
    "wed": 3,
    "thu": 4,
    "fri": 5,
    "sat": 6,
}


def cron_problem(cron: str) -> str | None:
    """Checks a five-field cron expression (unix-cron, as Vertex schedules read it).

    Args:
        cron: e.g. "0 3 * * 1"; a leading "TZ=Area/City " is not allowed (use the time zone key).

    Returns:
        None when valid, else what is wrong.
    """
    fields = cron.split()
    if len(fields) != 5:
        return f"must have 5 fields (minute hour day-of-month month day-of-week), got {len(fields)}"
    for text, (name, low, high) in zip(fields, _CRON_FIELDS):
        for part in text.split(","):
            base, _, step = part.partition("/")
            if step and not (step.isdigit() and int(step) > 0):
                return f"{name} field {text!r}: step {step!r} must be a positive integer"
            if base == "*":
                continue
            for bound in base.split("-", 1):
                value = _CRON_NAMES.get(bound.lower()) if not bound.isdigit() else int(bound)
                if value is None or not low <= value <= high:
                    return f"{name} field {text!r}: {bound!r} is not in {low}-{high}"
    return None
