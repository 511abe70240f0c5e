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

from components.common.manifest import ManifestError, verify_if_marked

TOKEN_STATS_FILE = "token_stats.json"
DATA_FILE = "data.jsonl"
RUN_AGAIN = "run validate-data again (a cached run: --no-cache, or delete its cache entry)"


def checked_rows_file(folder: str | Path, expected_marker: str = "") -> Path:
    """A validated dataset's `data.jsonl`, once the folder is checked against its completion marker.

    The one check every reader of a validate-data output makes (train-lora, evaluate): the rows
    as validate-data wrote them, never a truncated or edited copy.

    Args:
        folder: The dataset folder (data.jsonl + images/).
        expected_marker: The sha256 of its marker as validate-data recorded it (the artifact's
            `manifest_sha256`): a marker removed or edited since is caught too. Default ""
            (checked when the folder has a marker).

    Returns:
        The path of `data.jsonl`.

    Raises:
        ManifestError: No data.jsonl, or the files differ from the marker (naming the file).
    """
    src = Path(folder) / DATA_FILE
    if not src.is_file():
        raise ManifestError(folder, DATA_FILE, "not a validated dataset (no data.jsonl)", "run validate-data first")
    verify_if_marked(folder, expected_sha256=expected_marker, fix=RUN_AGAIN)
    return src


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
