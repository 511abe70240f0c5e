"""Validate the regression set: the same line, image and duplicate checks as the task rows, plus kind and gold.

A regression row (`components.common.regression`) is a task row in form (`messages` +
`images`) with a `kind`: vqa, ocr or grounding. Every non-blank line ends up in the clean
regression dataset or in the quarantine, as for the task data:

* the text checks of `_read.parse_file` (E_ENCODING, E_JSON, E_DUPLICATE_KEY, E_SCHEMA, E_ROLE,
  E_ORDER, E_IMAGE_COUNT, E_IMAGE_PATH), with no task answer check;
* the kind and its gold answer (`regression.row_problem`): E_REGRESSION_KIND (no kind, or an
  unknown one), E_REGRESSION_GOLD (an empty gold answer; a grounding gold that is not a
  ```json list of boxes);
* the images (E_IMAGE_*), duplicates (E_DUPLICATE) and, for grounding rows, the boxes against
  the image in the data's box convention (E_BOX), as `_row_checks` checks them.

The clean set is one dataset folder (data.jsonl + images/ + its completion marker), written
whole or not at all. A set that quarantines to nothing is `EmptyRegressionSet`, raised
before any GPU work (train-lora waits for this task); more quarantined lines than
`max_invalid_fraction` allows is a DataError as for the task data. Token counts and the
train/eval split do not apply: the rows are only generated on.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.common import manifest, regression
from components.common import snapshot as snap
from components.validate_data import _images, _read, _row_checks, _write, types
from components.validate_data._paths import OTHER_FOLDER, check_image_paths, is_in, local_path, output_problem
from components.validate_data._sources import Reject
from components.validate_data._tokens import TokenCounter
from components.validate_data.types import (
    CheckedRow,
    DataError,
    Issue,
    LineAccountingError,
    Outputs,
    PendingRow,
    ReadFile,
    RejectedLine,
    issue_of,
)

CODES: dict[str, str] = {**types.CODES, **regression.CODES}
"""The codes a regression line can be quarantined with: the task rows' and the regression set's own."""


class EmptyRegressionSet(DataError):
    """Every row of the regression set was quarantined: evaluate would have nothing to guard with."""


@dataclass
class RegressionResult:
    """What validating the regression set produced.

    Attributes:
        dataset_dir: The clean regression dataset folder.
        quarantine: JSONL of the rejected lines (file, line, code, message, raw text).
        counts: n_lines (non-blank lines read), n_valid, n_invalid, rows per kind
            (`n_<kind>`), per-code counts.
        issues: The rejected lines, in input order.
        manifest_sha256: The sha256 of the dataset's completion marker.
    """

    dataset_dir: str
    quarantine: str
    counts: dict[str, int]
    issues: list[Issue] = field(default_factory=list)
    manifest_sha256: str = ""

    def summary(self, max_issues: int = 10) -> str:
        """Returns the counts (per kind, per code) and the first quarantined lines."""
        c = self.counts
        kinds = ", ".join(f"{c[f'n_{k}']} {k}" for k in regression.KIND_NAMES if c.get(f"n_{k}"))
        lines = [f"regression set: {c['n_lines']} lines: {c['n_valid']} valid ({kinds or 'none'}), "
                 f"{c['n_invalid']} quarantined"]  # fmt: skip
        lines += [f"  {code}: {c[code]}  ({text})" for code, text in CODES.items() if c.get(code)]
        lines += [f"  {issue}" for issue in self.issues[:max_issues]]
        if len(self.issues) > max_issues:
            lines.append(f"  ... and {len(self.issues) - max_issues} more in {self.quarantine}")
        return "\n".join(lines)


def _check_outputs(files: list[str], out: str, quarantine_out: str) -> None:
    """Refuses outputs that cannot be written, or that would overwrite an input (as `_paths.check_paths`)."""
    for arg, name, folder in (("regression_out", out, True), ("quarantine_out", quarantine_out, False)):
        if problem := output_problem(name, want_folder=folder):
            raise DataError(f"{arg} {name}: {problem}")
    real_out = local_path(out)
    if is_in(local_path(quarantine_out), real_out):
        raise DataError(f"quarantine_out {quarantine_out} is inside regression_out {out}: {OTHER_FOLDER}")
    for name in files:
        if is_in(local_path(name), real_out) or local_path(name) == local_path(quarantine_out):
            raise DataError(
                f"{name}: this input file is (inside) an output of the regression set's validation; it would be "
                f"overwritten while it is read: {OTHER_FOLDER}"
            )


def _kind_checks(
    files: list[ReadFile],
) -> tuple[list[PendingRow], list[RejectedLine]]:
    """Splits the rows that passed the text checks by `regression.row_problem`: (pending, rejected)."""
    pending, rejected = [], []
    for read in files:
        for p in read.pending:
            if problem := regression.row_problem(p.row):
                issue = issue_of(p.file, p.line, Reject(*problem), p.raw, p.row)
                rejected.append(RejectedLine(issue))
            else:
                pending.append(p)
    return pending, rejected


def _box_checks(
    checked: list[CheckedRow], box_check: _row_checks.BoxCheck | None
) -> tuple[list[CheckedRow], list[RejectedLine]]:
    """Checks the grounding rows' gold boxes against their images (E_BOX); returns (kept, rejected)."""
    kept, rejected = [], []
    for row in checked:
        try:
            if box_check is not None and row.row[regression.KIND_KEY] == "grounding":
                box_check.check(row.row["messages"], row.images)
            kept.append(row)
        except Reject as rej:
            issue = issue_of(row.file, row.line, rej, row.raw, row.row)
            rejected.append(RejectedLine(issue, [i.path for i in row.images]))
    return kept, rejected


def _counts(files: list[ReadFile], kept: list[CheckedRow], rejected: list[RejectedLine]) -> dict[str, int]:
    """Counts lines, rows per kind and codes; checks that every non-blank line was counted once."""
    n_lines = sum(f.n_read - f.n_blank for f in files)
    if len(kept) + len(rejected) != n_lines:
        raise LineAccountingError(
            f"validate-data lost track of regression lines (a bug, not a data problem): {n_lines} non-blank lines "
            f"read but {len(kept)} valid + {len(rejected)} quarantined"
        )
    counts = {"n_lines": n_lines, "n_valid": len(kept), "n_invalid": len(rejected)}
    for kind in regression.KIND_NAMES:
        counts[f"n_{kind}"] = sum(1 for r in kept if r.row[regression.KIND_KEY] == kind)
    for r in rejected:
        counts[r.issue.code] = counts.get(r.issue.code, 0) + 1
    return counts


def _enforce(result: RegressionResult, max_invalid_fraction: float) -> None:
    """Raises EmptyRegressionSet when nothing is left, DataError when too many lines are invalid."""
    c = result.counts
    if not c["n_valid"]:
        raise EmptyRegressionSet(
            f"the regression set (eval.regression) is empty after validation: all {c['n_lines']} of its rows were "
            f"quarantined ({result.quarantine}), so evaluate would have nothing to guard with; fix the rows, or "
            "remove eval.regression\n" + result.summary()
        )
    fraction = c["n_invalid"] / c["n_lines"]
    if fraction > max_invalid_fraction:
        raise DataError(
            f"regression set: {c['n_invalid']} of {c['n_lines']} lines invalid ({fraction:.1%} > "
            f"max_invalid_fraction {max_invalid_fraction:.1%}); fix them or raise data.max_invalid_fraction\n"
            + result.summary()
        )


def validate_regression(
    files: list[str],
    out: str,
    quarantine_out: str,
    *,
    snapshot: dict[str, Any] | None = None,
    model_dir: str | None = None,
    box_convention: str = "pixel",
    max_pixels: int = 0,
    max_invalid_fraction: float = 0.0,
    fetch_timeout: float = 30.0,
    workers: int = 0,
) -> RegressionResult:
    """Validates regression rows and writes the clean regression set and its quarantine.

    Args:
        files: The regression set's JSONL files (local paths or gs:// URIs).
        out: Folder for the clean regression dataset (data.jsonl + images/ + completion marker).
        quarantine_out: JSONL file for the rejected lines.
        snapshot: The regression set's snapshot (snapshot-data's `regression_snapshot`): each file
            is read only if it is still the snapshot's; `files` must be its files. Default None.
        model_dir: The base model folder: its family resolves box_convention "auto", its processor
            the resized_pixel rule. Default None.
        box_convention: What grounding boxes mean, as `data.box_convention`. Default "pixel".
        max_pixels: ms-swift's `max_pixels` (resized_pixel boxes). Default 0.
        max_invalid_fraction: Largest tolerated fraction of invalid lines (`data.max_invalid_fraction`).
            Default 0.0.
        fetch_timeout: Seconds one image download may take. Default 30.
        workers: Threads inspecting images; 0 = 4 per CPU, at most 32. Default 0.

    Returns:
        The RegressionResult.

    Raises:
        EmptyRegressionSet: No row is valid.
        DataError: An output that cannot be written or would overwrite an input, a file missing,
            empty or changed since the snapshot, files that are not the snapshot's, or more invalid
            lines than max_invalid_fraction.
        LineAccountingError: Valid + quarantined rows differ from the lines read (a bug here).
    """
    _check_outputs(files, out, quarantine_out)
    entries = {e["uri"]: e for e in (snapshot or {}).get("train", [])}
    if snapshot is not None and sorted(entries) != sorted(files):
        raise DataError("the regression files to validate are not the snapshot's; pass its train list")
    staging = Path(tempfile.mkdtemp(prefix="validate-regression-"))
    try:
        with ThreadPoolExecutor(workers or min(32, 4 * (os.cpu_count() or 1))) as pool:
            return _validate(files, Path(out), Path(quarantine_out), entries, staging, pool, max_invalid_fraction,
                             (model_dir, box_convention, max_pixels, fetch_timeout))  # fmt: skip
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _validate(
    files: list[str], out: Path, quarantine: Path, entries: dict[str, dict[str, Any]], staging: Path,
    pool: ThreadPoolExecutor, max_invalid_fraction: float, settings: tuple[str | None, str, int, float],
) -> RegressionResult:  # fmt: skip
    """Reads, checks, writes, then applies the policy (see `validate_regression`)."""
    model_dir, box_convention, max_pixels, fetch_timeout = settings
    read = [
        _read.parse_file(name, index=i, is_eval=True, task="", staging=staging, entry=entries.get(name))
        for i, name in enumerate(files)
    ]
    pending, rejected = _kind_checks(read)
    check_image_paths(pending, Outputs(out, out, quarantine, ""))
    inspected = _images.inspect_images(pending, staging=staging, timeout=fetch_timeout, pool=pool)
    checked, rejected_rows = _row_checks.check_rows(
        pending, inspected, counter=TokenCounter(None, max_pixels), max_length=0
    )
    grounding = any(r.row[regression.KIND_KEY] == "grounding" for r in checked)
    box_check = _row_checks.box_check("detection", box_convention, model_dir, max_pixels) if grounding else None
    kept, rejected_boxes = _box_checks(checked, box_check)
    rejected = [r for f in read for r in f.rejected] + rejected + rejected_rows + rejected_boxes
    rejected.sort(key=lambda r: (files.index(r.issue.file), r.issue.line))
    counts = _counts(read, kept, rejected)
    quarantine.parent.mkdir(parents=True, exist_ok=True)
    _write.write_text_lines(
        quarantine, (json.dumps(_write.quarantine_record(r.issue), ensure_ascii=False) + "\n" for r in rejected)
    )
    result = RegressionResult(str(out), str(quarantine), counts, [r.issue for r in rejected])
    _enforce(result, max_invalid_fraction)  # nothing published for a set that fails its policy
    staged = manifest.staging_folder(out)
    try:
        _write.write_dataset(kept, staged, pool)
        result.manifest_sha256 = manifest.publish(staged, out, producer="validate-data")
    except BaseException:
        manifest.discard(staged, out)  # whole or not at all
        raise
    return result


def validate_regression_snapshot(
    snapshot_json: str, *, out: str, quarantine_out: str, **kwargs: Any
) -> RegressionResult:
    """Validates exactly the files of a regression snapshot (snapshot-data's `regression_snapshot` output).

    Args:
        snapshot_json: The regression snapshot's JSON text.
        out: Folder for the clean regression dataset.
        quarantine_out: JSONL file for the rejected lines.
        **kwargs: The other `validate_regression` arguments (model_dir, box_convention, ...).

    Raises:
        DataError: No snapshot or a malformed one, or as `validate_regression`.
    """
    if not snapshot_json.strip():
        raise DataError("no regression snapshot: snapshot-data found no eval.regression sources")
    try:
        snapshot = snap.parse(snapshot_json, where="regression snapshot")
    except snap.SnapshotError as exc:
        raise DataError(str(exc)) from None
    return validate_regression([e["uri"] for e in snapshot["train"]], out, quarantine_out, snapshot=snapshot, **kwargs)
