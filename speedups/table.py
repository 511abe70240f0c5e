"""The start-up table: one line per item (applied, or skipped and why), written by rank 0 as JSON and read back by
train-lora into its Metrics; and the lines naming a memory-relevant item the plan assumed otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from speedups import versions
from speedups.gate import Planned
from speedups.items import BY_NUMBER, ITEMS
from speedups.outcome import NOT_APPLICABLE, Outcome, skipped

# The environment variable naming the file the plugin writes the start-up table to (train-lora sets it).
TABLE_ENV = "VLM_LORA_SPEEDUPS_TABLE"
TABLE_VERSION = 1


@dataclass
class Table:
    """The start-up table: each item's outcome, in item order, and the versions the process ran."""

    outcomes: dict[int, Outcome] = field(default_factory=dict)
    versions: dict[str, str | None] = field(default_factory=dict)

    def counts(self) -> tuple[int, int]:
        done = [o for o in self.outcomes.values() if o.state != "pending"]
        return sum(o.applied for o in done), sum(o.skipped for o in done)

    def lines(self) -> list[str]:
        """The table as log lines: a header, then one line per item."""
        got, missed = self.counts()
        out = [f"speed-ups: {got} of {len(ITEMS)} applied, {missed} skipped"]
        for it in ITEMS:
            outcome = self.outcomes.get(it.number, skipped(NOT_APPLICABLE, "not reached"))
            out.append(f"{it.number:>2} {it.name:<15} {outcome.line()}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "version": TABLE_VERSION,
            "items": [
                {"number": it.number, "name": it.name, "memory": it.memory, **asdict(self.outcomes[it.number])}
                for it in ITEMS
                if it.number in self.outcomes
            ],
            "versions": dict(self.versions),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Table:
        outcomes = {
            int(row["number"]): Outcome(str(row["state"]), str(row.get("kind", "")), str(row.get("detail", "")))
            for row in data.get("items", [])
            if int(row.get("number", 0)) in BY_NUMBER
        }
        return cls(outcomes, dict(data.get("versions", {})))

    def write(self, path: str | Path) -> None:
        """Writes the table as JSON, whole: a temporary file beside it, then a rename."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.partial-{os.getpid()}-", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.to_json(), f, indent=1)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def rows(self) -> list[dict[str, Any]]:
        """One row per item for a report: number, name, applied (bool), and the outcome's words."""
        return [
            {"number": it.number, "name": it.name, "applied": self.outcomes[it.number].applied,
             "outcome": self.outcomes[it.number].line()}
            for it in ITEMS
            if it.number in self.outcomes
        ]  # fmt: skip

    def metrics(self) -> dict[str, int]:
        """`speedups_applied`, `speedups_skipped` and one 0 / 1 per item (`speedup_<number>_<name>`)."""
        got, missed = self.counts()
        out = {"speedups_applied": got, "speedups_skipped": missed}
        out.update({it.key: int(self.outcomes.get(it.number, Outcome("skipped")).applied) for it in ITEMS})
        return out


def read_table(path: str | Path) -> Table | None:
    """The table a run wrote (None: no file, or not one this version reads)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != TABLE_VERSION:
        return None
    return Table.from_json(data)


def disagreements(plan: Planned, table: Table) -> list[str]:
    """One line per memory-relevant item whose outcome in the run differs from what the planner assumed."""
    lines = []
    for it in ITEMS:
        if it.memory is None or it.number not in table.outcomes:
            continue
        expected, got = plan.outcomes[it.number], table.outcomes[it.number]
        if expected.applied != got.applied:
            lines.append(
                f"item {it.number} ({it.name}, planner flag {it.memory}): the plan assumed it "
                f"{'applies' if expected.applied else 'does not apply'}, the run says {got.line()}; "
                "the memory plan was made for the other case"
            )
    return lines


def versions_in_use() -> dict[str, str | None]:
    """The installed versions of every package an item names."""
    names = sorted({d for it in ITEMS for d in (*it.verified, *it.gpu_verified)})
    return {name: versions.installed_version(name) for name in names}
