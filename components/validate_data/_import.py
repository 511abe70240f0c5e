"""Detection labels from COCO JSON or Label Studio exports, as this project's rows (`vlm-lora import`).

    vlm-lora import coco|label-studio FILE --images DIR --out ROWS.jsonl [--convention norm1000] [--labels a,b]

One row per image: the user's prompt (`<image>` + a detection prompt naming the labels and the
convention) and the assistant's fenced JSON list of findings, boxes in the model's convention
(`components.common.boxes`; norm1000 for Qwen2-VL / Qwen3-VL, written `{"bbox_2d", "label"}`;
pixel as `{"label", "bbox"}`), each row carrying its source record (COCO image id, Label Studio
task and annotation ids) in its origin (`components.common.provenance`). `<out>.boxes.json` says the
convention (as `validate-data convert` writes it) and seals the rows (their size and sha256,
`_rows.import_seal`): validate-data keeps the origins of these very bytes only (a raw row's origin
is refused, E_RESERVED_KEY).

A record that cannot convert goes to `<out>.quarantine.jsonl` with a code: I_IMAGE_MISSING (no
such file under --images), I_IMAGE_SIZE (the export's width/height differ from the file's),
I_BOX_OUTSIDE (a box beyond its image by more than half a pixel), I_BOX_EMPTY (no area once in
the convention), I_LABEL (a label outside --labels), I_ROTATED (a rotated Label Studio rectangle).
A file that is not the tool's export is a named error (exit 1): a COCO annotation whose image_id or
category_id does not resolve; a Label Studio export of another labelling type (not rectangles).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.common.boxes import CONVENTIONS, box_key, from_pixels, is_proper
from components.common.provenance import ORIGIN_KEY, make_origin
from components.validate_data import _rows

SOURCES = ("coco", "label-studio")
TOLERANCE_PX = 0.5  # a box may overhang its image by rounding, no more
_UNITS = {"pixel": "in pixels", "norm1000": "with coordinates relative to the image in [0, 1000]",
          "resized_pixel": "in pixels of the resized image"}  # fmt: skip
_RECT = "rectanglelabels"


class ImportFailure(ValueError):
    """The file is not the tool's export (or cannot be read); the message names the record and the fix."""


@dataclass
class Record:
    """One image and its boxes as the export gives them (pixels of the original image).

    Attributes:
        number: The record's 1-based place in the export (its origin line).
        record: Its source id, e.g. "image_id=7" or "task=3 annotation=9".
        image: The image as the export names it.
        size: (width, height) the export declares, px; None when it declares none.
        boxes: (label, [x1, y1, x2, y2] px) per box.
        problem: (code, message) when the record itself cannot convert ("" code = none).
    """

    number: int
    record: str
    image: str
    size: tuple[int, int] | None
    boxes: list[tuple[str, list[float]]] = field(default_factory=list)
    problem: tuple[str, str] = ("", "")


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError) as exc:
        raise ImportFailure(f"{path}: cannot be read as JSON ({exc})") from None


def coco_records(path: Path) -> Iterator[Record]:
    """Yields a COCO file's images with their boxes ([x, y, w, h] -> corners); raises ImportFailure."""
    data = _load(path)
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("images", "annotations")):
        raise ImportFailure(f"{path}: not a COCO file (an object with 'images' and 'annotations' lists)")
    images = {img.get("id"): img for img in data["images"] if isinstance(img, dict)}
    names = {c.get("id"): c.get("name") for c in data.get("categories") or [] if isinstance(c, dict)}
    boxes: dict[Any, list[tuple[str, list[float]]]] = {k: [] for k in images}
    for i, ann in enumerate(data["annotations"]):
        where = f"{path}: annotations[{i}] (id {ann.get('id')!r})"
        if ann.get("image_id") not in images:
            raise ImportFailure(f"{where}: image_id {ann.get('image_id')!r} is not an id in 'images'; fix the export")
        if ann.get("category_id") not in names:
            raise ImportFailure(
                f"{where}: category_id {ann.get('category_id')!r} is not an id in 'categories' "
                f"({', '.join(map(str, names)) or 'none'}); fix the export"
            )
        bbox = ann.get("bbox")
        if not (isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(v, (int, float)) for v in bbox)):
            raise ImportFailure(f"{where}: bbox {bbox!r} is not [x, y, width, height]")
        x, y, w, h = bbox
        boxes[ann["image_id"]].append((str(names[ann["category_id"]]), [x, y, x + w, y + h]))
    for number, (image_id, img) in enumerate(images.items(), start=1):
        size = (img["width"], img["height"]) if isinstance(img.get("width"), int) else None
        yield Record(number, f"image_id={image_id}", str(img.get("file_name", "")), size, boxes[image_id])


def _ls_results(task: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """Returns (annotation id, its result items) of a Label Studio task: full JSON or JSON-MIN."""
    if isinstance(task.get("annotations"), list):  # full JSON export
        done = [a for a in task["annotations"] if isinstance(a, dict) and not a.get("was_cancelled")]
        if not done:
            return "", []
        items = [r for r in done[0].get("result") or [] if isinstance(r, dict)]
        return str(done[0].get("id", "")), [{**r.get("value", {}), **r} for r in items]
    lists = [v for k, v in task.items() if k != "data" and isinstance(v, list) and v and isinstance(v[0], dict)]
    items = [r for v in lists for r in v]  # JSON-MIN: the control tag's name holds the regions
    return str(task.get("annotation_id", "")), items


def _ls_image(task: dict[str, Any]) -> str:
    data = task.get("data") if isinstance(task.get("data"), dict) else task
    return str(data.get("image") or data.get("img") or "")


def label_studio_records(path: Path) -> Iterator[Record]:
    """Yields a Label Studio export's tasks with their rectangles (percent -> pixels); raises ImportFailure."""
    data = _load(path)
    if not isinstance(data, list):
        raise ImportFailure(f"{path}: not a Label Studio export (a JSON list of tasks; export JSON or JSON-MIN)")
    for number, task in enumerate(data, start=1):
        if not isinstance(task, dict):
            raise ImportFailure(f"{path}: task {number} is {type(task).__name__}, not an object")
        annotation, items = _ls_results(task)
        rec = Record(number, f"task={task.get('id')} annotation={annotation}", _ls_image(task), None)
        for k, item in enumerate(items):
            kinds = [key for key in item if key.endswith("labels") or key in ("choices", "textarea")]
            if _RECT not in item:
                raise ImportFailure(
                    f"{path}: task {task.get('id')!r} region {k} is {item.get('type') or ', '.join(kinds) or 'not a'} "
                    "region, not rectanglelabels: only rectangle (bounding box) projects import as detection rows"
                )
            width, height = item.get("original_width"), item.get("original_height")
            if not isinstance(width, int) or not isinstance(height, int):
                raise ImportFailure(f"{path}: task {task.get('id')!r} region {k} has no original_width/height")
            rec.size = (width, height)
            if item.get("rotation"):
                rec.problem = ("I_ROTATED", f"region {k} is rotated {item['rotation']} degrees: not an upright box")
            x, y, w, h = (float(item[key]) * scale / 100 for key, scale in
                          (("x", width), ("y", height), ("width", width), ("height", height)))  # fmt: skip
            for label in item[_RECT]:
                rec.boxes.append((str(label), [x, y, x + w, y + h]))
        yield rec


def _find_image(images: Path, name: str) -> Path | None:
    """Returns the file under `images` an export names (Label Studio's upload prefix `abcd1234-` tolerated)."""
    base = name.split("?")[0].rstrip("/").rsplit("/", 1)[-1]
    for candidate in (images / name, images / base, images / base.split("-", 1)[-1]):
        if name and candidate.is_file():
            return candidate
    return None


def _problem(rec: Record, path: Path | None, size: tuple[int, int], labels: set[str]) -> tuple[str, str]:
    if rec.problem[0]:
        return rec.problem
    if path is None:
        return "I_IMAGE_MISSING", f"image {rec.image!r} is not under --images; copy it there or fix --images"
    if rec.size and tuple(rec.size) != size:
        return "I_IMAGE_SIZE", f"the export says {rec.size[0]}x{rec.size[1]}, {path.name} is {size[0]}x{size[1]}"
    for k, (label, (x1, y1, x2, y2)) in enumerate(rec.boxes):
        if labels and label not in labels:
            return "I_LABEL", f"box {k} has label {label!r}, not one of --labels {', '.join(sorted(labels))}"
        t = TOLERANCE_PX
        if x1 < -t or y1 < -t or x2 > size[0] + t or y2 > size[1] + t:
            return (
                "I_BOX_OUTSIDE",
                f"box {k} ({label}) [{x1:g}, {y1:g}, {x2:g}, {y2:g}] px is outside the {size[0]}x{size[1]} image",
            )
    return "", ""


def prompt(labels: list[str], convention: str) -> str:
    """Returns the detection prompt naming the labels and the box convention."""
    key = box_key(convention)
    shape = (
        '{"label": ..., "bbox": [x1, y1, x2, y2]}' if key == "bbox" else '{"bbox_2d": [x1, y1, x2, y2], "label": ...}'
    )
    return f"Detect the {', '.join(labels)} in this image. Answer with a JSON list of {shape} {_UNITS[convention]}."


@dataclass
class ImportResult:
    """Rows written, quarantined records, boxes written."""

    rows: int
    quarantined: int
    boxes: int


def _findings(rec: Record, size: tuple[int, int], convention: str) -> list[dict[str, Any]]:
    """Returns a record's boxes clipped to the image (its rounding overhang) in the convention's written form."""
    out = []
    for label, box in rec.boxes:
        clipped = [max(0.0, min(v, size[i % 2])) for i, v in enumerate(box)]
        if convention == "pixel":
            out.append({"label": label, "bbox": [round(v, 2) for v in clipped]})
        else:
            out.append({"bbox_2d": from_pixels(clipped, convention, size), "label": label})
    return out


def _row(rec: Record, src: Path, image: Path, out: Path, text: str, findings: list[dict[str, Any]]) -> dict:
    inside = image.resolve().is_relative_to(out.parent.resolve())
    ref = os.path.relpath(image.resolve(), out.parent.resolve()) if inside else str(image.resolve())
    return {
        "messages": [{"role": "user", "content": "<image>" + text},
                     {"role": "assistant", "content": "```json\n" + json.dumps(findings, ensure_ascii=False) + "\n```"}],
        "images": [ref],
        ORIGIN_KEY: {**make_origin(str(src), rec.number, [rec.image]), "record": rec.record},
    }  # fmt: skip


def import_file(
    source: str, src: str | Path, images: str | Path, out: str | Path, *, convention: str = "norm1000",
    labels: list[str] | None = None,
) -> ImportResult:  # fmt: skip
    """Imports a COCO or Label Studio export as detection rows.

    Args:
        source: "coco" or "label-studio".
        src: The export (COCO JSON; Label Studio JSON or JSON-MIN).
        images: Folder holding the images the export names.
        out: Output JSONL (must not exist); `<out>.quarantine.jsonl` and `<out>.boxes.json` beside it.
        convention: Box convention of the rows. Default "norm1000" (Qwen2-VL / Qwen3-VL).
        labels: Allowed labels (others quarantine their record); None = every label the export uses.

    Returns:
        The ImportResult.

    Raises:
        ImportFailure: Unknown source or convention, output exists, the export unreadable or not the tool's.
    """
    from PIL import Image

    src, images, out = Path(src), Path(images), Path(out)
    if source not in SOURCES or convention not in CONVENTIONS:
        raise ImportFailure(f"source is one of {', '.join(SOURCES)}, convention one of {', '.join(CONVENTIONS)}")
    if out.exists():
        raise ImportFailure(f"{out}: exists; write the rows to a new file")
    records = list((coco_records if source == "coco" else label_studio_records)(src))
    allowed = set(labels or [])
    names = labels or sorted({label for rec in records for label, _ in rec.boxes})
    text = prompt(names, convention)
    rows, quarantine, n_boxes = [], [], 0
    for rec in records:
        path = _find_image(images, rec.image)
        size = (0, 0)
        if path is not None:
            with Image.open(path) as img:  # header only
                size = img.size
        code, message = _problem(rec, path, size, allowed)
        findings = [] if code else _findings(rec, size, convention)
        empty = [f for f in findings if not is_proper(f.get("bbox", f.get("bbox_2d")))]
        if empty:
            code, message = "I_BOX_EMPTY", f"box {empty[0]} ({convention}) has no area: smaller than one unit"
        if code:
            quarantine.append({"file": str(src), "number": rec.number, "record": rec.record, "image": rec.image,
                               "code": code, "message": message})  # fmt: skip
            continue
        rows.append(_row(rec, src, path, out, text, findings))
        n_boxes += len(rec.boxes)
    out.parent.mkdir(parents=True, exist_ok=True)
    _write(out, rows)
    _write(Path(str(out) + ".quarantine.jsonl"), quarantine)
    sidecar = {"convention": convention, "source": str(src), **_rows.import_seal(out)}  # origins kept (_rows)
    Path(str(out) + _rows.SIDECAR_SUFFIX).write_text(json.dumps(sidecar, indent=1))
    return ImportResult(len(rows), len(quarantine), n_boxes)


def _write(path: Path, rows: list[dict]) -> None:
    """Writes JSONL whole: a temp name, then renamed into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(path)


def main(argv: list[str]) -> int:
    """`vlm-lora import coco|label-studio FILE --images DIR --out ROWS.jsonl [--convention C] [--labels a,b]`."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="vlm-lora import", description=__doc__.split("\n")[0])
    parser.add_argument("source", choices=SOURCES, help="the export's tool")
    parser.add_argument("file", help="the export: COCO JSON, Label Studio JSON or JSON-MIN")
    parser.add_argument("--images", required=True, help="folder holding the images the export names")
    parser.add_argument("--out", required=True, help="output JSONL (must not exist)")
    parser.add_argument(
        "--convention", default="norm1000", choices=CONVENTIONS,
        help="box convention of the rows (norm1000: Qwen2-VL / Qwen3-VL; resized_pixel: Qwen2.5-VL)",
    )  # fmt: skip
    parser.add_argument("--labels", default="", help="comma-separated labels to keep (others are quarantined)")
    args = parser.parse_args(argv)
    labels = [s.strip() for s in args.labels.split(",") if s.strip()] or None
    try:
        result = import_file(args.source, args.file, args.images, args.out, convention=args.convention, labels=labels)
    except ImportFailure as exc:
        print(f"import: {exc}", file=sys.stderr)
        return 1
    print(
        f"import: {result.rows} rows ({result.boxes} boxes, {args.convention}) -> {args.out}; "
        f"{result.quarantined} record(s) quarantined -> {args.out}.quarantine.jsonl"
    )
    return 0 if result.rows else 1
