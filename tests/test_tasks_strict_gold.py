"""Gold answers are parsed strictly (`tasks.check_gold`); the tolerant parsers stay for model output (issue #41)."""

from __future__ import annotations

import pytest

from components.common.tasks import GOLD_CODES, check_gold, get_task, parse_findings, parse_key_value

BAD_GOLD = {  # (task, answer): code
    ("key_value", '```json\n{"invoice": "A-1", "total": "1.00"}'): "E_GOLD_FENCE",
    ("key_value", '```json\n{"total": "1.00", "total": "999.00"}\n```'): "E_GOLD_DUPLICATE_KEY",
    ("key_value", '```json\n{"total": "1.00", "Total": "999.00"}\n```'): "E_GOLD_KEY_COLLISION",
    ("key_value", '```json\n{"invoice number": "A-1", "invoice  number ": "B-2"}\n```'): "E_GOLD_KEY_COLLISION",
    ("key_value", '```json\n{"": "1.00", "total": "2.00"}\n```'): "E_GOLD_EMPTY_KEY",
    ("key_value", '```json\n{"  ": "1.00"}\n```'): "E_GOLD_EMPTY_KEY",
    ("detection", '```json\n[{"label": "hole", "bbox": [1, 2, 30, 40], "bbox_2d": [5, 6, 70, 80]}]\n```'): (
        "E_GOLD_MIXED_BOX_KEYS"
    ),
    ("detection", '```json\n[{"label": "hole", "bbox": [1, 2, 30, 40], "label": "rivet"}]\n```'): (
        "E_GOLD_DUPLICATE_KEY"
    ),
    ("detection", '```json\n[{"label": "hole", "bbox": [1, 2, 30, 40]}]'): "E_GOLD_FENCE",
    ("json", '```json\n{"a": {"b": 1, "b": 2}}\n```'): "E_GOLD_DUPLICATE_KEY",
}


@pytest.mark.parametrize(("task", "answer"), list(BAD_GOLD))
def test_bad_gold_is_refused_with_its_code(task, answer):
    problem = check_gold(task, answer)
    assert problem is not None and problem.code == BAD_GOLD[(task, answer)]
    assert problem.code in GOLD_CODES
    assert ":" in problem.message  # what is wrong, then the fix


@pytest.mark.parametrize(("task", "answer"), list(BAD_GOLD))
def test_the_tolerant_parse_still_reads_them(task, answer):
    """Model output keeps its tolerance: each of these parses (one reading chosen silently), which is why gold may not."""
    assert get_task(task).parse(answer)[1] is None


def test_messages_name_the_keys_and_the_fix():
    assert "'total' appears twice" in check_gold("key_value", '```json\n{"total": "1", "total": "2"}\n```').message
    collision = check_gold("key_value", '```json\n{"total": "1", "Total ": "2"}\n```').message
    assert "'total' and 'Total '" in collision and "merge them" in collision
    mixed = check_gold("detection", '```json\n[{"label": "a", "bbox": [1, 2, 3, 4], "bbox_2d": [1, 2, 3, 5]}]\n```')
    assert "finding 0" in mixed.message and "[1, 2, 3, 5]" in mixed.message and "keep one key" in mixed.message
    assert "add ```" in check_gold("json", '```json\n{"a": 1}').message


GOOD_GOLD = [
    ("key_value", '```json\n{"invoice": "A-1", "total": 12.5}\n```'),
    ("key_value", 'Here it is:\n```json\n{"invoice": "A-1"}\n```\nDone.'),
    ("detection", '```json\n[{"label": "hole", "bbox": [1, 2, 30, 40]}]\n```'),
    ("detection", '```json\n[{"label": "hole", "bbox_2d": [1, 2, 30, 40]}]\n```'),
    ("detection", '```json\n[{"label": "hole", "bbox": [1, 2, 30, 40], "bbox_2d": [1, 2, 30, 40]}]\n```'),
    ("detection", '```json\n[{"label": "a", "bbox": [1, 2, 3, 4]}, {"label": "a", "bbox": [1, 2, 3, 4]}]\n```'),
    ("json", '```json\n[{"a": 1}, {"a": 2}]\n```'),
    ("", "free text with ```json\n{unclosed"),
    ("key_value", "no fence at all: left to the task's own check"),
]


@pytest.mark.parametrize(("task", "answer"), GOOD_GOLD)
def test_good_gold_passes(task, answer):
    assert check_gold(task, answer) is None


def test_scoring_would_keep_one_of_two_values():
    """What the strict parse prevents: the tolerant readers pick one value without a word."""
    assert parse_key_value('```json\n{"total": "1.00", "total": "999.00"}\n```')[0] == {"total": "999.00"}
    findings, _ = parse_findings('```json\n[{"label": "a", "bbox": [1, 2, 3, 4], "bbox_2d": [5, 6, 7, 8]}]\n```')
    assert findings == [{"label": "a", "bbox": [1, 2, 3, 4]}]
