"""Tests of the evaluate HTML report (components.evaluate._report)."""

from __future__ import annotations

import base64
import io
import json
import re
import tempfile
from html.parser import HTMLParser
from pathlib import Path

from PIL import Image, ImageDraw

from components.evaluate._report import (
    GOLD_COLOR,
    PRED_COLOR,
    REF_COLOR,
    draw_thumbnail,
    render_report,
    sample_f1,
    worst_samples,
    write_report,
)
from components.evaluate.metrics import score_sample


def _answer(findings):
    return "```json\n" + json.dumps(findings) + "\n```"


GOLD_BOX = {"label": "title_block", "bbox": [10, 10, 50, 40]}
PRED_BOX = {"label": "title_block", "bbox": [60, 50, 90, 80]}


def _sample(tmp_path, line, tuned_text, name="img.png"):
    path = tmp_path / name
    Image.new("RGB", (100, 100), "white").save(path)
    gold = _answer([GOLD_BOX])
    return {
        "line": line,
        "images": [str(path)],
        "gold": gold,
        "tuned": tuned_text,
        "tuned_score": score_sample(tuned_text, gold),
        "reference": "no idea",
        "reference_score": score_sample("no idea", gold),
    }


TUNED = {
    "n": 3,
    "f1": 0.6667,
    "precision": 0.5,
    "recall": 1.0,
    "json_valid_rate": 0.6667,
    "exact_match_rate": 0.3333,
    "samples_per_second": 2.5,
    "generated_tokens_per_second": 346.5,
    "generate_seconds": 1.2,
}
BASE = {
    "n": 3,
    "f1": 0.0,
    "precision": 0.0,
    "recall": 0.0,
    "json_valid_rate": 0.0,
    "exact_match_rate": 0.0,
    "samples_per_second": 0.8,
    "generated_tokens_per_second": 127.2,
    "generate_seconds": 3.75,
}


class _Collector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.imgs, self.cells, self._cell = [], [], [], None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "img":
            self.imgs.append(dict(attrs)["src"])
        if tag in ("td", "th"):
            self._cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.cells.append(self._cell)
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def _decode(src: str) -> Image.Image:
    assert src.startswith("data:image/png;base64,")
    return Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))).convert("RGB")


def test_report_is_self_contained_with_table_and_drawn_worst_samples(tmp_path):
    samples = [
        _sample(tmp_path, 1, _answer([GOLD_BOX])),  # perfect
        _sample(tmp_path, 2, _answer([PRED_BOX])),  # valid, wrong box
        _sample(tmp_path, 3, "I cannot see a drawing."),  # invalid
    ]
    page = render_report(TUNED, BASE, samples, passed=True, reason="PASS: f1 0.6667 ...", worst_n=2)
    parser = _Collector()
    parser.feed(page)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<script" not in page and not re.search(r'(src|href)="(http|//)', page)  # no external requests
    # metric table: reference, tuned, delta
    cells = parser.cells
    row = cells.index("F1")
    assert cells[row : row + 4] == ["F1", "0.0000", "0.6667", "+0.6667"]
    assert "346.5" in cells and "127.2" in cells and "samples/s" in cells and "generated tokens/s" in cells
    assert "PASSED" in page
    # worst two: the invalid one first, then the wrong box; the perfect one is not shown; each drawn
    # twice, the tuned model's answer and the reference's beside it
    assert len(parser.imgs) == 4
    assert page.index("line 3") < page.index("line 2") and "line 1<" not in page
    assert "invalid: no JSON" in page
    thumb = _decode(parser.imgs[2])  # line 2, tuned: gold green at (10..50, 10..40), prediction red at (60..90, 50..80)
    assert thumb.size == (100, 100)
    assert thumb.getpixel((10, 25)) == GOLD_COLOR and thumb.getpixel((30, 10)) == GOLD_COLOR
    assert thumb.getpixel((60, 65)) == PRED_COLOR and thumb.getpixel((75, 80)) == PRED_COLOR
    assert thumb.getpixel((30, 25)) == (255, 255, 255)  # inside a box: untouched


def test_thumbnail_scales_large_images_and_normalised_boxes(tmp_path):
    path = tmp_path / "big.png"
    Image.new("RGB", (640, 320), "white").save(path)
    png = draw_thumbnail(path, [{"label": "a", "bbox": [64, 32, 320, 160]}], [], size=320)
    image = Image.open(io.BytesIO(png)).convert("RGB")
    assert image.size == (320, 160)
    assert image.getpixel((32, 50)) == GOLD_COLOR  # left edge, scaled by 0.5
    # 0-1000 normalised coordinates on a small image: 500 -> half the width
    small = tmp_path / "small.png"
    Image.new("RGB", (100, 100), "white").save(small)
    image = Image.open(io.BytesIO(draw_thumbnail(small, [], [{"label": "a", "bbox": [500, 100, 900, 900]}])))
    assert image.convert("RGB").getpixel((50, 50)) == PRED_COLOR


def test_missing_image_still_draws(tmp_path):
    png = draw_thumbnail(tmp_path / "gone.png", [{"label": "a", "bbox": [5, 5, 50, 50]}], [])
    image = Image.open(io.BytesIO(png)).convert("RGB")
    assert image.getpixel((5, 20)) == GOLD_COLOR


def test_worst_samples_order_and_sample_f1(tmp_path):
    samples = [
        _sample(tmp_path, 1, _answer([GOLD_BOX])),
        _sample(tmp_path, 2, _answer([GOLD_BOX, PRED_BOX])),
        _sample(tmp_path, 3, "nope"),
    ]
    assert [s["line"] for s in worst_samples(samples, 3)] == [3, 2, 1]
    assert sample_f1(samples[0]["tuned_score"]) == 1.0
    assert sample_f1(samples[1]["tuned_score"]) == 2 / 3
    assert sample_f1({"json_valid": True, "tp": 0, "fp": 0, "fn": 0}) == 1.0
    assert sample_f1(samples[2]["tuned_score"]) == 0.0


def test_write_report_and_champion_column(tmp_path):
    out = write_report(tmp_path / "r" / "report.html", TUNED, BASE, [], False, "FAIL: ...", reference_name="champion")
    page = Path(out).read_text(encoding="utf-8")
    assert "champion" in page and "FAILED" in page and "<img" not in page
    assert "&lt;script&gt;" in render_report(TUNED, BASE, [], reason="<script>")  # escaped


def _card_sample(tmp_path, gold, tuned, convention, size=(200, 100)):
    path = tmp_path / f"{convention}.png"
    Image.new("RGB", size, "white").save(path)
    return {
        "line": 7,
        "images": [str(path)],
        "box_convention": convention,
        "image_size": list(size),
        "gold": gold,
        "tuned": tuned,
        "tuned_score": {"json_valid": True, "tp": 0, "fp": 1, "fn": 1},
        "reference_score": {},
    }


def test_report_draws_boxes_in_pixels_for_each_convention(tmp_path):
    # the same boxes on a 200 x 100 image: gold (20, 10)-(100, 50), prediction (120, 60)-(180, 90)
    pixel = _card_sample(
        tmp_path,
        _answer([{"label": "a", "bbox": [20, 10, 100, 50]}]),
        _answer([{"label": "a", "bbox": [120, 60, 180, 90]}]),
        "pixel",
    )
    norm = _card_sample(
        tmp_path,
        _answer([{"bbox_2d": [100, 100, 500, 500], "label": "a"}]),
        _answer([{"bbox_2d": [600, 600, 900, 900], "label": "a"}]),
        "norm1000",
    )
    page = render_report(TUNED, BASE, [pixel, norm], iou_threshold=0.5, worst_n=2)
    assert "IoU ≥ 0.5" in page and "norm1000" in page
    parser = _Collector()
    parser.feed(page)
    for src in parser.imgs[::2]:  # the tuned model's drawings (the reference's follow each)
        thumb = _decode(src)
        assert thumb.size == (200, 100)
        assert thumb.getpixel((20, 30)) == GOLD_COLOR and thumb.getpixel((60, 10)) == GOLD_COLOR
        assert thumb.getpixel((120, 75)) == PRED_COLOR and thumb.getpixel((150, 89)) == PRED_COLOR
        assert thumb.getpixel((60, 30)) == (255, 255, 255)  # inside the gold box: untouched


def test_invalid_prediction_is_marked_not_drawn_as_a_large_box(tmp_path):
    # x2 < x1: the metric scores it as zero area; min/max would draw (20, 10)-(180, 90)
    sample = _card_sample(
        tmp_path,
        _answer([{"label": "a", "bbox": [40, 40, 60, 60]}]),
        _answer([{"label": "a", "bbox": [180, 10, 20, 90]}]),
        "pixel",
    )
    page = render_report(TUNED, BASE, [sample], worst_n=1)
    parser = _Collector()
    parser.feed(page)
    thumb = _decode(parser.imgs[0])
    assert thumb.getpixel((20, 50)) == (255, 255, 255) and thumb.getpixel((100, 90)) == (255, 255, 255)
    assert thumb.getpixel((180, 10)) == PRED_COLOR  # a small cross at (x1, y1)
    assert "1 invalid" in page


def test_thumbnail_with_an_explicit_convention(tmp_path):
    path = tmp_path / "img.png"
    Image.new("RGB", (200, 100), "white").save(path)
    png = draw_thumbnail(path, [{"label": "a", "bbox": [100, 100, 500, 500]}], [], convention="norm1000")
    assert Image.open(io.BytesIO(png)).convert("RGB").getpixel((20, 30)) == GOLD_COLOR
    # pixel: the same numbers are not rescaled
    png = draw_thumbnail(path, [{"label": "a", "bbox": [100, 10, 150, 50]}], [], convention="pixel")
    assert Image.open(io.BytesIO(png)).convert("RGB").getpixel((100, 30)) == GOLD_COLOR


def _scored(tmp_path, line, gold, tuned, reference, size=(200, 100), name="s.png", color="white"):
    path = tmp_path / f"{line}-{name}"
    Image.new("RGB", size, color).save(path)
    return {
        "line": line,
        "origin": {"file": "gs://bucket/drawings/train.jsonl", "line": 40 + line, "images": [f"drawings/{name}"]},
        "images": [str(path)],
        "box_convention": "pixel",
        "image_size": list(size),
        "gold": gold,
        "tuned": tuned,
        "tuned_score": score_sample(tuned, gold, 0.5),
        "reference": reference,
        "reference_score": score_sample(reference, gold, 0.5),
    }


def _labelled_samples(tmp_path):
    hole, block = {"label": "hole", "bbox": [10, 10, 40, 40]}, {"label": "title_block", "bbox": [100, 50, 190, 90]}
    moved = {"label": "hole", "bbox": [120, 10, 150, 40]}
    flipped = {"label": "title_block", "bbox": [190, 50, 100, 90]}  # x2 < x1: zero area, never matches
    return [
        _scored(tmp_path, 1, _answer([hole, block]), _answer([hole, block]), _answer([moved])),
        _scored(tmp_path, 2, _answer([hole, block]), _answer([moved, flipped]), "no boxes here"),
        _scored(tmp_path, 3, _answer([block]), "I cannot tell", _answer([block]), color=(240, 240, 200)),
    ]


def test_per_label_counts_add_up_to_the_metric():
    from components.evaluate._labels import per_label
    from components.evaluate.metrics import aggregate

    with tempfile.TemporaryDirectory() as tmp:
        samples = _labelled_samples(Path(tmp))
        for key in ("tuned", "reference"):
            labels = per_label(samples, key, "detection", 0.5)
            total = aggregate([s[f"{key}_score"] for s in samples])
            for count in ("tp", "fp", "fn"):
                assert sum(v[count] for v in labels.values()) == total[count], (key, count)
        tuned = per_label(samples, "tuned", "detection", 0.5)
        assert tuned["hole"]["tp"] == 1 and tuned["hole"]["fp"] == 1 and tuned["hole"]["fn"] == 1
        assert tuned["title_block"] == {**tuned["title_block"], "tp": 1, "fp": 1, "fn": 2, "n_gold": 3}
        assert tuned["title_block"]["precision"] == 0.5 and tuned["title_block"]["recall"] == 1 / 3


def test_report_has_per_label_table_reference_answers_provenance_and_iou(tmp_path):
    samples = _labelled_samples(tmp_path)
    page = render_report(TUNED, BASE, samples, reference_name="base", iou_threshold=0.6, worst_n=3)
    parser = _Collector()
    parser.feed(page)
    cells = parser.cells
    # per-label table: label, expected, reference P/R/F1, tuned P/R/F1, delta
    row = cells.index("title_block", cells.index("F1 tuned − base"))
    assert cells[row : row + 9] == ["title_block", "3", "1.000", "0.333", "0.500", "0.500", "0.333", "0.400", "-0.100"]
    assert "Per label (2)" in page and "IoU ≥ 0.6" in page
    # the per-label F1 chart: matplotlib SVG with the labels and the axis title as text
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", page)
    assert "hole" in texts and "title_block" in texts and "F1 (per label, boxes matched at the IoU threshold)" in texts
    # every card: the user's file:line and image name, the reference's answer beside the tuned one
    assert "gs://bucket/drawings/train.jsonl:43" in page and "drawings/s.png" in page and "(eval set line 3)" in page
    assert page.count('alt="reference, line') == 3 and "no boxes here" in page
    assert page.count('<div class="label ref">base (') == 3
    assert "1 invalid: x2 ≤ x1 or y2 ≤ y1, never matches" in page  # the flipped box, as the metric scores it
    # the reference drawing of line 1 (the last card): its (moved) hole box in blue, the gold boxes in green
    ref = _decode(parser.imgs[5])
    assert ref.getpixel((120, 25)) == REF_COLOR and ref.getpixel((10, 25)) == GOLD_COLOR


def test_evaluate_report_renders_in_chromium(tmp_path):
    from tests.browser import assert_not_blank, pixels_near, screenshot

    page = tmp_path / "evaluate_report.html"
    write_report(page, TUNED, BASE, _labelled_samples(tmp_path), True, "PASS: f1 ...", iou_threshold=0.5, worst_n=3)
    img = screenshot(page, tmp_path / "evaluate_report.png", (1250, 2200))
    assert pixels_near(img, GOLD_COLOR, 10) > 200  # expected boxes
    assert pixels_near(img, PRED_COLOR, 10) > 100 and pixels_near(img, REF_COLOR, 10) > 100  # both models' boxes
    assert pixels_near(img, (0x1A, 0x73, 0xE8), 12) > 300  # the tuned F1 bars
    assert_not_blank(img)


CONTROL = "".join(chr(c) for c in (7, 1, 2, 3, 4, 5, 6, 8, 0x0E, 0x0F, 0x10, 0x11))  # 12 control characters
_RAW_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u200b-\u200f\ue000]")


def _control_sample(tmp_path):
    """A base model's answer of raw control characters, a bell, a zero-width space and a private-use character."""
    gold = _answer([GOLD_BOX])
    reference = CONTROL + "title\x07block \u200b\ue000 <done>"
    return {**_sample(tmp_path, 1, _answer([PRED_BOX])), "reference": reference,
            "reference_score": score_sample(reference, gold)}  # fmt: skip


def test_control_characters_are_escaped_or_summarised(tmp_path):
    page = render_report(TUNED, BASE, [_control_sample(tmp_path)], worst_n=1)
    assert not _RAW_CONTROL.search(page)  # none reaches the browser, which would draw tofu boxes
    # a run is summarised with its first escapes; a lone one is its escape; the text around stays readable
    assert "⟨12 control characters: \\x07 \\x01 \\x02 …⟩" in page
    assert 'title<span class="ctl">\\x07</span>block' in page
    assert 'block <span class="ctl">\\u200b\\ue000</span> &lt;done&gt;' in page
    assert "15 unprintable character(s) shown as escapes" in page


def test_readable_text_keeps_layout_and_escapes_markup():
    from components.common.report import count_unprintable, readable_text

    assert str(readable_text("a\n\tb <i>")) == "a\n\tb &lt;i&gt;"
    assert str(readable_text("\x1b[0m")) == '<span class="ctl">\\x1b</span>[0m'
    assert str(readable_text("\x00\x00\x00")) == '<span class="ctl">\\x00\\x00\\x00</span>'  # 3: spelt out
    assert "⟨4 control characters" in str(readable_text("\x00" * 4))
    assert count_unprintable("ok\n\t\x7f\u200b") == 2 and str(readable_text(None)) == ""


def test_boxes_sharing_a_corner_get_tags_that_do_not_overlap(tmp_path):
    from components.common.report import place_tags
    from components.common.tasks import Shape
    from components.evaluate._report import draw_shapes

    # a perfect prediction: the tuned boxes lie on the expected ones, on a small image
    boxes = [("title_block", (10, 30, 60, 70)), ("dimension", (12, 32, 62, 72))]
    gold = [Shape(label, box, True) for label, box in boxes]
    path = tmp_path / "small.png"
    Image.new("RGB", (100, 100), "white").save(path)
    thumb = Image.open(io.BytesIO(draw_shapes(path, gold, gold))).convert("RGB")
    # every tag shows whole: off the box outlines, each colour covers two tags' area (11 x 14 px, less the digit)
    outline = Image.new("1", thumb.size, 0)
    for _, (x1, y1, x2, y2) in boxes:
        ImageDraw.Draw(outline).rectangle((x1 - 1, y1 - 1, x2 + 1, y2 + 1), outline=1, width=4)
    off = [c for c, o in zip(thumb.getdata(), outline.getdata()) if not o]
    assert off.count(GOLD_COLOR) > 2 * 70 and off.count(PRED_COLOR) > 2 * 70
    # many shapes at one corner: every tag inside the image, no two overlapping
    rects = place_tags([(10, 30, 60, 70)] * 12, (14, 14), (100, 100))
    for i, a in enumerate(rects):
        assert 0 <= a[0] and a[2] <= 100 and 0 <= a[1] and a[3] <= 100
        for b in rects[i + 1 :]:
            assert not (a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]), (a, b)


def test_each_drawing_has_a_numbered_legend(tmp_path):
    page = render_report(TUNED, BASE, _labelled_samples(tmp_path), worst_n=3)
    legends = re.findall(r'<ol class="legend">(.*?)</ol>', page, re.S)
    assert len(legends) == 6  # each drawing: the expected boxes at least
    # line 2 (tuned): the expected hole and title_block, then the moved hole and the flipped title_block
    items = [
        re.sub(r"<[^>]+>", "", li).split() for li in re.findall(r"<li>(.*?)</li>", legends[2])
    ]  # worst first: line 3, then line 2
    assert items == [["1", "hole", "expected"], ["2", "title_block", "expected"], ["3", "hole", "tuned"],
                     ["4", "title_block", "tuned,", "invalid", "(×)"]]  # fmt: skip
    assert '<span class="tag ref">' in page and '<span class="tag pred">' in page


def test_control_characters_and_tags_in_chromium(tmp_path):
    from tests.browser import assert_not_blank, pixels_near, screenshot

    page = tmp_path / "evaluate_readable.html"
    samples = [_control_sample(tmp_path), *_labelled_samples(tmp_path)]
    write_report(page, TUNED, BASE, samples, True, "PASS", iou_threshold=0.5, worst_n=2)
    img = screenshot(page, tmp_path / "evaluate_readable.png", (1250, 1600))
    assert pixels_near(img, (0xFE, 0xF7, 0xE0), 3) > 300  # the escapes' amber background
    assert_not_blank(img)


def test_label_metrics_give_register_both_models_per_label(tmp_path):
    """evaluate's Metrics metadata "labels": what register imports as one Model Registry slice per label."""
    from components.evaluate.core import EvalResult, label_metrics
    from components.register.evaluation import build_evaluation

    samples = _labelled_samples(tmp_path)
    result = EvalResult(reference={}, tuned={}, passed=True, reason="", predictions="", samples=samples)
    labels = label_metrics(result, "detection", 0.5, None)
    assert list(labels) == ["hole", "title_block"]
    assert labels["hole"]["tuned"]["tp"] == 1 and labels["hole"]["reference"]["tp"] == 0
    assert labels["title_block"]["tuned"]["fn"] == 2 and labels["title_block"]["reference"]["n_gold"] == 3
    assert label_metrics(result, "vqa_only", 0.5, None) == {}  # a task without labels
    built = build_evaluation({"tuned_f1": 0.5, "labels": labels}, "run-1", "gs://s/schema.yaml")
    assert [s["slice_"]["value"] for s in built.slices] == ["hole", "title_block"]
