"""Rewrite a detection dataset's boxes into another convention (`python -m components.validate_data convert`).

Qwen2-VL / Qwen3-VL were trained on boxes relative to the image in [0, 1000]
(`norm1000`), Qwen2.5-VL on pixels of the image after the processor's smart resize
(`resized_pixel`); annotation tools write pixels of the original image (`pixel`). The
converter reads each row's image size from its header, converts every box of every
assistant answer (components.common.boxes) and writes the answers in the target's form:
`{"label", "bbox"}` for pixel, `{"bbox_2d", "label"}` (the Qwen cookbooks' key) otherwise.

It writes `<out>.boxes.json` beside the output ({"convention": ...}) and reads the same
file beside an input, so a converted file is recognised: converting it again to the same
convention is refused instead of converting twice. Without that file an input whose boxes
use `bbox` is taken as pixel, and one using `bbox_2d` needs `--from`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from components.common.answers import parse_findings
from components.common.boxes import CONVENTIONS, BoxError, ResizeRule, convert_findings, is_proper
from components.common.files import open_nofollow
from components.validate_data import _rows

SIDECAR_SUFFIX = ".boxes.json"


class ConvertError(ValueError):
    """The dataset cannot be converted; the message names file:line and the fix."""


@dataclass
class ConvertResult:
    """What a conversion did.

    Attributes:
        rows: Rows written.
        boxes: Boxes converted.
        source: The input's convention.
        to: The output's convention.
    """

    rows: int
    boxes: int
    source: str
    to: str


def sidecar(path: str | Path) -> Path:
    """Returns the convention file beside a JSONL file."""
    return Path(str(path) + SIDECAR_SUFFIX)


def _source_convention(src: Path, rows: list[tuple[int, dict]], given: str) -> str:
    """Returns the input's convention: `given`, else its sidecar's, else pixel for `bbox` answers."""
    if given != "auto":
        return given
    if sidecar(src).is_file():
        try:
            return json.loads(sidecar(src).read_text(encoding="utf-8"))["convention"]
        except (OSError, ValueError, KeyError, TypeError):
            raise ConvertError(f"{sidecar(src)}: not a convention file; delete it or pass --from") from None
    for number, row in rows:
        for msg in row.get("messages", []):
            if msg.get("role") == "assistant" and "bbox_2d" in str(msg.get("content", "")):
                raise ConvertError(
                    f"{src}:{number}: boxes are written as bbox_2d (norm1000 or resized_pixel) and no "
                    f"{sidecar(src).name} says which; pass --from norm1000 or --from resized_pixel"
                )
    return "pixel"


def _image_size(src: Path, number: int, row: dict) -> tuple[int, int]:
    images = row.get("images") or []
    if len(images) != 1 or not isinstance(images[0], str):
        raise ConvertError(f"{src}:{number}: a detection row needs exactly one image to convert its boxes")
    ref = images[0]
    if "://" in ref or ref.startswith("data:"):
        raise ConvertError(f"{src}:{number}: image {ref[:80]!r} is not a local file; download the data first")
    path = Path(ref) if Path(ref).is_absolute() else src.parent / ref
    try:
        with Image.open(path) as image:  # header only
            return image.size
    except (OSError, ValueError) as exc:
        raise ConvertError(f"{src}:{number}: image {ref!r} cannot be read ({exc})") from None


def _check_proper(
    where: str, findings: list[dict], converted: list[dict], conventions: tuple[str, str], size: tuple[int, int]
) -> None:
    """Raises ConvertError for the first converted box without area (x1 < x2 and y1 < y2 fail): rounding to the
    target's whole units can shrink a box of a pixel or two to nothing, which no metric can ever match."""
    source, to = conventions
    for k, (before, after) in enumerate(zip(findings, converted)):
        box = after.get("bbox", after.get("bbox_2d"))
        if not is_proper(box):
            raise ConvertError(
                f"{where} finding {k} ({before['label']!r}): box {before['bbox']} ({source}) becomes {box} in {to} "
                f"on this {size[0]}x{size[1]} image, a box without area (x1 < x2 and y1 < y2 must hold): it is "
                f"smaller than one {to} unit; enlarge or remove it in the input, or keep the data in {source}"
            )


def _read_rows(src: Path) -> list[tuple[int, Any]]:
    """Returns (line number, row) of every non-blank line of a UTF-8 JSONL file; raises ConvertError."""
    try:
        raw = src.read_bytes()
    except OSError as exc:
        raise ConvertError(f"{src}: cannot be read ({exc.strerror or exc}); pass an existing JSONL file") from None
    rows: list[tuple[int, Any]] = []
    for number, line in enumerate(raw.splitlines(), start=1):
        try:
            text = line.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            raise ConvertError(
                f"{src}:{number}: not UTF-8 at byte {exc.start} of the line; save the file as UTF-8 (e.g. "
                f"iconv -f latin1 -t utf-8 {src} > NEW.jsonl), then convert that"
            ) from None
        if not text.strip():
            continue
        try:
            rows.append((number, json.loads(text)))
        except json.JSONDecodeError as exc:
            raise ConvertError(f"{src}:{number}: not valid JSON ({exc.msg}); run validate-data first") from None
        except (ValueError, RecursionError) as exc:  # e.g. an integer over Python's digit limit
            raise ConvertError(f"{src}:{number}: cannot be read ({exc}); run validate-data first") from None
        if not isinstance(rows[-1][1], dict) or not isinstance(rows[-1][1].get("messages"), list):
            raise ConvertError(f"{src}:{number}: not a row with a messages list; run validate-data first")
    return rows


def _convert_row(src: Path, dst: Path, number: int, row: dict, to: str, source: str, rule: ResizeRule) -> int:
    """Converts one row in place; returns the number of boxes."""
    size = _image_size(src, number, row)
    n = 0
    for i, msg in enumerate(row["messages"]):
        if msg.get("role") != "assistant":
            continue
        findings, reason = parse_findings(msg.get("content", ""))
        if findings is None:
            raise ConvertError(f"{src}:{number}: messages[{i}] is not a detection answer ({reason})")
        try:
            converted = convert_findings(findings, to, size, rule, source=source)
        except BoxError as exc:
            raise ConvertError(f"{src}:{number}: {exc}") from None
        _check_proper(f"{src}:{number}: messages[{i}]", findings, converted, (source, to), size)
        msg["content"] = "```json\n" + json.dumps(converted, ensure_ascii=False) + "\n```"
        n += len(converted)
    ref = row["images"][0]
    if not Path(ref).is_absolute():  # keep the image reachable from the output's folder
        row["images"] = [os.path.relpath(src.parent / ref, dst.parent)]
    return n


def convert_file(
    src: str | Path, dst: str | Path, *, to: str, source: str = "auto", model_dir: str | None = None,
    max_pixels: int = 0,
) -> ConvertResult:  # fmt: skip
    """Converts the boxes of a detection JSONL file into another convention.

    Args:
        src: Input ms-swift JSONL (local; image paths relative to it or absolute).
        dst: Output JSONL (must not exist; relative image paths are rewritten for its folder).
        to: Target convention: pixel, norm1000 or resized_pixel.
        source: The input's convention, or "auto" (its `.boxes.json`, else pixel for `bbox`
            answers). Default "auto".
        model_dir: Model folder whose preprocessor_config.json gives the smart-resize rule
            (resized_pixel). Default: Qwen2.5-VL's defaults.
        max_pixels: ms-swift's `max_pixels` of the training run, px (resized_pixel: the
            boxes are relative to the image scaled down to it, as the model sees it); 0 =
            none. Default 0.

    Returns:
        The ConvertResult.

    Raises:
        ConvertError: Unknown convention, input already in the target convention, output
            exists or is the input, the input unreadable or not UTF-8, a row that is not JSON /
            not a detection answer / has not exactly one local image, or a box that would have
            no area in the target convention (rounded to its whole units).
    """
    src, dst = Path(src), Path(dst)
    if to not in CONVENTIONS or source not in (*CONVENTIONS, "auto"):
        raise ConvertError(f"conventions are {', '.join(CONVENTIONS)} (--from may also be auto)")
    if os.path.lexists(dst) or dst.resolve() == src.resolve():  # a dangling link too: never written through
        raise ConvertError(f"{dst}: exists (or is the input); write the converted data to a new file")
    rows = _read_rows(src)
    source = _source_convention(src, rows, source)
    if source == to:
        raise ConvertError(
            f"{src}: its boxes are already {to} ({sidecar(src).name if sidecar(src).is_file() else 'bbox'}"
            "); nothing to convert (converting twice would corrupt them)"
        )
    rule = ResizeRule.from_model(model_dir, max_pixels)
    n_boxes = sum(_convert_row(src, dst, number, row, to, source, rule) for number, row in rows)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open_nofollow(dst, "x") as f:  # created, never through a link planted meanwhile
        f.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for _, row in rows))
    body = {"convention": to, "converted_from": source, "source": str(src)}
    if _rows.origin_trusted(str(src), src):  # rows whose origins validate-data keeps: so are the converted ones
        body.update(_rows.import_seal(dst, _rows.CONVERT_PRODUCER))
    with open_nofollow(sidecar(dst), "w") as f:
        f.write(json.dumps(body, indent=1))
    return ConvertResult(rows=len(rows), boxes=n_boxes, source=source, to=to)


def main(argv: list[str]) -> int:
    """`python -m components.validate_data convert SRC --to CONVENTION --out DST [--from C] [--model DIR]
    [--max-pixels N]`."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m components.validate_data convert", description=__doc__.split("\n")[0]
    )
    parser.add_argument("src", help="detection JSONL to convert (local)")
    parser.add_argument("--to", required=True, choices=CONVENTIONS, help="target convention")
    parser.add_argument(
        "--from",
        dest="source",
        default="auto",
        choices=(*CONVENTIONS, "auto"),
        help="the input's convention (auto: its .boxes.json, else pixel for bbox answers)",
    )
    parser.add_argument("--model", default=None, help="model folder: its preprocessor gives the resize rule")
    parser.add_argument(
        "--max-pixels", type=int, default=0,
        help="ms-swift's max_pixels of the training run: resized_pixel boxes follow the scaled-down image (0 = none)",
    )  # fmt: skip
    parser.add_argument("--out", required=True, help="output JSONL (must not exist)")
    args = parser.parse_args(argv)
    try:
        result = convert_file(
            args.src, args.out, to=args.to, source=args.source, model_dir=args.model, max_pixels=args.max_pixels
        )
    except ConvertError as exc:
        print(f"convert: {exc}", file=sys.stderr)
        return 1
    print(
        f"convert: {result.rows} rows, {result.boxes} boxes {result.source} -> {result.to}: {args.out} "
        f"(+ {sidecar(args.out).name}); prompts are unchanged: say the new convention in them if they name one"
    )
    return 0
