"""The strict check of gold answers (`check_gold`): what the tolerant parsers would read silently."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from components.common import bounded_json
from components.common.answers import FENCE_RE
from components.common.tasks._key_value import normalize_value

GOLD_CODES: dict[str, str] = {
    "E_GOLD_FENCE": "a gold answer's ```json block has no closing ``` fence",
    "E_GOLD_BLOCKS": "a gold answer has more than one ```json block (scoring reads the first, training teaches all)",
    "E_GOLD_DUPLICATE_KEY": "a gold answer's JSON object has the same key twice (scoring would keep one)",
    "E_GOLD_KEY_COLLISION": "two key_value gold fields are one field once compared (case, spaces)",
    "E_GOLD_EMPTY_KEY": "a key_value gold field name is empty",
    "E_GOLD_MIXED_BOX_KEYS": 'a detection gold finding has both "bbox" and a different "bbox_2d"',
}
"""The codes of `check_gold`: what the tolerant parsers would read silently in a gold answer."""


@dataclass(frozen=True)
class GoldProblem:
    """Why a gold answer is refused: a `GOLD_CODES` code and a message naming the field and the fix."""

    code: str
    message: str


class _RepeatedKey(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads' object_pairs_hook: raises _RepeatedKey at the first key an object holds twice."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _RepeatedKey(key)
        seen.add(key)
    return dict(pairs)


def _gold_json(text: str) -> tuple[Any, GoldProblem | None]:
    """Returns the JSON of a gold answer's first ```json block, strictly: (value, None), (None, problem), or
    (None, None) when there is no such block or it is not JSON (the task's own check says so)."""
    blocks = [m for m in FENCE_RE.finditer(text) if m.group(1).strip().lower() == "json"]
    if not blocks:
        return None, None
    block = blocks[0]
    if not block.group(0).endswith("```"):
        return None, GoldProblem(
            "E_GOLD_FENCE", "the ```json block has no closing ``` fence (the answer runs to its end): add ``` after "
            "the JSON, as the model must learn to write it",
        )  # fmt: skip
    if len(blocks) > 1:
        return None, GoldProblem(
            "E_GOLD_BLOCKS", f"the answer has {len(blocks)} ```json blocks; scoring reads the first and training "
            "teaches the model to write all of them: keep the one answer block",
        )  # fmt: skip
    try:
        return bounded_json.loads(block.group(2), object_pairs_hook=_no_repeats), None
    except _RepeatedKey as exc:
        return None, GoldProblem(
            "E_GOLD_DUPLICATE_KEY", f"key {exc.key!r} appears twice in one object; a JSON reader keeps only the "
            "last value: keep the right one and remove the other",
        )  # fmt: skip
    except (ValueError, RecursionError):
        return None, None


def _key_value_problem(data: Any) -> GoldProblem | None:
    """Returns the first empty or colliding field of a key_value gold object (None when fine)."""
    if not isinstance(data, dict):
        return None
    first: dict[str, str] = {}
    for key in data:
        if not key.strip():
            return GoldProblem("E_GOLD_EMPTY_KEY", f"field {key!r} has an empty name: name the field or remove it")
        norm = normalize_value(key)
        if norm in first:
            return GoldProblem(
                "E_GOLD_KEY_COLLISION", f"fields {first[norm]!r} and {key!r} differ only in case or spaces, so "
                "scoring reads them as one field and keeps one value: merge them into one field",
            )  # fmt: skip
        first[norm] = key
    return None


def _mixed_box_problem(data: Any) -> GoldProblem | None:
    """Returns the first detection gold finding with both box keys holding different boxes (None when fine)."""
    for k, item in enumerate(data if isinstance(data, list) else []):
        if isinstance(item, dict) and "bbox" in item and "bbox_2d" in item and item["bbox"] != item["bbox_2d"]:
            return GoldProblem(
                "E_GOLD_MIXED_BOX_KEYS", f"finding {k} has \"bbox\": {json.dumps(item['bbox'])} and a different "
                f"\"bbox_2d\": {json.dumps(item['bbox_2d'])}; scoring would use \"bbox\" silently: keep one key",
            )  # fmt: skip
    return None


def check_gold(task: str, text: str) -> GoldProblem | None:
    """Checks a gold (training or held-out) answer strictly, beyond the task's shape (`Task.check_answer`).

    The tolerant parsers (`parse_findings`, `parse_key_value`) stay for model output; a gold
    answer must not need their tolerance, since scoring would then keep one of two readings
    without saying so. For the json, detection and key_value tasks, in this order:
    E_GOLD_FENCE (the ```json block is not closed), E_GOLD_BLOCKS (more than one ```json block),
    E_GOLD_DUPLICATE_KEY (an object of its
    JSON, at any depth, has a key twice); key_value: E_GOLD_EMPTY_KEY (a field name of only
    spaces), E_GOLD_KEY_COLLISION (two fields equal after `normalize_value`); detection:
    E_GOLD_MIXED_BOX_KEYS (a finding with "bbox" and a different "bbox_2d"). An answer with
    no ```json block, or one that is not JSON, is left to `Task.check_answer`.

    Args:
        task: A name in `TASKS`.
        text: The gold answer.

    Returns:
        The first GoldProblem, or None when the answer passes (always None for the free-text task).
    """
    if task not in ("json", "detection", "key_value") or not isinstance(text, str):
        return None
    data, problem = _gold_json(text)
    if problem is not None or data is None:
        return problem
    if task == "key_value":
        return _key_value_problem(data)
    return _mixed_box_problem(data) if task == "detection" else None
