"""Cloud Storage helpers shared by the components: gs:// <-> /gcs/ paths and a client.

On Vertex, Cloud Storage is mounted with FUSE under /gcs/, so a task reads gs://b/p as
/gcs/b/p. The client honours STORAGE_EMULATOR_HOST (anonymous credentials), which is how
the tests run against gcp-storage-emulator. `read_bytes` reads an object, retrying
transient failures (`components.common.retry`); other reads take `retry.gcs_retry(...)`
as their `retry=` argument.
"""

from __future__ import annotations

import os

from components.common import retry as _retry

FUSE_ROOT = "/gcs"


def split_gs(uri: str) -> tuple[str, str]:
    """Splits 'gs://bucket/a/b/' into ('bucket', 'a/b'); the prefix has no slashes at its ends."""
    if not uri.startswith("gs://"):
        raise ValueError(f"{uri!r} is not a gs:// URI")
    bucket, _, prefix = uri[len("gs://") :].partition("/")
    if not bucket:
        raise ValueError(f"{uri!r} has no bucket")
    return bucket, prefix.strip("/")


def to_fuse_path(uri: str, root: str = FUSE_ROOT) -> str:
    """Maps gs://bucket/p to the Cloud Storage FUSE path /gcs/bucket/p (Vertex mounts it there).

    Args:
        uri: A gs:// URI.
        root: Mount point. Default '/gcs'.

    Returns:
        The FUSE path; other strings are returned unchanged.
    """
    if not uri.startswith("gs://"):
        return uri
    bucket, prefix = split_gs(uri)
    return f"{root}/{bucket}/{prefix}".rstrip("/")


def from_fuse_path(path: str, root: str = FUSE_ROOT) -> str:
    """Maps /gcs/bucket/p back to gs://bucket/p; other strings are returned unchanged."""
    if path == root or not path.startswith(root + "/"):
        return path
    return "gs://" + path[len(root) + 1 :]


def client():
    """Returns a storage client; honours STORAGE_EMULATOR_HOST (then no credentials)."""
    from google.cloud import storage

    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(
            project=os.environ.get("GOOGLE_CLOUD_PROJECT", "emulator"), credentials=AnonymousCredentials()
        )
    return storage.Client()


def read_bytes(
    uri: str,
    timeout: float = 60.0,
    if_generation_match: int | None = None,
    gcs_client=None,
    policy: _retry.Policy | None = None,
    tally: _retry.Tally | None = None,
) -> bytes:
    """Downloads a gs:// object, retrying transient failures (429, 5xx, resets, timeouts).

    Args:
        uri: gs://bucket/object.
        timeout: Seconds each attempt may take. Default 60.
        if_generation_match: Read only this generation (a precondition: a 412 is never
            retried). Default None (the live object).
        gcs_client: A storage client. Default: `client()`.
        policy: Retry policy. Default: `retry.DEFAULT`.
        tally: Counts the failed attempts, for the caller's message. Default: none.

    Returns:
        The object's bytes.

    Raises:
        google.api_core.exceptions.GoogleAPICallError: NotFound, Forbidden,
            PreconditionFailed at once; a transient error after the policy's attempts.
        google.api_core.exceptions.RetryError: the policy's deadline passed while retrying.
        ValueError: uri is not a gs:// URI with an object name.
    """
    bucket, _, name = uri[len("gs://") :].partition("/")  # the object name as written: no slashes stripped
    if not uri.startswith("gs://") or not bucket or not name:
        raise ValueError(f"{uri!r} names no object; expected gs://bucket/object")
    blob = (gcs_client or client()).bucket(bucket).blob(name)
    return blob.download_as_bytes(
        timeout=timeout,
        if_generation_match=if_generation_match,
        retry=_retry.gcs_retry(uri, policy, tally),
    )
