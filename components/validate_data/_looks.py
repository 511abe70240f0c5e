"""What the model sees of an image: the identity of its decoded pixels and a perceptual hash.

Leakage by file bytes alone misses the same picture stored another way. Each distinct image
content, once decoded (validate-data decodes every image anyway), gets:

* `pixels`: blake2b-128 of its size and its pixels as ms-swift reads them (`convert("RGB")`,
  upright): a PNG saved at level 0 or 9, a BMP, an RGBA copy with opaque alpha or a copy with
  an extra EXIF chunk have other bytes and the same `pixels`.
* `phash`: a 256-bit perceptual hash (`imagehash.phash`, hash_size 16: a 64x64 grayscale
  thumbnail's DCT, the 16x16 low frequencies against their median). Two images within
  `NEAR_DUPLICATE_BITS` of each other are near-duplicates: a JPEG q100 or q85 copy, a 1-pixel
  edit, a 1-pixel resize.

The threshold, measured on the demo data (`pipelines.demo.drawings.render_drawing`, 256 px,
1,000 drawings seeded "fpr-0".."fpr-999", 2026-12-01, `looks_of` as below): distinct drawings
are at least 20 bits apart (0.1 % of the 499,500 pairs below 54 bits, 1 % below 64, median 86),
so 16 bits gives 0 false positives in 499,500 pairs; a copy is at most 16 bits away (1,000
drawings each: a 1-px resize to 255 or 257 px with LANCZOS max 16, mean 4.4, 1 of 1,000 above
12; NEAREST max 14; BICUBIC max 8; 200 drawings each: JPEG q85 max 4, JPEG q100 and a 1-px
edit max 2). The 64-bit pHash (hash_size 8) cannot tell these drawings apart (a white sheet, a
frame, a title block always bottom-right): 2.7 % of distinct pairs within 8 bits, so it is not
used. On other data, distinct images closer than 17 bits would be reported as leaks: the report
names both rows and `near:<bits>`, and `data.leakage: warn` keeps them.

An image without structure (its 64x64 grayscale thumbnail's standard deviation below
`FLAT_STD`: a blank page, a plain colour) has no meaningful pHash (every flat image hashes
alike), so it gets none and is compared by bytes and pixels only.

`near_pairs` compares hashes with numpy (XOR and `bitwise_count` of 64-bit words), in blocks
so the memory stays under ~64 MB whatever the count.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import imagehash  # at import, not per image: a missing package is not a corrupt image
import numpy as np
from PIL import Image

PHASH_SIZE = 16  # imagehash's hash_size: 16x16 = 256 bits
NEAR_DUPLICATE_BITS = 16  # Hamming distance at or below which two images are near-duplicates (see the module doc)
PHASH_MIN_SIDE = 64  # pixels a side the hash needs (imagehash resizes to 4 x hash_size first)
FLAT_STD = 2.0  # grey levels (0..255): below it the thumbnail is flat and no pHash is kept
_BLOCK = 1 << 20  # hash pairs compared at once (x 32 bytes: 32 MB)


@dataclass(frozen=True)
class Looks:
    """What the model sees of one image.

    Attributes:
        pixels: 32-hex blake2b-128 of the size and the RGB pixels.
        phash: The 256-bit perceptual hash, 32 bytes; b"" for a flat image (see the module doc).
    """

    pixels: str
    phash: bytes


def looks_of(img: Image.Image) -> Looks:
    """Returns the pixel identity and the perceptual hash of a decoded image (as ms-swift reads it: RGB)."""
    rgb = img if img.mode == "RGB" else img.convert("RGB")
    digest = hashlib.blake2b(f"{rgb.width}x{rgb.height}\0".encode(), digest_size=16)
    digest.update(rgb.tobytes())
    side = PHASH_SIZE * 4
    thumb = rgb.convert("L").resize((side, side), Image.Resampling.LANCZOS)  # what imagehash.phash starts from
    if float(np.asarray(thumb, dtype=np.float32).std()) < FLAT_STD:
        return Looks(digest.hexdigest(), b"")
    bits = imagehash.phash(thumb, hash_size=PHASH_SIZE).hash.flatten()
    return Looks(digest.hexdigest(), np.packbits(bits).tobytes())


def _words(hashes: Sequence[bytes]) -> np.ndarray:
    """The hashes as rows of four uint64 words."""
    return np.frombuffer(b"".join(hashes), dtype=np.uint64).reshape(len(hashes), -1)


def distance(a: bytes, b: bytes) -> int:
    """Returns the Hamming distance of two perceptual hashes, in bits."""
    return int(np.bitwise_count(np.bitwise_xor(_words([a]), _words([b]))).sum())


def near_pairs(left: Sequence[bytes], right: Sequence[bytes] | None = None) -> list[tuple[int, int]]:
    """Returns the index pairs (i, j) whose hashes are within NEAR_DUPLICATE_BITS.

    Every pair is compared (XOR and popcount over four 64-bit words, in blocks of `_BLOCK`
    pairs); with `right` None only the pairs i < j, so 10,000 hashes are 50 million pairs.

    Args:
        left: Perceptual hashes (32 bytes each).
        right: Other hashes to compare `left` with. Default None: `left` with itself, each
            pair once (i < j).

    Returns:
        (index in left, index in right) pairs, sorted.
    """
    same = right is None
    if not left or (not same and not right):
        return []
    a = _words(left)
    b = a if same else _words(right)
    rows = max(1, _BLOCK // len(b))
    found: list[tuple[int, int]] = []
    for start in range(0, len(a), rows):
        first = start + 1 if same else 0  # with itself: only the columns right of the block's first row
        block, other = a[start : start + rows], b[first:]
        dist = np.bitwise_count(np.bitwise_xor(block[:, None, :], other[None, :, :])).sum(axis=2, dtype=np.uint16)
        for i, j in zip(*np.nonzero(dist <= NEAR_DUPLICATE_BITS), strict=True):
            if not same or start + i < first + j:
                found.append((start + int(i), first + int(j)))
    return sorted(found)
