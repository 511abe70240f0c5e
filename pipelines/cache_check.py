"""Checks of kfp.local's cache before a local run: a reused output must still be what its task wrote.

kfp.local reuses a task's cache entry while the entry's artifact paths exist; it never looks
at their bytes. `check_cache_entries` drops every entry one of whose artifact folders changed
since (a flipped byte, a truncated file, a file replaced in the model cache), naming the file,
so that task runs again and, through its new outputs, exactly the tasks after it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def cache_entries(cache_dir: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(entry file, its outputs) of each readable kfp.local cache entry, in name order."""
    for entry in sorted(cache_dir.glob("*.json")) if cache_dir.is_dir() else []:
        try:
            outputs = json.loads(entry.read_text())
        except (OSError, ValueError):
            continue  # kfp.local ignores an unreadable entry too
        if isinstance(outputs, dict):
            yield entry, outputs


FULL_CHECK_MAX_BYTES = 4 << 30  # a marked folder up to 4 GiB is hashed whole on every reuse (~3 s at 1.5 GB/s)


def _changed_output(uri: str, metadata: dict[str, Any]) -> tuple[str, str] | None:
    """(file, what differs) when a cached artifact folder no longer holds what its task wrote, else None.

    A folder with a completion marker (`components.common.manifest`: validate-data's datasets,
    train-lora's adapter, merge-export's merged model) is checked against it: every file hashed
    up to `FULL_CHECK_MAX_BYTES`, above it every size plus a hash of each file whose inode,
    mtime or ctime changed. A model-cache entry of stage-model (its `manifest.json`) is checked
    by stage-model's own `verify_entry` (size and sha256 of every file).
    """
    from components.common.manifest import ManifestError, read_marker, total_bytes, verify_if_marked

    if _is_staged(uri):
        from components.stage_model.entry import verify_entry

        valid, reason = verify_entry(uri)
        return None if valid else (f"{uri}/{reason.split(':', 1)[0]}", reason)
    marker = read_marker(uri)
    quick = marker is not None and total_bytes(marker) > FULL_CHECK_MAX_BYTES
    try:
        verify_if_marked(uri, expected_sha256=str(metadata.get("manifest_sha256") or ""), quick=quick)
    except ManifestError as exc:
        return f"{exc.folder}/{exc.file}", exc.problem
    return None


def check_cache_entries(cache_dir: Path, root_dir: Path) -> list[str]:
    """Drops kfp.local cache entries whose artifact folders no longer match what their task wrote.

    kfp.local reuses an entry while its artifact paths exist; it never looks at the bytes. An
    artifact folder under the pipeline root with a completion marker
    (`components.common.manifest`: datasets, adapters, merged models), or whose producer
    recorded one (`manifest_sha256` in its metadata, kept in the entry), and a staged base
    model in the model cache (wherever it is), are checked here (`_changed_output`): a file
    missing, truncated or changed, or the marker gone or edited, drops the entry, so the task
    runs again (and every task after it whose inputs are then new).

    Args:
        cache_dir: kfp.local's cache folder (`<pipeline root>/.kfp_cache`); absent = nothing to do.
        root_dir: The pipeline root: only artifacts under it (and staged models) are checked.

    Returns:
        One line per dropped entry: the task, the output, the file and what differs.
    """
    lines = []
    root = str(root_dir.resolve()) + os.sep
    for entry, outputs in cache_entries(cache_dir):
        for name, value in outputs.items():
            uri = str(value.get("uri") or "") if isinstance(value, dict) and value.get("__kfp_artifact__") else ""
            if not (uri.startswith(root) or _is_staged(uri)) or not os.path.isdir(uri):
                continue
            changed = _changed_output(uri, value.get("metadata") or {})
            if changed is not None:
                entry.unlink(missing_ok=True)
                task = _task_of(uri, root)
                lines.append(
                    f"cache: {task}'s output {name} changed since {task} wrote it ({changed[0]}: "
                    f"{changed[1]}); its cache entry {entry.stem[:12]} is dropped and {task} runs again"
                )
                break
    return lines


def _is_staged(uri: str) -> bool:
    """Whether a folder is a stage-model cache entry (its `manifest.json`, no completion marker)."""
    return (
        bool(uri)
        and os.path.isfile(os.path.join(uri, "manifest.json"))
        and not os.path.isfile(os.path.join(uri, "complete.json"))
    )


def _task_of(uri: str, root: str) -> str:
    """The task folder's name of an artifact under the root (`<root>/<run>/<task>/<output>`), else 'stage-model'."""
    return Path(uri).parent.name if uri.startswith(root) else "stage-model"
