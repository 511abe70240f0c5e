"""Validate ms-swift JSONL data line by line and write clean train/eval datasets.

Every input line ends up in exactly one place: the clean train set, the clean eval set,
or the quarantine (with file, line number, a stable code and a message). Nothing is
dropped silently: `clean + quarantined == input lines`, checked before returning.

A dataset written here is a folder:

    data.jsonl    one row per line, image paths relative to this folder
    images/       the rows' images, named by content hash (copied once)

so it is self-contained and readable by the training task wherever the folder is
(`/gcs/...` on Vertex, a local folder under kfp.local).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

ROLES = ("system", "user", "assistant", "tool")
IMAGE_TAG = "<image>"
MAX_LINE_BYTES = 8 * 1024 * 1024
MIN_IMAGE_SIDE = 28  # Qwen-VL resizes to multiples of 28/32 px; smaller images are errors
MAX_IMAGE_PIXELS = 8192 * 8192
IMAGE_MODES = ("RGB", "RGBA", "L", "LA", "P", "I;16", "I", "1", "CMYK", "YCbCr")

# Stable check codes, in the order checks run.
CODES = {
    "E_ENCODING": "line is not valid UTF-8",
    "E_TOO_LONG": f"line longer than {MAX_LINE_BYTES} bytes",
    "E_JSON": "line is not valid JSON",
    "E_SCHEMA": "row does not match {messages: [{role, content}], images: [...]}",
    "E_ROLE": "unknown role",
    "E_ORDER": "messages out of order (alternation / last message must be the assistant's)",
    "E_IMAGE_COUNT": "number of <image> tags differs from len(images)",
    "E_IMAGE_PATH": "image path escapes the dataset folder or uses an unsupported form",
    "E_IMAGE_MISSING": "image file not found",
    "E_IMAGE_UNREADABLE": "image cannot be opened",
    "E_IMAGE_SIZE": "image size or mode not usable",
    "E_DUPLICATE": "same row as an earlier line",
}


class DataError(ValueError):
    """The data cannot be validated at all, or fails the policy; the message says why."""


@dataclass
class Issue:
    """One rejected line."""

    file: str
    line: int
    code: str
    message: str
    raw: str = ""  # the rejected line (first 64 KiB), so nothing is lost

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.code}: {self.message}"


@dataclass
class ValidationResult:
    """What validation produced.

    Attributes:
        train_dir: Clean train dataset folder.
        eval_dir: Clean eval dataset folder.
        quarantine: JSONL of rejected lines (file, line, code, message, raw text).
        counts: n_lines, n_valid, n_invalid, n_train, n_eval, n_images, per-code counts.
        issues: The rejected lines, in input order.
    """

    train_dir: str
    eval_dir: str
    quarantine: str
    counts: dict[str, int]
    issues: list[Issue] = field(default_factory=list)

    def summary(self, max_issues: int = 10) -> str:
        """Returns a human-readable summary: counts per check and the first errors."""
        c = self.counts
        lines = [
            f"{c['n_lines']} lines: {c['n_valid']} valid ({c['n_train']} train, {c['n_eval']} eval), "
            f"{c['n_invalid']} quarantined; {c['n_images']} images"
        ]
        for code in CODES:
            if c.get(code):
                lines.append(f"  {code}: {c[code]}  ({CODES[code]})")
        for issue in self.issues[:max_issues]:
            lines.append(f"  {issue}")
        if len(self.issues) > max_issues:
            lines.append(f"  ... and {len(self.issues) - max_issues} more in {self.quarantine}")
        return "\n".join(lines)


class _Reject(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def _check_messages(row: Any) -> list[dict[str, Any]]:
    if not isinstance(row, dict):
        raise _Reject("E_SCHEMA", f"row must be a JSON object, got {type(row).__name__}")
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _Reject("E_SCHEMA", "field 'messages' must be a non-empty list")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str) or not isinstance(msg.get("content"), str):
            raise _Reject("E_SCHEMA", f"messages[{i}] must be an object with string 'role' and 'content'")
        if msg["role"] not in ROLES:
            raise _Reject("E_ROLE", f"messages[{i}].role {msg['role']!r} is not one of {', '.join(ROLES)}")
    roles = [m["role"] for m in messages]
    if roles[-1] != "assistant":
        raise _Reject("E_ORDER", f"last message must be from 'assistant', got {roles[-1]!r}")
    body = roles[1:] if roles[0] == "system" else roles
    if "system" in body:
        raise _Reject("E_ORDER", "a 'system' message may only come first")
    for prev, cur in zip(body, body[1:]):
        if prev == cur and prev != "tool":
            raise _Reject("E_ORDER", f"two '{cur}' messages in a row; user and assistant must alternate")
    if body[0] not in ("user", "tool"):
        raise _Reject("E_ORDER", f"the first non-system message must be from 'user', got {body[0]!r}")
    images = row.get("images", [])
    if not isinstance(images, list) or not all(isinstance(p, str) for p in images):
        raise _Reject("E_SCHEMA", "field 'images' must be a list of strings")
    n_tags = sum(m["content"].count(IMAGE_TAG) for m in messages)
    if n_tags != len(images):
        raise _Reject("E_IMAGE_COUNT", f"{n_tags} {IMAGE_TAG} tag(s) in messages but {len(images)} image(s)")
    return messages


def _resolve_image(ref: str, base: Path) -> Path:
    """Resolves an image reference to a local file inside the dataset folder tree."""
    if "://" in ref or ref.startswith("data:"):
        raise _Reject("E_IMAGE_PATH", f"image {ref!r}: URLs, gs:// and base64 images are not supported yet")
    path = Path(ref)
    if path.is_absolute():
        return path
    resolved = (base / path).resolve()
    if not resolved.is_relative_to(base.resolve()):
        raise _Reject("E_IMAGE_PATH", f"image {ref!r} escapes the dataset folder {base}")
    return resolved


def _check_image(path: Path, ref: str) -> tuple[int, int]:
    if not path.is_file():
        raise _Reject("E_IMAGE_MISSING", f"image {ref!r} not found (looked at {path})")
    try:
        with Image.open(path) as img:
            width, height = img.size
            mode = img.mode
            img.verify()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise _Reject("E_IMAGE_UNREADABLE", f"image {ref!r} cannot be opened: {exc}") from None
    if min(width, height) < MIN_IMAGE_SIDE or width * height > MAX_IMAGE_PIXELS:
        raise _Reject(
            "E_IMAGE_SIZE",
            f"image {ref!r} is {width}x{height}; sides must be >= {MIN_IMAGE_SIDE} px and area <= {MAX_IMAGE_PIXELS} px",
        )
    if mode not in IMAGE_MODES:
        raise _Reject("E_IMAGE_SIZE", f"image {ref!r} has mode {mode!r}, not one of {', '.join(IMAGE_MODES)}")
    return width, height


def _read_lines(path: Path):
    """Yields (line_number, raw_bytes) of a JSONL file, tolerating a BOM and CRLF."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            yield number, raw.rstrip(b"\r\n")


def _validate_file(path: Path, seen: dict[str, str], issues: list[Issue]) -> list[tuple[dict[str, Any], list[Path], str]]:
    """Returns the valid rows of one file as (row, image paths, row key); records issues."""
    if not path.is_file():
        raise DataError(f"{path}: data file not found")
    base = path.parent
    rows = []
    n_lines = 0
    for number, raw in _read_lines(path):
        if not raw.strip():
            continue  # blank lines are not rows
        n_lines += 1
        try:
            if len(raw) > MAX_LINE_BYTES:
                raise _Reject("E_TOO_LONG", f"line has {len(raw)} bytes (limit {MAX_LINE_BYTES})")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _Reject("E_ENCODING", f"not UTF-8 at byte {exc.start}") from None
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                raise _Reject("E_JSON", f"{exc.msg} at column {exc.colno}") from None
            _check_messages(row)
            image_paths = []
            for ref in row.get("images", []):
                image_path = _resolve_image(ref, base)
                _check_image(image_path, ref)
                image_paths.append(image_path)
            key = hashlib.sha256(
                json.dumps(
                    [row["messages"], [sha_of_file(p) for p in image_paths]], sort_keys=True, ensure_ascii=False
                ).encode()
            ).hexdigest()
            if key in seen:
                raise _Reject("E_DUPLICATE", f"same messages and images as {seen[key]}")
            seen[key] = f"{path}:{number}"
            rows.append((row, image_paths, key))
        except _Reject as rej:
            text = raw[:65536].decode("utf-8", errors="replace")
            issues.append(Issue(str(path), number, rej.code, rej.message, text))
    if n_lines == 0:
        raise DataError(f"{path}: file is empty (no JSONL rows)")
    return rows


_SHA_CACHE: dict[tuple[Path, int, int], str] = {}


def sha_of_file(path: Path) -> str:
    """Returns the sha256 of a file's bytes (cached per path, size and mtime within a process)."""
    st = path.stat()
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _SHA_CACHE:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        _SHA_CACHE[key] = digest.hexdigest()
    return _SHA_CACHE[key]


def _write_dataset(rows: list[tuple[dict[str, Any], list[Path], str]], out_dir: Path) -> int:
    """Writes rows + their images into a self-contained dataset folder; returns image count."""
    image_dir = out_dir / "images"
    image_dir.mkdir(parents=True, exist_ok=True)
    written = set()
    with open(out_dir / "data.jsonl", "w", encoding="utf-8") as f:
        for row, image_paths, _ in rows:
            refs = []
            for src in image_paths:
                name = sha_of_file(src)[:20] + src.suffix.lower()
                dst = image_dir / name
                if name not in written:
                    # a copy, not a link: a validated dataset must not change with its source
                    shutil.copyfile(src, dst)
                    written.add(name)
                refs.append(f"images/{name}")
            out = dict(row)
            if refs or "images" in row:
                out["images"] = refs
            f.write(json.dumps(out, ensure_ascii=False) + "\n")
    return len(written)


def split_key(row_key: str, salt: str) -> float:
    """Returns a row's deterministic position in [0, 1) for the hash split."""
    digest = hashlib.sha256(f"{salt}\0{row_key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def validate_data(
    train_files: list[str],
    train_out: str,
    eval_out: str,
    quarantine_out: str,
    eval_files: list[str] | None = None,
    eval_fraction: float = 0.1,
    max_invalid_fraction: float = 0.0,
    split_seed: str = "split-v1",
) -> ValidationResult:
    """Validates JSONL files and writes clean train/eval datasets and a quarantine.

    Args:
        train_files: ms-swift JSONL files with training rows.
        train_out: Folder for the clean training set (data.jsonl + images/).
        eval_out: Folder for the clean held-out set (data.jsonl + images/).
        quarantine_out: JSONL file for the rejected lines.
        eval_files: Held-out JSONL files; None or [] = hash-split `eval_fraction` of train.
            Default None.
        eval_fraction: Held-out fraction for the hash split, 0 < f < 1. Default 0.1. When
            the split leaves the eval set empty and there are >= 2 rows, the row with the
            lowest split key goes to eval, so there is always something to evaluate on.
        max_invalid_fraction: Largest tolerated fraction of invalid lines. Default 0.0.
        split_seed: Salt of the split hash. Default "split-v1".

    Returns:
        The ValidationResult.

    Raises:
        DataError: A file is missing or empty, fewer than one valid train row, or the
            invalid fraction exceeds `max_invalid_fraction` (message holds the summary).
    """
    issues: list[Issue] = []
    seen: dict[str, str] = {}
    train_rows = [r for f in train_files for r in _validate_file(Path(f), seen, issues)]
    if eval_files:
        eval_rows = [r for f in eval_files for r in _validate_file(Path(f), seen, issues)]
    else:
        positions = {r[2]: split_key(r[2], split_seed) for r in train_rows}
        eval_keys = {k for k, pos in positions.items() if pos < eval_fraction}
        if not eval_keys and len(train_rows) >= 2:
            eval_keys = {min(positions, key=positions.get)}
        eval_rows = [r for r in train_rows if r[2] in eval_keys]
        train_rows = [r for r in train_rows if r[2] not in eval_keys]

    quarantine = Path(quarantine_out)
    quarantine.parent.mkdir(parents=True, exist_ok=True)
    with open(quarantine, "w", encoding="utf-8") as f:
        for issue in issues:
            f.write(json.dumps(issue.__dict__, ensure_ascii=False) + "\n")
    n_images = _write_dataset(train_rows, Path(train_out)) + _write_dataset(eval_rows, Path(eval_out))
    n_valid = len(train_rows) + len(eval_rows)
    counts: dict[str, int] = {
        "n_lines": n_valid + len(issues),
        "n_valid": n_valid,
        "n_invalid": len(issues),
        "n_train": len(train_rows),
        "n_eval": len(eval_rows),
        "n_images": n_images,
    }
    for issue in issues:
        counts[issue.code] = counts.get(issue.code, 0) + 1
    result = ValidationResult(train_out, eval_out, str(quarantine), counts, issues)
    invalid_fraction = len(issues) / counts["n_lines"]
    if invalid_fraction > max_invalid_fraction:
        raise DataError(
            f"{len(issues)} of {counts['n_lines']} lines invalid ({invalid_fraction:.1%} > "
            f"max_invalid_fraction {max_invalid_fraction:.1%}); fix them or raise data.max_invalid_fraction\n"
            + result.summary()
        )
    if not train_rows:
        raise DataError("no valid training rows left\n" + result.summary())
    if not eval_rows:
        raise DataError("no valid eval rows: pass an eval file or more training rows\n" + result.summary())
    return result

