"""validate-data's token counts against ms-swift's own Qwen3-VL template (peer check, CPU, no mocks).

ms-swift drops a training row longer than `max_length` and, with its `max_pixels`
argument, scales large images down before they become tokens. validate-data must count
what ms-swift encodes: here its count of each row is compared with the length of
`Template.encode(row)["input_ids"]` of the installed ms-swift, on the project's tiny random
Qwen3-VL (its real tokenizer, chat template and image processor settings).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from components.common.boxes import ResizeRule, model_input_size
from tests.test_validate_data import Run, line, png, row, write_lines

# environment variables through which ms-swift's qwen_vl_utils would resize images
RESIZE_ENV = ("MAX_PIXELS", "MIN_PIXELS", "IMAGE_MAX_TOKEN_NUM", "IMAGE_MIN_TOKEN_NUM", "SPATIAL_MERGE_SIZE")
SHRINK = 160 * 160  # small enough that the tiny model's 600x400 and 1024x1024 images are scaled down


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    from pipelines.demo.tiny_model import ensure_tiny_model

    return Path(ensure_tiny_model())


@pytest.fixture(scope="module")
def swift_processor(tiny_model):
    """ms-swift's processor of the tiny Qwen3-VL (no weights loaded), with no resize settings in the environment."""
    from swift.model import get_processor

    with pytest.MonkeyPatch.context() as mp:
        for name in RESIZE_ENV:
            mp.delenv(name, raising=False)
        return get_processor(str(tiny_model), model_type="qwen3_vl")


def swift_lengths(processor, rows: list[dict], folder: Path, max_pixels: int) -> list[int]:
    """len(input_ids) of each row as ms-swift's qwen3_vl template encodes it for training."""
    from swift.template import get_template

    template = get_template(processor, max_pixels=max_pixels or None)
    template.set_mode("train")
    lengths = []
    for r in rows:
        images = [str(folder / p) for p in r.get("images", [])]
        lengths.append(len(template.encode({"messages": r["messages"], "images": images})["input_ids"]))
    return lengths


@pytest.fixture(scope="module")
def peer_rows(tmp_path_factory) -> tuple[Path, list[dict]]:
    """Rows with images below and above SHRINK, several images, a system prompt, an image mid-text."""
    folder = tmp_path_factory.mktemp("peer")
    for name, size in {
        "small.png": (64, 64),
        "wide.png": (600, 400),
        "big.png": (1024, 1024),
        "odd.png": (333, 777),
        "thin.png": (1000, 90),
    }.items():
        png(folder / name, size=size, color=(30 + len(name) * 9, 90, 200))
    answer = '```json\n[{"label": "hole", "bbox_2d": [12, 40, 300, 512]}]\n```'
    rows = [
        row("find the holes", ["small.png"], answer=answer),
        row("find the holes", ["wide.png"], answer=answer),
        row("find the holes", ["big.png"], answer="none here", system="You read engineering drawings."),
        row("compare these", ["odd.png", "wide.png"], answer=answer),
        row("thin strip", ["thin.png"], answer=answer),
        {
            "messages": [
                {"role": "user", "content": "look at <image> please, and count 12345 holes"},
                {"role": "assistant", "content": answer},
                {"role": "user", "content": "and again?"},
                {"role": "assistant", "content": "the same: 7"},
            ],
            "images": ["small.png"],
        },
    ]
    return folder, rows


@pytest.mark.parametrize("max_pixels", [0, SHRINK, 300_000])
def test_token_counts_equal_ms_swift_encoding(tmp_path, tiny_model, swift_processor, peer_rows, max_pixels):
    folder, rows = peer_rows
    path = write_lines(folder / f"train-{max_pixels}.jsonl", [line(r) for r in rows])
    result = Run(tmp_path / "out")([path], model_dir=str(tiny_model), max_pixels=max_pixels, eval_fraction=0.3)
    assert result.counts["n_valid"] == len(rows), result.summary()
    assert result.stats["max_pixels"] == max_pixels
    assert result.stats["token_counts"] == swift_lengths(swift_processor, rows, folder, max_pixels)


def test_max_pixels_shrinks_the_count_of_large_images_only(tmp_path, tiny_model, swift_processor, peer_rows):
    folder, rows = peer_rows
    full = swift_lengths(swift_processor, rows[:3], folder, 0)
    shrunk = swift_lengths(swift_processor, rows[:3], folder, SHRINK)
    assert shrunk[0] == full[0]  # 64x64 is below max_pixels: unchanged
    assert shrunk[1] < full[1] and shrunk[2] < full[2]  # 600x400 and 1024x1024 are scaled down
    # 1024x1024 -> rescale_image 160x160 -> smart resize 160x160: 25 tokens instead of 1024
    assert model_input_size(1024, 1024, ResizeRule.from_model(tiny_model, SHRINK)) == (160, 160)
    assert full[2] - shrunk[2] == 1024 - 25


def test_large_image_is_kept_with_max_pixels_and_quarantined_without(tmp_path, tiny_model, swift_processor):
    folder = tmp_path / "data"
    png(folder / "drawing.png", size=(1600, 1600))
    png(folder / "small.png", size=(128, 96))
    rows = [row(f"find the holes {i}", ["small.png"]) for i in range(3)] + [row("find the holes", ["drawing.png"])]
    path = write_lines(folder / "train.jsonl", [line(r) for r in rows])
    max_length = 400  # 1600x1600 at full size: 2500 image tokens; at max_pixels 1024x1024/4: 256

    without = Run(tmp_path / "without")(
        [path], model_dir=str(tiny_model), max_length=max_length, max_invalid_fraction=0.3
    )
    assert [(i.line, i.code) for i in without.issues] == [(4, "E_TOKENS")]
    assert "full-size images" in without.issues[0].message and "swift.max_pixels" in without.issues[0].message

    kept = Run(tmp_path / "with")([path], model_dir=str(tiny_model), max_length=max_length, max_pixels=512 * 512)
    assert kept.issues == [] and kept.counts["n_valid"] == 4
    assert "max_pixels 262144" in kept.summary()
    # and the kept row is as long as ms-swift encodes it with that max_pixels: under max_length
    assert sorted(kept.stats["token_counts"]) == sorted(swift_lengths(swift_processor, rows, folder, 512 * 512))
    assert max(kept.stats["token_counts"]) <= max_length
