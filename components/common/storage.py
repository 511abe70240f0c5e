"""Cloud Storage helpers shared by the components: gs:// <-> /gcs/ paths and a client.

On Vertex, Cloud Storage is mounted with FUSE under /gcs/, so a task reads gs://b/p as
/gcs/b/p. The client honours STORAGE_EMULATOR_HOST (anonymous credentials), which is how
the tests run against gcp-storage-emulator.
"""

from __future__ import annotations

import os

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
