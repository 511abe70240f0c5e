"""The checks of a row once its images are inspected: its images, detection boxes, tokens and duplicates."""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.common import bounded_json
from components.common.answers import is_finite_number, parse_findings
from components.common.boxes import BoxError, ResizeRule, box_problem, convention_for_model, resolve_convention
from components.common.progress import Progress
from components.common.provenance import make_origin, origin_of
from components.validate_data import _sources
from components.validate_data._sources import Reject
from components.validate_data._tokens import TokenCounter
from components.validate_data.types import CheckedRow, DataError, InspectedImage, PendingRow, RejectedLine, issue_of


@dataclass(frozen=True)
class BoxCheck:
    """The detection box check of a run: the boxes' convention and the processor's resize rule."""

    convention: str
    rule: ResizeRule

    def check(self, messages: list[dict[str, Any]], images: list[InspectedImage]) -> None:
        """Raises Reject E_BOX for the first box of an assistant answer that is not valid."""
        # a box is relative to the row's image; with several images only the convention's own range is known
        size = (images[0].width, images[0].height) if len(images) == 1 else (10**9, 10**9)
        for i, msg in enumerate(messages):
            if msg["role"] != "assistant":
                continue
            findings, _ = parse_findings(msg["content"])
            for k, finding in enumerate(findings or []):
                if not isinstance(finding.get("label"), str) or not finding["label"].strip():
                    raise Reject("E_BOX", f"messages[{i}] finding {k}: no label; every box needs a non-empty label")
                problem = box_problem(finding.get("bbox"), self.convention, size, self.rule)
                if problem:
                    raise Reject(
                        "E_BOX",
                        f"messages[{i}] finding {k}: {problem}{_exif_note(images)}; fix the box, or set "
                        "data.box_convention to what the numbers mean (pixel, norm1000, resized_pixel)",
                    )


def _exif_note(images: list[InspectedImage]) -> str:
    """Returns, for a box error on a row whose image has an EXIF orientation, how its size was read ("" if none)."""
    turned = [i for i in images if i.exif_orientation != 1]
    if len(images) != 1 or not turned:
        return ""
    i = turned[0]
    return (
        f" (the image has EXIF orientation {i.exif_orientation}: boxes are read on its upright view, "
        f"{i.width}x{i.height}, as a photo viewer shows it and as the clean dataset holds it; draw them on that view)"
    )


def _check_object_boxes(objects: dict[str, Any], images: list[InspectedImage]) -> None:
    """Raises Reject E_BOX for the first grounding box outside its image (real) or [0, 1] (norm1), or unordered."""
    norm1 = objects.get("bbox_type", "real") == "norm1"
    ids = list(objects.get("image_id") or []) + [0] * len(objects["bbox"])
    kind = "norm1: [0, 1]" if norm1 else "real: pixels of the image"
    for k, box in enumerate(objects["bbox"]):
        image = images[ids[k]] if images and ids[k] < len(images) else None
        size = (1, 1) if norm1 or image is None else (image.width, image.height)
        if isinstance(box, list) and len(box) == 2 and all(is_finite_number(v) for v in box):  # a point
            problem = "" if 0 <= box[0] <= size[0] and 0 <= box[1] <= size[1] else f"point {box} outside the image"
        else:
            problem = box_problem(box, "pixel", size)
        if problem:
            raise Reject("E_BOX", f"objects.bbox[{k}] ({kind}): {problem}")


def box_check(task: str, convention: str, model_dir: str | None, max_pixels: int = 0) -> BoxCheck | None:
    """Returns the box check for a detection task ("auto": the convention of the model's family); resized_pixel
    boxes are checked against the image the model sees (`ResizeRule.from_model(model_dir, max_pixels)`)."""
    if task != "detection":
        return None
    family = ("", "")
    if model_dir:
        try:
            cfg = bounded_json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
            family = ((cfg.get("architectures") or [""])[0], cfg.get("model_type", ""))
        except (OSError, ValueError):
            pass
    try:
        resolved = resolve_convention(convention, *family)
    except BoxError as exc:
        raise DataError(str(exc)) from None
    native = convention_for_model(*family)
    if any(family) and resolved != native:  # a warning, not an error: the model can learn it, from further away
        warnings.warn(
            f"the data's boxes are {resolved}, but {family[0] or family[1]} was trained on {native}: fine-tuning "
            f"must unlearn its grounding; convert the data (python -m components.validate_data convert --to "
            f"{native}) and set data.box_convention: {native}",
            stacklevel=2,
        )
    return BoxCheck(resolved, ResizeRule.from_model(model_dir, max_pixels))


def _check_row(
    p: PendingRow,
    inspected: dict[_sources.Source, InspectedImage | Reject],
    *,
    counter: TokenCounter,
    max_length: int,
    seen: dict[str, str],
    boxes: BoxCheck | None = None,
) -> CheckedRow:
    """Runs the image, token and duplicate checks of one row; records it in `seen`; raises Reject."""
    images: list[InspectedImage] = []
    for _, src in p.sources:
        info = inspected[src]
        if isinstance(info, Reject):
            raise Reject(info.code, info.message)
        images.append(info)
    if "objects" in p.row:
        _check_object_boxes(p.row["objects"], images)  # E_BOX
    elif boxes is not None:
        boxes.check(p.row["messages"], images)  # E_BOX
    try:
        n_tokens = counter.text_tokens(p.row["messages"]) + sum(counter.image_tokens(i.width, i.height) for i in images)
    except ValueError as exc:
        raise Reject("E_IMAGE_SIZE", str(exc)) from None
    if max_length and n_tokens > max_length:
        pixels = f"images resized to max_pixels {counter.max_pixels}" if counter.max_pixels else "full-size images"
        raise Reject(
            "E_TOKENS", f"about {n_tokens} tokens ({counter.source}, {pixels}) > max_length {max_length}; "
            "set swift.max_pixels to shrink the images, shorten the text, or raise swift.max_length"
        )  # fmt: skip
    key = hashlib.sha256(
        json.dumps([p.row["messages"], [i.sha for i in images]], sort_keys=True, ensure_ascii=False).encode()
    ).hexdigest()
    if key in seen:
        raise Reject("E_DUPLICATE", f"same messages and images as {seen[key]}")
    seen[key] = f"{p.file}:{p.line}"
    origin = origin_of(p.row) or make_origin(p.file, p.line, [ref for ref, _ in p.sources])
    return CheckedRow(p.row, images, key, n_tokens, p.is_eval, origin, p.file, p.line, p.raw)


def _thumbnails(p: PendingRow, inspected: dict[_sources.Source, InspectedImage | Reject]) -> list[Path]:
    """Returns a rejected row's local images for the report: readable ones, and those of the wrong size."""
    return [
        x.path if isinstance(x, InspectedImage) else Path(s.location)
        for _, s in p.sources
        if isinstance(x := inspected[s], InspectedImage) or (x.code == "E_IMAGE_SIZE" and s.kind == "file")
    ]


def check_rows(
    pending: list[PendingRow],
    inspected: dict[_sources.Source, InspectedImage | Reject],
    *,
    counter: TokenCounter,
    max_length: int,
    boxes: BoxCheck | None = None,
) -> tuple[list[CheckedRow], list[RejectedLine]]:
    """Runs the row checks in input order; returns (clean rows, rejected rows)."""
    seen: dict[str, str] = {}  # row key -> file:line of its first occurrence
    checked, rejected = [], []
    with Progress("validate-data: rows (tokens, boxes)", len(pending), "rows", enabled=len(pending) > 0) as progress:
        for p in pending:
            try:
                checked.append(_check_row(p, inspected, counter=counter, max_length=max_length, seen=seen, boxes=boxes))
            except Reject as rej:
                rejected.append(RejectedLine(issue_of(p.file, p.line, rej, p.raw, p.row), _thumbnails(p, inspected)))
            progress.update()
    return checked, rejected
