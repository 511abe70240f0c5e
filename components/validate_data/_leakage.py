"""Train/eval leakage: eval rows that a train row gives away, found by image content and by (images, prompt).

An eval row leaks when a train row has one of its images (the same bytes, under any name:
images are compared by their sha256) or, for rows without images, the same prompt (every
message but the assistant's). Scoring such a row measures memorisation, not generalisation.

Two uses, both on validate-data's checked rows (anything with `.key`, `.row`, `.images`
holding `.sha`, `.file`, `.line` and `.origin`):

* `split_groups`: the hash split keeps the rows that share an image or a prompt on one side,
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

MAX_TRAIN_REFS = 3  # train rows named per leaked eval row (the first ones, in input order)


def prompt_key(row: dict[str, Any]) -> str:
    """Returns the sha256 of a row's prompt: every message but the assistant's, roles included."""
    prompt = [[m["role"], m["content"]] for m in row["messages"] if m["role"] != "assistant"]
    return hashlib.sha256(json.dumps(prompt, ensure_ascii=False).encode()).hexdigest()


def _links(r: Any) -> list[str]:
    """Returns what a row shares with another when they leak: its image hashes, or its prompt when it has none."""
    shas = [f"image:{i.sha}" for i in r.images]
    return shas or [f"prompt:{prompt_key(r.row)}"]


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

    first: dict[str, str] = {}
    for r in rows:
        for link in _links(r):
            if link not in first:
                first[link] = r.key
                continue
            a, b = find(first[link]), find(r.key)
            if a != b:
                parent[max(a, b)] = min(a, b)  # the root is the smallest key of the group
    return {r.key: find(r.key) for r in rows}


@dataclass
class Leak:
    """One eval row that train rows give away.

    Attributes:
        eval_row: The eval row.
        train_rows: The train rows that share its image (or prompt), first MAX_TRAIN_REFS, in input order.
        same_prompt: Whether a train row has its images and its prompt too (the very question),
            not only an image.
        images: The eval row's image names (as written) that a train row has.
        train_images: The same images' names in the first train row that has each.
    """

    eval_row: Any
    train_rows: list[Any] = field(default_factory=list)
    same_prompt: bool = False
    images: list[str] = field(default_factory=list)
    train_images: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """Returns what the eval row shares and with which train rows (their file:line, and original file:line)."""
        refs = ", ".join(_where(t) for t in self.train_rows)
        if not self.eval_row.images:
            return f"the same prompt as train row {refs} (no image)"
        what = "the same image and prompt" if self.same_prompt else "the same image (another prompt)"
        shown = ", ".join(
            repr(e) + ("" if e == t else f" (in train: {t!r})") for e, t in zip(self.images[:3], self.train_images)
        )
        return f"{what} as train row {refs}: image {shown}, compared by content (sha256)"

    def record(self) -> dict[str, Any]:
        """Returns the leak for the report and stats: eval and train file:lines, and what is shared."""
        return {
            "eval": _where(self.eval_row),
            "train": [_where(t) for t in self.train_rows],
            "shared": "image and prompt" if self.same_prompt else "image" if self.eval_row.images else "prompt",
            "images": self.images,
            "train_images": self.train_images,
        }


def _where(r: Any) -> str:
    """Returns a row's file:line, with the user's original file:line when the row was validated before."""
    here = f"{r.file}:{r.line}"
    original = where(r.origin) if r.origin.get("file") != r.file or r.origin.get("line") != r.line else ""
    return f"{here} (originally {original})" if original else here


def _image_names(r: Any) -> list[str]:
    """Returns a row's image names as the user wrote them (its origin), else the shas' short form."""
    names = r.origin.get("images") or []
    return list(names) if len(names) == len(r.images) else [i.sha[:12] for i in r.images]


def _name_in(r: Any, sha: str) -> str:
    """Returns the name a row gives the image with this hash."""
    names = _image_names(r)
    return next(names[k] for k, i in enumerate(r.images) if i.sha == sha)


def find_leaks(train: Sequence[Any], held_out: Sequence[Any]) -> list[Leak]:
    """Returns the eval rows that share an image (by content) or, without images, a prompt with a train row.

    Args:
        train: The train rows, in input order.
        held_out: The eval rows, in input order.

    Returns:
        One Leak per leaked eval row, in eval order.
    """
    by_link: dict[str, list[Any]] = {}  # image or prompt -> the train rows with it, in input order
    by_question: set[tuple[tuple[str, ...], str]] = set()
    order = {id(t): k for k, t in enumerate(train)}
    for t in train:
        for link in _links(t):
            by_link.setdefault(link, []).append(t)
        by_question.add((tuple(i.sha for i in t.images), prompt_key(t.row)))
    leaks = []
    for e in held_out:
        links = _links(e)
        sharing = list({id(t): t for link in links for t in by_link.get(link, [])}.values())
        if not sharing:
            continue
        sharing.sort(key=lambda t: order[id(t)])
        names = _image_names(e)
        shared = [(names[k], i.sha) for k, i in enumerate(e.images) if f"image:{i.sha}" in by_link]
        train_names = [_name_in(by_link[f"image:{sha}"][0], sha) for _, sha in shared]
        same = (tuple(i.sha for i in e.images), prompt_key(e.row)) in by_question
        leaks.append(Leak(e, sharing[:MAX_TRAIN_REFS], same, [n for n, _ in shared], train_names))
    return leaks
