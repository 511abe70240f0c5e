"""Tests of the task registry (components.common.tasks) and the tolerant detection parser."""

from __future__ import annotations

import pytest

from components.common import boxes
from components.common.answers import parse_findings
from components.common.tasks import PIXEL, TASKS, Geometry, Shape, get_task

# Answers as Qwen-VL models write them (Qwen3-VL / Qwen2.5-VL grounding cookbook form).
QWEN3_FENCED = '```json\n[\n\t{"bbox_2d": [12, 34, 567, 890], "label": "title block"}\n]\n```'
QWEN25_TWO = (
    '```json\n[\n\t{"bbox_2d": [135, 114, 1016, 672], "label": "hole"},\n'
    '\t{"bbox_2d": [10, 20, 30, 40], "label": "dimension"}\n]\n```'
)
UNFENCED = '[{"bbox_2d": [12, 34, 567, 890], "label": "title block"}]'
IN_PROSE = (
    "Boxes are given as [x1, y1, x2, y2]. Here they are:\n"
    '[{"bbox_2d": [12, 34, 567, 890], "label": "title block"}]\nHope this helps.'
)


@pytest.mark.parametrize("text", [QWEN3_FENCED, UNFENCED, IN_PROSE])
def test_parser_reads_real_qwen_answers(text):
    assert parse_findings(text) == ([{"label": "title block", "bbox": [12, 34, 567, 890]}], None)


def test_parser_reads_several_bbox_2d_findings_and_prefers_bbox():
    findings, error = parse_findings(QWEN25_TWO)
    assert error is None and [f["bbox"] for f in findings] == [[135, 114, 1016, 672], [10, 20, 30, 40]]
    both = '[{"label": "a", "bbox": [1, 2, 3, 4], "bbox_2d": [5, 6, 7, 8]}]'
    assert parse_findings(both) == ([{"label": "a", "bbox": [1, 2, 3, 4]}], None)
    findings, error = parse_findings('[{"label": "a", "bbox_2d": [1, 2, 3]}]')
    assert findings is None and "item 0" in error


def test_registry_names_and_metrics():
    assert set(TASKS) == {"", "json", "detection", "key_value"}
    assert get_task("detection").metrics[0] == "f1"
    with pytest.raises(ValueError, match="not one of"):
        get_task("segmentation")


def test_training_answers_need_the_fence():
    det = get_task("detection")
    assert det.check_answer(QWEN3_FENCED) == ""
    assert "fenced" in det.check_answer(UNFENCED)
    assert "invalid JSON" in get_task("json").check_answer("```json\n{oops\n```")
    assert get_task("").check_answer("anything") == ""


def test_norm1000_prediction_matches_pixel_gold_of_the_same_image():
    size = (640, 480)
    gold = '```json\n[{"label": "hole", "bbox": [64, 48, 320, 240]}]\n```'
    pred = '```json\n[{"bbox_2d": [100, 100, 500, 500], "label": "hole"}]\n```'
    score = get_task("detection").score(pred, gold, Geometry("pixel", size), 0.5, "auto", Geometry("norm1000", size))
    assert (score["tp"], score["fp"], score["fn"], score["exact_match"]) == (1, 0, 0, True)
    # read in pixels, the same numbers are far off
    assert get_task("detection").score(pred, gold, PIXEL)["tp"] == 0


def test_resized_pixel_boxes_are_scaled_back_to_the_original_image():
    size = (250, 130)  # not multiples of 28: smart resize gives 252 x 140
    assert boxes.smart_resize(130, 250) == (140, 252)
    geometry = Geometry("resized_pixel", size)
    assert geometry.to_pixels([252, 140, 252, 140]) == pytest.approx([250, 130, 250, 130])
    gold = '[{"label": "a", "bbox": [50, 26, 150, 104]}]'
    pred_box = boxes.from_pixels([50, 26, 150, 104], "resized_pixel", size)
    pred = f'[{{"label": "a", "bbox_2d": {pred_box}}}]'
    score = get_task("detection").score(pred, gold, Geometry("pixel", size), 0.9, "auto", geometry)
    assert score["tp"] == 1


def test_shapes_are_pixels_and_mark_invalid_boxes():
    text = '[{"label": "a", "bbox_2d": [100, 100, 500, 500]}, {"label": "b", "bbox": [600, 100, 200, 300]}]'
    shapes = get_task("detection").shapes(text, Geometry("norm1000", (200, 100)))
    assert shapes == [Shape("a", (20, 10, 100, 50), True), Shape("b", (120, 10, 40, 30), False)]
    assert get_task("detection").shapes("no answer", PIXEL) == []
    with pytest.raises(boxes.BoxError, match="image size"):
        Geometry("norm1000").to_pixels([1, 2, 3, 4])


def test_json_and_text_tasks_score_exact_match():
    json_task, text_task = get_task("json"), get_task("")
    assert json_task.score('```json\n{"a": 1}\n```', '{"a": 1}')["exact_match"] is True
    assert json_task.score("nope", '{"a": 1}')["json_valid"] is False
    assert text_task.score(" yes ", "yes")["exact_match"] is True
