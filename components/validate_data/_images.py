"""Image inspection: fetch, hash, read the header of and decode each distinct image once.

The size, aspect and mode checks use the header alone; the pixels are decoded once per distinct
content, in a thread pool, within DECODE_BUDGET_BYTES. 16-bit grayscale and EXIF-rotated images are
written as 8-bit / upright PNG copies, which the clean dataset holds.
"""

from __future__ import annotations

import errno
import os
import threading
import warnings
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image, UnidentifiedImageError

from components.common.files import open_nofollow, sha256_file
from components.common.progress import Progress
from components.validate_data import _sources
from components.validate_data._sources import Reject
from components.validate_data._tokens import MAX_ASPECT_RATIO
from components.validate_data._write import temp_name
from components.validate_data.types import MAX_IMAGE_PIXELS, InspectedImage, PendingRow

if TYPE_CHECKING:  # imported in `_decode`: numpy and imagehash stay out of `vlm-lora validate --help`
    from components.validate_data import _looks

MIN_IMAGE_SIDE = 28  # Qwen-VL resizes to multiples of 28/32 px; smaller images are errors
# 16-bit grayscale (mode "I" too: older Pillow opens 16-bit PNGs so; read as 0..65535) goes
# into the clean set as an 8-bit "L" PNG of the top 8 bits
SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")
IMAGE_MODES = ("RGB", "RGBA", "L", "LA", "P", "1", "CMYK", "YCbCr", *SIXTEEN_BIT_MODES)
DECODE_BUDGET_BYTES = 1 << 30  # pixels of the image decodes in flight at once (one larger image runs alone)


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
        tmp = temp_name(out)
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


def _inspect_image(
    source: _sources.Source, ref: str, staging: Path, timeout: float, decoder: _Decoder
) -> InspectedImage:
    """Fetches (if remote), hashes, reads the header of, and decodes one image; raises Reject.

    The size, aspect and mode checks use the header alone, so an image over
    MAX_IMAGE_PIXELS is rejected without decoding it.
    """
    path = _sources.fetch(source, ref, staging, timeout)
    if not path.is_file():
        raise Reject("E_IMAGE_MISSING", _missing_reason(ref, path))
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
        raise Reject(
            "E_IMAGE_SIZE", f"image {ref!r}: {exc}; downscale it to at most {MAX_IMAGE_PIXELS} px in area"
        ) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise Reject("E_IMAGE_UNREADABLE", f"image {ref!r} cannot be opened: {exc}") from None
    if min(width, height) < MIN_IMAGE_SIDE or width * height > MAX_IMAGE_PIXELS:
        raise Reject(
            "E_IMAGE_SIZE",
            f"image {ref!r} is {width}x{height}; "
            f"sides must be >= {MIN_IMAGE_SIDE} px and area <= {MAX_IMAGE_PIXELS} px",
        )
    if max(width, height) / min(width, height) > MAX_ASPECT_RATIO:
        raise Reject("E_IMAGE_SIZE", f"image {ref!r} is {width}x{height}; aspect ratio above {MAX_ASPECT_RATIO}")
    if mode not in IMAGE_MODES:
        raise Reject("E_IMAGE_SIZE", f"image {ref!r} has mode {mode!r}, not one of {', '.join(IMAGE_MODES)}")
    problem, copy, looks = decoder(path, sha, (width, height), mode, orientation)
    if problem:
        raise Reject(
            "E_IMAGE_UNREADABLE",
            f"image {ref!r} cannot be decoded ({problem}): the file is corrupt or cut short; export or download "
            "it again",
        )
    if copy is not None:  # the clean set holds the 8-bit or upright copy: training and evaluate read that
        if orientation in TRANSPOSED_ORIENTATIONS:
            width, height = height, width
        with Image.open(copy) as made:
            copy_mode = made.mode
        return InspectedImage(copy, sha_of_file(copy), width, height, copy_mode, ".png", orientation, looks)
    suffix = path.suffix.lower() if source.kind == "file" else ""
    return InspectedImage(path, sha, width, height, mode, suffix or _FORMAT_SUFFIX.get(fmt or "", ""), looks=looks)


def inspect_images(
    pending: list[PendingRow], *, staging: Path, timeout: float, pool: ThreadPoolExecutor
) -> dict[_sources.Source, InspectedImage | Reject]:
    """Inspects every distinct image of the pending rows once, in parallel (pixels decoded once per content)."""
    distinct = list(dict.fromkeys(src for p in pending for _, src in p.sources))
    refs = {src: ref for p in pending for ref, src in p.sources}
    decoder = _Decoder(staging / "8bit")

    def inspect(src: _sources.Source) -> InspectedImage | Reject:
        try:
            return _inspect_image(src, refs[src], staging, timeout, decoder)
        except Reject as rej:
            return rej
        finally:
            progress.update()

    with Progress("validate-data: images", len(distinct), "images", enabled=len(distinct) > 0) as progress:
        return dict(zip(distinct, pool.map(inspect, distinct)))
