"""Stage a base model into the model cache, verified, once.

A cache entry is `<cache>/<scheme>/<org>/<name>/<revision>/` (a local folder or a
gs:// prefix) holding the model files and `manifest.json` (files, sizes, sha256 and
crc32c, source, resolved revision, time, model facts). The manifest is written last: an
entry without a manifest, or whose files do not match it, is not trusted and is repaired
(only the missing or bad files are copied again). A valid entry is reused with nothing
copied (a cache hit).

Sources: `hf://org/name[@rev]` and `ms://org/name[@rev]` (revision resolved to the commit
hash), `gs://bucket/prefix` and a local folder (revision = content fingerprint, so a
changed folder is a new entry).

Two stagers of one entry at once (two pipeline runs) are safe by construction:
  1. Same entry => same bytes: the entry name is a commit hash or content fingerprint
     (plus the file selection), so every stager writes identical content to each file.
  2. Every file write is atomic: a temporary name + rename locally, a single object
     upload on GCS (readers never see a torn object). A reader sees a whole file or none.
  3. The manifest is written last, only after every file it lists was checked in the
     entry, create-only (O_EXCL link / ifGenerationMatch=0). A stager that loses the race
     keeps the winner's manifest if it verifies.
  4. A lock `<entry>.lock` (create-only, heartbeat, taken over when stale) makes a second
     stager wait for the first and then return a cache hit instead of copying again. It is
     an optimisation: where preconditions are not enforced (the GCS emulator), both copy
     and the end state is still one valid entry. The lock records its owner (host, pid,
     process start time); a lock whose owner ran on this host and is gone (`kill -9`) is
     taken over at once, one of another host when its heartbeat is older than the stale
     bound. The new holder removes the dead stager's `*.partial-*` files (see `_lock`).

Hostile or careless input is refused with a StageError, never read or written through: a
manifest (or source listing) naming a path that is not plainly inside the entry (absolute,
`..`, backslash, drive letter, empty segment, a symlink out of the entry), a cache path
under a file, a full disk.
"""

from __future__ import annotations

import base64
import errno
import fnmatch
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import struct
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from components.common import bounded_json
from components.common.files import CopyMismatch, copy_verified, sha256_file, write_json_atomic
from components.common.model_sources import (
    Listing,
    SourceError,
    SourceSpec,
    fingerprint,
    parse_source,
    read_token,
    resolve_hf,
    resolve_ms,
)
from components.common.progress import Progress, tree_bytes
from components.stage_model import _gcs, _lock
from components.stage_model._gcs import from_fuse_path, to_fuse_path  # noqa: F401 - public helpers

log = logging.getLogger("stage_model")

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
_CHUNK = 8 * 1024 * 1024

# Architectures ms-swift can LoRA-tune with this pipeline, mapped to ms-swift model_type.
SUPPORTED_ARCHITECTURES = {
    "Qwen3VLForConditionalGeneration": "qwen3_vl",
    "Qwen3VLMoeForConditionalGeneration": "qwen3_moe_vl",
    "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
    "Qwen2VLForConditionalGeneration": "qwen2_vl",
}
# Never staged: VCS and cache folders, and partial files of other stagers.
DEFAULT_IGNORE = (".git/*", ".cache/*", "*.partial-*", MANIFEST)


class StageError(RuntimeError):
    """Staging failed; the message names the source or file and the fix."""


_DRIVE_RE = re.compile(r"^[A-Za-z]:")
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def _bad_name(rel: Any) -> str:
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


def _untrusted(uri: str, rel: Any, why: str) -> StageError:
    return StageError(
        f"cache entry {uri}: {rel!r} is not a path inside the entry ({why}); the entry is corrupt or "
        f"was tampered with: delete {uri} and stage again"
    )


def _size(n: float) -> str:
    """Bytes for people: '1.5 GB', '12.0 MB', '640 B'."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


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


def list_files(folder: Path, allow: list[str] | None = None, ignore: list[str] | None = None) -> list[str]:
    """Lists a folder's files as sorted POSIX relative paths, filtered by glob patterns.

    Args:
        folder: The model folder.
        allow: Keep only paths matching one of these globs; None keeps all. Default None.
        ignore: Drop paths matching one of these globs (added to DEFAULT_IGNORE). Default None.

    Returns:
        Relative file paths, sorted.
    """
    names = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    return _select(names, allow, ignore)


def _safetensors_header(path: Path) -> dict[str, Any]:
    """Reads a safetensors file's JSON header without loading tensors."""
    try:
        with open(path, "rb") as f:
            raw_len = f.read(8)
            if len(raw_len) != 8:
                raise ValueError("file shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", raw_len)
            if n > 100 * 1024 * 1024 or n > path.stat().st_size - 8:
                raise ValueError(f"header length {n} exceeds the file")
            header = bounded_json.loads(f.read(n))
            if not isinstance(header, dict):
                raise ValueError("header is not a JSON object")
            header.pop("__metadata__", None)
            for name, info in header.items():
                if not (
                    isinstance(info, dict)
                    and isinstance(info.get("dtype"), str)
                    and isinstance(info.get("shape"), list)
                    and all(isinstance(d, int) for d in info["shape"])
                    and isinstance(info.get("data_offsets"), list)
                    and len(info["data_offsets"]) == 2
                    and all(isinstance(o, int) for o in info["data_offsets"])
                ):
                    raise ValueError(f"tensor {name!r} needs dtype, shape and data_offsets")
    except (OSError, ValueError) as exc:
        raise StageError(f"{path}: unreadable safetensors header ({exc}); re-export the weights") from None
    end = max((v["data_offsets"][1] for v in header.values()), default=0)
    if 8 + n + end > path.stat().st_size:
        raise StageError(f"{path}: truncated safetensors file (tensor data ends past the file); copy it again")
    return header


_CONFIG_FIX = "restore the model's own config.json (as its hub repo or `save_pretrained` writes it)"
_INDEX_FIX = "restore the index `save_pretrained` wrote, or delete it when the weights are one model.safetensors"


def _read_json_object(path: Path, fix: str) -> dict[str, Any]:
    """A JSON file that must hold an object; StageError (naming the file and `fix`) otherwise."""
    try:
        data = bounded_json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StageError(f"{path}: cannot parse ({exc}); {fix}") from None
    if not isinstance(data, dict):
        raise StageError(f"{path}: expected a JSON object {{...}}, found {_json_kind(data)}; {fix}")
    return data


def _read_config(path: Path) -> dict[str, Any]:
    """Reads a model's config.json and checks the shape of the fields staging reads.

    Raises:
        StageError: Not JSON, not an object, `architectures` not a list of class names,
            `text_config` not an object. The message names the file, the field and the fix.
    """
    config = _read_json_object(path, _CONFIG_FIX)
    archs = config.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise StageError(
            f"{path}: field 'architectures' must be a list of class names such as "
            f'["Qwen3VLForConditionalGeneration"], found {_short(archs)}; {_CONFIG_FIX}'
        )
    text = config.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise StageError(f"{path}: field 'text_config' must be an object, found {_json_kind(text)}; {_CONFIG_FIX}")
    return config


def _read_weight_map(path: Path) -> dict[str, str]:
    """Reads model.safetensors.index.json's `weight_map` ({tensor name: shard file name}).

    Raises:
        StageError: Not JSON, not an object, no `weight_map`, a `weight_map` that is not an
            object of file names. The message names the file, the field and the fix.
    """
    index = _read_json_object(path, _INDEX_FIX)
    weight_map = index.get("weight_map")
    if "weight_map" not in index:
        raise StageError(f"{path}: cannot parse: no field 'weight_map' {{tensor name: shard file}}; {_INDEX_FIX}")
    if not isinstance(weight_map, dict):
        raise StageError(
            f"{path}: field 'weight_map' must be an object {{tensor name: shard file}}, found "
            f"{_json_kind(weight_map)}; {_INDEX_FIX}"
        )
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard:
            raise StageError(
                f"{path}: field 'weight_map' maps {name!r} to {_short(shard)}, not a shard file name such as "
                f'"model-00001-of-00002.safetensors"; {_INDEX_FIX}'
            )
    return weight_map


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return f"{kinds.get(type(value), 'null')} ({_short(value)})"


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_model(folder: Path, files: list[str]) -> dict[str, Any]:
    """Checks that a folder holds a model this pipeline can train.

    Args:
        folder: The model folder.
        files: Its relative file list.

    Returns:
        Metadata: architecture, model_type, num_parameters, dtype, torch_dtype.

    Raises:
        StageError: config.json missing or unparsable, unsupported architecture, tokenizer
            or processor files missing, no safetensors, an indexed shard missing, or an
            unreadable safetensors header. The message names the file and the fix.
    """
    config_path = folder / "config.json"
    if "config.json" not in files:
        raise StageError(f"{folder}: no config.json; this does not look like a Hugging Face model folder")
    config = _read_config(config_path)
    archs = config.get("architectures") or []
    arch = archs[0] if archs else ""
    if arch not in SUPPORTED_ARCHITECTURES:
        raise StageError(
            f"{config_path}: architecture {arch or '(none)'!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    if "tokenizer_config.json" not in files or not (
        "tokenizer.json" in files or {"vocab.json", "merges.txt"} <= set(files)
    ):
        raise StageError(f"{folder}: tokenizer files missing (need tokenizer_config.json and tokenizer.json)")
    if "preprocessor_config.json" not in files and "processor_config.json" not in files:
        raise StageError(f"{folder}: image processor missing (need preprocessor_config.json)")
    shards = [f for f in files if f.endswith(".safetensors")]
    if not shards:
        raise StageError(f"{folder}: no *.safetensors weights; convert the model to safetensors first")
    if "model.safetensors.index.json" in files:
        index_path = folder / "model.safetensors.index.json"
        missing = sorted(set(_read_weight_map(index_path).values()) - set(shards))
        if missing:
            raise StageError(f"{index_path}: shard(s) listed but not present: {', '.join(missing)}")
    n_params, dtypes = 0, {}
    for shard in shards:
        for info in _safetensors_header(folder / shard).values():
            count = 1
            for dim in info["shape"]:
                count *= dim
            n_params += count
            dtypes[info["dtype"]] = dtypes.get(info["dtype"], 0) + count
    text = config.get("text_config") or {}
    return {
        "architecture": arch,
        "model_type": SUPPORTED_ARCHITECTURES[arch],
        "num_parameters": n_params,
        "dtype": max(dtypes, key=dtypes.get) if dtypes else "",
        "torch_dtype": str(config.get("torch_dtype") or config.get("dtype") or text.get("dtype") or ""),
    }


def local_revision(folder: Path, files: list[str], hashes: dict[str, str]) -> str:
    """Returns a content fingerprint of a local folder: 'sha256-' + 16 hex digits."""
    digest = hashlib.sha256()
    for rel in files:
        digest.update(f"{rel}\0{hashes[rel]}\n".encode())
    return "sha256-" + digest.hexdigest()[:16]


def crc32c_file(path: Path) -> str:
    """Returns the base64 crc32c of a file (the form GCS reports), read in 8 MiB chunks."""
    import google_crc32c

    checksum = google_crc32c.Checksum()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            checksum.update(chunk)
    return base64.b64encode(checksum.digest()).decode()


def _select(names: list[str], allow: list[str] | None, ignore: list[str] | None) -> list[str]:
    """Filters relative names by allow/ignore globs (DEFAULT_IGNORE always applies); sorted."""
    patterns = list(DEFAULT_IGNORE) + list(ignore or [])
    return sorted(
        n
        for n in names
        if not any(fnmatch.fnmatch(n, p) for p in patterns) and (not allow or any(fnmatch.fnmatch(n, p) for p in allow))
    )


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


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
            raise _untrusted(self.uri, rel, "a symlink leads outside the entry")
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


def _open_entry(entry: Path | str):
    if str(entry).startswith("gs://"):
        return _gcs.GcsEntry(str(entry))
    return LocalEntry(Path(entry))


def _check_entry(entry) -> tuple[bool, str, dict[str, Any] | None, Any]:
    """Returns (valid, reason, manifest, manifest generation) of an entry."""
    try:
        manifest, generation = entry.read_manifest()
    except (OSError, ValueError) as exc:
        return False, f"unreadable manifest ({exc!r})", {}, None  # {}: present, must be removed
    if manifest is None:
        return False, "no manifest (incomplete entry)", None, None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    for rel in files if isinstance(files, dict) else ():
        if why := _bad_name(rel):
            raise _untrusted(entry.uri, rel, why)  # checked before anything is read
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
        valid, reason, _, _ = _check_entry(_open_entry(entry))
    except StageError as exc:
        return False, str(exc)
    return valid, reason


class _Heartbeat:
    """Holds the entry lock: refreshes it every `every_s` seconds until stopped."""

    def __init__(self, entry, owner: str, every_s: float):
        self._entry, self._owner, self._every = entry, owner, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self._entry.refresh_lock(self._owner)
            except Exception:  # noqa: BLE001 - a missed refresh only risks duplicate work
                log.warning("stage-model: could not refresh the lock of %s", self._entry.uri)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._entry.unlock(self._owner)


def _acquire(entry, owner: str, wait_s: float, stale_s: float, poll_s: float):
    """Takes the entry's lock, or waits while another live stager holds it.

    Returns:
        ("hit", manifest) when the other stager finished a valid entry meanwhile,
        ("locked", None) when this stager holds the lock, ("unlocked", None) after
        `wait_s` (staging then goes on without the lock; it stays correct, see module doc).
    """
    deadline = time.monotonic() + wait_s
    waited = False
    while True:
        if entry.try_lock(owner, stale_s):
            # Double-checked: another stager may have finished between our first check and the lock.
            valid, _, manifest, _ = _check_entry(entry)
            if valid:
                entry.unlock(owner)
                return "hit", manifest
            return "locked", None
        if not waited:
            log.info("stage-model: %s is being staged by another run; waiting", entry.uri)
        waited = True
        valid, _, manifest, _ = _check_entry(entry)
        if valid:
            return "hit", manifest
        if time.monotonic() > deadline:
            log.warning("stage-model: lock of %s still held after %.0f s; staging without it", entry.uri, wait_s)
            return "unlocked", None
        time.sleep(poll_s)


def _parallel(
    fn, items: list, workers: int, total_bytes: int, progress: bool, desc: str, measure=None, every_s: float = 2.0
) -> list:
    """Runs fn(item) -> bytes on a thread pool; returns results in order.

    With `progress`, logs bytes done / total, the rate and the ETA, at most one line per 5 % or
    30 s, whichever comes later (`components.common.progress`): bytes of finished files, or, with
    `measure` (a function returning the bytes written so far, partial files included), what it
    measures every `every_s` seconds, so one large file shows its progress too.
    """
    bar = Progress(f"stage-model: {desc}", total_bytes, "bytes", enabled=progress and bool(items))
    with bar, bar.watching(measure, every_s), ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(fn, item) for item in items]
        out = []
        try:
            done = 0
            for fut in futures:
                n = fut.result()
                done += n if isinstance(n, int) else 0
                bar.set(done)
                out.append(n)
        except BaseException:
            for fut in futures:  # the first failure stops the rest (a full disk: no more copies)
                fut.cancel()
            raise
        return out


@dataclass
class _Prepared:
    """A source ready to publish: complete local files, their checksums and model facts."""

    folder: Path
    files: list[str]
    infos: dict[str, dict[str, Any]]
    meta: dict[str, Any]


def _prepare_local(src: Path, files: list[str], workers: int, progress: bool = False) -> _Prepared:
    """Checks the model and hashes its files (sha256 and crc32c: two reads of every byte, logged with `progress`)."""
    meta = check_model(src, files)
    sizes = {rel: (src / rel).stat().st_size for rel in files}
    bar = Progress(f"stage-model: checksums of {src}", 2 * sum(sizes.values()), "bytes", enabled=progress)

    def hashed(fn, rel: str) -> str:
        digest = fn(src / rel)
        bar.update(sizes[rel])
        return digest

    with bar, ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        shas = list(pool.map(lambda rel: hashed(sha256_file, rel), files))
        crcs = list(pool.map(lambda rel: hashed(crc32c_file, rel), files))
    infos = {rel: {"size": sizes[rel], "sha256": s, "crc32c": c} for rel, s, c in zip(files, shas, crcs)}
    return _Prepared(src, files, infos, meta)


def _download(
    spec: SourceSpec, listing: Listing, files: list[str], workdir: Path, workers: int, progress: bool
) -> _Prepared:
    """Fetches the files of a remote source into workdir, checks sizes and known checksums."""

    def fetch(rel: str) -> int:
        try:
            path = listing.fetch(rel, workdir)
        except OSError as exc:
            if exc.errno in _NO_SPACE:
                need = sum(listing.files[r] for r in files)
                raise StageError(
                    f"no space left on device while downloading {rel} of {spec.uri} to {workdir}: "
                    f"the download needs {_size(need)}; free that much there or set TMPDIR to a larger disk"
                ) from None
            raise
        if path != workdir / rel:
            (workdir / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, workdir / rel)
        return (workdir / rel).stat().st_size

    total = sum(listing.files[r] for r in files)
    _parallel(fetch, files, workers, total, progress, f"download {spec.uri}", measure=lambda: tree_bytes(workdir))
    for rel in files:
        size = (workdir / rel).stat().st_size
        if listing.files[rel] and size != listing.files[rel]:
            raise StageError(
                f"model source {spec.uri}: {rel} downloaded {size} bytes, expected {listing.files[rel]}; stage again"
            )
    prepared = _prepare_local(workdir, files, workers, progress)
    for rel, known in listing.expected.items():
        for kind, value in known.items():
            if rel in prepared.infos and prepared.infos[rel][kind] != value:
                raise StageError(f"model source {spec.uri}: {rel} {kind} differs from the source's; stage again")
    return prepared


def _entry_for(cache: str, spec: SourceSpec, revision: str):
    if cache.startswith("gs://"):
        return _gcs.GcsEntry("/".join([cache.rstrip("/"), spec.scheme, *spec.parts, revision]))
    root = Path(cache).expanduser().resolve()
    return LocalEntry(root.joinpath(spec.scheme, *spec.parts, revision))


@dataclass(frozen=True)
class _Locking:
    """How a stager waits for another one of the same entry (see `stage_model`'s lock_* arguments)."""

    wait_s: float = 4 * 3600.0
    stale_s: float = 300.0
    poll_s: float = 2.0


@dataclass
class _Resolved:
    """A source resolved to exact files and the revision that names its cache entry."""

    uri: str
    files: list[str]
    revision: str  # the entry's name: commit hash or content fingerprint (+ selection suffix)
    listing: Listing | None = None  # remote sources: where to download the files from
    prepared: _Prepared | None = None  # local sources: hashed in place, nothing to download

    @property
    def source_revision(self) -> str:
        """The revision the manifest records (the source's own, without a selection suffix)."""
        return self.listing.revision if self.listing else self.revision


def _stage(
    spec: SourceSpec,
    cache: str,
    *,
    allow: list[str] | None,
    ignore: list[str] | None,
    token_from: str | None,
    workers: int,
    progress: bool,
    locking: _Locking,
) -> StageResult:
    """Stages a parsed source: resolve it, reuse a valid entry, else copy it in under the entry's lock."""
    _check_cache(cache)
    if spec.scheme == "local":
        source = _resolve_local(spec, allow, ignore, workers, progress)
    else:
        source = _resolve_remote(spec, allow, ignore, token_from)
    entry = _entry_for(cache, spec, source.revision)
    valid, reason, manifest, _ = _check_entry(entry)
    if valid:
        return _result(entry, True, 0, manifest)
    if manifest:  # a staged entry whose files changed since (a file edited, truncated or removed in the cache)
        log.warning("stage-model: the model cache entry %s changed since it was staged (%s); staging it again",
                    entry.uri, reason)  # fmt: skip
    else:
        log.info("stage-model: staging %s into %s (%s)", source.uri, entry.uri, reason)
    return _stage_locked(entry, spec, source, workers=workers, progress=progress, locking=locking)


def _check_cache(cache: str) -> None:
    """Fails fast on a cache that cannot work: a gs:// bucket that does not exist, an unknown
    scheme, a local path that is, or lies under, a file."""
    if cache.startswith("gs://"):
        try:
            _gcs.GcsEntry(cache.rstrip("/") + "/x").check_bucket()
        except FileNotFoundError:
            raise StageError(f"model cache {cache}: bucket not found; create it or fix the cache URI") from None
        return
    if "://" in cache:
        raise StageError(f"model cache {cache!r}: unknown scheme; use gs://bucket/prefix or a local folder")
    path = Path(cache).expanduser()
    for folder in (path, *path.parents):
        if folder.exists():  # the nearest existing one: a folder, or nothing can be created below
            if not folder.is_dir():
                raise StageError(
                    f"model cache {cache}: {folder} is a file, not a folder; "
                    "point model.cache at a folder (or move the file)"
                )
            return


def _resolve_local(
    spec: SourceSpec, allow: list[str] | None, ignore: list[str] | None, workers: int, progress: bool = False
) -> _Resolved:
    """Lists, checks and hashes a local model folder; its revision is the content fingerprint."""
    src = Path(spec.uri).expanduser()
    if not src.is_dir():
        raise StageError(f"model source {spec.uri!r}: folder not found; pass an existing model folder")
    src = src.resolve()
    files = list_files(src, allow, ignore)
    if not files:
        raise StageError(f"model source {src}: no files to stage (after allow/ignore patterns)")
    prepared = _prepare_local(src, files, workers, progress)
    hashes = {rel: info["sha256"] for rel, info in prepared.infos.items()}
    return _Resolved(str(src), files, local_revision(src, files, hashes), prepared=prepared)


def _resolve_remote(
    spec: SourceSpec, allow: list[str] | None, ignore: list[str] | None, token_from: str | None
) -> _Resolved:
    """Resolves a gs://, hf:// or ms:// source to its file listing and exact revision (nothing downloaded)."""
    if spec.scheme == "gs":
        try:
            objects = _gcs.list_source(spec.uri)
        except FileNotFoundError as exc:
            raise StageError(f"model source {spec.uri}: {exc}; check the bucket name") from None
        if not objects:
            raise StageError(f"model source {spec.uri}: no objects under this prefix; check the path")
        names = _select(list(objects), allow, ignore)
        listing = Listing(
            fingerprint({n: objects[n][1] for n in names}),
            {n: objects[n][0] for n in names},
            lambda rel, workdir: _gs_fetch(spec.uri, rel, workdir),
            {n: {"crc32c": objects[n][1]} for n in names},
        )
    else:
        token = read_token(token_from, "HF_TOKEN" if spec.scheme == "hf" else "MODELSCOPE_API_TOKEN")
        listing = resolve_hf(spec, token) if spec.scheme == "hf" else resolve_ms(spec, token)
    files = _select(list(listing.files), allow, ignore)
    if not files:
        raise StageError(f"model source {spec.uri}: no files to stage (after allow/ignore patterns)")
    for rel in files:
        if why := _bad_name(rel):
            raise StageError(
                f"model source {spec.uri}: file {rel!r} is not a path inside the model folder ({why}); "
                "rename or delete it at the source, or skip it with --ignore (model.ignore)"
            )
    if "config.json" not in files:
        raise StageError(f"model source {spec.uri}: no config.json; not a Hugging Face model repo/folder")
    if not any(f.endswith(".safetensors") for f in files):
        raise StageError(
            f"model source {spec.uri}: no *.safetensors weights; use a safetensors revision or convert the model first"
        )
    revision = listing.revision
    if spec.scheme in ("hf", "ms") and (allow or ignore):  # a file selection is its own entry
        revision += "-" + fingerprint({f: "" for f in files})[len("sha256-") :][:8]
    return _Resolved(spec.uri, files, revision, listing=listing)


def _stage_locked(
    entry, spec: SourceSpec, source: _Resolved, *, workers: int, progress: bool, locking: _Locking
) -> StageResult:
    """Takes the entry's lock (or finds another stager's finished entry), then downloads and publishes."""
    owner = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    # Five beats per stale bound, so that a short bound never looks stale while the holder lives;
    # the bound is at least five of the entry's shortest beats (Cloud Storage: 1 s, its write rate).
    stale_s = max(locking.stale_s, 5 * entry.heartbeat_min_s)
    state, theirs = _acquire(entry, owner, locking.wait_s, stale_s, locking.poll_s)
    if state == "hit":
        return _result(entry, True, 0, theirs)
    heartbeat = _Heartbeat(entry, owner, stale_s / 5) if state == "locked" else None
    workdir = None
    try:
        prepared = source.prepared
        if prepared is None:
            _remove_dead_workdirs()
            workdir = Path(tempfile.mkdtemp(prefix=f"stage-model-{_lock.tag()}-"))
            prepared = _download(spec, source.listing, source.files, workdir, workers, progress)
        return _publish(entry, prepared, _manifest(spec, source, prepared), workers, progress)
    finally:
        if heartbeat:
            heartbeat.stop()
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def _remove_dead_workdirs() -> None:
    """Removes download folders of stagers of this host that are gone (killed mid-download)."""
    for folder in Path(tempfile.gettempdir()).glob("stage-model-*"):
        if folder.is_dir() and not folder.is_symlink() and _lock.tagged_by_gone_process(folder.name):
            shutil.rmtree(folder, ignore_errors=True)


def _manifest(spec: SourceSpec, source: _Resolved, prepared: _Prepared) -> dict[str, Any]:
    """The entry's manifest: files with sizes and checksums, source, revisions, time, model facts."""
    return {
        "version": MANIFEST_VERSION,
        "source": source.uri,
        "scheme": spec.scheme,
        "requested_revision": spec.revision or "",
        "revision": source.source_revision,
        "created": _now(),
        "total_bytes": sum(i["size"] for i in prepared.infos.values()),
        "files": prepared.infos,
        "model": prepared.meta,
    }


def _gs_fetch(uri: str, rel: str, workdir: Path) -> Path:
    _gcs.download(uri, rel, workdir / rel)
    return workdir / rel


def _publish(entry, prepared: _Prepared, manifest: dict[str, Any], workers: int, progress: bool) -> StageResult:
    """Copies the missing or bad files into the entry, then writes the manifest last."""
    _, _, old, generation = _check_entry(entry)
    if old is not None:  # a manifest that does not verify must not vouch for a repair in progress
        entry.delete_manifest(generation)
    good = entry.good_files(prepared.infos)
    todo = [rel for rel in prepared.files if rel not in good]

    def put(rel: str) -> int:
        try:
            return entry.put(prepared.folder / rel, rel, prepared.infos[rel])
        except _gcs.ChecksumError as exc:
            raise StageError(f"{exc}; stage again") from None
        except OSError as exc:
            if exc.errno not in _NO_SPACE:
                raise
            need = sum(prepared.infos[r]["size"] for r in todo)
            free = _free_bytes(entry.path) if isinstance(entry, LocalEntry) else 0
            if need > free:
                fix = f"free {_size(need - free)} (the entry needs {_size(need)}, {_size(free)} is free)"
            else:  # the disk says there is room: a quota or the inodes ran out
                fix = f"free {_size(need)} (the entry needs that much; a quota or the inodes may be the limit)"
            raise StageError(
                f"no space left on device while copying {prepared.folder / rel} to {entry.uri}/{rel}: "
                f"{fix} or point model.cache elsewhere"
            ) from None

    total = sum(prepared.infos[r]["size"] for r in todo)
    measure = None
    if isinstance(entry, LocalEntry):  # partial copies are written beside their files: count them as they grow
        before = tree_bytes(entry.path)
        measure = lambda: tree_bytes(entry.path) - before  # noqa: E731
    copied = sum(_parallel(put, todo, workers, total, progress, f"copy to {entry.uri}", measure=measure))
    if isinstance(entry, LocalEntry):
        check_model(entry.path, prepared.files)
    if not entry.write_manifest(manifest):
        # Another stager finished first. Keep its manifest if it verifies, else replace it.
        valid, _, theirs, generation = _check_entry(entry)
        if valid:
            return _result(entry, False, copied, theirs)
        entry.write_manifest(manifest, replace_generation=generation)
    valid, reason, final, _ = _check_entry(entry)
    if not valid:
        entry.delete_manifest()
        raise StageError(f"cache entry {entry.uri}: does not verify after copying ({reason}); stage again")
    return _result(entry, False, copied, final)


def _free_bytes(path: Path) -> int:
    """Free bytes on the file system of a path (of its nearest existing folder); 0 if unknown."""
    for folder in (path, *path.parents):
        try:
            return shutil.disk_usage(folder).free
        except OSError:
            continue
    return 0


def _result(entry, cache_hit: bool, copied: int, manifest: dict[str, Any]) -> StageResult:
    return StageResult(entry.uri, cache_hit, copied, manifest, {**manifest.get("model", {}), "cache_hit": cache_hit})


def stage_local(
    source: str | Path,
    cache: str | Path,
    allow: list[str] | None = None,
    ignore: list[str] | None = None,
) -> StageResult:
    """Stages a local model folder into the model cache (a local folder or gs://).

    Args:
        source: The model folder.
        cache: Cache root; the entry is `<cache>/local/<folder name>/<content revision>/`.
        allow: Only stage files matching these globs. Default None (all).
        ignore: Skip files matching these globs. Default None.

    Returns:
        The StageResult; `cache_hit` is True when the entry was already valid.

    Raises:
        StageError: The source is missing or not a valid model (see `check_model`), or a
            file changed while being copied. Nothing is left that looks like a valid entry.
    """
    path = Path(source).expanduser()
    spec = SourceSpec("local", str(path), [path.resolve().name], None)
    return _stage(
        spec, str(cache), allow=allow, ignore=ignore, token_from=None, workers=8, progress=False, locking=_Locking()
    )


def stage_model(
    source: str,
    cache: str,
    allow: list[str] | None = None,
    ignore: list[str] | None = None,
    *,
    revision: str | None = None,
    token_from: str | None = None,
    workers: int = 8,
    progress: bool = False,
    lock_wait_s: float = None,
    lock_stale_s: float = None,
    poll_s: float = None,
) -> StageResult:
    """Stages a model from any supported source into the cache (the component's core).

    Args:
        source: `hf://org/name[@rev]`, `ms://org/name[@rev]`, `gs://bucket/prefix` or a
            local model folder.
        cache: Cache root: a local folder or `gs://bucket/prefix`. The entry is
            `<cache>/<scheme>/<org>/<name>/<revision>/` (hf/ms: commit hash, plus a
            selection suffix when allow/ignore are given; gs/local: content fingerprint).
        allow: Only stage files matching these globs. Default None (all).
        ignore: Skip files matching these globs (e.g. '*.bin', 'original/*'). Default None.
        revision: Branch, tag or commit for hf/ms sources. Default None (main/master).
        token_from: Hub token source: 'env:VAR' or a Secret Manager name
            'projects/P/secrets/S[/versions/V]'. Default None: $HF_TOKEN /
            $MODELSCOPE_API_TOKEN if set. Never the token itself.
        workers: Files copied in parallel. Default 8.
        progress: Log bytes downloaded / checksummed / copied of the total, the rate and the ETA
            on stderr, at most one line per 5 % or 30 s (whichever comes later). Default False.
        lock_wait_s: Longest wait, in seconds, for another stager of the same entry
            before staging without the lock. Default 4 h.
        lock_stale_s: A lock not refreshed for this many seconds is taken over. Default 300.
            The holder refreshes it five times per bound; on a gs:// cache the bound is at
            least 5 s (one lock write a second). A lock whose owner ran on this host and is
            gone (killed) is taken over at once, whatever the bound.
        poll_s: Seconds between checks while waiting. Default 2.

    Returns:
        The StageResult; `entry` is a folder or a gs:// URI.

    Raises:
        StageError: Unknown scheme, repo/revision/bucket not found, no permission, no
            safetensors, unsupported architecture, a cache path under a file, a manifest
            or source file name outside its folder, a full disk, or any copy failure. One
            line naming the source or file and the fix; no valid-looking partial entry and
            no partial file is left.
    """
    from google.api_core import exceptions as gex
    from google.auth import exceptions as gauth

    try:
        spec = parse_source(source, revision)
        default = _Locking()
        locking = _Locking(
            default.wait_s if lock_wait_s is None else lock_wait_s,
            default.stale_s if lock_stale_s is None else lock_stale_s,
            default.poll_s if poll_s is None else poll_s,
        )
        return _stage(
            spec,
            cache,
            allow=allow,
            ignore=ignore,
            token_from=token_from,
            workers=workers,
            progress=progress,
            locking=locking,
        )
    except SourceError as exc:
        raise StageError(str(exc)) from None
    except gex.Forbidden:
        raise StageError(
            f"model source {source} / cache {cache}: no permission on Cloud Storage; grant the "
            "service account roles/storage.objectAdmin on the cache bucket "
            "(objectViewer on the source)"
        ) from None
    except gauth.DefaultCredentialsError:
        raise StageError(
            f"model source {source} / cache {cache}: no Google credentials for Cloud Storage; run "
            "`gcloud auth application-default login` or run on Vertex with a service account"
        ) from None
    except gex.NotFound as exc:
        raise StageError(
            f"model source {source} / cache {cache}: not found on Cloud Storage "
            f"({exc.__class__.__name__}); check the bucket and prefix"
        ) from None
    except OSError as exc:
        raise StageError(_os_error_message(exc, source, cache)) from None


def _os_error_message(exc: OSError, source: str, cache: str) -> str:
    """One line for a file system error the steps above did not name: the path and the fix."""
    where = exc.filename or f"model source {source} / cache {cache}"
    if exc.errno in _NO_SPACE:
        return f"no space left on device writing {where}: free space there or point model.cache elsewhere"
    what = exc.strerror or exc.__class__.__name__  # never str(exc): it may quote a request
    if not exc.filename:
        return f"{where}: {what}; check the network and the paths, then stage again"
    return f"{where}: {what}; check that the path exists and is writable (model source {source}, cache {cache})"


def result_summary(result: StageResult) -> dict[str, Any]:
    """Returns the JSON-able facts of a StageResult (for logs and artifact metadata)."""
    out = asdict(result)
    out.pop("manifest")
    out.update(out.pop("metadata"))  # architecture, model_type, ... at the top level
    out["revision"] = result.manifest.get("revision", "")
    out["source"] = result.manifest.get("source", "")
    out["total_bytes"] = result.manifest.get("total_bytes", 0)
    out["fuse_path"] = _gcs.to_fuse_path(result.entry)
    return out
