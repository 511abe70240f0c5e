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

The pieces: `sources` (resolve and download), `metadata` (what a model must hold), `listing`
(file selection, checksums), `entry` (manifests, the local entry), `locking`, `transfer`
(hash, copy, publish); this module runs them in order.

Hostile or careless input is refused with a StageError, never read or written through: a
manifest (or source listing) naming a path that is not plainly inside the entry (absolute,
`..`, backslash, drive letter, empty segment, a symlink out of the entry), a cache path
under a file, a full disk.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

from components.common.model_sources import SourceError, SourceSpec, parse_source
from components.stage_model import _gcs, _lock
from components.stage_model._gcs import from_fuse_path, to_fuse_path  # noqa: F401 - public helpers
from components.stage_model.entry import MANIFEST_VERSION, StageResult, check_entry, entry_for, entry_result
from components.stage_model.errors import NO_SPACE, StageError
from components.stage_model.locking import Heartbeat, Locking, acquire
from components.stage_model.sources import Resolved, download, resolve_local, resolve_remote
from components.stage_model.transfer import Prepared, publish

log = logging.getLogger("stage_model")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _stage(
    spec: SourceSpec,
    cache: str,
    *,
    allow: list[str] | None,
    ignore: list[str] | None,
    token_from: str | None,
    workers: int,
    progress: bool,
    locking: Locking,
) -> StageResult:
    """Stages a parsed source: resolve it, reuse a valid entry, else copy it in under the entry's lock."""
    _check_cache(cache)
    if spec.scheme == "local":
        source = resolve_local(spec, allow, ignore, workers, progress)
    else:
        source = resolve_remote(spec, allow, ignore, token_from)
    entry = entry_for(cache, spec, source.revision)
    valid, reason, manifest, _ = check_entry(entry)
    if valid:
        return entry_result(entry, True, 0, manifest)
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


def _stage_locked(
    entry, spec: SourceSpec, source: Resolved, *, workers: int, progress: bool, locking: Locking
) -> StageResult:
    """Takes the entry's lock (or finds another stager's finished entry), then downloads and publishes."""
    owner = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    # Five beats per stale bound, so that a short bound never looks stale while the holder lives;
    # the bound is at least five of the entry's shortest beats (Cloud Storage: 1 s, its write rate).
    stale_s = max(locking.stale_s, 5 * entry.heartbeat_min_s)
    state, theirs = acquire(entry, owner, locking.wait_s, stale_s, locking.poll_s)
    if state == "hit":
        return entry_result(entry, True, 0, theirs)
    heartbeat = Heartbeat(entry, owner, stale_s / 5) if state == "locked" else None
    workdir = None
    try:
        prepared = source.prepared
        if prepared is None:
            _remove_dead_workdirs()
            workdir = Path(tempfile.mkdtemp(prefix=f"stage-model-{_lock.tag()}-"))
            prepared = download(spec, source.listing, source.files, workdir, workers, progress)
        return publish(entry, prepared, _manifest(spec, source, prepared), workers, progress)
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


def _manifest(spec: SourceSpec, source: Resolved, prepared: Prepared) -> dict[str, Any]:
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
        spec, str(cache), allow=allow, ignore=ignore, token_from=None, workers=8, progress=False, locking=Locking()
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
        default = Locking()
        locking = Locking(
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
    if exc.errno in NO_SPACE:
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
