"""Validate ms-swift JSONL data line by line and write clean train/eval datasets.

Every non-blank input line ends up in exactly one place: the clean train set, the clean
eval set, or the quarantine (with file, line number, a stable code and a message).
Nothing is dropped silently: `train + eval + quarantined == non-blank lines read`, counted
from every source as it is read and checked before anything is written (a violation is a
bug here and raises LineAccountingError). A blank line (only ASCII whitespace after the
end-of-line and a leading BOM are removed; for a line over MAX_LINE_BYTES, its first
64 KiB) is not a row: it is neither kept nor quarantined, and is not counted in
`n_lines`, but it still counts for the line numbers.

A dataset written here is a folder:

    data.jsonl    one row per line, image paths relative to this folder
    token_stats.json  the rows' token counts (max, p95, mean; `components.common.dataset`)
    images/       the rows' images, named by content hash (copied once)
    complete.json the completion marker, written last: every file's size and sha256
                  (`components.common.manifest`; readers check it)

written into a staging folder beside its final path and renamed into place at the end, so
it is whole or absent (an interrupted run leaves the previous folder), and self-contained:
readable by the training task wherever the folder is (`/gcs/...` on Vertex, a local folder
under kfp.local). Images given as http(s) URLs,
gs:// URIs or base64 are fetched once and copied in like local ones.

How it runs: the output paths are checked first (none may be, or hold, an input file or
an image a row uses: re-validating a clean set into its own folder is refused before
anything is written). Each file is parsed line by line (text checks; a JSON object with
the same key twice is quarantined, never last-wins), then every distinct image is
inspected once, in a thread pool: its bytes hashed, its header read (PIL's `Image.open`
+ `verify()`: size, mode, chunk checksums), and, only when its size passes, its pixels
decoded once per distinct content (a truncated or corrupt file is E_IMAGE_UNREADABLE
here, not a crash in training). JPEGs decode at 1/8 scale (`Image.draft`: every byte is
still read and entropy-decoded), and the pixels of all decodes in flight together stay
under DECODE_BUDGET_BYTES. 16-bit grayscale images (modes I;16*, I) are converted, not
rejected: the clean dataset holds an 8-bit grayscale PNG of their top 8 bits (what
ms-swift's `convert("RGB")` would otherwise clip to white). An image with an EXIF orientation
other than 1 (a phone photo stored sideways, tagged to be shown rotated) is made upright: the
clean dataset holds a PNG of its pixels rotated / mirrored as the tag says, with no EXIF, so
ms-swift (which ignores the tag) trains on, and evaluate scores, the view the boxes were drawn
on; sizes and boxes are checked against the upright size, and `counts["n_exif_rotated"]`
counts these images. Token counts are what ms-swift
encodes: the text through the model's tokenizer, the images at the size ms-swift resizes them
to (`max_pixels`, then smart resize; see `_tokens.py`). An HTML report (`_report.py`) shows the
counts, distributions and the first errors with thumbnails.

The phases, one module each, run in order by `_validate`: `_read` (files, lines and the text
checks; a row's shape in `_schema`), `_paths` (no output may hold an input or an image),
`_images` (inspection and decoding), `_row_checks` (boxes, tokens, duplicates), `_split` (the
split and leaked eval rows), `_write` (the quarantine, both datasets, the lineage) and `_report`;
the records they pass on are in `types`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.common import data_policy
from components.common import snapshot as snap
from components.validate_data import _formats, _images, _read, _row_checks, _split
from components.validate_data._leakage import Leak
from components.validate_data._paths import check_image_paths, check_paths
from components.validate_data._report import write_report
from components.validate_data._tokens import TokenCounter
from components.validate_data._write import staged_outputs, write_lineage, write_outputs
from components.validate_data.types import (
    TASKS,
    CheckedRow,
    DataError,
    LineAccountingError,
    Outputs,
    ReadFile,
    RejectedLine,
    ValidationResult,
    invalid_fraction,
)


def _check_line_accounting(
    files: list[ReadFile], train: list[CheckedRow], held_out: list[CheckedRow], rejected: list[RejectedLine]
) -> int:
    """Checks that every non-blank line read ended up in exactly one output; returns their number.

    Raises:
        LineAccountingError: train + eval + quarantined != non-blank lines read.
    """
    n_rows = sum(f.n_read - f.n_blank for f in files)
    if len(train) + len(held_out) + len(rejected) != n_rows:
        per_file = ", ".join(f"{f.name}: {f.n_read} read, {f.n_blank} blank" for f in files)
        raise LineAccountingError(
            f"validate-data lost track of lines (a bug, not a data problem): {n_rows} non-blank lines read "
            f"({per_file}) but {len(train)} train + {len(held_out)} eval + {len(rejected)} quarantined "
            f"= {len(train) + len(held_out) + len(rejected)}"
        )
    return n_rows


def _result(
    checked: list[CheckedRow], train: list[CheckedRow], held_out: list[CheckedRow], rejected: list[RejectedLine],
    *, n_lines: int, n_images: int, outputs: Outputs, counter: TokenCounter, max_length: int,
    max_invalid_fraction: float,
) -> ValidationResult:  # fmt: skip
    """Gathers the counts and statistics of a run into its ValidationResult."""
    counts: dict[str, int] = {
        "n_lines": n_lines,
        "n_valid": len(train) + len(held_out),
        "n_invalid": len(rejected),
        "n_train": len(train),
        "n_eval": len(held_out),
        "n_images": n_images,
    }
    for r in rejected:
        counts[r.issue.code] = counts.get(r.issue.code, 0) + 1
    valid_images = {id(i): i for r in train + held_out for i in r.images}.values()
    stats = {
        "token_counts": [r.tokens for r in checked],
        "token_source": counter.source,
        "token_model": counter.model,
        "token_model_dir": counter.model_dir,
        "max_length": max_length,
        "max_pixels": counter.max_pixels,
        "max_invalid_fraction": max_invalid_fraction,
        "image_sizes": [(i.width, i.height) for i in {i.sha: i for i in valid_images}.values()],
    }
    issues = [r.issue for r in rejected]
    return ValidationResult(
        str(outputs.train), str(outputs.eval), str(outputs.quarantine), counts, issues, stats, outputs.report
    )


def _enforce_policy(result: ValidationResult, max_invalid_fraction: float, leakage: str = "quarantine") -> None:
    """Raises DataError when too many lines are invalid, eval rows leak with leakage "error", or a dataset came
    out empty."""
    c = result.counts
    fraction = invalid_fraction(c)
    if fraction > max_invalid_fraction:
        raise DataError(
            f"{c['n_invalid'] - c.get('E_LEAK', 0)} of {c['n_lines']} lines invalid ({fraction:.1%} > "
            f"max_invalid_fraction {max_invalid_fraction:.1%}); fix them or raise data.max_invalid_fraction\n"
            + result.summary()
        )
    if leakage == "error" and c.get("n_leaked"):
        shown = "; ".join(f"eval {k['eval']} <- train {', '.join(k['train'])}" for k in result.stats["leaks"][:5])
        raise DataError(
            f"{c['n_leaked']} eval row(s) share an image or a prompt with train rows ({shown}"
            f"{'; ...' if c['n_leaked'] > 5 else ''}): remove them from the eval data, or set data.leakage "
            "(CLI --leakage) to quarantine to drop them or warn to keep them\n" + result.summary()
        )
    if not c["n_train"]:
        raise DataError("no valid training rows left\n" + result.summary())
    if not c["n_eval"]:
        raise DataError("no valid eval rows: pass an eval file or more training rows\n" + result.summary())


def validate_data(
    train_files: list[str],
    train_out: str,
    eval_out: str,
    quarantine_out: str,
    eval_files: list[str] | None = None,
    eval_fraction: float = 0.1,
    max_invalid_fraction: float = 0.0,
    split_seed: str = "split-v1",
    *,
    report_out: str | None = None,
    model_dir: str | None = None,
    max_length: int = 0,
    max_pixels: int = 0,
    task: str = "",
    fetch_timeout: float = 30.0,
    workers: int = 0,
    box_convention: str = "pixel",
    snapshot: dict[str, Any] | None = None,
    lineage: dict[str, Any] | None = None,
    previous_lineage: dict[str, Any] | None = None,
    leakage: str = data_policy.DEFAULT_LEAKAGE,
    columns: str = "",
) -> ValidationResult:
    """Validates JSONL files and writes clean train/eval datasets and a quarantine.

    Args:
        train_files: ms-swift JSONL files with training rows: local paths (`/gcs/...` on
            Vertex) or gs:// URIs.
        train_out: Folder for the clean training set (data.jsonl + images/).
        eval_out: Folder for the clean held-out set (data.jsonl + images/).
        quarantine_out: JSONL file for the rejected lines.
        eval_files: Held-out JSONL files; None or [] = hash-split `eval_fraction` of train.
            Default None.
        eval_fraction: Held-out fraction for the hash split, 0 < f < 1. Default 0.1. When
            the split leaves the eval set empty and there are >= 2 rows, the row with the
            lowest split key goes to eval, so there is always something to evaluate on.
        max_invalid_fraction: Largest tolerated fraction of invalid lines. Default 0.0.
        split_seed: Salt of the split hash. Default "split-v1".
        report_out: HTML report file; None = no report. Written before the policy check,
            so a failed run still has one. Default None.
        model_dir: Model folder whose tokenizer and preprocessor_config.json count tokens;
            None = the approximation of `_tokens.approx_text_tokens` with Qwen3-VL image
            defaults. Default None.
        max_length: Largest token count of a row (ms-swift `max_length`: ms-swift drops a
            longer row); 0 = no check (counts are still reported). Default 0.
        max_pixels: ms-swift's `max_pixels` argument of the training run (`swift.max_pixels`),
            px: images of a larger area are counted (and resized_pixel boxes checked) at the
            size ms-swift scales them to; 0 = none, full size (ms-swift's default). Default 0.
        task: Answer check: "" none, "json" (every assistant answer holds a ```json block
            that parses), "detection" (that block is a list of {"label", "bbox": [4
            numbers]}, as evaluate parses it). Default "".
        fetch_timeout: Seconds a single image download (http(s), gs://) may take in all.
            Default 30.
        workers: Threads inspecting images; 0 = 4 per CPU, at most 32. Default 0.
        box_convention: What detection boxes mean (components.common.boxes): "pixel",
            "norm1000", "resized_pixel" or "auto" (the family of the model in `model_dir`).
            With task "detection" every box must be 4 numbers with x1 < x2, y1 < y2, inside
            the row's image in that convention (E_BOX). Default "pixel".
        snapshot: A data snapshot (components.common.snapshot): when given, `train_files`
            and `eval_files` must be its files (`snapshot_files`), each read only if it is
            still the snapshot's, and the data lineage (`LINEAGE_FILE`: the snapshot, rows
            per file, the `lineage` extras) is written into the train dataset folder and
            `stats["lineage"]`. Default None.
        lineage: Extra lineage fields, e.g. {"training_key": ...}. Default None.
        previous_lineage: The champion's data lineage; the report and `stats["since"]`
            say what changed since (files added / removed / changed, rows). Default None.
        leakage: An eval row sharing an image (by content) or, without images, its prompt
            with a train row (`_leakage`): "quarantine" it (E_LEAK; not counted against
            max_invalid_fraction), "error" (quarantined, then the run fails naming both
            rows), or "warn" (kept; a warning). Either way `counts["n_leaked"]` counts them
            and `stats["leaks"]` lists them (eval and train file:line). The hash split keeps
            rows sharing an image on one side. Default "quarantine".
        columns: A LLaMA-Factory dataset_info.json entry (`FILE` or `FILE:NAME`) whose `columns` / `tags` say
            how sharegpt rows are laid out; "" = forms recognised by their keys (`_formats`). Default "".

    Returns:
        The ValidationResult.

    Raises:
        DataError: An output would overwrite an input (`check_paths`; a local image in an
            output folder too: checked before anything is written); a file is missing,
            empty, or changed since the snapshot; the model folder has no tokenizer, max_pixels
            is negative, the task is unknown, eval_fraction / max_invalid_fraction / leakage break
            the config's rules (`components.common.data_policy`), fewer than one valid train row,
            the invalid fraction exceeds `max_invalid_fraction`, or eval rows leak with leakage
            "error" (message holds the summary).
        LineAccountingError: Clean + quarantined rows differ from the non-blank lines read
            (a bug in this module; nothing is written).
    """
    _check_settings(task, eval_fraction, max_invalid_fraction, leakage)
    check_paths(
        [str(f) for f in [*train_files, *(eval_files or [])]], train_out=str(train_out), eval_out=str(eval_out),
        quarantine_out=str(quarantine_out), report_out=report_out or "",
    )  # fmt: skip
    try:
        counter = TokenCounter(model_dir, max_pixels)
    except ValueError as exc:
        raise DataError(str(exc)) from None
    boxes = _row_checks.box_check(task, box_convention, model_dir, max_pixels)
    try:
        column_map = _formats.load_column_map(columns) if columns else None
    except _formats.FormatError as exc:
        raise DataError(str(exc)) from None
    workers = workers or min(32, 4 * (os.cpu_count() or 1))
    run = _Run(
        [str(f) for f in train_files], [str(f) for f in eval_files or []],
        Outputs(Path(train_out), Path(eval_out), Path(quarantine_out), report_out or ""), task=task, counter=counter,
        max_length=max_length, boxes=boxes, fetch_timeout=fetch_timeout, eval_fraction=eval_fraction,
        split_seed=split_seed, max_invalid_fraction=max_invalid_fraction, leakage=leakage, columns=column_map,
        snapshot=snapshot, lineage=lineage, previous_lineage=previous_lineage,
    )  # fmt: skip
    staging = Path(tempfile.mkdtemp(prefix="validate-data-"))
    try:
        with ThreadPoolExecutor(workers) as pool:
            return _validate(run, staging, pool)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _check_settings(task: str, eval_fraction: float, max_invalid_fraction: float, leakage: str) -> None:
    """Raises DataError for an unknown task, or a setting that breaks the config's rule for it."""
    if task not in TASKS:
        raise DataError(f"task {task!r} is not one of {TASKS}")
    for name, value in (("eval_fraction", eval_fraction), ("max_invalid_fraction", max_invalid_fraction),
                        ("leakage", leakage)):  # fmt: skip
        if problem := data_policy.setting_problem(name, value):
            raise DataError(f"{name} {problem} (the rule of data.{name})")


@dataclass(frozen=True)
class _Run:
    """One run's inputs and settings, as `validate_data` checked and resolved them (its arguments say more).

    Attributes:
        train_files: The training files, in order.
        eval_files: The eval files, in order ([] = the hash split).
        outputs: Where the run writes.
        task: The answer check ("" = none).
        counter: Counts a row's tokens.
        max_length: Largest token count of a row (0 = no check).
        boxes: The detection box check; None = none.
        fetch_timeout: Seconds per image download.
        eval_fraction: Held-out fraction of the hash split.
        split_seed: Salt of the split hash.
        max_invalid_fraction: Largest tolerated fraction of invalid lines.
        leakage: What is done with a leaked eval row: quarantine, error or warn.
        columns: The sharegpt column map; None = forms recognised by their keys.
        snapshot: The data snapshot the files are read from; None = none.
        lineage: Extra lineage fields. Default None.
        previous_lineage: The champion's data lineage. Default None.
    """

    train_files: list[str]
    eval_files: list[str]
    outputs: Outputs
    task: str
    counter: TokenCounter
    max_length: int
    boxes: _row_checks.BoxCheck | None
    fetch_timeout: float
    eval_fraction: float
    split_seed: str
    max_invalid_fraction: float
    leakage: str
    columns: _formats.ColumnMap | None
    snapshot: dict[str, Any] | None
    lineage: dict[str, Any] | None = None
    previous_lineage: dict[str, Any] | None = None


def _validate(run: _Run, staging: Path, pool: ThreadPoolExecutor) -> ValidationResult:
    """Runs the phases in order: read, check image paths, inspect images, check rows, split, account, write,
    report, policy."""
    files = _read_files(run, staging)
    pending = [p for f in files for p in f.pending]
    check_image_paths(pending, run.outputs)
    inspected = _images.inspect_images(pending, staging=staging, timeout=run.fetch_timeout, pool=pool)
    checked, rejected_rows = _row_checks.check_rows(
        pending, inspected, counter=run.counter, max_length=run.max_length, boxes=run.boxes
    )
    rejected = [r for f in files for r in f.rejected] + rejected_rows

    hash_split = not run.eval_files
    train, held_out = _split.split_rows(
        checked, hash_split=hash_split, eval_fraction=run.eval_fraction, split_seed=run.split_seed
    )
    # a hash split leaks only when every row shares an image: quarantining its eval rows would empty eval
    split_leakage = "warn" if hash_split and run.leakage == "quarantine" else run.leakage
    held_out, leaks = _split.handle_leaks(train, held_out, rejected, split_leakage)
    kept = {id(r) for r in train + held_out}
    checked = [r for r in checked if id(r) in kept]  # quarantined eval rows count no more as valid rows
    order = [*run.train_files, *run.eval_files]
    rejected.sort(key=lambda r: (order.index(r.issue.file), r.issue.line))
    n_lines = _check_line_accounting(files, train, held_out, rejected)

    result = _write(run, files, (checked, train, held_out, rejected), leaks, n_lines, pool)
    if run.outputs.report:
        issues = [(r.issue, r.thumbnails) for r in rejected]
        box_geometry = (run.boxes.convention, run.boxes.rule) if run.boxes else None
        write_report(run.outputs.report, result, issues, valid=train + held_out, task=run.task, boxes=box_geometry)
    _enforce_policy(result, run.max_invalid_fraction, run.leakage)
    return result


def _read_files(run: _Run, staging: Path) -> list[ReadFile]:
    """Reads every input file (train first, then eval) through the text checks (`_read.parse_file`)."""
    inputs = [(name, False) for name in run.train_files] + [(name, True) for name in run.eval_files]
    entries = _snapshot_entries(run.snapshot, run.train_files, run.eval_files)
    return [
        _read.parse_file(
            name,
            index=i,
            is_eval=is_eval,
            task=run.task,
            staging=staging,
            entry=entries.get(name),
            columns=run.columns,
        )  # fmt: skip
        for i, (name, is_eval) in enumerate(inputs)
    ]


def _write(
    run: _Run, files: list[ReadFile],
    rows: tuple[list[CheckedRow], list[CheckedRow], list[CheckedRow], list[RejectedLine]],
    leaks: list[Leak], n_lines: int, pool: ThreadPoolExecutor,
) -> ValidationResult:  # fmt: skip
    """Writes the quarantine and both dataset folders (each whole, its marker last) and the lineage; returns the
    run's result. `rows`: (checked, train, eval, rejected)."""
    checked, train, held_out, rejected = rows
    counter = run.counter
    settings = {"max_length": run.max_length, "max_pixels": counter.max_pixels, "source": counter.source}
    digests: dict[str, str] = {}
    with staged_outputs(run.outputs, digests) as staged:  # each dataset folder whole, its marker last
        n_images = write_outputs(train, held_out, rejected, staged, pool, settings)
        result = _result(
            checked, train, held_out, rejected, n_lines=n_lines, n_images=n_images, outputs=run.outputs,
            counter=counter, max_length=run.max_length, max_invalid_fraction=run.max_invalid_fraction,
        )  # fmt: skip
        result.counts["n_leaked"] = len(leaks)
        forms = sum((Counter(f.forms) for f in files), Counter())
        result.counts.update({f"n_form_{form}": forms[form] for form in _formats.FORMS if forms[form]})
        result.counts["n_exif_rotated"] = len(
            {i.sha for r in train + held_out for i in r.images if i.exif_orientation != 1}
        )
        result.stats.update(leakage=run.leakage, leaks=[leak.record() for leak in leaks])
        if run.snapshot is not None:
            # the task the rows were checked for: serve's smoke test reads it
            extra = {"task": run.task, **(run.lineage or {})}
            write_lineage(result, files, rejected, run.snapshot, extra, run.previous_lineage, staged.train)
    result.stats["manifests"] = digests
    return result


def snapshot_files(snapshot: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Returns (train files, eval files) of a data snapshot, in its order."""
    return [e["uri"] for e in snapshot["train"]], [e["uri"] for e in snapshot["eval"]]


def _snapshot_entries(
    snapshot: dict[str, Any] | None, train_files: list[str], eval_files: list[str]
) -> dict[str, dict[str, Any]]:
    """Returns {file: snapshot entry}; checks that the files are the snapshot's."""
    if snapshot is None:
        return {}
    train, held_out = snapshot_files(snapshot)
    if (train, held_out) != (train_files, eval_files):
        raise DataError("the files to validate are not the snapshot's; pass snapshot_files(snapshot)")
    return {e["uri"]: e for split in snap.SPLITS for e in snapshot[split]}


def training_max_pixels(swift_args: dict[str, Any], max_pixels: int = 0) -> int:
    """Returns the ms-swift `max_pixels` a training run resizes images with: what validate-data must count with.

    Args:
        swift_args: The run's `swift sft` arguments (the config's `swift` section).
        max_pixels: A value given on its own, px; 0 = `swift_args["max_pixels"]`. Default 0.

    Returns:
        The max_pixels, px; 0 = none (ms-swift's default).

    Raises:
        DataError: Not a whole number >= 0, or `max_pixels` differs from the swift section's.
    """
    swift_value = swift_args.get("max_pixels") or 0
    for name, value in (("swift.max_pixels", swift_value), ("max_pixels", max_pixels)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise DataError(f"{name} must be a whole number of pixels >= 0 (0 = no limit), got {value!r}")
    if max_pixels and swift_value and max_pixels != swift_value:
        raise DataError(
            f"max_pixels {max_pixels} differs from swift.max_pixels {swift_value}, which training resizes images "
            "with: pass the same value, or 0 to take the swift section's"
        )
    return max_pixels or swift_value


def validate_snapshot(
    snapshot_json: str, *, train_out: str, eval_out: str, quarantine_out: str, training_key: str = "",
    champion_dir: str = "", **kwargs: Any,
) -> ValidationResult:  # fmt: skip
    """Validates exactly the files of a data snapshot (snapshot-data's `snapshot` output).

    Args:
        snapshot_json: The snapshot's JSON text.
        train_out: Folder for the clean training set.
        eval_out: Folder for the clean held-out set.
        quarantine_out: JSONL file for the rejected lines.
        training_key: Key of data + training settings, recorded in the lineage. Default "".
        champion_dir: The champion's merged model folder ("" = none): the report says what
            changed since its data. Default "".
        **kwargs: The other `validate_data` arguments (eval_fraction, task, model_dir, ...).

    Returns:
        The ValidationResult; `stats["lineage"]` is the data lineage.

    Raises:
        DataError: A malformed snapshot, a damaged champion lineage (`snap.read_lineage`), a file
            changed since the snapshot, or as `validate_data`.
    """
    try:
        snapshot = snap.parse(snapshot_json)
        previous_lineage = snap.read_lineage(champion_dir)  # a damaged champion lineage: a named error
    except snap.SnapshotError as exc:
        raise DataError(str(exc)) from None
    train_files, eval_files = snapshot_files(snapshot)
    return validate_data(
        train_files, train_out, eval_out, quarantine_out, eval_files, snapshot=snapshot,
        lineage={"training_key": training_key} if training_key else {},
        previous_lineage=previous_lineage, **kwargs,
    )  # fmt: skip
