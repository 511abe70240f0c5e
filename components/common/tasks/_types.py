"""What every task's functions take and return: a sample's box geometry, the shapes a report draws,
and the per-sample score dict that `components.evaluate.metrics.aggregate` reads."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from components.common import boxes


@dataclass(frozen=True)
class Geometry:
    """How to read the box numbers of one sample: their convention and the image they belong to.

    Attributes:
        convention: One of `boxes.CONVENTIONS`. Default "pixel".
        image_size: (width, height) of the original image, px; needed unless pixel. Default None.
        rule: Smart-resize settings (for resized_pixel). Default Qwen2.5-VL's.
    """

    convention: str = "pixel"
    image_size: tuple[int, int] | None = None
    rule: boxes.ResizeRule = field(default_factory=boxes.ResizeRule)

    def to_pixels(self, box: Sequence[float]) -> list[float]:
        """Returns the box in pixels of the original image.

        Raises:
            boxes.BoxError: An unknown convention, or no image size for a convention that needs one.
        """
        if self.convention == "pixel":
            return [float(v) for v in box]
        if self.image_size is None:
            raise boxes.BoxError(f"a {self.convention} box needs the image size to be read in pixels")
        return boxes.to_pixels(box, self.convention, self.image_size, self.rule)


PIXEL = Geometry()


@dataclass(frozen=True)
class Shape:
    """One finding as a report draws it.

    Attributes:
        label: The finding's label.
        box: (x1, y1, x2, y2) in pixels of the original image, in the answer's order (not sorted).
        valid: x1 < x2 and y1 < y2. An invalid box has zero area: the metric never matches it,
            so a report must not draw it as a rectangle spanning its corners.
    """

    label: str
    box: tuple[float, float, float, float]
    valid: bool


ScoreFn = Callable[..., dict[str, Any]]


def invalid_score(error: str | None, n_gold: int) -> dict[str, Any]:
    """Returns the score dict of an answer that does not parse: nothing found, every gold item missed."""
    return {
        "json_valid": False,
        "exact_match": False,
        "tp": 0,
        "fp": 0,
        "fn": n_gold,
        "n_pred": 0,
        "n_gold": n_gold,
        "error": error,
    }


def valid_score(exact: bool, tp: int, n_pred: int, n_gold: int) -> dict[str, Any]:
    """Returns the score dict of an answer that parses, from its exact match and counts."""
    return {
        "json_valid": True,
        "exact_match": exact,
        "tp": tp,
        "fp": n_pred - tp,
        "fn": n_gold - tp,
        "n_pred": n_pred,
        "n_gold": n_gold,
        "error": None,
    }


def no_shapes(text: str, geometry: Geometry = PIXEL) -> list[Shape]:
    """`Task.shapes` of a task with nothing to draw."""
    return []
