"""The validate-data HTML report: its content, and what a person sees in a browser.

The browser check renders the report in headless Chromium (Debian package `chromium`,
`tests/browser.py`) and looks at the pixels: the verdict banner, the histogram bars and an
error's thumbnail must be on screen. It skips only when Chromium is absent and CI is unset.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from components.validate_data.types import CODES
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
    from components.validate_data.types import ValidationResult

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
    img = screenshot(report, tmp_path / "validate_data_report.png", (1100, 3400))
    assert pixels_near(img, (0xE6, 0xF4, 0xEA), 3) > 2000  # the green "PASSED" banner
    assert pixels_near(img, (0x1A, 0x73, 0xE8), 20) > 300  # blue histogram bars and size dots
    assert pixels_near(img, GREEN, 30) > 500  # the E_TOKENS example's thumbnail (96x96 px)
    assert pixels_near(img, PURPLE, 30) > 500  # the E_IMAGE_COUNT example's thumbnail: a text check, readable image
    assert_not_blank(img)


def _pv_images(html: str) -> list:
    """The preview drawings (PNG data URIs inside the valid-rows section), decoded."""
    import base64
    import io

    from PIL import Image

    section = html.split("<h2>Valid rows", 1)[1].split("<h2>", 1)[0]
    uris = re.findall(r'src="data:image/png;base64,([^"]+)"', section)
    return [Image.open(io.BytesIO(base64.b64decode(u))).convert("RGB") for u in uris]


def _table(html: str, css_class: str) -> list[list[str]]:
    table = html.split(f'<table class="{css_class}">', 1)[1].split("</table>", 1)[0]
    return [
        [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", tr, re.S)]
        for tr in re.findall(r"<tr>(.*?)</tr>", table, re.S)
    ]


def _answer(*findings) -> str:
    return "```json\n" + json.dumps([{"label": k, "bbox": b} for k, b in findings]) + "\n```"


def test_detection_report_previews_rows_and_counts_labels(tmp_path):
    from components.common.report import GOLD_COLOR

    folder = tmp_path / "data"
    hole, block = ("hole", [10, 10, 40, 40]), ("title_block", [50, 60, 150, 90])
    train = []
    for i in range(5):
        png(folder / f"t{i}.png", size=(160, 100), color=(255, 255, 255 - 10 * i))
        findings = [hole, block] if i % 2 == 0 else [hole]
        train.append(line(row(f"find the features {i}", [f"t{i}.png"], answer=_answer(*findings))))
    png(folder / "e0.png", size=(160, 100), color=(230, 230, 255))
    png(folder / "e1.png", size=(160, 100), color=(220, 230, 255))
    evals = [line(row("find the features e0", ["e0.png"], answer=_answer(hole, hole))),
             line(row("find the features e1", ["e1.png"], answer=_answer()))]  # fmt: skip
    report = tmp_path / "report.html"
    Run(tmp_path / "out")([write_lines(folder / "train.jsonl", train)], eval_files=[str(write_lines(folder / "eval.jsonl", evals))],
                          task="detection", report_out=str(report))  # fmt: skip
    html = report.read_text(encoding="utf-8")
    # the first four valid rows: where each came from, its prompt and answer, its image with the boxes drawn
    assert "<h2>Valid rows: the first 4</h2>" in html and html.count('<div class="pv">') == 4
    assert "train.jsonl:1</div>" not in html and "train.jsonl:1 <span" in html and "find the features 0" in html
    first = _pv_images(html)[0]
    assert first.size == (160, 100)
    assert first.getpixel((10, 25)) == GOLD_COLOR and first.getpixel((100, 90)) == GOLD_COLOR  # both boxes' edges
    assert first.getpixel((25, 25)) == (255, 255, 255)  # inside the hole box: the image itself
    legend = html.split("<h2>Valid rows", 1)[1].split('<ol class="legend">', 1)[1].split("</ol>", 1)[0]
    assert re.sub(r"<[^>]+>", " ", legend).split() == ["1", "hole", "2", "title_block"]
    # per label, per split: 5 + 2 holes, 3 + 0 title blocks; rows per number of boxes
    assert _table(html, "labels")[1:] == [["hole", "5", "2", "7", ""], ["title_block", "3", "0", "3", ""]]
    assert _table(html, "per-row")[1:] == [["0", "0", "1", "1", ""], ["1", "2", "0", "2", ""], ["2", "3", "1", "4", ""]]
    assert "10 boxes of 2 label(s) in 7 valid rows" in html
    # a label the eval set lacks is a warning (amber), not an error
    assert re.search(r'<p class="note warn">Label\(s\) with no box in the eval set[^<]*<code>title_block</code>', html)


def test_key_value_report_counts_fields(tmp_path):
    folder = tmp_path / "data"
    rows = []
    for i in range(6):
        png(folder / f"k{i}.png", size=(64, 64), color=(10 * i, 50, 50))
        fields = {"invoice": f"A-{i}", "total": str(10 * i), **({"date": f"2026-01-0{i + 1}"} if i < 2 else {})}
        rows.append(
            line(row(f"read the invoice {i}", [f"k{i}.png"], answer="```json\n" + json.dumps(fields) + "\n```"))
        )
    report = tmp_path / "report.html"
    Run(tmp_path / "out")([write_lines(folder / "train.jsonl", rows)], task="key_value", report_out=str(report))
    html = report.read_text(encoding="utf-8")
    counts = {r[0]: int(r[3]) for r in _table(html, "fields-count")[1:]}
    assert counts == {"invoice": 6, "total": 6, "date": 2}
    assert "<h2>Fields</h2>" in html and "<td>invoice</td><td>A-0</td>" in html  # the preview's field table


def test_fine_states_are_not_styled_as_errors(tmp_path):
    from components.common.report import RED

    report, _ = make_report(tmp_path)  # max_length 600, beyond the longest valid row: a fine state
    html = report.read_text(encoding="utf-8")
    title = re.search(r"<text[^>]*style=\"([^\"]*)\"[^>]*>max_length 600 → beyond the longest row", html)
    assert title and RED.lower() not in title.group(1).lower() and "#5f6368" in title.group(1).lower()
    assert "#d93025" not in html.split("<h2>Token length per row</h2>", 1)[1].split("<h2>", 1)[0].lower()


def test_leakage_notes_follow_the_setting(tmp_path):
    folder = tmp_path / "data"
    for i in range(4):
        png(folder / f"s{i}.png", size=(64, 64), color=(40 * i, 90, 90))
    train = write_lines(
        folder / "train.jsonl", [line(row(f"q {i}", [f"s{i}.png"], answer=fenced(i))) for i in range(3)]
    )
    leaked, clean = row("q again", ["s0.png"], answer=fenced(0)), row("q new", ["s3.png"], answer=fenced(3))
    evals = write_lines(folder / "eval.jsonl", [line(leaked), line(clean)])
    styles = {}
    for leakage in ("quarantine", "warn"):
        report = tmp_path / f"{leakage}.html"
        Run(tmp_path / leakage)([train], eval_files=[str(evals)], leakage=leakage, report_out=str(report),
                                max_invalid_fraction=1.0)  # fmt: skip
        styles[leakage] = re.search(r'<p class="note (\w+)">1 eval row\(s\) share', report.read_text("utf-8")).group(1)
    assert styles == {"quarantine": "info", "warn": "warn"}
