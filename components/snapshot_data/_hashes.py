"""Content hashes of the images beside the data, with a cache that skips unchanged files.

A snapshot identifies each local image by its bytes (blake2b, 128 bits): an image rewritten
with other pixels but the same size and modification time (`cp -p`, `rsync -t`, `tar x`)
changes the snapshot. Hashing every image on every run costs a read of the whole folder, so
the hashes are kept in a cache keyed by (inode, size, mtime_ns, ctime_ns): a file whose four
figures are unchanged is not read again. The change time (ctime) cannot be set from user
space (`touch`, `utime`, `cp -p` all update it to now), so a rewrite always misses the cache.

The cache lives under `$XDG_CACHE_HOME/vlm-lora/asset-hashes/` (default `~/.cache/...`),
one JSON file per data folder, named by a hash of the folder's absolute path. It is only an
optimisation: unreadable, missing or unwritable means every file is hashed, never an error.
Each file of it is written whole (temporary file + rename).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from components.common.files import write_json_atomic

CHUNK = 1024 * 1024  # bytes read at a time
CACHE_FORMAT = "vlm-lora-asset-hashes-v1"


def blake2b_file(path: str | Path) -> str:
    """Returns the 32-hex blake2b-128 of a file's bytes."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def cache_dir() -> Path:
    """The folder of the hash caches (`$XDG_CACHE_HOME/vlm-lora/asset-hashes`)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vlm-lora" / "asset-hashes"


def _cache_file(folder: Path) -> Path:
    name = hashlib.sha256(str(folder.absolute()).encode()).hexdigest()[:24]
    return cache_dir() / f"{name}.json"


@dataclass
class HashCache:
    """The cached hashes of one data folder's files.

    Attributes:
        folder: The data folder.
        entries: {relative path: [inode, size, mtime_ns, ctime_ns, hash]} as last seen.
        seen: The same for this listing (what `save` writes).
        changed: (relative path, same size and mtime as before) of files whose content differs
            from the cached hash (rewritten with other bytes), in the order met.
        hashed: Files read this time (cache misses).
    """

    folder: Path
    entries: dict[str, list] = field(default_factory=dict)
    seen: dict[str, list] = field(default_factory=dict)
    changed: list[tuple[str, bool]] = field(default_factory=list)
    hashed: int = 0

    @classmethod
    def load(cls, folder: Path) -> HashCache:
        """Reads the folder's cache; an absent or unreadable one is empty."""
        try:
            body = json.loads(_cache_file(folder).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return cls(folder)
        ok = isinstance(body, dict) and body.get("format") == CACHE_FORMAT and body.get("folder") == str(folder)
        entries = body.get("files") if ok else None
        return cls(folder, entries if isinstance(entries, dict) else {})

    def hash_of(self, rel: str, st: os.stat_result) -> str:
        """Returns the content hash of `folder/rel`, from the cache when its stat figures match."""
        key = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        old = self.entries.get(rel)
        if isinstance(old, list) and len(old) == 5 and old[:4] == key:
            self.seen[rel] = old
            return str(old[4])
        digest = blake2b_file(self.folder / rel)
        self.hashed += 1
        if isinstance(old, list) and len(old) == 5 and old[4] != digest:
            self.changed.append((rel, old[1:3] == key[1:3]))
        self.seen[rel] = [*key, digest]
        return digest

    def save(self) -> None:
        """Writes what this listing saw (best effort: a cache that cannot be written is skipped)."""
        if self.seen == self.entries:
            return
        path = _cache_file(self.folder)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, {"format": CACHE_FORMAT, "folder": str(self.folder), "files": self.seen})
        except OSError:
            pass
