"""Box conventions of Qwen-VL models: conversions round-trip, the real smart-resize rule, range checks."""

import json
import random

import pytest
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize as hf_smart_resize

from components.common.boxes import (
    BoxError,
    ResizeRule,
    box_problem,
    convention_for_model,
    from_pixels,
    model_input_size,
    resolve_convention,
    smart_resize,
    to_pixels,
)


@pytest.mark.parametrize(
    "size", [(1024, 1024), (1600, 1200), (640, 480), (3000, 57), (28, 28), (33, 4000), (7000, 5000)]
)
def test_smart_resize_is_the_processors_rule(size):
    h, w = size
    assert smart_resize(h, w) == hf_smart_resize(h, w, factor=28, min_pixels=56 * 56, max_pixels=14 * 14 * 4 * 1280)
    rule = ResizeRule(factor=32, min_pixels=64 * 64, max_pixels=1024 * 1024)
    assert smart_resize(h, w, rule) == hf_smart_resize(h, w, factor=32, min_pixels=64 * 64, max_pixels=1024 * 1024)


def test_pixel_norm1000_pixel_round_trips_within_one_pixel():
    rng = random.Random(0)
    for _ in range(500):
        width, height = rng.randint(50, 5000), rng.randint(50, 5000)
        x1, y1 = rng.uniform(0, width - 2), rng.uniform(0, height - 2)
        box = [x1, y1, rng.uniform(x1 + 1, width), rng.uniform(y1 + 1, height)]
        norm = from_pixels(box, "norm1000", (width, height))
        assert all(0 <= v <= 1000 for v in norm)
        back = to_pixels(norm, "norm1000", (width, height))
        # whole norm1000 numbers: one step is width / 1000 px, so half a step each way
        assert all(abs(a - b) <= max(1.0, width / 2000, height / 2000) for a, b in zip(back, box, strict=True))


def test_resized_pixel_round_trips_and_uses_the_resized_size():
    width, height = 1600, 1200  # Qwen2.5-VL sees 1596 x 1204 -> see smart_resize
    rh, rw = smart_resize(height, width)
    box = [100, 200, 1600, 1200]
    resized = from_pixels(box, "resized_pixel", (width, height), integers=False)
    assert resized[2] == pytest.approx(rw) and resized[3] == pytest.approx(rh)
    assert to_pixels(resized, "resized_pixel", (width, height)) == pytest.approx(box)


@pytest.mark.parametrize(
    ("architecture", "model_type", "expected"),
    [
        ("Qwen3VLForConditionalGeneration", "qwen3_vl", "norm1000"),
        ("Qwen2VLForConditionalGeneration", "qwen2_vl", "norm1000"),
        ("Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl", "resized_pixel"),
        ("Qwen3VLMoeForConditionalGeneration", "qwen3_vl_moe", "norm1000"),
        ("LlavaForConditionalGeneration", "llava", "pixel"),
    ],
)
def test_default_convention_follows_the_model_family(architecture, model_type, expected):
    assert convention_for_model(architecture, model_type) == expected
    assert resolve_convention("auto", architecture, model_type) == expected
    assert resolve_convention("pixel", architecture, model_type) == "pixel"


def test_unknown_convention_is_a_named_error():
    with pytest.raises(BoxError, match="not one of auto, pixel, norm1000, resized_pixel"):
        resolve_convention("normalized")


@pytest.mark.parametrize(
    ("box", "convention", "fragment"),
    [
        ([10, 10, 5, 20], "pixel", "x1 < x2"),
        ([10, 10, 20, 10], "pixel", "y1 < y2"),
        ([10, 10, 700, 20], "pixel", "outside [0, 0, 640, 480]"),
        ([-1, 10, 20, 20], "pixel", "outside"),
        ([10, 10, 1001, 20], "norm1000", "outside [0, 0, 1000, 1000]"),
        ([1, 2, 3], "pixel", "4 finite numbers"),
        ([1, 2, 3, float("nan")], "pixel", "4 finite numbers"),
        ([1, 2, 3, True], "pixel", "4 finite numbers"),
    ],
)
def test_box_problems_are_named(box, convention, fragment):
    assert fragment in box_problem(box, convention, (640, 480))


def test_valid_boxes_have_no_problem():
    assert box_problem([0, 0, 640, 480], "pixel", (640, 480)) == ""
    assert box_problem([0, 0, 1000, 1000], "norm1000", (640, 480)) == ""
    rh, rw = smart_resize(480, 640)
    assert box_problem([0, 0, rw, rh], "resized_pixel", (640, 480)) == ""


def test_model_input_size_is_ms_swifts_resize():
    """ms-swift's template `rescale_image` (its max_pixels argument), then qwen_vl_utils' smart resize."""
    from PIL import Image
    from qwen_vl_utils.vision_process import smart_resize as qwen_smart_resize
    from swift.template.vision_utils import rescale_image

    rng = random.Random(1)
    for _ in range(150):
        width, height = rng.randint(28, 2500), rng.randint(28, 2500)
        cap = rng.choice([0, 40_000, 160 * 160, 307_200, 1024 * 1024])
        for patch in (14, 16):
            rule = ResizeRule.for_patch_size(patch, cap)
            scaled = rescale_image(Image.new("L", (width, height)), cap) if cap else Image.new("L", (width, height))
            f = patch * 2
            expected = qwen_smart_resize(scaled.height, scaled.width, f, 4 * f * f, 16384 * f * f)
            assert model_input_size(height, width, rule) == expected, (width, height, cap, patch)
    assert model_input_size(1200, 1600) == smart_resize(1200, 1600)  # no max_pixels: smart resize alone


def test_rule_from_model_folder(tmp_path):
    config = {"patch_size": 16, "merge_size": 2, "size": {"shortest_edge": 65536, "longest_edge": 262144}}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    # ms-swift's bounds, not the folder's size: its Qwen-VL templates resize with qwen_vl_utils
    assert ResizeRule.from_model(tmp_path) == ResizeRule(32, 4 * 32 * 32, 16384 * 32 * 32, 0)
    assert ResizeRule.from_model(tmp_path, max_pixels=1 << 20).template_max_pixels == 1 << 20
    assert ResizeRule.from_model(None, max_pixels=5) == ResizeRule(template_max_pixels=5)
    assert ResizeRule.from_model(tmp_path / "missing") == ResizeRule()


def test_resized_pixel_follows_the_image_scaled_down_by_max_pixels():
    width, height = 1600, 1200
    rule = ResizeRule.for_patch_size(14, max_pixels=640 * 480)  # Qwen2.5-VL trained with swift.max_pixels
    rh, rw = model_input_size(height, width, rule)
    assert (rw, rh) == (644, 476)  # rescaled to 640x480, then rounded to multiples of 28
    assert box_problem([0, 0, rw, rh], "resized_pixel", (width, height), rule) == ""
    assert "outside [0, 0, 644, 476]" in box_problem([0, 0, 1596, 1204], "resized_pixel", (width, height), rule)
    assert box_problem([0, 0, 1596, 1204], "resized_pixel", (width, height), ResizeRule.for_patch_size(14)) == ""
    box = [100, 200, 1600, 1200]
    resized = from_pixels(box, "resized_pixel", (width, height), rule, integers=False)
    assert resized[2] == pytest.approx(rw) and resized[3] == pytest.approx(rh)
    assert to_pixels(resized, "resized_pixel", (width, height), rule) == pytest.approx(box)
