"""The shape checks of one parsed row: its messages, ms-swift's grounding `objects`, a task's answers."""

from __future__ import annotations

from typing import Any

from components.common.tasks import check_gold, get_task
from components.validate_data._sources import Reject

ROLES = ("system", "user", "assistant", "tool")
IMAGE_TAG = "<image>"


def check_messages(row: Any) -> list[dict[str, Any]]:
    if not isinstance(row, dict):
        raise Reject("E_SCHEMA", f"row must be a JSON object, got {type(row).__name__}")
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Reject("E_SCHEMA", "field 'messages' must be a non-empty list")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str) or not isinstance(msg.get("content"), str):
            raise Reject("E_SCHEMA", f"messages[{i}] must be an object with string 'role' and 'content'")
        if msg["role"] not in ROLES:
            raise Reject("E_ROLE", f"messages[{i}].role {msg['role']!r} is not one of {', '.join(ROLES)}")
    roles = [m["role"] for m in messages]
    if roles[-1] != "assistant":
        raise Reject("E_ORDER", f"last message must be from 'assistant', got {roles[-1]!r}")
    body = roles[1:] if roles[0] == "system" else roles
    if "system" in body:
        raise Reject("E_ORDER", "a 'system' message may only come first")
    for prev, cur in zip(body, body[1:]):
        if prev == cur and prev != "tool":
            raise Reject("E_ORDER", f"two '{cur}' messages in a row; user and assistant must alternate")
    if body[0] not in ("user", "tool"):
        raise Reject("E_ORDER", f"the first non-system message must be from 'user', got {body[0]!r}")
    images = row.get("images", [])
    if not isinstance(images, list) or not all(isinstance(p, str) for p in images):
        raise Reject("E_SCHEMA", "field 'images' must be a list of strings")
    n_tags = sum(m["content"].count(IMAGE_TAG) for m in messages)
    if n_tags != len(images):
        raise Reject("E_IMAGE_COUNT", f"{n_tags} {IMAGE_TAG} tag(s) in messages but {len(images)} image(s)")
    return messages


GROUNDING_TAGS = ("<ref-object>", "<bbox>")
BBOX_TYPES = ("real", "norm1")


def check_objects(row: dict[str, Any]) -> None:
    """Checks ms-swift's grounding form: `objects` = {"ref": [str], "bbox": [[x1, y1, x2, y2] | [x, y]],
    "bbox_type": "real" (pixels, default) | "norm1" ([0, 1]), "image_id": [int]}, one `<ref-object>` per ref and
    one `<bbox>` per box in the messages (ms-swift fills them in order and leaves extra tags as text).

    Box ranges against the image are checked later (`_row_checks.check_object_boxes`), once the image size is known.
    """
    objects = row["objects"]
    if not isinstance(objects, dict):
        raise Reject("E_SCHEMA", "field 'objects' must be an object {ref, bbox, bbox_type, image_id}")
    refs, boxes_ = objects.get("ref", []), objects.get("bbox")
    if not isinstance(refs, list) or not all(isinstance(r, str) and r.strip() for r in refs):
        raise Reject("E_SCHEMA", "objects.ref must be a list of non-empty strings")
    if not isinstance(boxes_, list) or not boxes_:
        raise Reject("E_SCHEMA", "objects.bbox must be a non-empty list of boxes [x1, y1, x2, y2] (or points [x, y])")
    if objects.get("bbox_type", "real") not in BBOX_TYPES:
        raise Reject("E_SCHEMA", f"objects.bbox_type must be one of {', '.join(BBOX_TYPES)}")
    ids = objects.get("image_id", [])
    n_images = len(row.get("images") or [])
    if not isinstance(ids, list) or not all(isinstance(i, int) and 0 <= i < max(n_images, 1) for i in ids):
        raise Reject("E_SCHEMA", f"objects.image_id must be a list of image indexes below {n_images}")
    text = "".join(m["content"] for m in row["messages"])
    for tag, items, key in (("<ref-object>", refs, "ref"), ("<bbox>", boxes_, "bbox")):
        if text.count(tag) != len(items):
            raise Reject(
                "E_SCHEMA",
                f"{text.count(tag)} {tag} tag(s) in the messages but {len(items)} objects.{key}; "
                "ms-swift fills one tag per item, in order",
            )


def check_answer(messages: list[dict[str, Any]], task: str) -> None:
    """Checks that every assistant answer is gold parsed strictly (`check_gold`: E_GOLD_*) and has the task's
    shape (E_ANSWER); see `components.common.tasks`."""
    check = get_task(task).check_answer
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        if problem := check_gold(task, msg["content"]):
            raise Reject(problem.code, f"messages[{i}].content (assistant, the gold answer): {problem.message}")
        if reason := check(msg["content"]):
            raise Reject("E_ANSWER", f"messages[{i}] (assistant): {reason}")
