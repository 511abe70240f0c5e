"""A cache entry and its manifest: what is trusted, and how a local entry is written and locked.

An entry is valid when its manifest lists only plain relative names and every file
matches its size and checksum (`verify_entry`); a manifest naming a path that is not
plainly inside the entry is refused before anything is read.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.common.files import CopyMismatch, copy_verified, sha256_file, write_json_atomic
from components.common.model_sources import SourceSpec
from components.stage_model import _gcs, _lock
from components.stage_model.errors import StageError

log = logging.getLogger("stage_model")

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1


_DRIVE_RE = re.compile(r"^[A-Za-z]:")


def bad_name(rel: Any) -> str:
    """Why a file name from a manifest or a source listing is not a plain relative path ('' if it is)."""
    if not isinstance(rel, str) or not rel:
        return "empty name"
    for why, bad in (
        ("NUL character", "\0" in rel),
        ("absolute path", rel.startswith("/")),
        ("backslash", "\\" in rel),
        ("drive letter", bool(_DRIVE_RE.match(rel))),
        ("empty path segment", "" in rel.split("/")),
        ("'.' or '..' segment", any(part in (".", "..") for part in rel.split("/"))),
    ):
        if bad:
            return why
    return ""


def untrusted(uri: str, rel: Any, why: str) -> StageError:
    return StageError(
        f"cache entry {uri}: {rel!r} is not a path inside the entry ({why}); the entry is corrupt or "
        f"was tampered with: delete {uri} and stage again"
    )


@dataclass
class StageResult:
    """What staging produced.

    Attributes:
        entry: The verified cache entry folder (the Model artifact's location).
        cache_hit: True when a valid entry existed and nothing was copied.
        bytes_copied: Bytes written into the cache by this call.
        manifest: The entry's manifest.
        metadata: Model facts for the artifact: architecture, model_type, parameters, dtype.
    """

    entry: str
    cache_hit: bool
    bytes_copied: int
    manifest: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)


class LocalEntry:
    """A cache entry folder on a local (or FUSE-mounted) file system.

    Same contract as `_gcs.GcsEntry`: files are replaced atomically (temporary name +
    rename), the manifest is created only if absent (hard link of a complete temporary
    file), and the lock `<entry>.lock` is created with O_EXCL.
    """

    heartbeat_min_s = 0.05  # shortest time between two refreshes of the lock

    def __init__(self, path: Path):
        self.path = Path(path)
        self.uri = str(self.path)

    def _file(self, rel: str) -> Path:
        """The path of `rel` in the entry; StageError when it resolves outside (a symlink out)."""
        path = self.path / rel
        if not path.resolve().is_relative_to(self.path.resolve()):
            raise untrusted(self.uri, rel, "a symlink leads outside the entry")
        return path

    def read_manifest(self) -> tuple[dict[str, Any] | None, Any]:
        path = self._file(MANIFEST)
        try:
            raw = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None, None
        return json.loads(raw), path.stat().st_ino

    def verify(self, manifest: dict[str, Any]) -> tuple[bool, str]:
        files = {rel: (info["size"], info["sha256"]) for rel, info in manifest["files"].items()}
        for rel, (size, sha) in files.items():
            path = self._file(rel)
            if not path.is_file():
                return False, f"{rel}: missing"
            if path.stat().st_size != size:
                return False, f"{rel}: size {path.stat().st_size} != {size}"
            if sha256_file(path) != sha:
                return False, f"{rel}: sha256 mismatch"
        return True, "ok"

    def good_files(self, expected: dict[str, dict[str, Any]]) -> set[str]:
        good = set()
        for rel, info in expected.items():
            path = self._file(rel)
            if path.is_file() and path.stat().st_size == info["size"] and sha256_file(path) == info["sha256"]:
                good.add(rel)
        return good

    def put(self, local: Path, rel: str, info: dict[str, Any]) -> int:
        """Copies a file into the entry atomically; returns bytes written."""
        try:
            return copy_verified(local, self._file(rel), info["sha256"], atomic=True, tmp_tag=_lock.tag())
        except CopyMismatch:
            raise StageError(f"{local}: changed while being copied (sha256 differs); stage again") from None

    def write_manifest(self, manifest: dict[str, Any], replace_generation: Any = None) -> bool:
        self.path.mkdir(parents=True, exist_ok=True)
        if replace_generation is not None:
            write_json_atomic(self.path / MANIFEST, manifest, indent=2)
            return True
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=f"{MANIFEST}.partial-{_lock.tag()}-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(manifest, f, indent=2, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, self.path / MANIFEST)  # fails if a manifest exists: create-only
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def delete_manifest(self, generation: Any = None) -> None:
        (self.path / MANIFEST).unlink(missing_ok=True)

    def _lock_path(self) -> Path:
        return self.path.parent / (self.path.name + ".lock")

    def try_lock(self, owner: str, stale_s: float) -> bool:
        """Creates the lock (O_EXCL) with this process's record; True when this owner holds it."""
        lock = self._lock_path()
        lock.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):  # once more right after removing an abandoned lock
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if not self._take_over(lock, owner, stale_s):
                    return False
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(_lock.record(owner), f)
            return True
        return False

    def _take_over(self, lock: Path, owner: str, stale_s: float) -> bool:
        """Removes the lock if its owner is gone (or its heartbeat, the mtime, is stale); True when gone."""
        try:
            raw = lock.read_bytes()
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return True
        try:
            held = json.loads(raw)
        except ValueError:
            held = {}
        held = held if isinstance(held, dict) else {}
        why = _lock.abandoned(held, age, stale_s)
        if not why:
            return False
        moved = lock.with_name(f"{lock.name}.stale-{owner}")
        try:
            os.replace(lock, moved)  # only one stager can move this very file away
        except FileNotFoundError:
            return True
        try:
            if moved.read_bytes() != raw:  # a new holder's lock came in between: put it back
                try:
                    os.link(moved, lock)
                except FileExistsError:
                    pass
                return False
        finally:
            moved.unlink(missing_ok=True)
        log.warning("stage-model: took over the lock of %s: %s", self.uri, why)
        self._clean_partials(held, stale_s)
        return True

    def _clean_partials(self, dead: dict[str, Any], stale_s: float) -> None:
        """Removes the `*.partial-*` files of gone stagers (see `_lock.partial_is_abandoned`)."""
        for folder, _, names in os.walk(self.path):  # does not follow symlinks
            for name in names:
                path = Path(folder) / name
                if ".partial-" in name and _lock.partial_is_abandoned(path, dead, stale_s):
                    path.unlink(missing_ok=True)
                    log.info("stage-model: removed %s, left by a stager that is gone", path)

    def refresh_lock(self, owner: str) -> None:
        """Heartbeat: touches the lock (its mtime) while this owner holds it."""
        lock = self._lock_path()
        try:
            if json.loads(lock.read_text()).get("owner") == owner:
                os.utime(lock)
        except (FileNotFoundError, ValueError, AttributeError):
            pass

    def unlock(self, owner: str) -> None:
        lock = self._lock_path()
        try:
            if json.loads(lock.read_text()).get("owner") == owner:
                lock.unlink()
        except (FileNotFoundError, ValueError, AttributeError):
            pass


def open_entry(entry: Path | str):
    if str(entry).startswith("gs://"):
        return _gcs.GcsEntry(str(entry))
    return LocalEntry(Path(entry))


def check_entry(entry) -> tuple[bool, str, dict[str, Any] | None, Any]:
    """Returns (valid, reason, manifest, manifest generation) of an entry."""
    try:
        manifest, generation = entry.read_manifest()
    except (OSError, ValueError) as exc:
        return False, f"unreadable manifest ({exc!r})", {}, None  # {}: present, must be removed
    if manifest is None:
        return False, "no manifest (incomplete entry)", None, None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    for rel in files if isinstance(files, dict) else ():
        if why := bad_name(rel):
            raise untrusted(entry.uri, rel, why)  # checked before anything is read
    try:
        valid, reason = entry.verify(manifest)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return False, f"unreadable manifest ({exc!r})", manifest, generation
    return valid, reason, manifest, generation


def verify_entry(entry: Path | str) -> tuple[bool, str]:
    """Checks a cache entry against its manifest.

    A local entry is checked by size and sha256 of every file; a gs:// entry by size and
    crc32c of every object, from the object listing (no data is read).

    Args:
        entry: The entry folder, or its gs:// URI.

    Returns:
        (valid, reason): reason says what is wrong when not valid (a manifest naming a path
        outside the entry is not valid, and nothing outside is read).
    """
    try:
        valid, reason, _, _ = check_entry(open_entry(entry))
    except StageError as exc:
        return False, str(exc)
    return valid, reason


def entry_for(cache: str, spec: SourceSpec, revision: str):
    if cache.startswith("gs://"):
        return _gcs.GcsEntry("/".join([cache.rstrip("/"), spec.scheme, *spec.parts, revision]))
    root = Path(cache).expanduser().resolve()
    return LocalEntry(root.joinpath(spec.scheme, *spec.parts, revision))


def entry_result(entry, cache_hit: bool, copied: int, manifest: dict[str, Any]) -> StageResult:
    return StageResult(entry.uri, cache_hit, copied, manifest, {**manifest.get("model", {}), "cache_hit": cache_hit})
