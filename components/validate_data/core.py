"""Validate ms-swift JSONL data line by line and write clean train/eval datasets.

Every non-blank input line ends up in exactly one place: the clean train set, the clean
eval set, or the quarantine (with file, line number, a stable code and a message).
Nothing is dropped silently: `train + eval + quarantined == non-blank lines read`, counted
from every source as it is read and checked before anything is written (a violation is a
bug here and raises LineAccountingError). A blank line (only ASCII whitespace after the
end-of-line and a leading BOM are removed; for a line over MAX_LINE_BYTES, its first
64 KiB) is not a row: it is neither kept nor quarantined, and is not counted in
`n_lines`, but it still counts for the line numbers.

A dataset written here is a folder:

    data.jsonl    one row per line, image paths relative to this folder
    token_stats.json  the rows' token counts (max, p95, mean; `components.common.dataset`)
    images/       the rows' images, named by content hash (copied once)
    complete.json the completion marker, written last: every file's size and sha256
                  (`components.common.manifest`; readers check it)

written into a staging folder beside its final path and renamed into place at the end, so
it is whole or absent (an interrupted run leaves the previous folder), and self-contained:
readable by the training task wherever the folder is (`/gcs/...` on Vertex, a local folder
under kfp.local). Images given as http(s) URLs,
gs:// URIs or base64 are fetched once and copied in like local ones.

How it runs: the output paths are checked first (none may be, or hold, an input file or
an image a row uses: re-validating a clean set into its own folder is refused before
anything is written). Each file is parsed line by line (text checks; a JSON object with
the same key twice is quarantined, never last-wins), then every distinct image is
inspected once, in a thread pool: its bytes hashed, its header read (PIL's `Image.open`
+ `verify()`: size, mode, chunk checksums), and, only when its size passes, its pixels
decoded once per distinct content (a truncated or corrupt file is E_IMAGE_UNREADABLE
here, not a crash in training). JPEGs decode at 1/8 scale (`Image.draft`: every byte is
still read and entropy-decoded), and the pixels of all decodes in flight together stay
under DECODE_BUDGET_BYTES. 16-bit grayscale images (modes I;16*, I) are converted, not
rejected: the clean dataset holds an 8-bit grayscale PNG of their top 8 bits (what
ms-swift's `convert("RGB")` would otherwise clip to white). An image with an EXIF orientation
other than 1 (a phone photo stored sideways, tagged to be shown rotated) is made upright: the
clean dataset holds a PNG of its pixels rotated / mirrored as the tag says, with no EXIF, so
ms-swift (which ignores the tag) trains on, and evaluate scores, the view the boxes were drawn
on; sizes and boxes are checked against the upright size, and `counts["n_exif_rotated"]`
counts these images. Token counts are what ms-swift
encodes: the text through the model's tokenizer, the images at the size ms-swift resizes them
to (`max_pixels`, then smart resize; see `_tokens.py`). An HTML report (`_report.py`) shows the
counts, distributions and the first errors with thumbnails.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import shutil
import tempfile
import threading
import warnings
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image, UnidentifiedImageError

from components.common import bounded_json, data_policy, manifest
from components.common import snapshot as snap
from components.common.answers import is_finite_number, parse_findings
from components.common.boxes import BoxError, ResizeRule, box_problem, convention_for_model, resolve_convention
from components.common.dataset import token_stats, write_token_stats
from components.common.files import copy_nofollow, open_nofollow, sha256_file
from components.common.progress import Progress
from components.common.provenance import ORIGIN_KEY, make_origin, origin_of, strip_origin, where
from components.common.tasks import GOLD_CODES, TASK_NAMES, check_gold, get_task
from components.validate_data import _formats, _leakage, _rows, _sources
from components.validate_data._leakage import Leak as _Leak
from components.validate_data._sources import Reject as _Reject
from components.validate_data._tokens import MAX_ASPECT_RATIO, TokenCounter

if TYPE_CHECKING:  # imported in `_decode`: numpy and imagehash stay out of `vlm-lora validate --help`
    from components.validate_data import _looks

ROLES = ("system", "user", "assistant", "tool")
IMAGE_TAG = "<image>"
MAX_LINE_BYTES = 8 * 1024 * 1024
MIN_IMAGE_SIDE = 28  # Qwen-VL resizes to multiples of 28/32 px; smaller images are errors
MAX_IMAGE_PIXELS = 8192 * 8192
# 16-bit grayscale (mode "I" too: older Pillow opens 16-bit PNGs so; read as 0..65535) goes
# into the clean set as an 8-bit "L" PNG of the top 8 bits
SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")
IMAGE_MODES = ("RGB", "RGBA", "L", "LA", "P", "1", "CMYK", "YCbCr", *SIXTEEN_BIT_MODES)
DECODE_BUDGET_BYTES = 1 << 30  # pixels of the image decodes in flight at once (one larger image runs alone)

# Stable check codes, in the order checks run.
CODES = {
    "E_ENCODING": "line is not valid UTF-8",
    "E_TOO_LONG": f"line longer than {MAX_LINE_BYTES} bytes",
    "E_JSON": "line is not valid JSON",
    "E_DUPLICATE_KEY": "a JSON object has the same key twice (a JSON reader keeps only the last)",
    _formats.CODE: _formats.DESCRIPTION,
    "E_SCHEMA": "row does not match {messages: [{role, content}], images: [...]}",
    "E_RESERVED_KEY": f"row carries {ORIGIN_KEY!r}, the origin record validate-data writes into clean sets only "
    "(a raw row may not say where it came from)",
    "E_MEDIA_KEY": "row has 'videos' or 'audios', which ms-swift reads but validate-data does not check yet",
    "E_ROLE": "unknown role",
    "E_ORDER": "messages out of order (alternation / last message must be the assistant's)",
    "E_IMAGE_COUNT": "number of <image> tags differs from len(images)",
    "E_ANSWER": "assistant answer is not fenced JSON of the task's shape (only with task=...)",
    **GOLD_CODES,  # the strict parse of gold answers (components.common.tasks.check_gold; only with task=...)
    "E_IMAGE_PATH": "image path escapes the dataset folder or uses an unsupported form",
    "E_IMAGE_FETCH": "image URL / gs:// object could not be downloaded (timeout, HTTP or storage error)",
    "E_IMAGE_MISSING": "image file not found",
    "E_IMAGE_UNREADABLE": "image cannot be opened or decoded (corrupt or truncated file)",
    "E_IMAGE_SIZE": "image size, aspect ratio or mode not usable",
    "E_BOX": "a detection box is not 4 numbers with x1 < x2, y1 < y2 inside the image / the convention's range "
    "(only with task=detection)",
    "E_TOKENS": "token count (as ms-swift encodes the row, images resized by max_pixels) exceeds max_length "
    "(only with max_length > 0)",
    "E_DUPLICATE": "same row as an earlier line",
    "E_LEAK": "eval row shares an image (bytes, decoded pixels or a near-duplicate) or its prompt (case and spaces "
    "aside) with a train row (data.leakage: quarantine)",
}
TASKS = TASK_NAMES  # answer checks (components.common.tasks): none, fenced JSON, detection, key_value


class DataError(ValueError):
    """The data cannot be validated at all, or fails the policy; the message says why."""


class LineAccountingError(RuntimeError):
    """Train + eval + quarantined rows differ from the rows read: a bug in validate-data, not in the data."""


@dataclass
class Issue:
    """One rejected line."""

    file: str
    line: int
    code: str
    message: str
    raw: str = ""  # the rejected line (first 64 KiB), so nothing is lost
    origin: str = ""  # the user's `file:line` when the row carries its origin (a clean set validated again)
    origin_images: list[str] = field(default_factory=list)  # its images as the user named them

    def __str__(self) -> str:
        also = f" (originally {self.origin})" if self.origin else ""
        return f"{self.file}:{self.line}{also}: {self.code}: {self.message}"


@dataclass
class ValidationResult:
    """What validation produced.

    Attributes:
        train_dir: Clean train dataset folder.
        eval_dir: Clean eval dataset folder.
        quarantine: JSONL of rejected lines (file, line, code, message, raw text).
        counts: n_lines (non-blank lines read = n_valid + n_invalid), n_valid, n_invalid,
            n_train, n_eval, n_images, per-code counts.
        issues: The rejected lines, in input order.
        stats: token_counts (per valid row), token_source ("approx" or the tokenizer),
            max_length, max_pixels (ms-swift's `max_pixels` the image tokens were counted
            with; 0 = none), image_sizes ((width, height) per distinct valid image).
        report: The HTML report file ("" when none was asked for).
    """

    train_dir: str
    eval_dir: str
    quarantine: str
    counts: dict[str, int]
    issues: list[Issue] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    report: str = ""

    def summary(self, max_issues: int = 10) -> str:
        """Returns a human-readable summary: counts per check and the first errors."""
        c = self.counts
        lines = [
            f"{c['n_lines']} lines: {c['n_valid']} valid ({c['n_train']} train, {c['n_eval']} eval), "
            f"{c['n_invalid']} quarantined; {c['n_images']} images"
        ]
        tokens = sorted(self.stats.get("token_counts", []))
        if tokens:
            limit = self.stats.get("max_length") or "none"
            pixels = self.stats.get("max_pixels") or "none"
            lines.append(
                f"tokens per valid row ({self.stats.get('token_source', 'approx')}): "
                f"median {tokens[len(tokens) // 2]}, "
                f"p95 {tokens[min(len(tokens) - 1, int(len(tokens) * 0.95))]}, max {tokens[-1]} "
                f"(max_length {limit}, max_pixels {pixels})"
            )
        forms = [f"{c[f'n_form_{form}']} {form}" for form in _formats.FORMS if c.get(f"n_form_{form}")]
        if forms:
            lines.append(f"rows read by form (the conversion step): {', '.join(forms)}")
        for code in CODES:
            if c.get(code):
                lines.append(f"  {code}: {c[code]}  ({CODES[code]})")
        if c.get("n_exif_rotated"):
            lines.append(f"  {c['n_exif_rotated']} image(s) with an EXIF orientation written upright (tag applied)")
        if c.get("n_leaked"):
            lines.append(
                f"  {c['n_leaked']} eval row(s) share an image or a prompt with train rows "
                f"(data.leakage {self.stats.get('leakage', 'quarantine')}; the report lists them)"
            )
        for issue in self.issues[:max_issues]:
            lines.append(f"  {issue}")
        if len(self.issues) > max_issues:
            lines.append(f"  ... and {len(self.issues) - max_issues} more in {self.quarantine}")
        return "\n".join(lines)


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


GROUNDING_TAGS = ("<ref-object>", "<bbox>")
BBOX_TYPES = ("real", "norm1")


def _check_objects(row: dict[str, Any]) -> None:
    """Checks ms-swift's grounding form: `objects` = {"ref": [str], "bbox": [[x1, y1, x2, y2] | [x, y]],
    "bbox_type": "real" (pixels, default) | "norm1" ([0, 1]), "image_id": [int]}, one `<ref-object>` per ref and
    one `<bbox>` per box in the messages (ms-swift fills them in order and leaves extra tags as text).

    Box ranges against the image are checked later (`_BoxCheck.check_objects`), once the image size is known.
    """
    objects = row["objects"]
    if not isinstance(objects, dict):
        raise _Reject("E_SCHEMA", "field 'objects' must be an object {ref, bbox, bbox_type, image_id}")
    refs, boxes_ = objects.get("ref", []), objects.get("bbox")
    if not isinstance(refs, list) or not all(isinstance(r, str) and r.strip() for r in refs):
        raise _Reject("E_SCHEMA", "objects.ref must be a list of non-empty strings")
    if not isinstance(boxes_, list) or not boxes_:
        raise _Reject("E_SCHEMA", "objects.bbox must be a non-empty list of boxes [x1, y1, x2, y2] (or points [x, y])")
    if objects.get("bbox_type", "real") not in BBOX_TYPES:
        raise _Reject("E_SCHEMA", f"objects.bbox_type must be one of {', '.join(BBOX_TYPES)}")
    ids = objects.get("image_id", [])
    n_images = len(row.get("images") or [])
    if not isinstance(ids, list) or not all(isinstance(i, int) and 0 <= i < max(n_images, 1) for i in ids):
        raise _Reject("E_SCHEMA", f"objects.image_id must be a list of image indexes below {n_images}")
    text = "".join(m["content"] for m in row["messages"])
    for tag, items, key in (("<ref-object>", refs, "ref"), ("<bbox>", boxes_, "bbox")):
        if text.count(tag) != len(items):
            raise _Reject(
                "E_SCHEMA",
                f"{text.count(tag)} {tag} tag(s) in the messages but {len(items)} objects.{key}; "
                "ms-swift fills one tag per item, in order",
            )


def _check_answer(messages: list[dict[str, Any]], task: str) -> None:
    """Checks that every assistant answer is gold parsed strictly (`check_gold`: E_GOLD_*) and has the task's
    shape (E_ANSWER); see `components.common.tasks`."""
    check = get_task(task).check_answer
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        if problem := check_gold(task, msg["content"]):
            raise _Reject(problem.code, f"messages[{i}].content (assistant, the gold answer): {problem.message}")
        if reason := check(msg["content"]):
            raise _Reject("E_ANSWER", f"messages[{i}] (assistant): {reason}")


@dataclass
class _Image:
    """One inspected image: its local file, content hash and header facts (of the upright image).

    `exif_orientation` is the source's EXIF Orientation (1 = upright); when it is not 1, `path`
    is the upright copy that the clean dataset holds (`_decode`).
    """

    path: Path
    sha: str
    width: int
    height: int
    mode: str
    suffix: str
    exif_orientation: int = 1
    looks: _looks.Looks | None = None  # decoded pixels' identity and pHash (leakage by what the model sees)


_SHA_CACHE: dict[tuple[Path, int, int], str] = {}
_HASH_CHUNK = 1 << 20  # bytes read at a time: up to 32 threads hash at once


def sha_of_file(path: Path) -> str:
    """Returns the sha256 of a file's bytes (cached per path, size and mtime within a process)."""
    st = path.stat()
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _SHA_CACHE:
        _SHA_CACHE[key] = sha256_file(path, chunk=_HASH_CHUNK)
    return _SHA_CACHE[key]


_FORMAT_SUFFIX = {"PNG": ".png", "JPEG": ".jpg", "GIF": ".gif", "WEBP": ".webp", "BMP": ".bmp", "TIFF": ".tif"}


class _PixelBudget:
    """Bounds the bytes of pixels that threads decode at once; a request above the limit runs alone."""

    def __init__(self, limit: int):
        self._limit, self._used = limit, 0
        self._changed = threading.Condition()

    @contextmanager
    def hold(self, n_bytes: int) -> Iterator[None]:
        n_bytes = min(n_bytes, self._limit)
        with self._changed:
            self._changed.wait_for(lambda: self._used + n_bytes <= self._limit)
            self._used += n_bytes
        try:
            yield
        finally:
            with self._changed:
                self._used -= n_bytes
                self._changed.notify_all()


_DECODE_BUDGET = _PixelBudget(DECODE_BUDGET_BYTES)


def _decode(
    path: Path, sha: str, size: tuple[int, int], mode: str, out_dir: Path, orientation: int = 1
) -> tuple[str, Path | None, _looks.Looks | None]:
    """Decodes every pixel of an image whose header passed; returns (what went wrong or "", the copy or None,
    what the model sees of it: `_looks.looks_of` of the decoded, upright pixels).

    A JPEG decodes at 1/8 scale (`Image.draft`), or less reduced where that would leave a side
    under `_looks.PHASH_MIN_SIDE` px: its whole stream is still read and entropy-decoded, so
    truncation fails the same, with 1/64 of the pixels (its `looks.pixels` is then of that scale). A 16-bit
    grayscale image (SIXTEEN_BIT_MODES) is scaled to its top 8 bits, and an image whose EXIF
    `orientation` is not 1 is decoded in full and made upright (`ImageOps.exif_transpose`: the
    rotation / mirror applied to the pixels, the tag dropped); either is saved as a PNG
    `out_dir/<sha>.png` (lossless; no EXIF), the copy the clean dataset holds.
    """
    from components.validate_data import _looks  # outside the try below: a missing package is not a corrupt image

    wide = mode in SIXTEEN_BIT_MODES
    with _DECODE_BUDGET.hold(size[0] * size[1] * (10 if wide else 4)):  # Pillow keeps RGB in 4 bytes a pixel
        try:
            with Image.open(path) as img:
                if img.format == "JPEG" and orientation == 1:
                    img.draft(img.mode, tuple(min(n, max(n // 8, _looks.PHASH_MIN_SIDE)) for n in size))
                img.load()
                if not wide and orientation == 1:
                    return "", None, _looks.looks_of(img)
                copy = _upright(img) if orientation != 1 else img
                if wide:
                    copy = copy.convert("I").point(lambda v: v / 256).convert("L")  # v >> 8, clipped to 0..255
                elif copy.mode not in PNG_MODES:  # CMYK, YCbCr: what ms-swift's convert("RGB") makes of them
                    copy = copy.convert("RGB")
                looks = _looks.looks_of(copy)
        except Exception as exc:  # noqa: BLE001 - a decoder may raise anything on hostile bytes
            return str(exc) or type(exc).__name__, None, None
        out_dir.mkdir(parents=True, exist_ok=True)
        out = out_dir / f"{sha}.png"
        tmp = _temp_name(out)
        try:
            with open_nofollow(tmp, "wb") as f:
                copy.save(f, "PNG")
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
    return "", out, looks


PNG_MODES = ("1", "L", "LA", "P", "RGB", "RGBA", "I", "I;16")  # modes a PNG holds as they are


def _upright(img: Image.Image) -> Image.Image:
    """Returns the image with its EXIF orientation applied to the pixels and removed from its EXIF."""
    from PIL import ImageOps

    return ImageOps.exif_transpose(img)


def exif_orientation(img: Image.Image) -> int:
    """Returns an open image's EXIF Orientation (1 to 8; 1 = upright, also for none or a value out of range).

    Read from the header: a PNG's EXIF is looked at only when its eXIf chunk precedes the pixels
    (Pillow would otherwise decode the whole image to find one after them).
    """
    if img.format == "PNG" and "exif" not in img.info:
        return 1
    try:
        value = img.getexif().get(EXIF_ORIENTATION_TAG, 1)
    except Exception:  # noqa: BLE001 - a malformed EXIF block is no orientation
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


EXIF_ORIENTATION_TAG = 0x0112
TRANSPOSED_ORIENTATIONS = (5, 6, 7, 8)  # width and height swap when made upright


class _Decoder:
    """Decodes each distinct image content once per run: every path with the same bytes shares the result."""

    def __init__(self, out_dir: Path):
        self._out_dir = out_dir
        self._lock = threading.Lock()
        self._results: dict[str, Future] = {}

    def __call__(
        self, path: Path, sha: str, size: tuple[int, int], mode: str, orientation: int = 1
    ) -> tuple[str, Path | None, _looks.Looks | None]:
        with self._lock:
            future = self._results.get(sha)
            mine = future is None
            if mine:
                future = self._results[sha] = Future()
        if mine:
            try:
                future.set_result(_decode(path, sha, size, mode, self._out_dir, orientation))
            except BaseException as exc:
                future.set_exception(exc)
                raise
        return future.result()


def _missing_reason(ref: str, path: Path) -> str:
    """Returns why an image path names no readable file: not found, a symlink loop, a folder, or an OS error."""
    try:
        path.stat()
    except FileNotFoundError:
        return f"image {ref!r} not found (looked at {path})"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"image {ref!r} is a symlink loop ({path}): point the link at the image file"
        return f"image {ref!r} cannot be read ({exc.strerror or exc}; looked at {path})"
    kind = "a folder" if path.is_dir() else "not a regular file"
    return f"image {ref!r} is {kind} ({path}): name the image file itself"


def _inspect_image(source: _sources.Source, ref: str, staging: Path, timeout: float, decoder: _Decoder) -> _Image:
    """Fetches (if remote), hashes, reads the header of, and decodes one image; raises _Reject.

    The size, aspect and mode checks use the header alone, so an image over
    MAX_IMAGE_PIXELS is rejected without decoding it.
    """
    path = _sources.fetch(source, ref, staging, timeout)
    if not path.is_file():
        raise _Reject("E_IMAGE_MISSING", _missing_reason(ref, path))
    try:
        sha = sha_of_file(path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                width, height = img.size
                mode, fmt = img.mode, img.format
                orientation = exif_orientation(img)
                img.verify()
    except Image.DecompressionBombError as exc:
        raise _Reject(
            "E_IMAGE_SIZE", f"image {ref!r}: {exc}; downscale it to at most {MAX_IMAGE_PIXELS} px in area"
        ) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise _Reject("E_IMAGE_UNREADABLE", f"image {ref!r} cannot be opened: {exc}") from None
    if min(width, height) < MIN_IMAGE_SIDE or width * height > MAX_IMAGE_PIXELS:
        raise _Reject(
            "E_IMAGE_SIZE",
            f"image {ref!r} is {width}x{height}; "
            f"sides must be >= {MIN_IMAGE_SIDE} px and area <= {MAX_IMAGE_PIXELS} px",
        )
    if max(width, height) / min(width, height) > MAX_ASPECT_RATIO:
        raise _Reject("E_IMAGE_SIZE", f"image {ref!r} is {width}x{height}; aspect ratio above {MAX_ASPECT_RATIO}")
    if mode not in IMAGE_MODES:
        raise _Reject("E_IMAGE_SIZE", f"image {ref!r} has mode {mode!r}, not one of {', '.join(IMAGE_MODES)}")
    problem, copy, looks = decoder(path, sha, (width, height), mode, orientation)
    if problem:
        raise _Reject(
            "E_IMAGE_UNREADABLE",
            f"image {ref!r} cannot be decoded ({problem}): the file is corrupt or cut short; export or download "
            "it again",
        )
    if copy is not None:  # the clean set holds the 8-bit or upright copy: training and evaluate read that
        if orientation in TRANSPOSED_ORIENTATIONS:
            width, height = height, width
        with Image.open(copy) as made:
            copy_mode = made.mode
        return _Image(copy, sha_of_file(copy), width, height, copy_mode, ".png", orientation, looks)
    suffix = path.suffix.lower() if source.kind == "file" else ""
    return _Image(path, sha, width, height, mode, suffix or _FORMAT_SUFFIX.get(fmt or "", ""), looks=looks)


def _read_lines(path: Path):
    """Yields (line number, raw bytes, length) of a JSONL file, tolerating a BOM and CRLF.

    A line longer than MAX_LINE_BYTES is not held in memory: its first 64 KiB are yielded
    with its full length, and the rest is skipped.
    """
    limit = MAX_LINE_BYTES
    with open(path, "rb") as f:
        number = 0
        while True:
            raw = f.readline(limit + 2)
            if not raw:
                return
            number += 1
            length = len(raw)
            if length == limit + 2 and not raw.endswith(b"\n"):
                head, tail = raw, raw
                while True:
                    more = f.readline(1 << 20)
                    length += len(more)
                    if len(head) < 65536:
                        head += more[: 65536 - len(head)]
                    tail = (tail + more)[-2:]
                    if not more or more.endswith(b"\n"):
                        break
                length -= 2 if tail == b"\r\n" else 1 if tail.endswith(b"\n") else 0
                yield number, head[:65536].rstrip(b"\r\n"), length
                continue
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            raw = raw.rstrip(b"\r\n")
            yield number, raw, len(raw)


@dataclass
class _Pending:
    """A line that passed the text checks, waiting for its images."""

    file: str
    line: int
    raw: bytes
    row: dict[str, Any]
    sources: list[tuple[str, _sources.Source]]
    is_eval: bool


@dataclass
class _Rejected:
    """A quarantined line, with its local images for the report's thumbnails."""

    issue: Issue
    thumbnails: list[Path] = field(default_factory=list)


@dataclass
class _ReadFile:
    """One input file after the text checks.

    Attributes:
        name: The file as given (path or gs:// URI).
        n_read: Lines read from it, blank ones included.
        n_blank: Blank lines among them (not rows: neither clean nor quarantined).
        pending: Rows that passed the text checks, in line order.
        rejected: Lines that failed a text check, in line order.
        forms: Rows read per input form (`_formats.FORMS`), and conversion failures. Default empty.
    """

    name: str
    n_read: int
    n_blank: int
    pending: list[_Pending]
    rejected: list[_Rejected]
    forms: dict[str, int] = field(default_factory=dict)


@dataclass
class _CheckedRow:
    """A row that passed every check, ready to be written.

    Attributes:
        row: The parsed JSON row, as read.
        images: Its inspected images, in the row's order.
        key: sha256 of its messages and image hashes: the duplicate check and the split key.
        tokens: Its estimated token count.
        is_eval: Whether it came from an eval file.
        origin: The user's file, line and image names (`components.common.provenance`).
        file: The file it was read from. Default "".
        line: Its line number there. Default 0.
        raw: The line as read (a leaked eval row goes to the quarantine with it). Default b"".
    """

    row: dict[str, Any]
    images: list[_Image]
    key: str
    tokens: int
    is_eval: bool
    origin: dict[str, Any] = field(default_factory=dict)
    file: str = ""
    line: int = 0
    raw: bytes = b""


@dataclass(frozen=True)
class _Outputs:
    """Where one run writes: two dataset folders, the quarantine JSONL and the report ("" = none)."""

    train: Path
    eval: Path
    quarantine: Path
    report: str


def _raw_text(raw: bytes) -> str:
    """Returns a quarantined line's text as kept in the quarantine (first 64 KiB)."""
    return raw[:65536].decode("utf-8", errors="replace")


def _open_input(name: str, staging: Path, index: int, entry: dict[str, Any] | None = None) -> tuple[Path, str]:
    """Returns (local JSONL path, folder that relative image paths resolve against).

    With a snapshot `entry`, the file's bytes are read only if they are still the
    snapshot's (gs:// generation and CRC32C, local sha256), and parsed from a staging copy.
    """
    if entry is not None:
        local = staging / f"_input_{index}.jsonl"
        try:
            local.write_bytes(snap.read_entry(entry))
        except snap.SnapshotError as exc:
            raise DataError(str(exc)) from None
        return local, name.rsplit("/", 1)[0]
    if name.startswith("gs://"):
        local = staging / f"_input_{index}.jsonl"
        try:
            local.write_bytes(_sources.read_gs(name, timeout=300))
        except _Reject as rej:
            raise DataError(f"{name}: data file cannot be read ({rej.message})") from None
        return local, name.rsplit("/", 1)[0]
    path = Path(name)
    if not path.is_file() and not _formats.is_container(path):
        raise DataError(f"{path}: data file not found")
    return path, str(path.parent)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads' object_pairs_hook: the object as a dict; _Reject when a key repeats (no silent last-wins)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Reject("E_DUPLICATE_KEY", "")  # _load_json says which key, off the fast path
    return obj


def _load_json(text: str) -> Any:
    """Parses one line's JSON; raises _Reject E_JSON, or E_DUPLICATE_KEY naming the first repeated key."""
    repeated: list[tuple[str, list[str]]] = []

    def note_repeated(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        if not repeated and len(set(keys)) != len(keys):
            repeated.append((next(k for i, k in enumerate(keys) if k in keys[:i]), keys))
        return dict(pairs)

    try:
        try:
            return json.loads(text, object_pairs_hook=_unique_keys)
        except _Reject:  # parse again to name the key, or to find that the line is not JSON at all
            json.loads(text, object_pairs_hook=note_repeated)
    except json.JSONDecodeError as exc:
        raise _Reject("E_JSON", f"{exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise _Reject("E_JSON", "JSON nested too deeply") from None
    except ValueError as exc:  # an integer over Python's digit limit (sys.get_int_max_str_digits)
        raise _Reject("E_JSON", f"a number cannot be read ({exc}); write it as a string or with fewer digits") from None
    key, keys = repeated[0]
    shown = ", ".join(map(repr, keys[:12])) + (", ..." if len(keys) > 12 else "")
    raise _Reject(
        "E_DUPLICATE_KEY",
        f"key {key!r} appears {keys.count(key)} times in one object (keys {shown}); "
        "a JSON reader keeps only the last one: remove the duplicate",
    )


def _parse_line(raw: bytes, length: int, task: str, origin_ok: bool = False) -> dict[str, Any]:
    """Runs the text checks of one non-blank line; returns its row or raises _Reject.

    `origin_ok`: the file is a clean set validate-data wrote or rows `vlm-lora import` wrote
    (`_rows.origin_trusted`), or the row was converted from another form by `_formats` (which refused an
    origin in the raw row and wrote its own), so the row may carry its origin record."""
    if length > MAX_LINE_BYTES:
        raise _Reject("E_TOO_LONG", f"line has {length} bytes (limit {MAX_LINE_BYTES})")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Reject("E_ENCODING", f"not UTF-8 at byte {exc.start}") from None
    row = _load_json(text)
    try:  # a \\ud800-style escape decodes to a lone surrogate, which no UTF-8 writer accepts
        json.dumps(row, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _Reject(
            "E_ENCODING",
            f"a JSON string holds a lone surrogate escape (\\u{ord(exc.object[exc.start]):04x}) "
            "that cannot be encoded as UTF-8",
        ) from None
    messages = _check_messages(row)
    _rows.check_keys(row, origin_ok)
    if "objects" in row:  # ms-swift's grounding form: <ref-object> / <bbox> placeholders filled from `objects`
        _check_objects(row)
    elif task:
        _check_answer(messages, task)
    return row


def _parse_file(
    name: str, *, index: int, is_eval: bool, task: str, staging: Path, entry: dict[str, Any] | None = None,
    columns: _formats.ColumnMap | None = None,
) -> _ReadFile:  # fmt: skip
    """Reads one file (a snapshot `entry` when given) through the conversion step (`_formats`) and runs the text
    checks on each of its non-blank lines."""
    path, base = _open_input(name, staging, index, entry)
    origin_ok = _rows.origin_trusted(name, path)
    read = _ReadFile(name, n_read=0, n_blank=0, pending=[], rejected=[])
    conversion = _formats.Conversion(name, path, staging / f"_formats_{index}", columns)
    try:
        lines = list(conversion.lines(_read_lines)) if _formats.is_container(path) else conversion.lines(_read_lines)
    except _formats.FormatError as exc:
        raise DataError(str(exc)) from None
    for number, raw, length in lines:
        read.n_read += 1
        if not raw.strip():
            read.n_blank += 1  # blank lines are not rows
            continue
        try:
            raw = conversion.convert(number, raw)
            made = conversion.made_origin(number)  # converted from another form: the origin is the step's own
            row = _parse_line(raw, length if length > MAX_LINE_BYTES else len(raw), task, origin_ok or made)
            sources = [(ref, _sources.resolve(ref, base)) for ref in row.get("images", [])]  # E_IMAGE_PATH
        except (_Reject, _formats.ConvertReject) as rej:
            row = _json_or_none(raw)
            if not (origin_ok or conversion.made_origin(number)) and isinstance(row, dict):  # a forged origin never
                # names the line in the quarantine
                row = strip_origin(row)
            issue = _issue(name, number, rej, raw, row)
            read.rejected.append(_Rejected(issue, _local_images(row, base)))
            continue
        read.pending.append(_Pending(name, number, raw, row, sources, is_eval))
    read.forms = dict(conversion.counts)
    if read.n_read == read.n_blank:
        raise DataError(f"{name}: file is empty (no JSONL rows)")
    return read


def _json_or_none(raw: bytes) -> Any:
    """Returns a line's JSON value, or None when it does not parse (a rejected line, read again for its report)."""
    try:
        return json.loads(raw[:MAX_LINE_BYTES].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


def _issue(file: str, line: int, rej: _Reject, raw: bytes, row: Any) -> Issue:
    """Returns the quarantine record of a rejected line, with the row's original file:line when it carries one."""
    origin = origin_of(row)
    return Issue(file, line, rej.code, rej.message, _raw_text(raw), where(origin), origin["images"] if origin else [])


def _local_images(row: Any, base: str) -> list[Path]:
    """Returns the local image files a text-rejected row names (for the report's thumbnails; nothing is fetched)."""
    refs = row.get("images") if isinstance(row, dict) else None
    if isinstance(refs, str):
        refs = [refs]
    found = []
    for ref in refs if isinstance(refs, list) else []:
        try:
            src = _sources.resolve(ref, base) if isinstance(ref, str) else None
        except _Reject:
            continue
        if src is not None and src.kind == "file" and Path(src.location).is_file():
            found.append(Path(src.location))
    return found


def _inspect_images(
    pending: list[_Pending], *, staging: Path, timeout: float, pool: ThreadPoolExecutor
) -> dict[_sources.Source, _Image | _Reject]:
    """Inspects every distinct image of the pending rows once, in parallel (pixels decoded once per content)."""
    distinct = list(dict.fromkeys(src for p in pending for _, src in p.sources))
    refs = {src: ref for p in pending for ref, src in p.sources}
    decoder = _Decoder(staging / "8bit")

    def inspect(src: _sources.Source) -> _Image | _Reject:
        try:
            return _inspect_image(src, refs[src], staging, timeout, decoder)
        except _Reject as rej:
            return rej
        finally:
            progress.update()

    with Progress("validate-data: images", len(distinct), "images", enabled=len(distinct) > 0) as progress:
        return dict(zip(distinct, pool.map(inspect, distinct)))


@dataclass(frozen=True)
class _BoxCheck:
    """The detection box check of a run: the boxes' convention and the processor's resize rule."""

    convention: str
    rule: ResizeRule

    def check(self, messages: list[dict[str, Any]], images: list[_Image]) -> None:
        """Raises _Reject E_BOX for the first box of an assistant answer that is not valid."""
        # a box is relative to the row's image; with several images only the convention's own range is known
        size = (images[0].width, images[0].height) if len(images) == 1 else (10**9, 10**9)
        for i, msg in enumerate(messages):
            if msg["role"] != "assistant":
                continue
            findings, _ = parse_findings(msg["content"])
            for k, finding in enumerate(findings or []):
                if not isinstance(finding.get("label"), str) or not finding["label"].strip():
                    raise _Reject("E_BOX", f"messages[{i}] finding {k}: no label; every box needs a non-empty label")
                problem = box_problem(finding.get("bbox"), self.convention, size, self.rule)
                if problem:
                    raise _Reject(
                        "E_BOX",
                        f"messages[{i}] finding {k}: {problem}{_exif_note(images)}; fix the box, or set "
                        "data.box_convention to what the numbers mean (pixel, norm1000, resized_pixel)",
                    )


def _exif_note(images: list[_Image]) -> str:
    """Returns, for a box error on a row whose image has an EXIF orientation, how its size was read ("" if none)."""
    turned = [i for i in images if i.exif_orientation != 1]
    if len(images) != 1 or not turned:
        return ""
    i = turned[0]
    return (
        f" (the image has EXIF orientation {i.exif_orientation}: boxes are read on its upright view, "
        f"{i.width}x{i.height}, as a photo viewer shows it and as the clean dataset holds it; draw them on that view)"
    )


def _check_object_boxes(objects: dict[str, Any], images: list[_Image]) -> None:
    """Raises _Reject E_BOX for the first grounding box outside its image (real) or [0, 1] (norm1), or unordered."""
    norm1 = objects.get("bbox_type", "real") == "norm1"
    ids = list(objects.get("image_id") or []) + [0] * len(objects["bbox"])
    kind = "norm1: [0, 1]" if norm1 else "real: pixels of the image"
    for k, box in enumerate(objects["bbox"]):
        image = images[ids[k]] if images and ids[k] < len(images) else None
        size = (1, 1) if norm1 or image is None else (image.width, image.height)
        if isinstance(box, list) and len(box) == 2 and all(is_finite_number(v) for v in box):  # a point
            problem = "" if 0 <= box[0] <= size[0] and 0 <= box[1] <= size[1] else f"point {box} outside the image"
        else:
            problem = box_problem(box, "pixel", size)
        if problem:
            raise _Reject("E_BOX", f"objects.bbox[{k}] ({kind}): {problem}")


def _box_check(task: str, convention: str, model_dir: str | None, max_pixels: int = 0) -> _BoxCheck | None:
    """Returns the box check for a detection task ("auto": the convention of the model's family); resized_pixel
    boxes are checked against the image the model sees (`ResizeRule.from_model(model_dir, max_pixels)`)."""
    if task != "detection":
        return None
    family = ("", "")
    if model_dir:
        try:
            cfg = bounded_json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
            family = ((cfg.get("architectures") or [""])[0], cfg.get("model_type", ""))
        except (OSError, ValueError):
            pass
    try:
        resolved = resolve_convention(convention, *family)
    except BoxError as exc:
        raise DataError(str(exc)) from None
    native = convention_for_model(*family)
    if any(family) and resolved != native:  # a warning, not an error: the model can learn it, from further away
        warnings.warn(
            f"the data's boxes are {resolved}, but {family[0] or family[1]} was trained on {native}: fine-tuning "
            f"must unlearn its grounding; convert the data (python -m components.validate_data convert --to "
            f"{native}) and set data.box_convention: {native}",
            stacklevel=2,
        )
    return _BoxCheck(resolved, ResizeRule.from_model(model_dir, max_pixels))


def _check_row(
    p: _Pending,
    inspected: dict[_sources.Source, _Image | _Reject],
    *,
    counter: TokenCounter,
    max_length: int,
    seen: dict[str, str],
    boxes: _BoxCheck | None = None,
) -> _CheckedRow:
    """Runs the image, token and duplicate checks of one row; records it in `seen`; raises _Reject."""
    images: list[_Image] = []
    for _, src in p.sources:
        info = inspected[src]
        if isinstance(info, _Reject):
            raise _Reject(info.code, info.message)
        images.append(info)
    if "objects" in p.row:
        _check_object_boxes(p.row["objects"], images)  # E_BOX
    elif boxes is not None:
        boxes.check(p.row["messages"], images)  # E_BOX
    try:
        n_tokens = counter.text_tokens(p.row["messages"]) + sum(counter.image_tokens(i.width, i.height) for i in images)
    except ValueError as exc:
        raise _Reject("E_IMAGE_SIZE", str(exc)) from None
    if max_length and n_tokens > max_length:
        pixels = f"images resized to max_pixels {counter.max_pixels}" if counter.max_pixels else "full-size images"
        raise _Reject(
            "E_TOKENS", f"about {n_tokens} tokens ({counter.source}, {pixels}) > max_length {max_length}; "
            "set swift.max_pixels to shrink the images, shorten the text, or raise swift.max_length"
        )  # fmt: skip
    key = hashlib.sha256(
        json.dumps([p.row["messages"], [i.sha for i in images]], sort_keys=True, ensure_ascii=False).encode()
    ).hexdigest()
    if key in seen:
        raise _Reject("E_DUPLICATE", f"same messages and images as {seen[key]}")
    seen[key] = f"{p.file}:{p.line}"
    origin = origin_of(p.row) or make_origin(p.file, p.line, [ref for ref, _ in p.sources])
    return _CheckedRow(p.row, images, key, n_tokens, p.is_eval, origin, p.file, p.line, p.raw)


def _thumbnails(p: _Pending, inspected: dict[_sources.Source, _Image | _Reject]) -> list[Path]:
    """Returns a rejected row's local images for the report: readable ones, and those of the wrong size."""
    return [
        x.path if isinstance(x, _Image) else Path(s.location)
        for _, s in p.sources
        if isinstance(x := inspected[s], _Image) or (x.code == "E_IMAGE_SIZE" and s.kind == "file")
    ]


def _check_rows(
    pending: list[_Pending],
    inspected: dict[_sources.Source, _Image | _Reject],
    *,
    counter: TokenCounter,
    max_length: int,
    boxes: _BoxCheck | None = None,
) -> tuple[list[_CheckedRow], list[_Rejected]]:
    """Runs the row checks in input order; returns (clean rows, rejected rows)."""
    seen: dict[str, str] = {}  # row key -> file:line of its first occurrence
    checked, rejected = [], []
    with Progress("validate-data: rows (tokens, boxes)", len(pending), "rows", enabled=len(pending) > 0) as progress:
        for p in pending:
            try:
                checked.append(_check_row(p, inspected, counter=counter, max_length=max_length, seen=seen, boxes=boxes))
            except _Reject as rej:
                rejected.append(_Rejected(_issue(p.file, p.line, rej, p.raw, p.row), _thumbnails(p, inspected)))
            progress.update()
    return checked, rejected


def _split(
    checked: list[_CheckedRow], *, hash_split: bool, eval_fraction: float, split_seed: str
) -> tuple[list[_CheckedRow], list[_CheckedRow]]:
    """Returns (train rows, eval rows): by source file, or by the hash split when `hash_split`.

    The hash split places groups of rows (`_leakage.split_groups`: rows sharing an image by
    content, or a prompt when they have no image), each at the split position of its
    smallest row key; a row that shares nothing keeps its own position. When all rows form
    one group, no split keeps them apart: rows are split one by one and the leaks reported
    (`_handle_leaks`).
    """
    train = [r for r in checked if not r.is_eval]
    if not hash_split:
        return train, [r for r in checked if r.is_eval]
    group = _leakage.split_groups(train)  # rows sharing an image or a prompt stay on one side: no leak
    if len(set(group.values())) < 2:  # one group: no split keeps them apart (the leaks are reported)
        group = {r.key: r.key for r in train}
    positions = {g: split_key(g, split_seed) for g in set(group.values())}
    eval_groups = {g for g, pos in positions.items() if pos < eval_fraction}
    if not eval_groups and len(positions) >= 2:
        eval_groups = {min(positions, key=positions.get)}
    return [r for r in train if group[r.key] not in eval_groups], [r for r in train if group[r.key] in eval_groups]


def _handle_leaks(
    train: list[_CheckedRow], held_out: list[_CheckedRow], rejected: list[_Rejected], leakage: str
) -> tuple[list[_CheckedRow], list[_Leak]]:
    """Finds the eval rows a train row gives away (`_leakage.find_leaks`) and applies the leakage setting.

    quarantine and error: each leaked eval row goes to `rejected` (E_LEAK, naming the train
    rows' file:line); error then fails the run in `_enforce_policy`. warn: the rows stay in
    eval, each named in a warning. Returns (the eval rows kept, the leaks).
    """
    leaks = _leakage.find_leaks(train, held_out)
    if not leaks:
        return held_out, leaks
    if leakage == "warn":
        shown = "; ".join(f"{k.eval_row.file}:{k.eval_row.line} has {k.describe()}" for k in leaks[:3])
        warnings.warn(
            f"{len(leaks)} eval row(s) share an image or a prompt with train rows and stay in eval (data.leakage "
            f"warn, or a hash split of rows that all share one image): {shown}{'; ...' if len(leaks) > 3 else ''}",
            stacklevel=2,
        )
        return held_out, leaks
    fix = (
        "remove the row from the eval data (or its image from the train data); data.leakage: warn (CLI --leakage "
        "warn) keeps it"
    )
    for leak in leaks:
        e = leak.eval_row
        rej = _Reject("E_LEAK", f"eval row has {leak.describe()}; scoring it would measure memorisation: {fix}")
        thumbs = [i.path for i in e.images]
        rejected.append(_Rejected(_issue(e.file, e.line, rej, e.raw, e.row), thumbs))
    leaked = {id(leak.eval_row) for leak in leaks}
    return [r for r in held_out if id(r) not in leaked], leaks


def _check_line_accounting(
    files: list[_ReadFile], train: list[_CheckedRow], held_out: list[_CheckedRow], rejected: list[_Rejected]
) -> int:
    """Checks that every non-blank line read ended up in exactly one output; returns their number.

    Raises:
        LineAccountingError: train + eval + quarantined != non-blank lines read.
    """
    n_rows = sum(f.n_read - f.n_blank for f in files)
    if len(train) + len(held_out) + len(rejected) != n_rows:
        per_file = ", ".join(f"{f.name}: {f.n_read} read, {f.n_blank} blank" for f in files)
        raise LineAccountingError(
            f"validate-data lost track of lines (a bug, not a data problem): {n_rows} non-blank lines read "
            f"({per_file}) but {len(train)} train + {len(held_out)} eval + {len(rejected)} quarantined "
            f"= {len(train) + len(held_out) + len(rejected)}"
        )
    return n_rows


def _temp_name(path: Path) -> Path:
    """A temporary name beside `path`, unique per process and thread (two writers never share one)."""
    return path.with_name(f".{path.name}.partial-{os.getpid()}-{threading.get_ident()}")


def _copy_file(src: Path, dst: Path) -> None:
    """Copies src to dst through a temporary file and a rename: a file hard-linked to dst is never written through."""
    tmp = _temp_name(dst)
    try:
        copy_nofollow(src, tmp)  # a link planted at the temporary name is refused, never written through
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def _write_text_lines(path: Path, lines: Iterator[str]) -> None:
    """Writes a text file through a temporary file and a rename (never through a hard link, never half)."""
    tmp = _temp_name(path)
    try:
        with open_nofollow(tmp, "w") as f:
            f.writelines(lines)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _write_dataset(rows: list[_CheckedRow], out_dir: Path, pool: ThreadPoolExecutor) -> int:
    """Writes rows + their images into a self-contained dataset folder; returns image count."""
    image_dir = out_dir / "images"
    image_dir.mkdir(parents=True, exist_ok=True)
    to_copy: dict[str, Path] = {}

    def data_lines() -> Iterator[str]:
        for checked in rows:
            refs = []
            for image in checked.images:
                name = image.sha[:20] + image.suffix
                to_copy.setdefault(name, image.path)
                refs.append(f"images/{name}")
            out = dict(checked.row)
            if refs or "images" in checked.row:
                out["images"] = refs
            out[ORIGIN_KEY] = checked.origin  # the user's file:line and image names (evaluate's report)
            yield json.dumps(out, ensure_ascii=False) + "\n"

    _write_text_lines(out_dir / "data.jsonl", data_lines())
    # a copy, not a link: a validated dataset must not change with its source
    list(pool.map(lambda item: _copy_file(item[1], image_dir / item[0]), to_copy.items()))
    return len(to_copy)


def _record(issue: Issue) -> dict[str, Any]:
    """Returns a quarantine line: file, line, code, message, raw; plus origin / origin_images when the row had one."""
    return {k: v for k, v in issue.__dict__.items() if v or k not in ("origin", "origin_images")}


def _write_outputs(
    train: list[_CheckedRow], held_out: list[_CheckedRow], rejected: list[_Rejected], outputs: _Outputs,
    pool: ThreadPoolExecutor, token_settings: dict[str, Any] | None = None,
) -> int:  # fmt: skip
    """Writes the quarantine and both datasets (with their token figures); returns the number of images written.

    `outputs.train` / `outputs.eval` are the staging folders of `_staged_outputs`; the quarantine
    is one file, written through a temporary name and a rename.
    """
    outputs.quarantine.parent.mkdir(parents=True, exist_ok=True)
    _write_text_lines(outputs.quarantine, (json.dumps(_record(r.issue), ensure_ascii=False) + "\n" for r in rejected))
    written = _write_dataset(train, outputs.train, pool) + _write_dataset(held_out, outputs.eval, pool)
    for rows, folder in ((train, outputs.train), (held_out, outputs.eval)):
        write_token_stats(folder, token_stats([r.tokens for r in rows], **(token_settings or {})))
    return written


@contextmanager
def _staged_outputs(outputs: _Outputs, digests: dict[str, str]) -> Iterator[_Outputs]:
    """Yields `outputs` with the two dataset folders replaced by staging folders; publishes both at the end.

    Each dataset folder is written whole (`components.common.manifest`): its completion marker
    (size + sha256 of every file) is written last and the folder renamed into place, so an
    interrupted run leaves the previous folder or none, never a mix. On an error both staging
    folders are removed and nothing at the final paths changes.

    Args:
        outputs: The final paths.
        digests: Filled on success with {"train", "eval"}: each marker's sha256.
    """
    staged = {}
    try:
        for split, final in (("train", outputs.train), ("eval", outputs.eval)):
            staged[split] = manifest.staging_folder(final)
        yield dataclasses.replace(outputs, train=staged["train"], eval=staged["eval"])
        for split, final in (("train", outputs.train), ("eval", outputs.eval)):
            digests[split] = manifest.publish(staged.pop(split), final, producer="validate-data")
    finally:
        for split, staging in staged.items():
            manifest.discard(staging, getattr(outputs, split))


def _result(
    checked: list[_CheckedRow], train: list[_CheckedRow], held_out: list[_CheckedRow], rejected: list[_Rejected],
    *, n_lines: int, n_images: int, outputs: _Outputs, counter: TokenCounter, max_length: int,
    max_invalid_fraction: float,
) -> ValidationResult:  # fmt: skip
    """Gathers the counts and statistics of a run into its ValidationResult."""
    counts: dict[str, int] = {
        "n_lines": n_lines,
        "n_valid": len(train) + len(held_out),
        "n_invalid": len(rejected),
        "n_train": len(train),
        "n_eval": len(held_out),
        "n_images": n_images,
    }
    for r in rejected:
        counts[r.issue.code] = counts.get(r.issue.code, 0) + 1
    valid_images = {id(i): i for r in train + held_out for i in r.images}.values()
    stats = {
        "token_counts": [r.tokens for r in checked],
        "token_source": counter.source,
        "token_model": counter.model,
        "token_model_dir": counter.model_dir,
        "max_length": max_length,
        "max_pixels": counter.max_pixels,
        "max_invalid_fraction": max_invalid_fraction,
        "image_sizes": [(i.width, i.height) for i in {i.sha: i for i in valid_images}.values()],
    }
    issues = [r.issue for r in rejected]
    return ValidationResult(
        str(outputs.train), str(outputs.eval), str(outputs.quarantine), counts, issues, stats, outputs.report
    )


def invalid_fraction(counts: dict[str, int]) -> float:
    """Returns the fraction of lines that max_invalid_fraction limits: quarantined ones, leaked eval rows not
    counted (E_LEAK rows are valid rows moved out of eval, by the data.leakage setting)."""
    return (counts["n_invalid"] - counts.get("E_LEAK", 0)) / counts["n_lines"] if counts["n_lines"] else 0.0


def _enforce_policy(result: ValidationResult, max_invalid_fraction: float, leakage: str = "quarantine") -> None:
    """Raises DataError when too many lines are invalid, eval rows leak with leakage "error", or a dataset came
    out empty."""
    c = result.counts
    fraction = invalid_fraction(c)
    if fraction > max_invalid_fraction:
        raise DataError(
            f"{c['n_invalid'] - c.get('E_LEAK', 0)} of {c['n_lines']} lines invalid ({fraction:.1%} > "
            f"max_invalid_fraction {max_invalid_fraction:.1%}); fix them or raise data.max_invalid_fraction\n"
            + result.summary()
        )
    if leakage == "error" and c.get("n_leaked"):
        shown = "; ".join(f"eval {k['eval']} <- train {', '.join(k['train'])}" for k in result.stats["leaks"][:5])
        raise DataError(
            f"{c['n_leaked']} eval row(s) share an image or a prompt with train rows ({shown}"
            f"{'; ...' if c['n_leaked'] > 5 else ''}): remove them from the eval data, or set data.leakage "
            "(CLI --leakage) to quarantine to drop them or warn to keep them\n" + result.summary()
        )
    if not c["n_train"]:
        raise DataError("no valid training rows left\n" + result.summary())
    if not c["n_eval"]:
        raise DataError("no valid eval rows: pass an eval file or more training rows\n" + result.summary())


_OTHER_FOLDER = "write the outputs to another folder (CLI: --out OTHER_DIR)"


def _local_path(name: str) -> str:
    """Returns the absolute real path of a file or folder name; gs://b/o is /gcs/b/o (Cloud Storage FUSE)."""
    return os.path.realpath("/gcs/" + name[len("gs://") :] if name.startswith("gs://") else name)


def _is_in(path: str, folder: str) -> bool:
    """Whether real path `path` is `folder` or lies under it."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _output_problem(name: str, *, want_folder: bool) -> str:
    """Returns why an output cannot be written where it is named ("" when it can), reading nothing.

    Checks what is there now: the output itself of the wrong kind (a file where a folder goes,
    a folder where a file goes), its nearest existing parent not a folder, or that folder not
    writable. gs:// outputs are not checked here.
    """
    if name.startswith("gs://"):
        return ""
    path = Path(name)
    if path.exists():
        if want_folder and not path.is_dir():
            return "is a file, but a dataset folder goes here: remove or rename it, or write the outputs elsewhere"
        if not want_folder and path.is_dir():
            return "is a folder, but a file goes here: remove or rename the folder, or write the outputs elsewhere"
    parent = path if path.is_dir() else path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is a file, not a folder: pass an output folder that is not inside a file"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"the folder {parent} is not writable by this user: pass a folder you can write ({_OTHER_FOLDER})"
    return ""


def check_paths(inputs: list[str], *, train_out: str, eval_out: str, quarantine_out: str, report_out: str = "") -> None:
    """Refuses outputs that would overwrite an input or each other; reads and writes nothing.

    Args:
        inputs: The JSONL files to validate (train and eval; paths or gs:// URIs).
        train_out: Folder for the clean training set.
        eval_out: Folder for the clean held-out set.
        quarantine_out: JSONL file for the rejected lines.
        report_out: HTML report file; "" = none. Default "".

    Raises:
        DataError: An output cannot be written (a file where a folder goes or the reverse,
            inside a file, or in a folder this user cannot write), an input file lies in an
            output dataset folder or is an output file
            (re-validating a clean set into its own folder), the two dataset folders are
            one, or an output file lies in a dataset folder. The message names both paths.
    """
    folders = {"train_out": train_out, "eval_out": eval_out}
    files = {"quarantine_out": quarantine_out, **({"report_out": report_out} if report_out else {})}
    for arg, name in {**folders, **files}.items():
        problem = _output_problem(name, want_folder=arg in folders)
        if problem:
            raise DataError(f"{arg} {name}: {problem}")
    real = {arg: _local_path(name) for arg, name in {**folders, **files}.items()}
    if real["train_out"] == real["eval_out"]:
        raise DataError(f"train_out and eval_out are the same folder {train_out}: {_OTHER_FOLDER} for each")
    if real.get("report_out") == real["quarantine_out"]:
        raise DataError(f"quarantine_out and report_out are the same file {quarantine_out}: {_OTHER_FOLDER}")
    for file_arg, file_name in files.items():
        for folder_arg, folder in folders.items():
            if _is_in(real[file_arg], real[folder_arg]):
                raise DataError(f"{file_arg} {file_name} is inside {folder_arg} {folder}: {_OTHER_FOLDER}")
    for name in inputs:
        path = _local_path(name)
        for folder_arg, folder in folders.items():
            if _is_in(path, real[folder_arg]):
                raise DataError(
                    f"{name}: this input file is inside the output folder {folder} ({folder_arg}); validating "
                    f"into it would overwrite the data while it is read: {_OTHER_FOLDER}"
                )
        for file_arg, file_name in files.items():
            if path == real[file_arg]:
                raise DataError(
                    f"{name}: this input file is the output {file_arg} {file_name}; validating would overwrite "
                    f"it: {_OTHER_FOLDER}"
                )


def _check_image_paths(pending: list[_Pending], outputs: _Outputs) -> None:
    """Refuses a local image that lies in an output dataset folder (it would be overwritten while read)."""
    folders = {"train_out": outputs.train, "eval_out": outputs.eval}
    real = {arg: _local_path(str(folder)) for arg, folder in folders.items()}
    seen: set[str] = set()
    for p in pending:
        for ref, src in p.sources:
            if src.kind != "file" or src.location in seen:
                continue
            seen.add(src.location)
            # a relative reference is already resolved (_sources.resolve); an absolute one may hold links
            path = os.path.realpath(src.location) if os.path.isabs(ref.strip()) else src.location
            for folder_arg, folder in folders.items():
                if _is_in(path, real[folder_arg]):
                    raise DataError(
                        f"{p.file}:{p.line}: image {ref!r} ({path}) is inside the output folder {folder} "
                        f"({folder_arg}); validating into it would overwrite the image while it is read: "
                        f"{_OTHER_FOLDER}"
                    )


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
    *,
    report_out: str | None = None,
    model_dir: str | None = None,
    max_length: int = 0,
    max_pixels: int = 0,
    task: str = "",
    fetch_timeout: float = 30.0,
    workers: int = 0,
    box_convention: str = "pixel",
    snapshot: dict[str, Any] | None = None,
    lineage: dict[str, Any] | None = None,
    previous_lineage: dict[str, Any] | None = None,
    leakage: str = data_policy.DEFAULT_LEAKAGE,
    columns: str = "",
) -> ValidationResult:
    """Validates JSONL files and writes clean train/eval datasets and a quarantine.

    Args:
        train_files: ms-swift JSONL files with training rows: local paths (`/gcs/...` on
            Vertex) or gs:// URIs.
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
        report_out: HTML report file; None = no report. Written before the policy check,
            so a failed run still has one. Default None.
        model_dir: Model folder whose tokenizer and preprocessor_config.json count tokens;
            None = the approximation of `_tokens.approx_text_tokens` with Qwen3-VL image
            defaults. Default None.
        max_length: Largest token count of a row (ms-swift `max_length`: ms-swift drops a
            longer row); 0 = no check (counts are still reported). Default 0.
        max_pixels: ms-swift's `max_pixels` argument of the training run (`swift.max_pixels`),
            px: images of a larger area are counted (and resized_pixel boxes checked) at the
            size ms-swift scales them to; 0 = none, full size (ms-swift's default). Default 0.
        task: Answer check: "" none, "json" (every assistant answer holds a ```json block
            that parses), "detection" (that block is a list of {"label", "bbox": [4
            numbers]}, as evaluate parses it). Default "".
        fetch_timeout: Seconds a single image download (http(s), gs://) may take in all.
            Default 30.
        workers: Threads inspecting images; 0 = 4 per CPU, at most 32. Default 0.
        box_convention: What detection boxes mean (components.common.boxes): "pixel",
            "norm1000", "resized_pixel" or "auto" (the family of the model in `model_dir`).
            With task "detection" every box must be 4 numbers with x1 < x2, y1 < y2, inside
            the row's image in that convention (E_BOX). Default "pixel".
        snapshot: A data snapshot (components.common.snapshot): when given, `train_files`
            and `eval_files` must be its files (`snapshot_files`), each read only if it is
            still the snapshot's, and the data lineage (`LINEAGE_FILE`: the snapshot, rows
            per file, the `lineage` extras) is written into the train dataset folder and
            `stats["lineage"]`. Default None.
        lineage: Extra lineage fields, e.g. {"training_key": ...}. Default None.
        previous_lineage: The champion's data lineage; the report and `stats["since"]`
            say what changed since (files added / removed / changed, rows). Default None.
        leakage: An eval row sharing an image (by content) or, without images, its prompt
            with a train row (`_leakage`): "quarantine" it (E_LEAK; not counted against
            max_invalid_fraction), "error" (quarantined, then the run fails naming both
            rows), or "warn" (kept; a warning). Either way `counts["n_leaked"]` counts them
            and `stats["leaks"]` lists them (eval and train file:line). The hash split keeps
            rows sharing an image on one side. Default "quarantine".
        columns: A LLaMA-Factory dataset_info.json entry (`FILE` or `FILE:NAME`) whose `columns` / `tags` say
            how sharegpt rows are laid out; "" = forms recognised by their keys (`_formats`). Default "".

    Returns:
        The ValidationResult.

    Raises:
        DataError: An output would overwrite an input (`check_paths`; a local image in an
            output folder too: checked before anything is written); a file is missing,
            empty, or changed since the snapshot; the model folder has no tokenizer, max_pixels
            is negative, the task is unknown, eval_fraction / max_invalid_fraction / leakage break
            the config's rules (`components.common.data_policy`), fewer than one valid train row,
            the invalid fraction exceeds `max_invalid_fraction`, or eval rows leak with leakage
            "error" (message holds the summary).
        LineAccountingError: Clean + quarantined rows differ from the non-blank lines read
            (a bug in this module; nothing is written).
    """
    if task not in TASKS:
        raise DataError(f"task {task!r} is not one of {TASKS}")
    for name, value in (("eval_fraction", eval_fraction), ("max_invalid_fraction", max_invalid_fraction),
                        ("leakage", leakage)):  # fmt: skip
        if problem := data_policy.setting_problem(name, value):
            raise DataError(f"{name} {problem} (the rule of data.{name})")
    check_paths(
        [str(f) for f in [*train_files, *(eval_files or [])]], train_out=str(train_out), eval_out=str(eval_out),
        quarantine_out=str(quarantine_out), report_out=report_out or "",
    )  # fmt: skip
    try:
        counter = TokenCounter(model_dir, max_pixels)
    except ValueError as exc:
        raise DataError(str(exc)) from None
    boxes = _box_check(task, box_convention, model_dir, max_pixels)
    try:
        column_map = _formats.load_column_map(columns) if columns else None
    except _formats.FormatError as exc:
        raise DataError(str(exc)) from None
    workers = workers or min(32, 4 * (os.cpu_count() or 1))
    outputs = _Outputs(Path(train_out), Path(eval_out), Path(quarantine_out), report_out or "")
    staging = Path(tempfile.mkdtemp(prefix="validate-data-"))
    try:
        with ThreadPoolExecutor(workers) as pool:
            return _validate(
                train_files=[str(f) for f in train_files],
                eval_files=[str(f) for f in eval_files or []],
                outputs=outputs,
                task=task,
                counter=counter,
                max_length=max_length,
                boxes=boxes,
                fetch_timeout=fetch_timeout,
                eval_fraction=eval_fraction,
                split_seed=split_seed,
                max_invalid_fraction=max_invalid_fraction,
                staging=staging,
                pool=pool,
                snapshot=snapshot,
                lineage=lineage,
                previous_lineage=previous_lineage,
                leakage=leakage,
                columns=column_map,
            )
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _validate(
    *,
    train_files: list[str],
    eval_files: list[str],
    outputs: _Outputs,
    task: str,
    counter: TokenCounter,
    max_length: int,
    boxes: _BoxCheck | None = None,
    fetch_timeout: float,
    eval_fraction: float,
    split_seed: str,
    max_invalid_fraction: float,
    staging: Path,
    pool: ThreadPoolExecutor,
    snapshot: dict[str, Any] | None = None,
    lineage: dict[str, Any] | None = None,
    previous_lineage: dict[str, Any] | None = None,
    leakage: str = data_policy.DEFAULT_LEAKAGE,
    columns: _formats.ColumnMap | None = None,
) -> ValidationResult:
    """Runs the phases in order: read, check image paths, inspect images, check rows, split, account, write,
    report, policy."""
    inputs = [(name, False) for name in train_files] + [(name, True) for name in eval_files]
    entries = _snapshot_entries(snapshot, train_files, eval_files)
    files = [
        _parse_file(
            name, index=i, is_eval=is_eval, task=task, staging=staging, entry=entries.get(name), columns=columns
        )
        for i, (name, is_eval) in enumerate(inputs)
    ]
    pending = [p for f in files for p in f.pending]
    _check_image_paths(pending, outputs)
    inspected = _inspect_images(pending, staging=staging, timeout=fetch_timeout, pool=pool)
    checked, rejected_rows = _check_rows(pending, inspected, counter=counter, max_length=max_length, boxes=boxes)
    rejected = [r for f in files for r in f.rejected] + rejected_rows

    train, held_out = _split(checked, hash_split=not eval_files, eval_fraction=eval_fraction, split_seed=split_seed)
    # a hash split leaks only when every row shares an image: quarantining its eval rows would empty eval
    split_leakage = "warn" if not eval_files and leakage == "quarantine" else leakage
    held_out, leaks = _handle_leaks(train, held_out, rejected, split_leakage)
    kept = {id(r) for r in train + held_out}
    checked = [r for r in checked if id(r) in kept]  # quarantined eval rows count no more as valid rows
    order = [name for name, _ in inputs]
    rejected.sort(key=lambda r: (order.index(r.issue.file), r.issue.line))
    n_lines = _check_line_accounting(files, train, held_out, rejected)

    settings = {"max_length": max_length, "max_pixels": counter.max_pixels, "source": counter.source}
    digests: dict[str, str] = {}
    with _staged_outputs(outputs, digests) as staged:  # each dataset folder whole, its marker last
        n_images = _write_outputs(train, held_out, rejected, staged, pool, settings)
        result = _result(
            checked, train, held_out, rejected, n_lines=n_lines, n_images=n_images, outputs=outputs,
            counter=counter, max_length=max_length, max_invalid_fraction=max_invalid_fraction,
        )  # fmt: skip
        result.counts["n_leaked"] = len(leaks)
        forms = sum((Counter(f.forms) for f in files), Counter())
        result.counts.update({f"n_form_{form}": forms[form] for form in _formats.FORMS if forms[form]})
        result.counts["n_exif_rotated"] = len(
            {i.sha for r in train + held_out for i in r.images if i.exif_orientation != 1}
        )
        result.stats.update(leakage=leakage, leaks=[leak.record() for leak in leaks])
        if snapshot is not None:
            extra = {"task": task, **(lineage or {})}  # the task the rows were checked for: serve's smoke test reads it
            _write_lineage(result, files, rejected, snapshot, extra, previous_lineage, staged.train)
    result.stats["manifests"] = digests
    if outputs.report:
        from components.validate_data._report import write_report

        issues = [(r.issue, r.thumbnails) for r in rejected]
        box_geometry = (boxes.convention, boxes.rule) if boxes else None
        write_report(outputs.report, result, issues, valid=train + held_out, task=task, boxes=box_geometry)
    _enforce_policy(result, max_invalid_fraction, leakage)
    return result


def snapshot_files(snapshot: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Returns (train files, eval files) of a data snapshot, in its order."""
    return [e["uri"] for e in snapshot["train"]], [e["uri"] for e in snapshot["eval"]]


def _snapshot_entries(
    snapshot: dict[str, Any] | None, train_files: list[str], eval_files: list[str]
) -> dict[str, dict[str, Any]]:
    """Returns {file: snapshot entry}; checks that the files are the snapshot's."""
    if snapshot is None:
        return {}
    train, held_out = snapshot_files(snapshot)
    if (train, held_out) != (train_files, eval_files):
        raise DataError("the files to validate are not the snapshot's; pass snapshot_files(snapshot)")
    return {e["uri"]: e for split in snap.SPLITS for e in snapshot[split]}


def _write_lineage(
    result: ValidationResult, files: list[_ReadFile], rejected: list[_Rejected], snapshot: dict[str, Any],
    extra: dict[str, Any], previous: dict[str, Any] | None, train_out: Path,
) -> None:  # fmt: skip
    """Writes the data lineage into the train dataset folder and the result's stats."""
    quarantined: dict[str, int] = {}
    for r in rejected:
        quarantined[r.issue.file] = quarantined.get(r.issue.file, 0) + 1
    per_file = {f.name: {"rows": f.n_read - f.n_blank, "quarantined": quarantined.get(f.name, 0)} for f in files}
    c = result.counts
    lineage = {
        **extra,
        "snapshot": snapshot,
        "files": per_file,
        "n_rows": c["n_lines"],
        "n_train": c["n_train"],
        "n_eval": c["n_eval"],
    }
    (train_out / snap.LINEAGE_FILE).write_text(json.dumps(lineage, indent=1, sort_keys=True), encoding="utf-8")
    result.stats["lineage"] = lineage
    if previous is not None:
        change = snap.diff(previous["snapshot"], snapshot)
        result.stats["since"] = {
            "fingerprint": previous["snapshot"].get("fingerprint", ""),
            "added": change.added, "removed": change.removed, "changed": change.changed,
            "unchanged": change.unchanged,
            "rows_before": int(previous.get("n_rows", 0) or 0), "rows_now": c["n_lines"],
            "file_rows_before": {k: v.get("rows") for k, v in (previous.get("files") or {}).items()},
        }  # fmt: skip


def training_max_pixels(swift_args: dict[str, Any], max_pixels: int = 0) -> int:
    """Returns the ms-swift `max_pixels` a training run resizes images with: what validate-data must count with.

    Args:
        swift_args: The run's `swift sft` arguments (the config's `swift` section).
        max_pixels: A value given on its own, px; 0 = `swift_args["max_pixels"]`. Default 0.

    Returns:
        The max_pixels, px; 0 = none (ms-swift's default).

    Raises:
        DataError: Not a whole number >= 0, or `max_pixels` differs from the swift section's.
    """
    swift_value = swift_args.get("max_pixels") or 0
    for name, value in (("swift.max_pixels", swift_value), ("max_pixels", max_pixels)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise DataError(f"{name} must be a whole number of pixels >= 0 (0 = no limit), got {value!r}")
    if max_pixels and swift_value and max_pixels != swift_value:
        raise DataError(
            f"max_pixels {max_pixels} differs from swift.max_pixels {swift_value}, which training resizes images "
            "with: pass the same value, or 0 to take the swift section's"
        )
    return max_pixels or swift_value


def validate_snapshot(
    snapshot_json: str, *, train_out: str, eval_out: str, quarantine_out: str, training_key: str = "",
    champion_dir: str = "", **kwargs: Any,
) -> ValidationResult:  # fmt: skip
    """Validates exactly the files of a data snapshot (snapshot-data's `snapshot` output).

    Args:
        snapshot_json: The snapshot's JSON text.
        train_out: Folder for the clean training set.
        eval_out: Folder for the clean held-out set.
        quarantine_out: JSONL file for the rejected lines.
        training_key: Key of data + training settings, recorded in the lineage. Default "".
        champion_dir: The champion's merged model folder ("" = none): the report says what
            changed since its data. Default "".
        **kwargs: The other `validate_data` arguments (eval_fraction, task, model_dir, ...).

    Returns:
        The ValidationResult; `stats["lineage"]` is the data lineage.

    Raises:
        DataError: A malformed snapshot, a damaged champion lineage (`snap.read_lineage`), a file
            changed since the snapshot, or as `validate_data`.
    """
    try:
        snapshot = snap.parse(snapshot_json)
        previous_lineage = snap.read_lineage(champion_dir)  # a damaged champion lineage: a named error
    except snap.SnapshotError as exc:
        raise DataError(str(exc)) from None
    train_files, eval_files = snapshot_files(snapshot)
    return validate_data(
        train_files, train_out, eval_out, quarantine_out, eval_files, snapshot=snapshot,
        lineage={"training_key": training_key} if training_key else {},
        previous_lineage=previous_lineage, **kwargs,
    )  # fmt: skip
