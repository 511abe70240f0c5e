"""The validate-data HTML report: its content, and what a person sees in a browser.

The browser check renders the report in headless Chromium (Debian package `chromium`,
`tests/browser.py`) and looks at the pixels: the verdict banner, the histogram bars and an
error's thumbnail must be on screen. It skips only when Chromium is absent and CI is unset.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from components.validate_data.core import CODES
from tests.browser import assert_not_blank, pixels_near, screenshot
from tests.test_validate_data import Run, fenced, line, png, row, write_lines

GREEN = (0, 200, 0)  # the colour of the image of the over-long row: its thumbnail must show
PURPLE = (150, 0, 200)  # the image of a row rejected by a text check (E_IMAGE_COUNT): readable, so shown
LONG = "x" * 900  # a row text longer than the old 400-character cut


def make_report(tmp_path: Path) -> tuple[Path, object]:
    folder = tmp_path / "data"
    for i in range(6):
        png(folder / f"d{i}.png", size=(64 + 32 * i, 48 + 16 * i), color=(200, 30 + 30 * i, 30))
    png(folder / "big.png", size=(1024, 1024), color=GREEN)
    png(folder / "tiny.png", size=(8, 8))
    png(folder / "count.png", size=(64, 64), color=PURPLE)
    rows = [line(row(f"find the holes {i}", [f"d{i % 6}.png"], answer=fenced(i))) for i in range(20)]
    bad_count = row("two tags " + LONG, ["count.png"])
    bad_count["messages"][0]["content"] = "<image><image>" + bad_count["messages"][0]["content"]
    rows += [
        "{not json",
        line(row("too many tokens", ["big.png"])),
        line(row("tiny", ["tiny.png"])),
        line(row("escape <b>bold</b>", ["../../etc/passwd"])),
        line(bad_count),
    ]
    path = write_lines(folder / "train.jsonl", rows)
    run = Run(tmp_path / "out")
    report = tmp_path / "out" / "report.html"
    result = run([path], max_invalid_fraction=0.25, max_length=600, report_out=str(report))
    return report, result


def _texts(html: str) -> list[str]:
    return re.findall(r"<text[^>]*>([^<]*)</text>", html)


def test_report_holds_counts_histograms_and_examples(tmp_path):
    report, result = make_report(tmp_path)
    assert result.report == str(report)
    html = report.read_text(encoding="utf-8")
    assert "PASSED" in html and "20.0% invalid" in html
    for code in CODES:
        assert f"<code>{code}</code>" in html  # every check has a row, zero or not
    texts = _texts(html)
    histogram = _texts(html.split("<h2>Image sizes</h2>")[0])
    # token histogram: axis titles with units, over the data's range; max_length (600) lies beyond it
    assert "tokens per row (text + image tokens, as ms-swift encodes the row)" in texts and "rows" in texts

    longest = max(result.stats["token_counts"])
    x_title = histogram.index("tokens per row (text + image tokens, as ms-swift encodes the row)")
    ticks = [float(t) for t in histogram[:x_title]]  # the x tick labels come before the x axis title
    assert ticks and max(ticks) < 600 and min(ticks) > 0  # the data's range, not 0..max_length
    assert f"max_length 600 → beyond the longest row ({longest})" in histogram
    # image sizes: axis titles, each size's count written beside its dot
    assert "width (px)" in texts and "height (px)" in texts and "64×48: 1 image" in texts
    # examples: file:line, thumbnails (E_TOKENS big.png, E_IMAGE_SIZE tiny.png, E_IMAGE_COUNT count.png)
    assert "train.jsonl:21" in html and "train.jsonl:22" in html and "train.jsonl:24" in html
    assert html.count("data:image/jpeg;base64,") == 3
    assert LONG in html and '<pre class="raw">' in html  # the raw line whole, in a scrollable block
    assert "&lt;b&gt;bold&lt;/b&gt;" in html and "<b>bold</b>" not in html  # row text is escaped
    assert "<script" not in html and not re.search(r'(src|href)="(https?:)?//', html)  # nothing fetched


def test_one_shared_image_size_is_a_labelled_dot(tmp_path):
    folder = tmp_path / "data"
    for i in range(5):
        png(folder / f"a{i}.png", size=(640, 480), color=(10 * i, 0, 0))
    rows = [line(row(f"q {i}", [f"a{i}.png"], answer=fenced(i))) for i in range(5)]
    run = Run(tmp_path / "out")
    report = tmp_path / "report.html"
    run([write_lines(folder / "train.jsonl", rows)], report_out=str(report))
    texts = _texts(report.read_text(encoding="utf-8").split("<h2>Image sizes</h2>")[1])
    assert "640×480: 5 images" in texts
    x_ticks = [int(t) for t in texts[: texts.index("width (px)")]]
    assert x_ticks[0] == 0 and x_ticks[-1] >= 600  # limits from 0 past the one size, not a zero-width range


def test_token_source_names_the_model_not_its_cache_folder(tmp_path):
    from components.validate_data import _report
    from components.validate_data.core import ValidationResult

    counts = {"n_lines": 1, "n_valid": 1, "n_invalid": 0, "n_train": 1, "n_eval": 1, "n_images": 0}
    stats = {
        "token_counts": [120], "max_length": 130, "max_pixels": 0,
        "token_source": "tokenizer:hf://Qwen/Qwen3-VL-4B-Instruct@0123456789ab",
        "token_model": "hf://Qwen/Qwen3-VL-4B-Instruct@0123456789ab", "token_model_dir": "/cache/hf/Qwen/x/0123",
    }  # fmt: skip
    html = _report.render_report(ValidationResult("t", "e", "q", counts, [], stats), [])
    assert "the tokenizer of <code>hf://Qwen/Qwen3-VL-4B-Instruct@0123456789ab</code>" in html
    assert "max_length 130" in _texts(html)  # within reach of the data: drawn as a line, axis widened


def test_model_label_reads_the_staged_manifest(tmp_path):
    from components.validate_data._tokens import model_label

    folder = tmp_path / "0123456789abcdef0123"
    folder.mkdir()
    assert model_label(folder) == "0123456789abcdef0123"
    (folder / "manifest.json").write_text(
        json.dumps({"source": "hf://Qwen/Qwen3-VL-4B-Instruct", "revision": "0123456789abcdef0123"})
    )
    assert model_label(folder) == "hf://Qwen/Qwen3-VL-4B-Instruct@0123456789ab"
    (folder / "manifest.json").write_text(
        json.dumps({"source": "/models/tiny", "revision": "sha256-be99829f30069624ab"})
    )
    assert model_label(folder) == "/models/tiny@sha256-be99829f3006"


def test_report_renders_in_chromium(tmp_path):
    report, _ = make_report(tmp_path)
    img = screenshot(report, tmp_path / "validate_data_report.png", (1100, 2600))
    assert pixels_near(img, (0xE6, 0xF4, 0xEA), 3) > 2000  # the green "PASSED" banner
    assert pixels_near(img, (0x1A, 0x73, 0xE8), 20) > 300  # blue histogram bars and size dots
    assert pixels_near(img, GREEN, 30) > 500  # the E_TOKENS example's thumbnail (96x96 px)
    assert pixels_near(img, PURPLE, 30) > 500  # the E_IMAGE_COUNT example's thumbnail: a text check, readable image
    assert_not_blank(img)
