"""Train/eval leakage: eval rows that a train row gives away, found by what the model sees.

An eval row leaks when a train row has one of its images, or, for rows without images, the
same prompt (every message but the assistant's, compared after folding case and runs of
whitespace). An image is the same when it has the same bytes (sha256, under any name), the
same decoded pixels (`_looks`: a lossless re-encode, another format, an opaque alpha channel,
extra metadata) or is a near-duplicate (`_looks`: pHash within NEAR_DUPLICATE_BITS: a JPEG
copy, a 1-pixel edit or resize). Scoring such a row measures memorisation, not generalisation.

Two uses, both on validate-data's checked rows (anything with `.key`, `.row`, `.images`
holding `.sha` and `.looks`, `.file`, `.line` and `.origin`):

* `split_groups`: the hash split keeps the rows that share an image (near-duplicates included) or a prompt on one side,
  so it cannot leak; a row that shares nothing keeps its own split position.
* `find_leaks`: with eval files given, the eval rows a train row gives away, each with the
  train rows' `file:line`s.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from components.common.provenance import where

# `_looks` (numpy, imagehash) is imported where hashes are compared, not here: `vlm-lora validate --help`
# imports this module through core and must stay light (tests/test_help_speed.py).

MAX_TRAIN_REFS = 3  # train rows named per leaked eval row (the first ones, in input order)


def _folded(value: Any) -> Any:
    """A message's content with case and whitespace folded ("Hello  World " and "hello world" are one prompt)."""
    if isinstance(value, str):
        return " ".join(value.split()).casefold()
    if isinstance(value, list):
        return [_folded(v) for v in value]
    if isinstance(value, dict):
        return {k: _folded(v) for k, v in value.items()}
    return value


def prompt_key(row: dict[str, Any]) -> str:
    """Returns the sha256 of a row's prompt: every message but the assistant's, roles included, case and spaces folded."""
    prompt = [[m["role"], _folded(m["content"])] for m in row["messages"] if m["role"] != "assistant"]
    return hashlib.sha256(json.dumps(prompt, ensure_ascii=False).encode()).hexdigest()


def _image_links(i: Any) -> list[str]:
    looks = getattr(i, "looks", None)
    return [f"image:{i.sha}", *([f"pixels:{looks.pixels}"] if looks is not None else [])]


def _links(r: Any) -> list[str]:
    """Returns what a row shares with another when they leak: its images' bytes and pixels, or its prompt without images."""
    links = [link for i in r.images for link in _image_links(i)]
    return links or [f"prompt:{prompt_key(r.row)}"]


def _phashes(rows: Sequence[Any]) -> tuple[list[bytes], dict[bytes, list[Any]]]:
    """The distinct perceptual hashes of the rows' images (flat images have none), and the rows with each."""
    by_hash: dict[bytes, list[Any]] = {}
    for r in rows:
        for i in r.images:
            looks = getattr(i, "looks", None)
            if looks is not None and looks.phash:
                holders = by_hash.setdefault(looks.phash, [])
                if not holders or holders[-1] is not r:
                    holders.append(r)
    return list(by_hash), by_hash


def split_groups(rows: Sequence[Any]) -> dict[str, str]:
    """Returns {row key: its group's key}: rows sharing an image (or, without images, a prompt) form one group.

    The group's key is the smallest row key in it, so a row that shares nothing is its own
    group under its own key (its hash-split position does not change).
    """
    parent: dict[str, str] = {r.key: r.key for r in rows}

    def find(key: str) -> str:
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    def union(x: str, y: str) -> None:
        a, b = find(x), find(y)
        if a != b:
            parent[max(a, b)] = min(a, b)  # the root is the smallest key of the group

    first: dict[str, str] = {}
    for r in rows:
        for link in _links(r):
            if link not in first:
                first[link] = r.key
            else:
                union(first[link], r.key)
    hashes, holders = _phashes(rows)
    for group in holders.values():
        for r in group[1:]:
            union(group[0].key, r.key)
    from components.validate_data import _looks

    for i, j in _looks.near_pairs(hashes):  # near-duplicates stay on one side too
        union(holders[hashes[i]][0].key, holders[hashes[j]][0].key)
    return {r.key: find(r.key) for r in rows}


BY_BYTES, BY_PIXELS = "bytes", "pixels"  # how an image matched; a near-duplicate is "near:<bits>"


@dataclass
class Leak:
    """One eval row that train rows give away.

    Attributes:
        eval_row: The eval row.
        train_rows: The train rows that share its image (or prompt), first MAX_TRAIN_REFS, in input order.
        same_prompt: Whether a train row has one of its images and its prompt too (the very
            question, case and spaces aside), not only an image.
        images: The eval row's image names (as written) that a train row has.
        train_images: The same images' names in the first train row that has each.
        match: How each of those images matched: "bytes" (sha256), "pixels" (the same decoded
            pixels, other bytes) or "near:<bits>" (pHash that many bits apart).
    """

    eval_row: Any
    train_rows: list[Any] = field(default_factory=list)
    same_prompt: bool = False
    images: list[str] = field(default_factory=list)
    train_images: list[str] = field(default_factory=list)
    match: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """Returns what the eval row shares and with which train rows (their file:line, and original file:line)."""
        refs = ", ".join(_where(t) for t in self.train_rows)
        if not self.eval_row.images:
            return f"the same prompt as train row {refs} (no image)"
        what = "the same image and prompt" if self.same_prompt else "the same image (another prompt)"
        shown = ", ".join(
            repr(e) + ("" if e == t else f" (in train: {t!r})") for e, t in zip(self.images[:3], self.train_images)
        )
        return f"{what} as train row {refs}: image {shown}, compared by {_how(self.match)}"

    def record(self) -> dict[str, Any]:
        """Returns the leak for the report and stats: eval and train file:lines, and what is shared."""
        return {
            "eval": _where(self.eval_row),
            "train": [_where(t) for t in self.train_rows],
            "shared": "image and prompt" if self.same_prompt else "image" if self.eval_row.images else "prompt",
            "images": self.images,
            "train_images": self.train_images,
            "match": self.match,
        }


def _how(match: list[str]) -> str:
    from components.validate_data import _looks

    hows = []
    for m in match:
        if m == BY_BYTES:
            how = "content (sha256)"
        elif m == BY_PIXELS:
            how = "decoded pixels (the same RGB pixels in another file)"
        else:
            how = (f"perceptual hash (a near-duplicate: pHash {m.split(':', 1)[1]} of 256 bits apart, "
                   f"<= {_looks.NEAR_DUPLICATE_BITS})")  # fmt: skip
        if how not in hows:
            hows.append(how)
    return "; ".join(hows) or "content (sha256)"


def _where(r: Any) -> str:
    """Returns a row's file:line, with the user's original file:line when the row was validated before."""
    here = f"{r.file}:{r.line}"
    original = where(r.origin) if r.origin.get("file") != r.file or r.origin.get("line") != r.line else ""
    return f"{here} (originally {original})" if original else here


def _image_names(r: Any) -> list[str]:
    """Returns a row's image names as the user wrote them (its origin), else the shas' short form."""
    names = r.origin.get("images") or []
    return list(names) if len(names) == len(r.images) else [i.sha[:12] for i in r.images]


def _name_in(r: Any, link: str) -> str:
    """Returns the name a row gives its image with this link (bytes, pixels) or perceptual hash."""
    names = _image_names(r)
    for k, i in enumerate(r.images):
        looks = getattr(i, "looks", None)
        if link in _image_links(i) or (looks is not None and looks.phash == link):
            return names[k]
    return names[0]


@dataclass
class _TrainIndex:
    """The train rows by image bytes, pixels and prompt, and their distinct perceptual hashes."""

    by_link: dict[str, list[Any]]
    hashes: list[bytes]
    holders: dict[bytes, list[Any]]
    order: dict[int, int]

    @classmethod
    def of(cls, train: Sequence[Any]) -> _TrainIndex:
        by_link: dict[str, list[Any]] = {}  # image bytes / pixels or prompt -> the train rows with it, in order
        for t in train:
            for link in dict.fromkeys(_links(t)):
                by_link.setdefault(link, []).append(t)
        hashes, holders = _phashes(train)
        return cls(by_link, hashes, holders, {id(t): k for k, t in enumerate(train)})


def _near(held_out: Sequence[Any], index: _TrainIndex) -> dict[bytes, list[tuple[int, bytes]]]:
    """{eval image pHash: [(bits apart, train pHash)], nearest first} for every near-duplicate pair."""
    from components.validate_data import _looks

    hashes, _ = _phashes(held_out)
    near: dict[bytes, list[tuple[int, bytes]]] = {}
    for i, j in _looks.near_pairs(hashes, index.hashes):
        near.setdefault(hashes[i], []).append((_looks.distance(hashes[i], index.hashes[j]), index.hashes[j]))
    return {h: sorted(v) for h, v in near.items()}


def _image_match(i: Any, index: _TrainIndex, near: dict) -> tuple[str, list[Any], Any] | None:
    """(how, the train rows with it, the link or hash to name it by) of one eval image, or None."""
    for how, link in zip((BY_BYTES, BY_PIXELS), _image_links(i), strict=False):
        if link in index.by_link:
            return how, index.by_link[link], link
    looks = getattr(i, "looks", None)
    if looks is not None and looks.phash in near:
        pairs = near[looks.phash]
        rows = [t for _, h in pairs for t in index.holders[h]]
        return f"near:{pairs[0][0]}", rows, pairs[0][1]
    return None


def find_leaks(train: Sequence[Any], held_out: Sequence[Any]) -> list[Leak]:
    """Returns the eval rows that share an image (bytes, pixels or near-duplicate) or, without images, a prompt
    with a train row.

    Args:
        train: The train rows, in input order.
        held_out: The eval rows, in input order.

    Returns:
        One Leak per leaked eval row, in eval order.
    """
    index = _TrainIndex.of(train)
    near = _near(held_out, index)
    leaks = []
    for e in held_out:
        names = _image_names(e)
        found = [(names[k], m) for k, i in enumerate(e.images) if (m := _image_match(i, index, near))]
        if e.images:
            sharing = {id(t): t for _, (_, rows, _) in found for t in rows}
        else:
            sharing = {id(t): t for t in index.by_link.get(_links(e)[0], [])}
        if not sharing:
            continue
        rows = sorted(sharing.values(), key=lambda t: index.order[id(t)])
        key = prompt_key(e.row)
        same = bool(e.images) and any(prompt_key(t.row) == key for t in rows)
        train_names = [_name_in(m[1][0], m[2]) for _, m in found]
        leaks.append(Leak(e, rows[:MAX_TRAIN_REFS], same, [n for n, _ in found], train_names, [m[0] for _, m in found]))
    return leaks
