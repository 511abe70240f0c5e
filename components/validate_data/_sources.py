"""Where an image reference points, and how its bytes are fetched.

ms-swift accepts an image as a path relative to the JSONL's folder, an absolute path, an
http(s) URL or base64 (a `data:` URI or a bare base64 string longer than 200 characters).
gs:// URIs are accepted too (read with google-cloud-storage, which honours
`STORAGE_EMULATOR_HOST`). Remote and inline images are fetched once per run into a
staging folder, so every later check, and the training task, reads a local file.

Every failure is a `Reject` with a stable code; nothing here raises anything else. An
http(s) download has a total deadline, headers included: urllib's timeout bounds each
socket operation only, so a server that trickles its headers a byte at a time would
never trip it; here a timer shuts the connection's socket down at the deadline. A gs://
download is bounded by google-cloud-storage's own (per request) timeout.

Both retry transient failures (HTTP 408 / 429 / 5xx, connection resets and timeouts)
with exponential backoff before a row is quarantined (`components.common.retry`, one log
line per retry), within the same timeout: no retry starts after it; a 404 or 403 is
quarantined at once.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import hashlib
import http.client
import os
import posixpath
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from components.common import retry
from components.common.files import open_nofollow

MAX_FETCH_BYTES = 64 * 1024 * 1024  # a remote image larger than this is rejected
_BASE64_RE = re.compile(r"^[A-Za-z0-9+/=\s_-]+$")
_DATA_URI_RE = re.compile(r"^data:([^;,]*)(;[^,]*)?,(.*)$", re.DOTALL)


class Reject(Exception):
    """A line fails a check; `code` is one of `types.CODES`."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Source:
    """A resolved image reference.

    Attributes:
        kind: "file", "http", "gs" or "base64".
        location: The local path (file), the URL / gs:// URI, or the base64 payload.
    """

    kind: str
    location: str


def split_gs(uri: str) -> tuple[str, str]:
    """Returns (bucket, object name) of a gs:// URI."""
    rest = uri[len("gs://") :]
    bucket, _, name = rest.partition("/")
    return bucket, name


def resolve(ref: str, base: str) -> Source:
    """Resolves an image reference against the folder of its JSONL file.

    Args:
        ref: The reference as written in the row's `images`.
        base: The JSONL file's folder: a local path or a gs:// prefix.

    Returns:
        The Source.

    Raises:
        Reject: E_IMAGE_PATH when a relative path escapes the dataset folder or the form
            is not supported.
    """
    ref_s = ref.strip()
    if "\0" in ref_s:
        raise Reject(
            "E_IMAGE_PATH",
            f"image {ref[:200]!r} holds a NUL byte (\\u0000), which no file name can: remove it from the path",
        )
    if ref_s.startswith(("http://", "https://")):
        return Source("http", ref_s)
    if ref_s.startswith("gs://"):
        bucket, name = split_gs(ref_s)
        if not bucket or not name:
            raise Reject("E_IMAGE_PATH", f"image {ref!r}: gs:// URI needs a bucket and an object name")
        return Source("gs", ref_s)
    if ref_s.startswith("data:"):
        match = _DATA_URI_RE.match(ref_s)
        if not match or "base64" not in (match.group(2) or ""):
            raise Reject("E_IMAGE_PATH", f"image {ref[:60]!r}...: only base64 data: URIs are supported")
        return Source("base64", match.group(3))
    if "://" in ref_s:
        raise Reject(
            "E_IMAGE_PATH", f"image {ref[:200]!r}: unsupported URL scheme (use a path, http(s)://, gs:// or base64)"
        )
    if base.startswith("gs://"):
        if ref_s.startswith("/"):
            return Source("file", ref_s)
        bucket, prefix = split_gs(base)
        prefix = prefix.strip("/")
        joined = posixpath.normpath(posixpath.join(prefix, ref_s))
        if joined == ".." or joined.startswith("../") or (prefix and not joined.startswith(prefix + "/")):
            raise Reject("E_IMAGE_PATH", f"image {ref!r} escapes the dataset folder {base}")
        return Source("gs", f"gs://{bucket}/{joined}")
    if len(ref_s) > 200 and _BASE64_RE.match(ref_s) and not _names_a_file(ref_s, base):
        return Source("base64", ref_s)
    path = Path(ref_s)
    _check_name_lengths(ref, path)
    if path.is_absolute():
        return Source("file", str(path))
    base_path = Path(base).resolve()
    try:
        resolved = (base_path / path).resolve()
    except RuntimeError:  # Path.resolve's symlink loop (Python 3.11)
        raise Reject("E_IMAGE_PATH", f"image {ref!r} is a symlink loop: point the link at the image file") from None
    except OSError as exc:
        raise Reject("E_IMAGE_PATH", f"image {ref!r} cannot be resolved ({exc}); fix the path") from None
    if not resolved.is_relative_to(base_path):
        raise Reject("E_IMAGE_PATH", f"image {ref!r} escapes the dataset folder {base}")
    return Source("file", str(resolved))


def _names_a_file(ref: str, base: str) -> bool:
    """Whether a reference names an existing file or link (relative to the JSONL file's folder): then it is that
    file, whatever it looks like (a long extension-less path is also valid base64)."""
    try:
        return os.path.lexists(os.path.join(base, ref))
    except (OSError, ValueError):
        return False


MAX_NAME_BYTES = 255  # longest file or folder name (one path component) of Linux file systems and Cloud Storage FUSE


def _check_name_lengths(ref: str, path: Path) -> None:
    """Raises Reject E_IMAGE_PATH when a component of a local image path is longer than MAX_NAME_BYTES."""
    for part in path.parts:
        size = len(part.encode("utf-8", errors="surrogateescape"))
        if size > MAX_NAME_BYTES:
            raise Reject(
                "E_IMAGE_PATH",
                f"image {ref[:80]!r}...: the name {part[:40]!r}... is {size} bytes, over the file system's limit of "
                f"{MAX_NAME_BYTES}; no such file can exist: rename the image and this row's path",
            )


class _Deadline:
    """A download's total deadline: at it, the socket being read is shut down, which ends any read at once."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.end = time.monotonic() + seconds
        self.expired = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def remaining(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no answer within {self.seconds:g} s")
        return left

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            if self.expired:
                self._shut()

    def cancel(self) -> None:
        self._timer.cancel()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            self._shut()

    def _shut(self) -> None:
        try:
            if self._sock is not None:
                self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed


class _DeadlineHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection whose connect uses what is left of the deadline and whose socket the deadline watches."""

    def __init__(self, *args, deadline: _Deadline, **kwargs):
        super().__init__(*args, **kwargs)
        self._deadline = deadline

    def connect(self):
        self.timeout = self._deadline.remaining()  # TCP connect and TLS handshake: each bounded by what is left
        super().connect()
        self._deadline.watch(self.sock)


class _DeadlineHTTPSConnection(http.client.HTTPSConnection):
    """The HTTPS form of _DeadlineHTTPConnection."""

    def __init__(self, *args, deadline: _Deadline, **kwargs):
        super().__init__(*args, **kwargs)
        self._deadline = deadline

    def connect(self):
        self.timeout = self._deadline.remaining()
        super().connect()
        self._deadline.watch(self.sock)


def _opener(deadline: _Deadline) -> urllib.request.OpenerDirector:
    """Returns a urllib opener whose http(s) connections (redirects included) obey `deadline`."""

    class HTTPHandler(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(functools.partial(_DeadlineHTTPConnection, deadline=deadline), req)

    class HTTPSHandler(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(
                functools.partial(_DeadlineHTTPSConnection, deadline=deadline), req, context=self._context
            )

    return urllib.request.build_opener(HTTPHandler, HTTPSHandler)


def _get(url: str, timeout: float, budget: float) -> bytes:
    """One attempt at a URL's body, within `timeout` seconds in all (connect, headers, body).

    Args:
        url: The http(s) URL.
        timeout: Seconds this attempt may take.
        budget: Seconds all attempts together may take (for the message).

    Raises:
        TimeoutError: No complete answer within `timeout`.
        Reject: E_IMAGE_FETCH when the body is larger than MAX_FETCH_BYTES (not retried).
        Exception: urllib's HTTPError / URLError and socket errors, as raised.
    """
    deadline = _Deadline(timeout)
    request = urllib.request.Request(url, headers={"User-Agent": "vlm-lora-validate-data"})
    try:
        with _opener(deadline).open(request, timeout=timeout) as response:
            chunks, size = [], 0
            while True:
                chunk = response.read1(1 << 16)  # what has arrived, so the deadline is checked often
                if deadline.expired:
                    raise TimeoutError(f"no complete answer within {budget:g} s")
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_FETCH_BYTES:
                    raise Reject("E_IMAGE_FETCH", f"image {url!r}: larger than {MAX_FETCH_BYTES} bytes")
                chunks.append(chunk)
            return b"".join(chunks)
    except (Reject, urllib.error.HTTPError):
        raise
    except Exception as exc:  # URLError, OSError, http.client errors: a timeout when the deadline cut them
        reason = getattr(exc, "reason", exc)
        if deadline.expired or isinstance(reason, TimeoutError):
            raise TimeoutError(f"no complete answer within {budget:g} s") from None
        raise
    finally:
        deadline.cancel()


def _fetch_http(url: str, timeout: float, policy: retry.Policy | None = None) -> bytes:
    """Returns a URL's body within `timeout` seconds in all, retrying transient failures inside that budget.

    Args:
        url: The http(s) URL.
        timeout: Seconds the download may take in all: attempts, waits between them, and
            each attempt's connect, headers and body. An attempt gets what is left.
        policy: Retry policy. Default: `retry.DEFAULT` (HTTP 408 / 429 / 5xx and connection
            errors are retried with backoff; Retry-After is honoured, capped). A timeout
            uses up the budget, so it ends the retries.

    Raises:
        Reject: E_IMAGE_MISSING for HTTP 404 / 410, E_IMAGE_FETCH otherwise; the message
            says how many attempts were made.
    """
    policy = policy or retry.DEFAULT
    policy = dataclasses.replace(policy, deadline_s=min(policy.deadline_s, timeout))
    start, tally = time.monotonic(), retry.Tally()

    def attempt() -> bytes:
        return _get(url, max(0.001, timeout - (time.monotonic() - start)), timeout)

    try:
        return retry.call_with_retry(attempt, f"image {url}", policy, tally)
    except Reject:
        raise
    except urllib.error.HTTPError as exc:
        code = "E_IMAGE_MISSING" if exc.code in (404, 410) else "E_IMAGE_FETCH"
        raise Reject(code, f"image {url!r}: HTTP {exc.code} {exc.reason}{_give_up(exc, tally)}") from None
    except TimeoutError as exc:
        raise Reject("E_IMAGE_FETCH", f"image {url!r}: {exc}{_give_up(exc, tally)}") from None
    except Exception as exc:  # noqa: BLE001 - URLError, OSError, http.client errors: a quarantine entry
        reason = getattr(exc, "reason", exc)
        raise Reject("E_IMAGE_FETCH", f"image {url!r}: {reason}{_give_up(exc, tally)}") from None


def _give_up(exc: BaseException, tally: retry.Tally) -> str:
    """Returns the end of a quarantine message: how many attempts, and why no more."""
    if not retry.is_transient(exc):
        status = retry.status_of(exc)
        return f" (not retried: {f'HTTP {status}' if status else 'this error'} is not transient)"
    return f" (gave up after {tally.failures} attempt{'s' if tally.failures != 1 else ''})"


_GCS_CLIENT = threading.local()


def gcs_client():
    """Returns a google-cloud-storage client (per thread; honours STORAGE_EMULATOR_HOST)."""
    from components.common import storage as _storage

    key = os.environ.get("STORAGE_EMULATOR_HOST", "")
    cached = getattr(_GCS_CLIENT, "value", None)
    if cached is None or cached[0] != key:
        _GCS_CLIENT.value = (key, _storage.client())
    return _GCS_CLIENT.value[1]


def read_gs(uri: str, timeout: float, policy: retry.Policy | None = None) -> bytes:
    """Returns the bytes of a gs:// object, retrying transient failures.

    Args:
        uri: gs://bucket/object.
        timeout: Seconds each request may take (google-cloud-storage's timeout); no retry
            starts later than this after the first attempt.
        policy: Retry policy. Default: `retry.DEFAULT` (429, 5xx, resets and timeouts).

    Raises:
        Reject: E_IMAGE_MISSING when the object does not exist, E_IMAGE_FETCH otherwise
            (the message says how many attempts were made).
    """
    from google.api_core import exceptions as gexc

    from components.common import storage as _storage

    policy = policy or retry.DEFAULT
    policy = dataclasses.replace(policy, deadline_s=min(policy.deadline_s, timeout))  # no retry starts later
    tally = retry.Tally()
    try:
        return _storage.read_bytes(uri, timeout=timeout, gcs_client=gcs_client(), policy=policy, tally=tally)
    except Exception as exc:  # noqa: BLE001 - any client error becomes a quarantine entry
        if isinstance(exc, gexc.NotFound):
            raise Reject("E_IMAGE_MISSING", f"image {uri!r} not found") from None
        cause = exc.cause if isinstance(exc, gexc.RetryError) and exc.cause is not None else exc
        raise Reject(
            "E_IMAGE_FETCH", f"image {uri!r}: {type(cause).__name__}: {str(cause)[:300]}{_give_up(cause, tally)}"
        ) from None


_MAGIC = ((b"\x89PNG\r\n\x1a\n", ".png"), (b"\xff\xd8\xff", ".jpg"), (b"GIF8", ".gif"), (b"BM", ".bmp"))


def _sniff_suffix(data: bytes) -> str:
    """Returns the file suffix of image bytes by their magic number ("" when unknown)."""
    for magic, suffix in _MAGIC:
        if data.startswith(magic):
            return suffix
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return ".webp"
    return ""


def fetch(source: Source, ref: str, staging: Path, timeout: float) -> Path:
    """Returns a local file with the image's bytes, fetching remote and inline images.

    Args:
        source: The resolved reference.
        ref: The reference as written (for messages).
        staging: Folder for fetched images (named by content hash).
        timeout: Seconds a download may take in all.

    Raises:
        Reject: E_IMAGE_MISSING, E_IMAGE_FETCH or E_IMAGE_UNREADABLE.
    """
    if source.kind == "file":
        return Path(source.location)
    if source.kind == "http":
        data = _fetch_http(source.location, timeout)
    elif source.kind == "gs":
        data = read_gs(source.location, timeout)
    else:
        try:
            data = base64.b64decode("".join(source.location.split()), validate=False)
        except (binascii.Error, ValueError) as exc:
            raise Reject("E_IMAGE_UNREADABLE", f"image {ref[:60]!r}...: not valid base64 ({exc})") from None
        if not data:
            raise Reject("E_IMAGE_UNREADABLE", f"image {ref[:60]!r}...: empty base64 payload")
    staging.mkdir(parents=True, exist_ok=True)
    suffix = _sniff_suffix(data)
    path = staging / (hashlib.sha256(data).hexdigest() + suffix)
    if not path.exists():
        tmp = path.with_name(path.name + f".{threading.get_ident()}.tmp")
        with open_nofollow(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    return path
