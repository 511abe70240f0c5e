"""Synthetic engineering drawings for a tiny, fully offline demo dataset.

The generated data mirrors the seed task of the project: given an engineering
drawing, the model answers with a JSON list of detected elements. Every
drawing contains, on a white sheet inside a border frame:

* one part outline (rectangle, L-shape, chamfered rectangle or trapezoid) with
  dash-dot center lines,
* zero to two holes (circles with center-line crosses),
* zero or one dimension (horizontal, vertical or a diameter leader, with
  arrowheads and text such as ``"45.0"`` or ``"Ø12"``),
* a title block that is ALWAYS near the bottom-right corner (a few pixels of
  jitter), holding a part number, a scale and a sheet number,
* an unannotated "general tolerance" note at the bottom-left as clutter.

Only the elements with a label in :data:`LABELS` are annotated. A drawing has
at most four findings (title block + part outline + at most two of
holes/dimensions).

Bounding boxes are integer pixel coordinates ``[x1, y1, x2, y2]`` of the
element's ink, in PIL ``getbbox`` convention: ``x1``/``y1`` are the first
inked column/row and ``x2``/``y2`` are one past the last inked column/row, so
``0 <= x1 < x2 <= width`` and ``0 <= y1 < y2 <= height``. They are measured by
drawing every annotated element on its own mask, so they are tight by
construction.

Box conventions (``convention``, see :mod:`components.common.boxes`): the
default ``"pixel"`` writes the pixel boxes above under the key ``"bbox"``
(output unchanged). ``"norm1000"`` (Qwen2-VL, Qwen3-VL) writes them relative to
the image in [0, 1000] and ``"resized_pixel"`` (Qwen2.5-VL) in pixels of the
processor's smart-resized image (default Qwen2.5-VL rule), both as integers
from :func:`components.common.boxes.from_pixels`, under the key ``"bbox_2d"``
and in the order ``{"bbox_2d": ..., "label": ...}`` of the Qwen-VL grounding
cookbook, so answers match the form each model family was trained on. The
prompt names the convention.

Rows use the ms-swift messages format with image paths relative to the
JSONL's folder::

    {"messages": [{"role": "user", "content": "<image>" + PROMPT},
                  {"role": "assistant", "content": "```json\\n[...]\\n```"}],
     "images": ["images/train_00000.png"]}

Generation is deterministic: for the same arguments, the JSONL files and the
PNGs are byte-identical across runs (per-image RNGs are seeded from a string,
which :mod:`random` hashes with SHA-512, independent of ``PYTHONHASHSEED``).

CLI::

    python -m pipelines.demo.drawings OUT_DIR [--n-train N] [--n-eval N] [--seed S]
        [--convention pixel|norm1000|resized_pixel]
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from components.common import boxes

LABELS: tuple[str, ...] = ("title_block", "part_outline", "hole", "dimension")
"""Labels that can appear in a finding, in no particular order."""

PROMPT: str = (
    "Detect the title_block, part_outline, hole and dimension elements of this "
    'engineering drawing. Answer with a JSON list of {"label": ..., "bbox": '
    "[x1, y1, x2, y2]} in pixels, top to bottom."
)
"""User prompt that follows the ``<image>`` tag in every row (pixel convention)."""

PROMPTS: dict[str, str] = {
    "pixel": PROMPT,
    "norm1000": (
        "Detect the title_block, part_outline, hole and dimension elements of this "
        'engineering drawing. Answer with a JSON list of {"bbox_2d": [x1, y1, x2, y2], '
        '"label": ...} with coordinates relative to the image in [0, 1000], top to bottom.'
    ),
    "resized_pixel": (
        "Detect the title_block, part_outline, hole and dimension elements of this "
        'engineering drawing. Answer with a JSON list of {"bbox_2d": [x1, y1, x2, y2], '
        '"label": ...} in pixels of the resized image, top to bottom.'
    ),
}
"""User prompt per box convention."""

IMAGE_TAG = "<image>"
MIN_IMAGE_SIZE = 128

_INK = (0, 0, 0)
_THIN = (90, 90, 90)
_BACKGROUND = (255, 255, 255)
_SCALES: tuple[tuple[str, float], ...] = (("1:1", 1.0), ("1:2", 2.0), ("2:1", 0.5))


@dataclass(frozen=True)
class _Box:
    """Axis-aligned integer box ``[x1, y1, x2, y2]`` (x2/y2 exclusive)."""

    x1: int
    y1: int
    x2: int
    y2: int

    @property
    def width(self) -> int:
        return self.x2 - self.x1

    @property
    def height(self) -> int:
        return self.y2 - self.y1

    def intersects(self, other: _Box, pad: int = 0) -> bool:
        return not (
            self.x2 + pad <= other.x1
            or other.x2 + pad <= self.x1
            or self.y2 + pad <= other.y1
            or other.y2 + pad <= self.y1
        )

    def inside(self, other: _Box) -> bool:
        return self.x1 >= other.x1 and self.y1 >= other.y1 and self.x2 <= other.x2 and self.y2 <= other.y2


def _font() -> ImageFont.ImageFont:
    """Returns PIL's built-in bitmap font (no font files, same on every host)."""
    loader = getattr(ImageFont, "load_default_imagefont", None)
    return loader() if loader is not None else ImageFont.load_default()


def _text_size(font: ImageFont.ImageFont, text: str) -> tuple[int, int]:
    left, top, right, bottom = font.getbbox(text)
    return right - left, bottom - top


def _dashed_line(
    draw: ImageDraw.ImageDraw,
    p0: tuple[float, float],
    p1: tuple[float, float],
    pattern: Sequence[int],
    fill: tuple[int, int, int] | int,
) -> None:
    """Draws a dashed (or dash-dot) line; ``pattern`` alternates on/off lengths."""
    x0, y0 = p0
    x1, y1 = p1
    length = math.hypot(x1 - x0, y1 - y0)
    if length == 0:
        return
    ux, uy = (x1 - x0) / length, (y1 - y0) / length
    pos, i = 0.0, 0
    while pos < length:
        seg = min(pattern[i % len(pattern)], length - pos)
        if i % 2 == 0:
            draw.line(
                [
                    (round(x0 + ux * pos), round(y0 + uy * pos)),
                    (round(x0 + ux * (pos + seg)), round(y0 + uy * (pos + seg))),
                ],
                fill=fill,
            )
        pos += seg
        i += 1


def _arrowhead(
    draw: ImageDraw.ImageDraw,
    tip: tuple[float, float],
    direction: tuple[float, float],
    size: float,
    fill: int | tuple[int, int, int],
) -> None:
    """Draws a filled arrowhead whose tip is at ``tip`` pointing along ``direction``."""
    dx, dy = direction
    norm = math.hypot(dx, dy) or 1.0
    dx, dy = dx / norm, dy / norm
    bx, by = tip[0] - dx * size, tip[1] - dy * size
    half = size * 0.4
    pts = [
        (round(tip[0]), round(tip[1])),
        (round(bx - dy * half), round(by + dx * half)),
        (round(bx + dy * half), round(by - dx * half)),
    ]
    draw.polygon(pts, fill=fill)


class _Sheet:
    """Canvas plus one mask per annotated element, to measure tight bboxes."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.image = Image.new("RGB", (size, size), _BACKGROUND)
        self.draw = ImageDraw.Draw(self.image)
        self.findings: list[dict] = []
        self.facts: dict = {}  # what the drawing shows beyond its findings (the regression set's questions)

    def element(self, label: str) -> _Element:
        if label not in LABELS:
            raise ValueError(f"unknown label {label!r}; expected one of {LABELS}")
        return _Element(self, label)


class _Element:
    """Context manager: draw on a private mask, then stamp it and record bbox."""

    def __init__(self, sheet: _Sheet, label: str) -> None:
        self.sheet = sheet
        self.label = label
        self.mask = Image.new("L", (sheet.size, sheet.size), 0)
        self.draw = ImageDraw.Draw(self.mask)

    def __enter__(self) -> _Element:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            return
        bbox = self.mask.getbbox()
        if bbox is None:
            raise RuntimeError(f"element {self.label!r} drew nothing")
        self.sheet.image.paste(_INK, (0, 0), self.mask)
        self.sheet.findings.append({"label": self.label, "bbox": [int(v) for v in bbox]})


def _paste_text(el: _Element, font: ImageFont.ImageFont, xy: tuple[int, int], text: str, rotate: bool) -> None:
    """Writes ``text`` on an element mask, optionally rotated 90° counter-clockwise."""
    w, h = _text_size(font, text)
    tile = Image.new("L", (w + 2, h + 2), 0)
    ImageDraw.Draw(tile).text((1, 1), text, font=font, fill=255)
    if rotate:
        tile = tile.transpose(Image.Transpose.ROTATE_90)
    el.mask.paste(255, xy, tile)


def _title_block(sheet: _Sheet, rng: random.Random, frame: _Box, font) -> _Box:
    """Draws the title block near the bottom-right corner and returns its box."""
    s = sheet.size / 256
    th = _text_size(font, "A")[1]
    w = max(round(92 * s), 90) + rng.randint(-4, 4)
    h = max(round(40 * s), 2 * th + 12) + rng.randint(-3, 3)
    gap_x, gap_y = rng.randint(2, 6), rng.randint(2, 6)
    x2, y2 = frame.x2 - gap_x, frame.y2 - gap_y
    box = _Box(x2 - w, y2 - h, x2, y2)
    part_no = f"PART-{rng.randint(0, 999):03d}"
    scale_txt = rng.choice(_SCALES)[0]
    sheet_txt = f"{rng.randint(1, 4)}/4"
    sheet.facts.update(part_number=part_no, scale=scale_txt, sheet=sheet_txt)
    with sheet.element("title_block") as el:
        d = el.draw
        d.rectangle([box.x1, box.y1, box.x2 - 1, box.y2 - 1], outline=255)
        row = box.y1 + h // 2
        d.line([(box.x1, row), (box.x2 - 1, row)], fill=255)
        col = box.x2 - _text_size(font, "0/0")[0] - 6
        d.line([(col, row), (col, box.y2 - 1)], fill=255)
        d.text((box.x1 + 3, box.y1 + max(1, (h // 2 - th) // 2)), part_no, font=font, fill=255)
        d.text((box.x1 + 3, row + max(1, (h - h // 2 - th) // 2)), "SCALE " + scale_txt, font=font, fill=255)
        d.text((col + 2, row + max(1, (h - h // 2 - th) // 2)), sheet_txt, font=font, fill=255)
    return box


def _part_polygon(rng: random.Random, box: _Box) -> tuple[str, list[tuple[int, int]], list[_Box]]:
    """Returns (kind, outline polygon, solid sub-rectangles usable for holes)."""
    x1, y1, x2, y2 = box.x1, box.y1, box.x2 - 1, box.y2 - 1
    kind = rng.choice(("rect", "lshape", "chamfer", "trapezoid"))
    if kind == "rect":
        return kind, [(x1, y1), (x2, y1), (x2, y2), (x1, y2)], [box]
    if kind == "lshape":
        cx = x1 + round(box.width * rng.uniform(0.45, 0.65))
        cy = y1 + round(box.height * rng.uniform(0.35, 0.55))
        poly = [(x1, y1), (cx, y1), (cx, cy), (x2, cy), (x2, y2), (x1, y2)]
        return kind, poly, [_Box(x1, y1, cx, box.y2), _Box(x1, cy, box.x2, box.y2)]
    if kind == "chamfer":
        c = max(3, round(min(box.width, box.height) * rng.uniform(0.12, 0.22)))
        poly = [
            (x1 + c, y1),
            (x2 - c, y1),
            (x2, y1 + c),
            (x2, y2 - c),
            (x2 - c, y2),
            (x1 + c, y2),
            (x1, y2 - c),
            (x1, y1 + c),
        ]
        return kind, poly, [_Box(x1 + c, y1, box.x2 - c, box.y2), _Box(x1, y1 + c, box.x2, box.y2 - c)]
    inset = max(3, round(box.width * rng.uniform(0.1, 0.2)))
    poly = [(x1 + inset, y1), (x2 - inset, y1), (x2, y2), (x1, y2)]
    return kind, poly, [_Box(x1 + inset, y1, box.x2 - inset, box.y2)]


def _place_holes(rng: random.Random, solids: list[_Box], n: int, s: float) -> list[tuple[int, int, int]]:
    """Places up to ``n`` non-overlapping circles (cx, cy, r) fully inside a solid."""
    holes: list[tuple[int, int, int]] = []
    margin = max(3, round(5 * s))
    for _ in range(40 * max(n, 1)):
        if len(holes) >= n:
            break
        r = rng.randint(max(3, round(5 * s)), max(4, round(12 * s)))
        solid = rng.choice(solids)
        lo_x, hi_x = solid.x1 + r + margin, solid.x2 - 1 - r - margin
        lo_y, hi_y = solid.y1 + r + margin, solid.y2 - 1 - r - margin
        if lo_x > hi_x or lo_y > hi_y:
            continue
        cx, cy = rng.randint(lo_x, hi_x), rng.randint(lo_y, hi_y)
        if all(math.hypot(cx - hx, cy - hy) > r + hr + 2 * margin for hx, hy, hr in holes):
            holes.append((cx, cy, r))
    return holes


def _dimension(
    sheet: _Sheet,
    rng: random.Random,
    part: _Box,
    holes: list[tuple[int, int, int]],
    mm_per_px: float,
    frame: _Box,
    title: _Box,
    font,
) -> None:
    """Draws one dimension (horizontal, vertical or diameter leader)."""
    s = sheet.size / 256
    arrow = max(4, round(5 * s))
    kinds = ["horizontal", "vertical"] + (["diameter", "diameter"] if holes else [])
    kind = rng.choice(kinds)
    if kind == "horizontal":
        yd = part.y1 - rng.randint(round(9 * s), round(14 * s))
        text = f"{part.width * mm_per_px:.1f}"
        tw, th = _text_size(font, text)
        with sheet.element("dimension") as el:
            d = el.draw
            d.line([(part.x1, yd), (part.x2 - 1, yd)], fill=255)
            _arrowhead(d, (part.x1, yd), (-1, 0), arrow, 255)
            _arrowhead(d, (part.x2 - 1, yd), (1, 0), arrow, 255)
            tx = (part.x1 + part.x2) // 2 - tw // 2
            _paste_text(el, font, (tx, yd - th - 3), text, rotate=False)
        for x in (part.x1, part.x2 - 1):  # extension lines: context, not annotated
            sheet.draw.line([(x, part.y1 - 2), (x, yd - 3)], fill=_THIN)
        return
    if kind == "vertical":
        xd = part.x1 - rng.randint(round(9 * s), round(14 * s))
        text = f"{part.height * mm_per_px:.1f}"
        tw, th = _text_size(font, text)
        with sheet.element("dimension") as el:
            d = el.draw
            d.line([(xd, part.y1), (xd, part.y2 - 1)], fill=255)
            _arrowhead(d, (xd, part.y1), (0, -1), arrow, 255)
            _arrowhead(d, (xd, part.y2 - 1), (0, 1), arrow, 255)
            ty = (part.y1 + part.y2) // 2 - tw // 2
            _paste_text(el, font, (xd - th - 4, ty), text, rotate=True)
        for y in (part.y1, part.y2 - 1):
            sheet.draw.line([(part.x1 - 2, y), (xd - 3, y)], fill=_THIN)
        return
    # Diameter leader: arrow on the circle, diagonal leader, shoulder, "Ø.." text.
    cx, cy, r = rng.choice(holes)
    text = f"Ø{round(2 * r * mm_per_px)}"
    tw, th = _text_size(font, text)
    run = round(14 * s)
    directions = [(1, -1), (-1, -1), (1, 1), (-1, 1)]
    rng.shuffle(directions)
    for sx, sy in directions:
        tip = (cx + sx * r * math.sqrt(0.5), cy + sy * r * math.sqrt(0.5))
        knee = (tip[0] + sx * run, tip[1] + sy * run)
        end_x = knee[0] + sx * (tw + 4)
        xs = sorted((tip[0], knee[0], end_x))
        est = _Box(
            math.floor(xs[0]) - 2,
            math.floor(min(tip[1], knee[1])) - th - 4,
            math.ceil(xs[2]) + 3,
            math.ceil(max(tip[1], knee[1])) + 3,
        )
        if est.inside(_Box(frame.x1 + 2, frame.y1 + 2, frame.x2 - 2, frame.y2 - 2)) and not (
            est.intersects(title, pad=2)
        ):
            with sheet.element("dimension") as el:
                d = el.draw
                d.line([(round(tip[0]), round(tip[1])), (round(knee[0]), round(knee[1]))], fill=255)
                d.line([(round(knee[0]), round(knee[1])), (round(end_x), round(knee[1]))], fill=255)
                _arrowhead(d, tip, (-sx, -sy), arrow, 255)
                tx = round(min(knee[0], end_x)) + 2
                _paste_text(el, font, (tx, round(knee[1]) - th - 3), text, rotate=False)
            return
    # No room for a leader around this hole: fall back to a horizontal dimension.
    _dimension(sheet, rng, part, [], mm_per_px, frame, title, font)


def _sort_key(finding: dict) -> tuple:
    x1, y1, x2, y2 = finding["bbox"]
    return (y1, x1, y2, x2, finding["label"])


def convert_findings(findings: list[dict], convention: str, image_size: tuple[int, int]) -> list[dict]:
    """Converts pixel findings to a convention: ``"bbox"`` for pixel, else integer ``"bbox_2d"``.

    Args:
        findings: ``{"label", "bbox"}`` dicts in pixels.
        convention: One of ``components.common.boxes.CONVENTIONS``.
        image_size: (width, height) of the image, px.

    Returns:
        New dicts: the same for pixel, ``{"bbox_2d", "label"}`` otherwise (order kept).

    Raises:
        ValueError: An unknown convention.
    """
    return boxes.convert_findings(findings, convention, image_size)


def render_drawing(image_size: int, rng: random.Random, convention: str = "pixel") -> tuple[Image.Image, list[dict]]:
    """Renders one synthetic drawing: `render_drawing_facts` without the facts."""
    image, findings, _ = render_drawing_facts(image_size, rng, convention)
    return image, findings


def render_drawing_facts(
    image_size: int, rng: random.Random, convention: str = "pixel"
) -> tuple[Image.Image, list[dict], dict]:
    """Renders one synthetic drawing, and says what else it shows.

    Args:
        image_size: Width and height of the square image in pixels (>= 128).
        rng: Random source; the output is a pure function of its state.
        convention: Box convention of the findings (see the module docstring).
            Default "pixel".

    Returns:
        ``(image, findings, facts)`` where ``image`` is an RGB PIL image,
        ``findings`` is the list of ``{"label", "bbox"}`` dicts (pixel) or
        ``{"bbox_2d", "label"}`` dicts (other conventions), sorted by their
        pixel boxes, and ``facts`` holds the title block's ``part_number``,
        ``scale`` and ``sheet`` texts, the unannotated ``note`` and its pixel
        ``note_bbox``, and ``holes`` (their number). The facts draw no random
        numbers: the image is the one `render_drawing` makes.

    Raises:
        ValueError: If ``image_size`` is too small for the layout, or the
            convention is unknown.
    """
    if convention not in boxes.CONVENTIONS:
        raise ValueError(f"convention must be one of {boxes.CONVENTIONS}, got {convention!r}")
    if image_size < MIN_IMAGE_SIZE:
        raise ValueError(f"image_size must be >= {MIN_IMAGE_SIZE}, got {image_size}")
    size = image_size
    s = size / 256
    font = _font()
    sheet = _Sheet(size)
    m = max(4, round(6 * s))
    frame = _Box(m, m, size - m, size - m)
    sheet.draw.rectangle([frame.x1, frame.y1, frame.x2 - 1, frame.y2 - 1], outline=_INK, width=2)

    title = _title_block(sheet, rng, frame, font)
    scale_mm = rng.choice(_SCALES)[1]

    # Unannotated clutter: a general-tolerance note at the bottom-left.
    note = rng.choice(("TOL ±0.1", "TOL ±0.2", "UNITS: mm", "MATL: AL"))
    _, nh = _text_size(font, note)
    sheet.draw.text((frame.x1 + 4, frame.y2 - nh - 6), note, font=font, fill=_THIN)
    note_mask = Image.new("L", sheet.image.size, 0)  # its ink box, measured apart (no random draw: same image)
    ImageDraw.Draw(note_mask).text((frame.x1 + 4, frame.y2 - nh - 6), note, font=font, fill=255)
    sheet.facts.update(note=note, note_bbox=[int(v) for v in note_mask.getbbox()])

    # Part outline in the free area above the title block, leaving room on the
    # top and on the left for dimensions.
    th = _text_size(font, "0")[1]
    region = _Box(
        frame.x1 + max(round(34 * s), th + 26),
        frame.y1 + max(round(30 * s), th + 24),
        frame.x2 - round(14 * s),
        title.y1 - round(10 * s),
    )
    pw = rng.randint(round(region.width * 0.45), round(region.width * 0.8))
    ph = rng.randint(round(region.height * 0.45), round(region.height * 0.85))
    px = rng.randint(region.x1, region.x2 - pw)
    py = rng.randint(region.y1, region.y2 - ph)
    part = _Box(px, py, px + pw, py + ph)
    _, poly, solids = _part_polygon(rng, part)
    with sheet.element("part_outline") as el:
        el.draw.polygon(poly, outline=255)
        el.draw.line(poly + [poly[0]], fill=255, width=2)

    # Part center lines (dash-dot), thin and unannotated.
    cxp, cyp = (part.x1 + part.x2 - 1) / 2, (part.y1 + part.y2 - 1) / 2
    ext = round(6 * s)
    pattern = (round(8 * s), 2, 1, 2)
    _dashed_line(sheet.draw, (part.x1 - ext, cyp), (part.x2 - 1 + ext, cyp), pattern, _THIN)
    _dashed_line(sheet.draw, (cxp, part.y1 - ext), (cxp, part.y2 - 1 + ext), pattern, _THIN)

    n_holes = rng.randint(0, 2)
    holes = _place_holes(rng, solids, n_holes, s)
    for hx, hy, hr in holes:
        with sheet.element("hole") as el:
            el.draw.ellipse([hx - hr, hy - hr, hx + hr, hy + hr], outline=255, width=2)
        cross = hr + max(2, round(3 * s))
        _dashed_line(sheet.draw, (hx - cross, hy), (hx + cross, hy), (4, 2), _THIN)
        _dashed_line(sheet.draw, (hx, hy - cross), (hx, hy + cross), (4, 2), _THIN)

    if len(holes) < 2 and rng.random() < 0.75:
        _dimension(sheet, rng, part, holes, scale_mm, frame, title, font)

    findings = sorted(sheet.findings, key=_sort_key)
    sheet.facts["holes"] = len(holes)
    return sheet.image, convert_findings(findings, convention, sheet.image.size), sheet.facts


def format_answer(findings: list[dict]) -> str:
    """Formats findings (of any convention, keys as given) as the assistant answer: a fenced ```json block."""
    return "```json\n" + json.dumps(findings) + "\n```"


def _write_split(out_dir: Path, split: str, n: int, image_size: int, seed: int, convention: str) -> Path:
    images_dir = out_dir / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    jsonl = out_dir / f"{split}.jsonl"
    lines = []
    for i in range(n):
        rng = random.Random(f"drawings:{seed}:{split}:{i}")
        image, findings = render_drawing(image_size, rng, convention)
        rel = f"images/{split}_{i:05d}.png"
        image.save(out_dir / rel, format="PNG", optimize=False)
        row = {
            "messages": [
                {"role": "user", "content": IMAGE_TAG + PROMPTS[convention]},
                {"role": "assistant", "content": format_answer(findings)},
            ],
            "images": [rel],
        }
        lines.append(json.dumps(row, ensure_ascii=False))
    jsonl.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return jsonl


def generate_dataset(
    out_dir: str | Path,
    n_train: int = 64,
    n_eval: int = 16,
    image_size: int = 256,
    seed: int = 0,
    convention: str = "pixel",
) -> dict:
    """Generates the synthetic drawing dataset.

    Writes ``out_dir/train.jsonl``, ``out_dir/eval.jsonl`` and the PNGs under
    ``out_dir/images/`` (``train_00000.png``, ..., ``eval_00000.png``, ...).
    Existing files with the same names are overwritten; other files are left
    alone. Train and eval images are drawn from disjoint RNG streams.

    Args:
        out_dir: Output folder, created if missing.
        n_train: Number of training rows (>= 0).
        n_eval: Number of evaluation rows (>= 0).
        image_size: Side of the square images in pixels (>= 128).
        seed: Seed; equal arguments give byte-identical files.
        convention: Box convention of the answers: "pixel" (key "bbox", the
            default, output unchanged), "norm1000" or "resized_pixel" (integer
            "bbox_2d"); the images are the same for every convention.

    Returns:
        ``{"train": str, "eval": str, "n_train": int, "n_eval": int}`` with
        the paths of the two JSONL files.

    Raises:
        ValueError: On a negative count, a too small ``image_size`` or an
            unknown convention.
    """
    if convention not in boxes.CONVENTIONS:
        raise ValueError(f"convention must be one of {boxes.CONVENTIONS}, got {convention!r}")
    if n_train < 0 or n_eval < 0:
        raise ValueError(f"n_train and n_eval must be >= 0, got {n_train} and {n_eval}")
    if image_size < MIN_IMAGE_SIZE:
        raise ValueError(f"image_size must be >= {MIN_IMAGE_SIZE}, got {image_size}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train = _write_split(out, "train", n_train, image_size, seed, convention)
    evl = _write_split(out, "eval", n_eval, image_size, seed, convention)
    return {"train": str(train), "eval": str(evl), "n_train": n_train, "n_eval": n_eval}


REGRESSION_PROMPTS: dict[str, str] = {
    "ocr": "Read the part number written in the title block of this engineering drawing. Answer with the text only.",
    "holes": "How many holes does this engineering drawing show? Answer with a number.",
    "scale": "What scale is written in the title block of this drawing? Answer with the scale only, such as 1:1.",
    "dimension": "Does this engineering drawing carry a dimension? Answer yes or no.",
    "grounding": "Locate the general note at the bottom left of this drawing (a tolerance, units or material text). "
    'Answer with a JSON list of {"label": "note", "bbox": [x1, y1, x2, y2]} in pixels.',
}
"""The regression set's questions: about what the drawings show beyond the task's labels."""


def regression_rows(facts: dict, image: str, index: int, convention: str, image_size: int) -> list[dict]:
    """Returns a drawing's three regression rows (`components.common.regression`): ocr, vqa and grounding.

    ocr reads the part number; vqa asks, by turns (`index` % 3), the number of holes, the scale, or
    whether a dimension is drawn; grounding boxes the unannotated note at the bottom left (a
    label the detection task does not know), in the data's box convention.

    Args:
        facts: `render_drawing_facts`' facts of the drawing.
        image: The image path the rows name (relative to the JSONL file).
        index: The drawing's number in the set.
        convention: Box convention of the grounding answer (pixel: "bbox"; others "bbox_2d").
        image_size: Side of the square image, px.
    """
    topic, answer = (
        ("holes", str(facts["holes"])),
        ("scale", facts["scale"]),
        ("dimension", "yes" if facts.get("dimension") else "no"),
    )[index % 3]
    note = convert_findings([{"label": "note", "bbox": facts["note_bbox"]}], convention, (image_size, image_size))
    grounding = REGRESSION_PROMPTS["grounding"]
    if convention != "pixel":
        grounding = grounding.replace('"bbox"', '"bbox_2d"').replace(" in pixels.", f" ({convention}).")
    asked = (("ocr", REGRESSION_PROMPTS["ocr"], facts["part_number"]), ("vqa", REGRESSION_PROMPTS[topic], answer),
             ("grounding", grounding, format_answer(note)))  # fmt: skip
    return [
        {
            "messages": [{"role": "user", "content": IMAGE_TAG + prompt}, {"role": "assistant", "content": gold}],
            "images": [image],
            "kind": kind,
        }
        for kind, prompt, gold in asked
    ]


def generate_regression(
    out_dir: str | Path, n: int = 4, image_size: int = 256, seed: int = 0, convention: str = "pixel"
) -> dict:
    """Generates the demo's regression set: three general rows (ocr, vqa, grounding) on each of `n` new drawings.

    Writes ``out_dir/regression.jsonl`` and ``out_dir/images/regression_*.png``, drawn from an RNG
    stream of their own (no image of the train or eval split). Deterministic, as `generate_dataset`.

    Args:
        out_dir: Output folder, created if missing.
        n: Number of drawings (3 rows each, >= 1). Default 4.
        image_size: Side of the square images, px (>= 128). Default 256.
        seed: Seed. Default 0.
        convention: Box convention of the grounding answers. Default "pixel".

    Returns:
        ``{"regression": str, "n_rows": int}``: the JSONL file's path and its number of rows.

    Raises:
        ValueError: n < 1, a too small image_size or an unknown convention.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        image, findings, facts = render_drawing_facts(image_size, random.Random(f"drawings:{seed}:regression:{i}"))
        facts["dimension"] = any(f["label"] == "dimension" for f in findings)
        rel = f"images/regression_{i:05d}.png"
        image.save(out / rel, format="PNG", optimize=False)
        rows += regression_rows(facts, rel, i, convention, image_size)
    jsonl = out / "regression.jsonl"
    jsonl.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return {"regression": str(jsonl), "n_rows": len(rows)}


def main(argv: Sequence[str] | None = None) -> None:
    """CLI entry point; prints the JSON result of :func:`generate_dataset`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="output folder")
    parser.add_argument("--n-train", type=int, default=64)
    parser.add_argument("--n-eval", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--convention", default="pixel", choices=boxes.CONVENTIONS, help="box convention of the answers"
    )
    args = parser.parse_args(argv)
    result = generate_dataset(args.out_dir, args.n_train, args.n_eval, args.image_size, args.seed, args.convention)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
