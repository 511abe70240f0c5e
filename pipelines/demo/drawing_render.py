"""One synthetic engineering drawing: its sheet, its elements, and the tight box of each.

Every drawing contains, on a white sheet inside a border frame: one part outline with
dash-dot center lines, zero to two holes, zero or one dimension, a title block near the
bottom-right corner, and an unannotated note at the bottom-left as clutter (the layout is
described in :mod:`pipelines.demo.drawings`, which writes the dataset). Each annotated
element is drawn on its own mask, so its box is its ink's, tight by construction.
`render_drawing_facts` is a pure function of the RNG's state.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from PIL import Image, ImageDraw, ImageFont

from components.common import boxes

LABELS: tuple[str, ...] = ("title_block", "part_outline", "hole", "dimension")
"""Labels that can appear in a finding, in no particular order."""

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
        _horizontal_dimension(sheet, rng, part, mm_per_px, font, arrow)
        return
    if kind == "vertical":
        _vertical_dimension(sheet, rng, part, mm_per_px, font, arrow)
        return
    if not _diameter_leader(sheet, rng, holes, mm_per_px, frame, title, font, arrow):
        # No room for a leader around this hole: fall back to a horizontal dimension.
        _dimension(sheet, rng, part, [], mm_per_px, frame, title, font)


def _horizontal_dimension(sheet: _Sheet, rng: random.Random, part: _Box, mm_per_px: float, font, arrow: int) -> None:
    """The part's width above it, with its (unannotated) extension lines."""
    s = sheet.size / 256
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


def _vertical_dimension(sheet: _Sheet, rng: random.Random, part: _Box, mm_per_px: float, font, arrow: int) -> None:
    """The part's height left of it, text turned 90°, with its (unannotated) extension lines."""
    s = sheet.size / 256
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


def _diameter_leader(
    sheet: _Sheet,
    rng: random.Random,
    holes: list[tuple[int, int, int]],
    mm_per_px: float,
    frame: _Box,
    title: _Box,
    font,
    arrow: int,
) -> bool:
    """Arrow on a hole's circle, diagonal leader, shoulder, "Ø.." text; False when no direction has room."""
    s = sheet.size / 256
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
            return True
    return False


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
