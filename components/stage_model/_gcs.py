"""gs:// paths, the /gcs/ FUSE mapping, and a cache entry stored in Cloud Storage.

An entry is the object prefix `gs://BUCKET/<prefix>/` holding the model files and
`manifest.json`. Object uploads are atomic (a reader sees a whole old or a whole new
object, never a torn one), which is what makes concurrent stagers safe; see core.py.

Emulator limits (gcp-storage-emulator 2026.7.19, checked): ifGenerationMatch
preconditions are ignored on upload and delete, compose returns 404, crc32c is computed
server-side and a client-sent crc32c is validated, rewrite/copy works. The code below
uses preconditions (create-only manifest and lock) for real GCS but does not depend on
them for correctness.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from components.common.storage import FUSE_ROOT, client, from_fuse_path, split_gs, to_fuse_path  # noqa: F401 - shared helpers
from components.stage_model import _lock

log = logging.getLogger("stage_model")


class GcsEntry:
    """A cache entry under gs://bucket/prefix/ (see LocalEntry in entry.py for the contract)."""

    heartbeat_min_s = 1.0  # Cloud Storage takes about one write a second to one object name

    def __init__(self, uri: str, gcs_client=None):
        self.bucket_name, self.prefix = split_gs(uri)
        self.uri = f"gs://{self.bucket_name}/{self.prefix}"
        self._client = gcs_client or client()
        self.bucket = self._client.bucket(self.bucket_name)

    def _name(self, rel: str) -> str:
        return f"{self.prefix}/{rel}"

    def check_bucket(self) -> None:
        """Raises NotFound/Forbidden early when the bucket is missing or not ours."""
        from google.api_core import exceptions as gex

        try:
            next(iter(self._client.list_blobs(self.bucket_name, prefix=self.prefix + "/", max_results=1)), None)
        except gex.NotFound:
            raise FileNotFoundError(f"bucket gs://{self.bucket_name} not found") from None

    def listing(self) -> dict[str, tuple[int, str]]:
        """Returns {relative name: (size, crc32c base64)} of the objects under the entry."""
        out = {}
        for blob in self._client.list_blobs(self.bucket_name, prefix=self.prefix + "/"):
            out[blob.name[len(self.prefix) + 1 :]] = (blob.size, blob.crc32c)
        return out

    def read_manifest(self) -> tuple[dict[str, Any] | None, Any]:
        """Returns (manifest or None if absent, its generation)."""
        from google.api_core import exceptions as gex

        blob = self.bucket.blob(self._name("manifest.json"))
        try:
            raw = blob.download_as_bytes()
        except gex.NotFound:
            return None, None
        return json.loads(raw), blob.generation

    def verify(self, manifest: dict[str, Any]) -> tuple[bool, str]:
        """Checks every manifest file's size and crc32c against the object listing (reads no data)."""
        present = self.listing()
        for rel, info in manifest["files"].items():
            if rel not in present:
                return False, f"{rel}: missing"
            size, crc = present[rel]
            if size != info["size"]:
                return False, f"{rel}: size {size} != {info['size']}"
            if crc != info["crc32c"]:
                return False, f"{rel}: crc32c mismatch"
        return True, "ok"

    def good_files(self, expected: dict[str, dict[str, Any]]) -> set[str]:
        """Returns the relative names whose object matches the expected size and crc32c."""
        present = self.listing()
        return {rel for rel, info in expected.items() if present.get(rel) == (info["size"], info["crc32c"])}

    def put(self, local: Path, rel: str, info: dict[str, Any]) -> int:
        """Uploads one file; the server checks the crc32c we send, so a changed file fails."""
        from google.api_core import exceptions as gex
        from google.resumable_media import common

        blob = self.bucket.blob(self._name(rel), chunk_size=16 * 1024 * 1024)
        blob.crc32c = info["crc32c"]
        try:
            blob.upload_from_filename(str(local), checksum="crc32c", timeout=600)
        except (gex.BadRequest, gex.Conflict, common.DataCorruption) as exc:
            raise ChecksumError(f"{local}: crc32c of the upload differs ({exc.__class__.__name__})") from None
        blob.reload()
        if blob.crc32c != info["crc32c"] or blob.size != info["size"]:
            raise ChecksumError(f"{local}: changed while being copied (crc32c differs)")
        return info["size"]

    def write_manifest(self, manifest: dict[str, Any], replace_generation: Any = None) -> bool:
        """Writes manifest.json create-only (ifGenerationMatch=0); False when one already exists."""
        from google.api_core import exceptions as gex

        blob = self.bucket.blob(self._name("manifest.json"))
        match = 0 if replace_generation is None else replace_generation
        try:
            blob.upload_from_string(
                json.dumps(manifest, indent=2, sort_keys=True),
                content_type="application/json",
                if_generation_match=match,
            )
        except gex.PreconditionFailed:
            return False
        return True

    def delete_manifest(self, generation: Any = None) -> None:
        from google.api_core import exceptions as gex

        try:
            self.bucket.blob(self._name("manifest.json")).delete(if_generation_match=generation)
        except (gex.NotFound, gex.PreconditionFailed):
            pass

    # The lock is `<entry>.lock`, beside the entry so that it never shows in the model folder.
    def try_lock(self, owner: str, stale_s: float) -> bool:
        """Creates the lock object create-only; True when this owner holds it afterwards."""
        from google.api_core import exceptions as gex

        name = self.prefix + ".lock"
        for _ in range(2):  # once more right after removing an abandoned lock
            try:
                # Look first: the emulator ignores ifGenerationMatch, real GCS enforces it below.
                if self.bucket.get_blob(name) is not None:
                    raise gex.PreconditionFailed("lock exists")
                self.bucket.blob(name).upload_from_string(json.dumps(_lock.record(owner)), if_generation_match=0)
            except gex.PreconditionFailed:
                if not self._take_over(stale_s):
                    return False
                continue
            # Read back: where preconditions are not enforced (the emulator) the last writer wins.
            try:
                return json.loads(self.bucket.blob(name).download_as_bytes()).get("owner") == owner
            except (gex.NotFound, ValueError, AttributeError):
                return False
        return False

    def _take_over(self, stale_s: float) -> bool:
        """Deletes the lock if its owner is gone or its heartbeat is stale; True when it is gone."""
        from google.api_core import exceptions as gex

        current = self.bucket.get_blob(self.prefix + ".lock")
        if current is None:
            return True
        try:
            held = json.loads(current.download_as_bytes())
        except gex.NotFound:
            return True
        except ValueError:
            held = {}
        held = held if isinstance(held, dict) else {}
        try:
            age = time.time() - float(held.get("time", 0))
        except (TypeError, ValueError):
            age = float("inf")
        why = _lock.abandoned(held, age, stale_s)
        if not why:
            return False
        try:  # only the stager that deletes this very generation wins
            current.delete(if_generation_match=current.generation)
        except (gex.NotFound, gex.PreconditionFailed):
            return False
        log.warning("stage-model: took over the lock of %s: %s", self.uri, why)
        return True

    def refresh_lock(self, owner: str) -> None:
        """Rewrites the lock's time (heartbeat) if this owner still holds it."""
        from google.api_core import exceptions as gex

        blob = self.bucket.get_blob(self.prefix + ".lock")
        if blob is None:
            return
        try:
            held = json.loads(blob.download_as_bytes())
            if held.get("owner") == owner:
                held["time"] = time.time()
                self.bucket.blob(self.prefix + ".lock").upload_from_string(
                    json.dumps(held), if_generation_match=blob.generation
                )
        except (gex.NotFound, gex.PreconditionFailed, ValueError, AttributeError):
            pass

    def unlock(self, owner: str) -> None:
        from google.api_core import exceptions as gex

        blob = self.bucket.get_blob(self.prefix + ".lock")
        if blob is None:
            return
        try:
            if json.loads(blob.download_as_bytes()).get("owner") == owner:
                blob.delete(if_generation_match=blob.generation)
        except (gex.NotFound, gex.PreconditionFailed, ValueError, AttributeError):
            pass


class ChecksumError(RuntimeError):
    """An uploaded object's checksum differs from the file's."""


def list_source(uri: str, gcs_client=None) -> dict[str, tuple[int, str]]:
    """Lists a gs:// model folder: {relative name: (size, crc32c)}.

    Raises:
        FileNotFoundError: The bucket does not exist.
    """
    from google.api_core import exceptions as gex

    bucket, prefix = split_gs(uri)
    c = gcs_client or client()
    base = prefix + "/" if prefix else ""
    try:
        return {
            b.name[len(base) :]: (b.size, b.crc32c)
            for b in c.list_blobs(bucket, prefix=base)
            if not b.name.endswith("/")
        }
    except gex.NotFound:
        raise FileNotFoundError(f"bucket gs://{bucket} not found") from None


def download(uri: str, rel: str, dst: Path, gcs_client=None) -> None:
    """Downloads gs://bucket/prefix/rel to dst (client-side crc32c check)."""
    bucket, prefix = split_gs(uri)
    c = gcs_client or client()
    name = f"{prefix}/{rel}" if prefix else rel
    dst.parent.mkdir(parents=True, exist_ok=True)
    c.bucket(bucket).blob(name).download_to_filename(str(dst), checksum="crc32c", timeout=600)
