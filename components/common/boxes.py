"""Box coordinate conventions of Qwen-VL models, and conversions between them.

A detection box is `[x1, y1, x2, y2]`. What the numbers mean depends on the model family,
because each was trained on boxes of one kind:

* `pixel`: absolute pixels of the original image (what annotation tools write; metrics are
  always computed in this convention).
* `norm1000`: relative to the image, scaled to [0, 1000] (Qwen2-VL and Qwen3-VL; the official
  Qwen3-VL grounding cookbook writes `{"bbox_2d": [x1, y1, x2, y2], "label": ...}`).
* `resized_pixel`: absolute pixels of the image the model sees (Qwen2.5-VL): the image
  after ms-swift's resize, `model_input_size` (`ResizeRule.template_max_pixels`, ms-swift's
  `max_pixels` argument, first; then `smart_resize`: sides rounded to multiples of `factor`
  (28), area kept within [min_pixels, max_pixels], the same rule as qwen_vl_utils and
  transformers' Qwen2-VL image processor).

`ResizeRule.from_model` is the rule ms-swift 4.6 trains and serves a model with; validate-data
counts image tokens with it (one LLM token per factor x factor block of `model_input_size`).

`to_pixels` / `from_pixels` convert one box; `convention_for_model` picks the default for a
staged model from its architecture; `iou` compares two boxes of one convention. Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.common import bounded_json

CONVENTIONS = ("pixel", "norm1000", "resized_pixel")
AUTO = "auto"
NORM = 1000.0
MAX_ASPECT_RATIO = 200  # Qwen-VL processors refuse images more elongated than this

# Qwen2.5-VL's processor defaults (the Qwen2.5-VL cookbook's max_pixels: 1280 tokens).
QWEN25_FACTOR = 28
QWEN25_MIN_PIXELS = 56 * 56
QWEN25_MAX_PIXELS = 14 * 14 * 4 * 1280

# What ms-swift's Qwen-VL templates resize every image with (qwen_vl_utils 0.0.14,
# vision_process.py:25-27, through `fetch_image`; the processor then runs with do_resize=False,
# so preprocessor_config.json's min/max pixels are not used). ms-swift maps the MIN_PIXELS /
# MAX_PIXELS environment variables onto the token numbers (swift/model/models/qwen.py:758-771).
SPATIAL_MERGE_SIZE = 2
IMAGE_MIN_TOKEN_NUM = 4
IMAGE_MAX_TOKEN_NUM = 16384

# model_type / architecture prefix -> convention the family was trained on
_FAMILY = (
    ("qwen2_5_vl", "resized_pixel"),
    ("qwen2.5-vl", "resized_pixel"),
    ("qwen2_5vl", "resized_pixel"),
    ("qwen3_vl", "norm1000"),
    ("qwen3vl", "norm1000"),
    ("qwen2_vl", "norm1000"),
    ("qwen2vl", "norm1000"),
)


class BoxError(ValueError):
    """A box or convention is not usable; the message says why."""


@dataclass(frozen=True)
class ResizeRule:
    """How a Qwen-VL model's images are resized before they become tokens.

    Attributes:
        factor: Sides become multiples of this (patch size x merge size: 28 for Qwen2/2.5-VL,
            32 for Qwen3-VL).
        min_pixels: Smallest area after `smart_resize`, px.
        max_pixels: Largest area after `smart_resize`, px.
        template_max_pixels: ms-swift's `max_pixels` argument (`swift sft --max_pixels`): an
            image of a larger area is first scaled down to about this area, keeping its
            aspect ratio (swift/template/vision_utils.py `rescale_image`); 0 = none.
            Default 0.
    """

    factor: int = QWEN25_FACTOR
    min_pixels: int = QWEN25_MIN_PIXELS
    max_pixels: int = QWEN25_MAX_PIXELS
    template_max_pixels: int = 0

    @classmethod
    def for_patch_size(cls, patch_size: int, max_pixels: int = 0) -> ResizeRule:
        """Returns ms-swift's rule for a vision patch size (qwen_vl_utils' bounds).

        Args:
            patch_size: The vision encoder's patch, px (14 Qwen2/2.5-VL, 16 Qwen3-VL).
            max_pixels: ms-swift's `max_pixels` argument; 0 = none. Default 0.

        Returns:
            factor = patch_size x SPATIAL_MERGE_SIZE, area within [IMAGE_MIN_TOKEN_NUM,
            IMAGE_MAX_TOKEN_NUM] x factor^2, `template_max_pixels` = max_pixels.
        """
        factor = patch_size * SPATIAL_MERGE_SIZE
        return cls(factor, IMAGE_MIN_TOKEN_NUM * factor**2, IMAGE_MAX_TOKEN_NUM * factor**2, max_pixels)

    @classmethod
    def from_model(cls, model_dir: str | Path | None, max_pixels: int = 0) -> ResizeRule:
        """Returns the rule ms-swift trains a model folder's images with.

        Args:
            model_dir: Model folder; its preprocessor_config.json gives the patch size.
                None, or a folder without that file, = the Qwen2.5-VL defaults above.
            max_pixels: ms-swift's `max_pixels` argument (the run's `swift.max_pixels`);
                0 = none. Default 0.

        Returns:
            The ResizeRule (`for_patch_size` of the folder's patch size).
        """
        cfg = None
        if model_dir:
            try:
                cfg = bounded_json.loads((Path(model_dir) / "preprocessor_config.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                cfg = None
        if not isinstance(cfg, dict):
            return cls(template_max_pixels=max_pixels)
        return cls.for_patch_size(int(cfg.get("patch_size", 14)), max_pixels)


def smart_resize(height: int, width: int, rule: ResizeRule = ResizeRule()) -> tuple[int, int]:
    """Returns (height, width) of an image after Qwen-VL's smart resize (`rule.template_max_pixels` not applied).

    Args:
        height: Original height, px.
        width: Original width, px.
        rule: The processor's settings. Default Qwen2.5-VL's.

    Raises:
        BoxError: Aspect ratio above MAX_ASPECT_RATIO (the processor refuses such images).
    """
    f = rule.factor
    ratio = max(height, width) / max(1, min(height, width))
    if ratio > MAX_ASPECT_RATIO:
        raise BoxError(f"aspect ratio {ratio:.0f} exceeds {MAX_ASPECT_RATIO}")
    h_bar = max(f, round(height / f) * f)
    w_bar = max(f, round(width / f) * f)
    if h_bar * w_bar > rule.max_pixels:
        beta = math.sqrt((height * width) / rule.max_pixels)
        h_bar = max(f, math.floor(height / beta / f) * f)
        w_bar = max(f, math.floor(width / beta / f) * f)
    elif h_bar * w_bar < rule.min_pixels:
        beta = math.sqrt(rule.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / f) * f
        w_bar = math.ceil(width * beta / f) * f
    return h_bar, w_bar


def model_input_size(height: int, width: int, rule: ResizeRule = ResizeRule()) -> tuple[int, int]:
    """Returns (height, width) of the image the model sees: ms-swift's two resizes in order.

    First, with `rule.template_max_pixels`, an image of a larger area is scaled to
    int(sqrt(max_pixels / ratio)) x int(that * ratio) px (swift/template/vision_utils.py
    `rescale_image`, called in swift/template/base.py `_preprocess_inputs`); then
    `smart_resize` (qwen_vl_utils `fetch_image`, swift/template/templates/qwen.py `replace_tag`).

    Args:
        height: Original height, px.
        width: Original width, px.
        rule: The resize settings. Default Qwen2.5-VL's, no template_max_pixels.

    Raises:
        BoxError: Aspect ratio above MAX_ASPECT_RATIO.
    """
    cap = rule.template_max_pixels
    if cap > 0 and width * height > cap:
        ratio = width / height  # the same float steps as rescale_image
        height_scaled = math.sqrt(cap / ratio)
        height, width = max(1, int(height_scaled)), max(1, int(height_scaled * ratio))
    return smart_resize(height, width, rule)


def convention_for_model(architecture: str = "", model_type: str = "") -> str:
    """Returns the box convention a Qwen-VL family was trained on ("pixel" when unknown).

    Args:
        architecture: e.g. "Qwen3VLForConditionalGeneration".
        model_type: e.g. "qwen2_5_vl".
    """
    for text in (model_type, architecture):
        key = (text or "").lower().replace("forconditionalgeneration", "")
        for prefix, convention in _FAMILY:
            if key.startswith(prefix):
                return convention
    return "pixel"


def resolve_convention(configured: str, architecture: str = "", model_type: str = "") -> str:
    """Returns the convention to use: the configured one, or the model's default for "auto"/"".

    Raises:
        BoxError: An unknown convention name.
    """
    if configured in ("", AUTO):
        return convention_for_model(architecture, model_type)
    if configured not in CONVENTIONS:
        raise BoxError(f"box convention {configured!r} is not one of {', '.join((AUTO, *CONVENTIONS))}")
    return configured


def _scales(convention: str, image_size: tuple[int, int], rule: ResizeRule) -> tuple[float, float]:
    """Returns (sx, sy): pixel = value * s for the convention."""
    width, height = image_size
    if convention == "pixel":
        return 1.0, 1.0
    if convention == "norm1000":
        return width / NORM, height / NORM
    if convention == "resized_pixel":
        rh, rw = model_input_size(height, width, rule)
        return width / rw, height / rh
    raise BoxError(f"box convention {convention!r} is not one of {', '.join(CONVENTIONS)}")


def to_pixels(
    box: Sequence[float], convention: str, image_size: tuple[int, int], rule: ResizeRule = ResizeRule()
) -> list[float]:
    """Converts a box of a convention to pixels of the original image.

    Args:
        box: [x1, y1, x2, y2] in `convention`.
        convention: One of CONVENTIONS.
        image_size: (width, height) of the original image, px.
        rule: Smart-resize settings (for resized_pixel). Default Qwen2.5-VL's.

    Returns:
        [x1, y1, x2, y2] in pixels (floats, not rounded).
    """
    sx, sy = _scales(convention, image_size, rule)
    x1, y1, x2, y2 = box
    return [x1 * sx, y1 * sy, x2 * sx, y2 * sy]


def from_pixels(
    box: Sequence[float],
    convention: str,
    image_size: tuple[int, int],
    rule: ResizeRule = ResizeRule(),
    *,
    integers: bool = True,
) -> list[float]:
    """Converts a pixel box of the original image to a convention.

    Args:
        box: [x1, y1, x2, y2] in pixels of the original image.
        convention: One of CONVENTIONS.
        image_size: (width, height) of the original image, px.
        rule: Smart-resize settings (for resized_pixel). Default Qwen2.5-VL's.
        integers: Round to whole numbers, as the models write them. Default True.

    Returns:
        [x1, y1, x2, y2] in `convention`.
    """
    sx, sy = _scales(convention, image_size, rule)
    x1, y1, x2, y2 = box
    out = [x1 / sx, y1 / sy, x2 / sx, y2 / sy]
    return [round(v) for v in out] if integers else out


def box_problem(box: Any, convention: str, image_size: tuple[int, int], rule: ResizeRule = ResizeRule()) -> str:
    """Returns why a box is not valid in its convention for an image ("" when it is).

    Checks: four finite numbers, x1 < x2 and y1 < y2, and inside the convention's range
    (the image for pixel, [0, 1000] for norm1000, the resized image for resized_pixel).
    """
    if (
        not isinstance(box, (list, tuple))
        or len(box) != 4
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in box)
    ):
        return "bbox must be 4 finite numbers [x1, y1, x2, y2]"
    x1, y1, x2, y2 = box
    if x2 <= x1 or y2 <= y1:
        return f"bbox {list(box)}: needs x1 < x2 and y1 < y2"
    width, height = image_size
    if convention == "norm1000":
        limit = (NORM, NORM)
    elif convention == "resized_pixel":
        rh, rw = model_input_size(height, width, rule)
        limit = (rw, rh)
    else:
        limit = (width, height)
    if min(x1, y1) < 0 or x2 > limit[0] or y2 > limit[1]:
        return (
            f"bbox {list(box)}: outside [0, 0, {limit[0]:g}, {limit[1]:g}] ({convention} of a {width}x{height} image)"
        )
    return ""


def _area(box: Sequence[float]) -> float:
    x1, y1, x2, y2 = box
    return max(0.0, x2 - x1) * max(0.0, y2 - y1)


def is_proper(box: Sequence[float]) -> bool:
    """Returns whether a box has x1 < x2 and y1 < y2 (else it has zero area and never matches)."""
    return box[2] > box[0] and box[3] > box[1]


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two ``[x1, y1, x2, y2]`` boxes of the same convention.

    Boxes are continuous (``x2 - x1`` is the width). A box with ``x2 <= x1``
    or ``y2 <= y1`` is degenerate and has zero area. When the union has zero
    area (both boxes degenerate, even if equal) the result is ``0.0``.

    Args:
        a: First box.
        b: Second box.

    Returns:
        IoU in ``[0, 1]``.

    Raises:
        ValueError: If a box does not have 4 coordinates.
    """
    if len(a) != 4 or len(b) != 4:
        raise ValueError(f"boxes must have 4 coordinates [x1, y1, x2, y2], got {a!r} and {b!r}")
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(0.0, iw) * max(0.0, ih) if _area(a) > 0 and _area(b) > 0 else 0.0
    union = _area(a) + _area(b) - inter
    if union <= 0:
        return 0.0
    return float(inter / union)


def box_key(convention: str) -> str:
    """Returns the key a convention's boxes are written under: "bbox" for pixel, "bbox_2d" (the Qwen cookbooks') else."""
    return "bbox" if convention == "pixel" else "bbox_2d"


def convert_findings(
    findings: Sequence[dict],
    to: str,
    image_size: tuple[int, int],
    rule: ResizeRule = ResizeRule(),
    source: str = "pixel",
) -> list[dict]:
    """Converts detection findings between conventions.

    Args:
        findings: `{"label", "bbox"}` dicts (as `answers.parse_findings` returns them), in `source`.
        to: The target convention.
        image_size: (width, height) of the original image, px.
        rule: Smart-resize settings (for resized_pixel). Default Qwen2.5-VL's.
        source: The findings' convention. Default "pixel".

    Returns:
        New dicts in the target's written form: `{"label", "bbox"}` for pixel (numbers kept
        when nothing changes), else `{"bbox_2d": integers, "label"}`, in the same order.

    Raises:
        BoxError: An unknown convention.
    """
    for name in (to, source):
        if name not in CONVENTIONS:
            raise BoxError(f"box convention {name!r} is not one of {', '.join(CONVENTIONS)}")
    out = []
    for f in findings:
        pixels = to_pixels(f["bbox"], source, image_size, rule)
        box = list(f["bbox"]) if to == source else from_pixels(pixels, to, image_size, rule)
        out.append({"label": f["label"], "bbox": box} if to == "pixel" else {"bbox_2d": box, "label": f["label"]})
    return out
