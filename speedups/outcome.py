"""What became of one speed-up item: applied, pending, or skipped with a kind and its words (the start-up table's cells)."""

from __future__ import annotations

from dataclasses import dataclass

from speedups import versions

# Why an item did not apply: the table's `kind` and its words.
SWITCH_OFF = "switch off"
VERSION = "version outside the verified range"
TARGET = "target missing or changed"
NOTHING = "found nothing in the model"
NOT_APPLICABLE = "not applicable"
ERROR = "error while installing"
KINDS = (SWITCH_OFF, VERSION, TARGET, NOTHING, NOT_APPLICABLE, ERROR)


@dataclass(frozen=True)
class Outcome:
    """Whether an item applied: state "applied", "skipped" or "pending" (installed when the plugin loaded, decided
    once a trainer is built); `kind` one of KINDS when skipped; `detail` the words after it (or what applied)."""

    state: str
    kind: str = ""
    detail: str = ""

    @property
    def applied(self) -> bool:
        return self.state == "applied"

    @property
    def skipped(self) -> bool:
        return self.state == "skipped"

    def line(self) -> str:
        if self.skipped:
            return f"skipped: {self.kind}" + (f" ({self.detail})" if self.detail else "")
        return self.state + (f": {self.detail}" if self.detail else "")


def applied(detail: str = "") -> Outcome:
    return Outcome("applied", detail=detail)


def pending(detail: str = "") -> Outcome:
    return Outcome("pending", detail=detail)


def skipped(kind: str, detail: str = "") -> Outcome:
    assert kind in KINDS, kind
    return Outcome("skipped", kind, detail)


def target_missing(*symbols: object, version_of: str = "") -> Outcome:
    """Skipped: the symbols it patches are not there (or not what it knows), with the installed version."""
    names = ", ".join(str(s) for s in symbols)
    version = versions.installed_version(version_of) if version_of else None
    return skipped(TARGET, names + (f"; {version_of} {version}" if version else ""))


def found_nothing(detail: str) -> Outcome:
    return skipped(NOTHING, detail)


def not_applicable(detail: str) -> Outcome:
    return skipped(NOT_APPLICABLE, detail)


def error(exc: BaseException) -> Outcome:
    """Skipped: an exception while installing, as its one-line text."""
    text = str(exc).strip().splitlines()
    return skipped(ERROR, f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__)
