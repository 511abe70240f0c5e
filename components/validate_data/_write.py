"""Writing a run's outputs: the quarantine, both dataset folders (each whole) and the data lineage.

Every file goes through a temporary name and a rename: never through a hard link or a planted
symlink, never half written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from components.common import manifest
from components.common import snapshot as snap
from components.common.dataset import token_stats, write_token_stats
from components.common.files import copy_nofollow, open_nofollow
from components.common.provenance import ORIGIN_KEY
from components.validate_data.types import CheckedRow, Issue, Outputs, ReadFile, RejectedLine, ValidationResult


def temp_name(path: Path) -> Path:
    """A temporary name beside `path`, unique per process and thread (two writers never share one)."""
    return path.with_name(f".{path.name}.partial-{os.getpid()}-{threading.get_ident()}")


def copy_file(src: Path, dst: Path) -> None:
    """Copies src to dst through a temporary file and a rename: a file hard-linked to dst is never written through."""
    tmp = temp_name(dst)
    try:
        copy_nofollow(src, tmp)  # a link planted at the temporary name is refused, never written through
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_lines(path: Path, lines: Iterator[str]) -> None:
    """Writes a text file through a temporary file and a rename (never through a hard link, never half)."""
    tmp = temp_name(path)
    try:
        with open_nofollow(tmp, "w") as f:
            f.writelines(lines)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_dataset(rows: list[CheckedRow], out_dir: Path, pool: ThreadPoolExecutor) -> int:
    """Writes rows + their images into a self-contained dataset folder; returns image count."""
    image_dir = out_dir / "images"
    image_dir.mkdir(parents=True, exist_ok=True)
    to_copy: dict[str, Path] = {}

    def data_lines() -> Iterator[str]:
        for checked in rows:
            refs = []
            for image in checked.images:
                name = image.sha[:20] + image.suffix
                to_copy.setdefault(name, image.path)
                refs.append(f"images/{name}")
            out = dict(checked.row)
            if refs or "images" in checked.row:
                out["images"] = refs
            out[ORIGIN_KEY] = checked.origin  # the user's file:line and image names (evaluate's report)
            yield json.dumps(out, ensure_ascii=False) + "\n"

    write_text_lines(out_dir / "data.jsonl", data_lines())
    # a copy, not a link: a validated dataset must not change with its source
    list(pool.map(lambda item: copy_file(item[1], image_dir / item[0]), to_copy.items()))
    return len(to_copy)


def quarantine_record(issue: Issue) -> dict[str, Any]:
    """Returns a quarantine line: file, line, code, message, raw; plus origin / origin_images when the row had one."""
    return {k: v for k, v in issue.__dict__.items() if v or k not in ("origin", "origin_images")}


def write_outputs(
    train: list[CheckedRow], held_out: list[CheckedRow], rejected: list[RejectedLine], outputs: Outputs,
    pool: ThreadPoolExecutor, token_settings: dict[str, Any] | None = None,
) -> int:  # fmt: skip
    """Writes the quarantine and both datasets (with their token figures); returns the number of images written.

    `outputs.train` / `outputs.eval` are the staging folders of `staged_outputs`; the quarantine
    is one file, written through a temporary name and a rename.
    """
    outputs.quarantine.parent.mkdir(parents=True, exist_ok=True)
    write_text_lines(
        outputs.quarantine, (json.dumps(quarantine_record(r.issue), ensure_ascii=False) + "\n" for r in rejected)
    )
    written = write_dataset(train, outputs.train, pool) + write_dataset(held_out, outputs.eval, pool)
    for rows, folder in ((train, outputs.train), (held_out, outputs.eval)):
        write_token_stats(folder, token_stats([r.tokens for r in rows], **(token_settings or {})))
    return written


@contextmanager
def staged_outputs(outputs: Outputs, digests: dict[str, str]) -> Iterator[Outputs]:
    """Yields `outputs` with the two dataset folders replaced by staging folders; publishes both at the end.

    Each dataset folder is written whole (`components.common.manifest`): its completion marker
    (size + sha256 of every file) is written last and the folder renamed into place, so an
    interrupted run leaves the previous folder or none, never a mix. On an error both staging
    folders are removed and nothing at the final paths changes.

    Args:
        outputs: The final paths.
        digests: Filled on success with {"train", "eval"}: each marker's sha256.
    """
    staged = {}
    try:
        for split, final in (("train", outputs.train), ("eval", outputs.eval)):
            staged[split] = manifest.staging_folder(final)
        yield dataclasses.replace(outputs, train=staged["train"], eval=staged["eval"])
        for split, final in (("train", outputs.train), ("eval", outputs.eval)):
            digests[split] = manifest.publish(staged.pop(split), final, producer="validate-data")
    finally:
        for split, staging in staged.items():
            manifest.discard(staging, getattr(outputs, split))


def write_lineage(
    result: ValidationResult, files: list[ReadFile], rejected: list[RejectedLine], snapshot: dict[str, Any],
    extra: dict[str, Any], previous: dict[str, Any] | None, train_out: Path,
) -> None:  # fmt: skip
    """Writes the data lineage into the train dataset folder and the result's stats."""
    quarantined: dict[str, int] = {}
    for r in rejected:
        quarantined[r.issue.file] = quarantined.get(r.issue.file, 0) + 1
    per_file = {f.name: {"rows": f.n_read - f.n_blank, "quarantined": quarantined.get(f.name, 0)} for f in files}
    c = result.counts
    lineage = {
        **extra,
        "snapshot": snapshot,
        "files": per_file,
        "n_rows": c["n_lines"],
        "n_train": c["n_train"],
        "n_eval": c["n_eval"],
    }
    (train_out / snap.LINEAGE_FILE).write_text(json.dumps(lineage, indent=1, sort_keys=True), encoding="utf-8")
    result.stats["lineage"] = lineage
    if previous is not None:
        change = snap.diff(previous["snapshot"], snapshot)
        result.stats["since"] = {
            "fingerprint": previous["snapshot"].get("fingerprint", ""),
            "added": change.added, "removed": change.removed, "changed": change.changed,
            "unchanged": change.unchanged,
            "rows_before": int(previous.get("n_rows", 0) or 0), "rows_now": c["n_lines"],
            "file_rows_before": {k: v.get("rows") for k, v in (previous.get("files") or {}).items()},
        }  # fmt: skip
