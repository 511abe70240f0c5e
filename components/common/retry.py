"""Retrying transient failures: one policy for Cloud Storage reads, image downloads and hub calls.

A transient failure is one that a later attempt may not meet: HTTP 408, 429, 500, 502,
503, 504, a connection reset or refused, a timeout, a temporary DNS failure. Anything
else (a 404, a 403, a 412 from an `ifGenerationMatch` precondition, a bad certificate)
is permanent and is raised at once.

Two ways in, with the same policy (`Policy`; `DEFAULT` is the module setting that tests
shrink):

* `call_with_retry(fn, what)` calls `fn()` until it returns, sleeping an exponential
  backoff with full jitter between attempts (or the server's `Retry-After`, capped);
* `gcs_retry(what)` returns a `google.api_core.retry.Retry` for any google-cloud-storage
  call's `retry=` argument (api-core draws the jittered wait itself).

Each retry logs one WARNING line: what, attempt n of N, the wait, the cause; URLs in
it lose their query strings (signed URLs carry credentials there). A `Tally` passed in
counts the failed attempts, so a caller's final error can say how many were made.
"""

from __future__ import annotations

import email.utils
import functools
import http.client
import logging
import random
import re
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

log = logging.getLogger(__name__)

TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_T = TypeVar("_T")
_QUERY_RE = re.compile(r"\?[^\s'\"<>]*")
_USERINFO_RE = re.compile(r"(\w+://)[^/@\s'\"]+@")


@dataclass(frozen=True)
class Policy:
    """How hard to retry.

    Attributes:
        attempts: Attempts in all, the first included (1 = never retry). Default 4.
        base_s: Backoff ceiling after the first failure, in seconds; it doubles after
            each further failure. Default 0.5.
        cap_s: Largest backoff ceiling, in seconds. Default 8.
        deadline_s: No attempt starts later than this many seconds after the first one.
            Default 120.
        retry_after_cap_s: Largest wait a server's Retry-After header can ask for, in
            seconds. Default 30.
    """

    attempts: int = 4
    base_s: float = 0.5
    cap_s: float = 8.0
    deadline_s: float = 120.0
    retry_after_cap_s: float = 30.0


DEFAULT = Policy()  # the module setting: tests replace it with a fast one


@dataclass
class Tally:
    """Failed attempts of one operation, for its final error message.

    Attributes:
        failures: Attempts that failed so far (when the operation fails: the attempts made).
    """

    failures: int = 0

    def note(self) -> str:
        """Returns ' (N attempts)' after more than one attempt, else ''."""
        return f" ({self.failures} attempts)" if self.failures > 1 else ""


# --- classification ---------------------------------------------------------------


def status_of(exc: BaseException) -> int | None:
    """Returns the HTTP status an exception carries (its own or its response's), or None.

    Understands urllib's HTTPError (`code`), google-api-core errors (`code`), and errors
    with a `response` of requests, httpx or google-resumable-media (`status_code`).
    """
    for holder in (exc, getattr(exc, "response", None)):
        for attr in ("status_code", "code", "status"):
            value = getattr(holder, attr, None)
            if isinstance(value, int) and 100 <= value <= 599:
                return value
    return None


@functools.cache
def _transient_types() -> tuple[type, ...]:
    """Exception types that mean "the connection failed or timed out" (of the installed HTTP stacks)."""
    types: list[type] = [
        TimeoutError,
        ConnectionError,
        http.client.IncompleteRead,
        http.client.BadStatusLine,
        http.client.ResponseNotReady,
    ]
    try:
        import requests.exceptions as rex

        types += [rex.ConnectionError, rex.Timeout, rex.ChunkedEncodingError]
    except ImportError:
        pass
    try:
        import urllib3.exceptions as uex

        types += [uex.ProtocolError, uex.TimeoutError, uex.NewConnectionError]
    except ImportError:
        pass
    try:
        import httpx

        types += [httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError]
    except ImportError:
        pass
    return tuple(types)


def _causes(exc: BaseException, depth: int = 6):
    """Yields an exception and what it wraps: `raise ... from` causes, URLError.reason, TransportError's arg."""
    seen = 0
    while exc is not None and seen < depth:
        yield exc
        seen += 1
        wrapped = exc.__cause__ or getattr(exc, "reason", None)
        if wrapped is None and type(exc).__name__ == "TransportError" and exc.args:
            wrapped = exc.args[0]  # google.auth wraps the transport's exception this way
        exc = wrapped if isinstance(wrapped, BaseException) else None


def is_transient(exc_or_status: BaseException | int) -> bool:
    """Whether a failure is worth another attempt.

    Args:
        exc_or_status: An exception, or an HTTP status code.

    Returns:
        True for HTTP 408 / 429 / 500 / 502 / 503 / 504, connection errors (reset,
        refused, aborted, broken), timeouts and a temporary DNS failure, also when
        wrapped (`raise ... from`, URLError.reason, google.auth TransportError). False for
        anything else: other statuses (404, 403, 412 precondition failed, ...), TLS
        errors, and exceptions of our own.
    """
    if isinstance(exc_or_status, int):
        return exc_or_status in TRANSIENT_STATUS
    for link in _causes(exc_or_status):
        status = status_of(link)
        if status is not None and status >= 400:
            return status in TRANSIENT_STATUS
        if isinstance(link, ssl.SSLError) or "SSLError" in type(link).__name__:
            return False  # a certificate or protocol mismatch does not heal
        if isinstance(link, socket.gaierror):
            return link.errno == socket.EAI_AGAIN
        if isinstance(link, _transient_types()):
            return True
    return False


# --- waiting ----------------------------------------------------------------------


def backoff_ceiling(failures: int, policy: Policy) -> float:
    """Returns the longest wait after `failures` failed attempts: base * 2**(failures-1), capped.

    The same schedule as google-api-core's `exponential_sleep_generator` (multiplier 2),
    which draws each wait uniformly in [0, ceiling].

    Args:
        failures: Failed attempts so far (>= 1).
        policy: base_s and cap_s, in seconds.
    """
    return min(policy.cap_s, policy.base_s * 2.0 ** max(0, failures - 1))


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Returns the seconds a Retry-After header asks for: delta-seconds or an HTTP date; None if absent or bad.

    Args:
        value: The header's value.
        now: The current time (UTC) for an HTTP date. Default: now.
    """
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return max(0.0, seconds) if seconds == seconds else None  # NaN is no answer


def retry_after_of(exc: BaseException) -> float | None:
    """Returns the Retry-After seconds of an HTTP error (its headers or its response's), or None."""
    for holder in (exc, getattr(exc, "response", None)):
        headers = getattr(holder, "headers", None)
        if headers is not None and hasattr(headers, "get"):
            found = parse_retry_after(headers.get("Retry-After"))
            if found is not None:
                return found
    return None


def backoff_delay(
    failures: int, policy: Policy, retry_after: float | None = None, rand: Callable[[], float] = random.random
) -> float:
    """Returns how long to wait before the next attempt, in seconds.

    Args:
        failures: Failed attempts so far (>= 1).
        policy: The backoff schedule.
        retry_after: Seconds the server asked for (Retry-After), or None. When given, it
            is the wait, capped at policy.retry_after_cap_s. Default None.
        rand: A source of uniform numbers in [0, 1) for the jitter. Default random.random.

    Returns:
        The server's capped Retry-After, else a uniform draw in [0, backoff_ceiling]
        ("full jitter", so that many clients failing together do not retry together).
    """
    if retry_after is not None:
        return min(retry_after, policy.retry_after_cap_s)
    return rand() * backoff_ceiling(failures, policy)


# --- logging ----------------------------------------------------------------------


def redact(text: str) -> str:
    """Returns text with URL query strings and user:password@ parts removed (signed URLs keep credentials there)."""
    return _USERINFO_RE.sub(r"\1", _QUERY_RE.sub("?<redacted>", text))


def describe(exc: BaseException) -> str:
    """Returns a short, redacted cause for a log line: 'HTTP 503 (ServiceUnavailable)' or 'Type: message'."""
    status = status_of(exc)
    if status is not None:
        return f"HTTP {status} ({type(exc).__name__})"
    text = str(exc).strip()
    text = redact(text.splitlines()[0])[:200] if text else ""
    return type(exc).__name__ + (f": {text}" if text else "")


def _log_retry(what: str, failures: int, policy: Policy, wait: str, exc: BaseException) -> None:
    log.warning(
        "retry: %s: attempt %d of %d failed (%s); next attempt in %s",
        redact(what),
        failures,
        policy.attempts,
        describe(exc),
        wait,
    )


# --- the two ways in ----------------------------------------------------------------


def call_with_retry(
    fn: Callable[[], _T],
    what: str,
    policy: Policy | None = None,
    tally: Tally | None = None,
    sleep: Callable[[float], Any] = time.sleep,
) -> _T:
    """Calls fn() until it returns, retrying transient failures with backoff.

    Args:
        fn: The operation; one call is one attempt.
        what: What it does, for the log lines (URLs in it are redacted).
        policy: Default: the module's DEFAULT.
        tally: Counts the failed attempts, for the caller's error message. Default: none.
        sleep: Waits that many seconds. Default time.sleep.

    Returns:
        fn's result.

    Raises:
        Exception: fn's last exception: a permanent one at once, a transient one when the
            attempts are used up or the next wait would end past policy.deadline_s.
    """
    policy = policy or DEFAULT
    tally = tally if tally is not None else Tally()
    start = time.monotonic()
    while True:
        try:
            return fn()
        except Exception as exc:
            tally.failures += 1
            if not is_transient(exc) or tally.failures >= policy.attempts:
                raise
            wait = backoff_delay(tally.failures, policy, retry_after_of(exc))
            if time.monotonic() - start + wait > policy.deadline_s:
                raise
            _log_retry(what, tally.failures, policy, f"{wait:.2f} s", exc)
            sleep(wait)


def gcs_retry(what: str, policy: Policy | None = None, tally: Tally | None = None):
    """Returns a google-api-core Retry for one google-cloud-storage operation.

    Pass it as `retry=` (download_as_bytes, get_blob, list_blobs, ...). It retries what
    `is_transient` accepts, so a 412 of an `ifGenerationMatch` read is raised at once, as
    are 404 and 403. It counts failures in `tally`, so make one per operation (the pages
    of one listing share it: N failed requests in all).

    Args:
        what: The object or listing, for the log lines.
        policy: Default: the module's DEFAULT (attempts, base_s, cap_s, deadline_s).
        tally: Counts the failed attempts. Default: a fresh one.

    Returns:
        A google.api_core.retry.Retry.
    """
    from google.api_core.retry import Retry

    policy = policy or DEFAULT
    tally = tally if tally is not None else Tally()

    def predicate(exc: Exception) -> bool:
        tally.failures += 1
        return is_transient(exc) and tally.failures < policy.attempts

    def on_error(exc: Exception) -> None:  # called only when the predicate said "retry"
        _log_retry(what, tally.failures, policy, f"up to {backoff_ceiling(tally.failures, policy):.2f} s", exc)

    return Retry(
        predicate=predicate,
        initial=policy.base_s,
        maximum=policy.cap_s,
        multiplier=2.0,
        timeout=policy.deadline_s,
        on_error=on_error,
    )
