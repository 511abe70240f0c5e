"""The held-out and regression rows evaluate reads, and each row's box geometry.

A validated dataset folder (validate-data's or validate-regression's output) is read whole or
not at all: its files are checked against the completion marker first
(`components.common.dataset.checked_rows_file`). Boxes are scored in pixels of the original
image, so each row's geometry carries the convention and the size of its first image (read
from the image header only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from components.common import regression as reg
from components.common.boxes import CONVENTIONS, ResizeRule
from components.common.dataset import checked_rows_file
from components.common.manifest import ManifestError
from components.common.provenance import make_origin, origin_of
from components.common.tasks import PIXEL, Geometry
from components.evaluate.result import EvalError


def load_eval_rows(dataset_dir: str | Path, max_samples: int = 0, expected_marker: str = "") -> list[dict[str, Any]]:
    """Reads a validated dataset's rows as prompts and gold answers.

    Args:
        dataset_dir: Validated dataset folder (data.jsonl + images/).
        max_samples: Keep the first N rows; 0 = all. Default 0.
        expected_marker: The sha256 of its completion marker as validate-data recorded it (the
            artifact's `manifest_sha256`). Default "" (checked when the folder has a marker).

    Returns:
        Rows {"messages": prompt messages (without the final answer), "images": absolute
        paths, "gold": the reference answer text, "line": line number in data.jsonl, "origin":
        the user's file, line and image names (`components.common.provenance`; this file's
        own when the row carries none)}.

    Raises:
        EvalError: No data.jsonl, its files differ from the folder's completion marker
            (`components.common.manifest`), or no rows.
    """
    rows = _read_rows(dataset_dir, max_samples, expected_marker)
    if not rows:
        raise EvalError(
            f"{Path(dataset_dir) / 'data.jsonl'}: eval set is empty; provide held-out rows (data.eval or a larger "
            "data.eval_fraction)"
        )
    return rows


def load_regression_rows(dataset_dir: str | Path, expected_marker: str = "") -> list[dict[str, Any]]:
    """Reads a validated regression set (validate-regression's output): rows as `load_eval_rows`, each with its kind.

    Args:
        dataset_dir: The regression dataset folder.
        expected_marker: The sha256 of its completion marker (the artifact's `manifest_sha256`).
            Default "" (checked when the folder has a marker).

    Returns:
        Rows of `load_eval_rows`, each with "kind" (one of `regression.KIND_NAMES`).

    Raises:
        EvalError: As `load_eval_rows`, no rows, or a row without a known kind (a folder
            validate-regression did not write).
    """
    rows = _read_rows(dataset_dir, 0, expected_marker)
    if not rows:
        raise EvalError(f"{Path(dataset_dir) / 'data.jsonl'}: the regression set is empty; run validate-regression")
    for row in rows:
        if row["kind"] not in reg.KINDS:
            raise EvalError(
                f"{Path(dataset_dir) / 'data.jsonl'}:{row['line']}: regression row of kind {row['kind']!r}, not one of "
                f"{', '.join(reg.KIND_NAMES)}; pass the dataset validate-regression wrote"
            )
    return rows


def _read_rows(dataset_dir: str | Path, max_samples: int, expected_marker: str) -> list[dict[str, Any]]:
    """The rows of a validated dataset folder, as `load_eval_rows` returns them (possibly none)."""
    try:  # the rows validate-data wrote: a gate never decides on a truncated copy
        src = checked_rows_file(dataset_dir, expected_marker)
    except ManifestError as exc:
        raise EvalError(str(exc)) from None
    rows = []
    with open(src, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            row = json.loads(line)
            messages = row["messages"]
            rows.append(
                {
                    "messages": messages[:-1],
                    "gold": messages[-1]["content"],
                    "images": [str((Path(dataset_dir) / p).resolve()) for p in row.get("images", [])],
                    "line": number,
                    # the user's file:line and image names (validate-data's provenance); else this file's
                    "origin": origin_of(row) or make_origin(str(src), number, row.get("images", [])),
                    "kind": row.get(reg.KIND_KEY, ""),  # a regression row's kind ("" for a task row)
                }
            )
            if max_samples and len(rows) >= max_samples:
                break
    return rows


def image_size(path: str | Path) -> tuple[int, int]:
    """Returns (width, height) of an image, px, from its header (the pixels are not decoded).

    Raises:
        EvalError: The file is missing or not an image.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return image.size
    except (OSError, UnidentifiedImageError) as exc:
        raise EvalError(f"image {path}: cannot read its size ({exc})") from None


def row_geometries(
    rows: list[dict[str, Any]], box_convention: str = "pixel", rule: ResizeRule | None = None
) -> list[Geometry]:
    """Returns each row's box geometry: the convention and the size of its first image.

    Args:
        rows: Rows of `load_eval_rows`.
        box_convention: Convention of the dataset's boxes, one of `boxes.CONVENTIONS`. Default
            "pixel" (no image is read).
        rule: Smart-resize settings for resized_pixel; None = Qwen2.5-VL's defaults. Default None.

    Raises:
        EvalError: An unknown convention ("auto" must be resolved before), or a row without a
            readable image when the convention needs its size.
    """
    if box_convention not in CONVENTIONS:
        raise EvalError(
            f"box_convention {box_convention!r} is not one of {', '.join(CONVENTIONS)} "
            "(resolve 'auto' with components.common.boxes.resolve_convention first)"
        )
    rule = rule or ResizeRule()
    if box_convention == "pixel":
        return [Geometry("pixel", None, rule) for _ in rows]
    out = []
    for row in rows:
        if not row["images"]:
            raise EvalError(f"eval row {row['line']}: no image, so its {box_convention} boxes cannot be read in pixels")
        out.append(Geometry(box_convention, image_size(row["images"][0]), rule))
    return out


def paired_geometries(
    rows: list[dict[str, Any]], box_convention: str, reference_box_convention: str, rule: ResizeRule | None
) -> tuple[list[Geometry], list[Geometry]]:
    """Each row's geometry for the gold (and the tuned model's answers), and for the reference's answers."""
    geometries = row_geometries(rows, box_convention, rule)
    if reference_box_convention == box_convention:
        return geometries, geometries
    return geometries, row_geometries(rows, reference_box_convention, rule)


def regression_paired_geometries(
    rows: list[dict[str, Any]], box_convention: str, reference_box_convention: str, rule: ResizeRule | None
) -> tuple[list[Geometry], list[Geometry]]:
    """As `paired_geometries` for regression rows: only grounding rows have boxes (the others get PIXEL, unread)."""
    boxed = [r for r in rows if r["kind"] == "grounding"]
    gold, ref = (iter(g) for g in paired_geometries(boxed, box_convention, reference_box_convention, rule))
    pairs = [(next(gold), next(ref)) if r["kind"] == "grounding" else (PIXEL, PIXEL) for r in rows]
    return [g for g, _ in pairs], [r for _, r in pairs]
