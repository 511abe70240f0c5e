"""The validated dataset folder's token figures: written by validate-data, read by train-lora's planner.

`token_stats.json` beside `data.jsonl` holds the row lengths validate-data counted (the
tokens ms-swift trains on: text plus image tokens after `swift.max_pixels`), so train-lora can
size its micro-batches before it loads anything.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TOKEN_STATS_FILE = "token_stats.json"


def token_stats(counts: Sequence[int], *, max_length: int = 0, max_pixels: int = 0, source: str = "") -> dict[str, Any]:
    """Summarises per-row token counts: rows, max, p95, mean (plus the settings they were counted with)."""
    ordered = sorted(int(c) for c in counts)
    if not ordered:
        return {"rows": 0, "max_tokens": 0, "p95_tokens": 0, "mean_tokens": 0.0}
    p95 = ordered[min(len(ordered) - 1, int(0.95 * (len(ordered) - 1) + 0.5))]
    return {
        "rows": len(ordered),
        "max_tokens": ordered[-1],
        "p95_tokens": p95,
        "mean_tokens": round(sum(ordered) / len(ordered), 1),
        "max_length": int(max_length),
        "max_pixels": int(max_pixels),
        "source": source,
    }


def write_token_stats(folder: str | Path, stats: dict[str, Any]) -> Path:
    """Writes `stats` as the folder's `token_stats.json`; returns its path."""
    path = Path(folder) / TOKEN_STATS_FILE
    path.write_text(json.dumps(stats, indent=1, sort_keys=True), encoding="utf-8")
    return path


def read_token_stats(folder: str | Path) -> dict[str, Any] | None:
    """The folder's token figures, or None when it has none (a dataset from before they were written)."""
    try:
        data = json.loads((Path(folder) / TOKEN_STATS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("max_tokens"), int) else None
