"""Where a validated row came from: the user's file, line and image names, carried with the row.

validate-data writes each clean row with one extra top-level key, `ORIGIN_KEY`:

    {"messages": [...], "images": ["images/3f2a...png"],
     "vlm_lora_origin": {"file": "gs://bucket/drawings/train.jsonl", "line": 12, "images": ["img/d12.png"]}}

so evaluate's report and validate-data's quarantine can name the user's `file:line` and the
image as the user named it, not the clean set's `data.jsonl` with content-hashed image names.
A row that already carries an origin (a clean set validated again) keeps it: the origin is
always the first file the row was read from.

ms-swift 4.6 tolerates the key (checked in its source): `swift.dataset.load_dataset` keeps only
`RowPreprocessor.standard_keys` (`remove_unused_columns`, default true), and with that off an
unknown key only reaches `StdTemplateInputs.extra_kwargs`. train-lora still removes it
(`strip_origin`) before `swift sft` reads the rows, so no setting can feed it to the model.
"""

from __future__ import annotations

from typing import Any

ORIGIN_KEY = "vlm_lora_origin"
_MAX_NAME = 200  # characters of an image name shown (URLs can be long; base64 payloads are not names)


def image_name(ref: Any) -> str:
    """Returns how a report names an image reference: as written, a base64 image as a short note."""
    text = str(ref).strip()
    if text.startswith("data:"):
        return f"(inline {text[5 : text.find(';')] if ';' in text[:40] else 'data'} image, {len(text)} chars)"
    return text if len(text) <= _MAX_NAME else text[: _MAX_NAME - 1] + "…"


def make_origin(file: str, line: int, images: list[Any]) -> dict[str, Any]:
    """Returns the origin record of a row read from `file` at `line` with these image references."""
    return {"file": str(file), "line": int(line), "images": [image_name(ref) for ref in images]}


def origin_of(row: Any) -> dict[str, Any] | None:
    """Returns a row's origin record, or None when it has none (or a malformed one)."""
    origin = row.get(ORIGIN_KEY) if isinstance(row, dict) else None
    if not isinstance(origin, dict) or not isinstance(origin.get("file"), str):
        return None
    line = origin.get("line")
    if not isinstance(line, int) or isinstance(line, bool):
        return None
    images = origin.get("images")
    out = {
        "file": origin["file"],
        "line": line,
        "images": [str(i) for i in images] if isinstance(images, list) else [],
    }
    if isinstance(origin.get("record"), str):  # the source record's id (an imported or converted row)
        out["record"] = origin["record"]
    return out


def where(origin: dict[str, Any] | None) -> str:
    """Returns `file:line` of an origin record ("" for None)."""
    return f"{origin['file']}:{origin['line']}" if origin else ""


def strip_origin(row: dict[str, Any]) -> dict[str, Any]:
    """Returns the row without its origin key (what a trainer reads)."""
    return {k: v for k, v in row.items() if k != ORIGIN_KEY}
