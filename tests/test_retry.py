"""Retrying transient failures (components.common.retry), on its own and against real servers.

Real servers only: a web server on 127.0.0.1 that answers 503 / 404 as told, a proxy in
front of gcp-storage-emulator that fails the first media downloads, the fake hub of
conftest.py. Backoff is made tiny through the module setting `retry.DEFAULT`.
"""

from __future__ import annotations

import email.utils
import http.client
import http.server
import itertools
import json
import logging
import socket
import ssl
import threading
import urllib.error
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlparse

import pytest
import requests
from google.api_core import exceptions as gexc

from components.common import retry, storage
from components.common.retry import Policy
from components.validate_data import _sources
from tests.test_validate_data import Run, line, row, write_lines
from tests.test_validate_data_sources import png_bytes

FAST = Policy(attempts=3, base_s=0.01, cap_s=0.02, deadline_s=30.0, retry_after_cap_s=0.05)


@pytest.fixture(autouse=True)
def _fast(monkeypatch):
    """Tiny backoff for everything that uses the default policy; no proxy for 127.0.0.1."""
    monkeypatch.setattr(retry, "DEFAULT", FAST)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def _retry_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == retry.log.name]


# --- the pure functions ---------------------------------------------------------------


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_transient_statuses(status):
    assert retry.is_transient(status)


@pytest.mark.parametrize("status", [200, 400, 401, 403, 404, 410, 412, 416, 501])
def test_permanent_statuses(status):
    assert not retry.is_transient(status)


def _response(status: int) -> requests.Response:
    resp = requests.Response()
    resp.status_code = status
    return resp


def _chained(outer: Exception, cause: Exception) -> Exception:
    try:
        raise outer from cause
    except Exception as exc:  # noqa: BLE001
        return exc


@pytest.mark.parametrize(
    "exc, expected",
    [
        (ConnectionResetError(104, "reset"), True),
        (ConnectionRefusedError(111, "refused"), True),
        (TimeoutError("timed out"), True),
        (http.client.RemoteDisconnected("closed"), True),
        (http.client.IncompleteRead(b"ab", 10), True),
        (urllib.error.URLError(ConnectionResetError(104, "reset")), True),
        (urllib.error.URLError(TimeoutError("timed out")), True),
        (urllib.error.URLError("unknown url type"), False),
        (urllib.error.HTTPError("http://x/a.png", 503, "Service Unavailable", {}, None), True),
        (urllib.error.HTTPError("http://x/a.png", 404, "Not Found", {}, None), False),
        (gexc.ServiceUnavailable("down"), True),
        (gexc.TooManyRequests("slow down"), True),
        (gexc.InternalServerError("oops"), True),
        (gexc.PreconditionFailed("generation does not match"), False),  # ifGenerationMatch: never retried
        (gexc.NotFound("no such object"), False),
        (gexc.Forbidden("no access"), False),
        (requests.ConnectionError("reset"), True),
        (requests.Timeout("read timeout"), True),
        (requests.HTTPError("503", response=_response(503)), True),
        (requests.HTTPError("403", response=_response(403)), False),
        (requests.exceptions.SSLError("bad certificate"), False),
        (ssl.SSLCertVerificationError("certificate verify failed"), False),
        (socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"), True),
        (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), False),
        (_chained(RuntimeError("cannot locate the file"), ConnectionResetError(104, "reset")), True),
        (_chained(RuntimeError("wrapped"), gexc.NotFound("gone")), False),
        (ValueError("not JSON"), False),
        (_sources.Reject("E_IMAGE_FETCH", "too large"), False),
    ],
)
def test_is_transient(exc, expected):
    assert retry.is_transient(exc) is expected


def test_storage_invalid_response_412_is_permanent_503_transient():
    from google.auth.exceptions import TransportError
    from google.cloud.storage.exceptions import InvalidResponse

    assert not retry.is_transient(InvalidResponse(_response(412), "precondition"))
    assert retry.is_transient(InvalidResponse(_response(503), "unavailable"))
    assert retry.is_transient(TransportError(ConnectionResetError(104, "reset")))


def test_backoff_ceiling_doubles_up_to_the_cap_like_api_core():
    from google.api_core.retry import exponential_sleep_generator

    policy = Policy(base_s=0.5, cap_s=4.0)
    assert [retry.backoff_ceiling(n, policy) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    for _ in range(50):  # api-core's jittered waits (what gcs_retry sleeps) stay under our ceilings
        waits = itertools.islice(exponential_sleep_generator(0.5, 4.0, 2.0), 6)
        assert all(0 <= w <= retry.backoff_ceiling(n, policy) for n, w in enumerate(waits, start=1))


def test_backoff_delay_is_full_jitter_or_the_capped_retry_after():
    policy = Policy(base_s=1.0, cap_s=8.0, retry_after_cap_s=30.0)
    assert retry.backoff_delay(3, policy, rand=lambda: 0.0) == 0.0
    assert retry.backoff_delay(3, policy, rand=lambda: 0.5) == 2.0
    assert retry.backoff_delay(9, policy, rand=lambda: 0.5) == 4.0  # ceiling capped at 8
    assert retry.backoff_delay(1, policy, retry_after=12.0) == 12.0
    assert retry.backoff_delay(1, policy, retry_after=3600.0) == 30.0


def test_parse_retry_after():
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert retry.parse_retry_after("7") == 7.0
    assert retry.parse_retry_after(" 1.5 ") == 1.5
    assert retry.parse_retry_after(email.utils.format_datetime(now + timedelta(seconds=10), usegmt=True), now) == 10
    assert retry.parse_retry_after(email.utils.format_datetime(now - timedelta(seconds=10), usegmt=True), now) == 0
    assert retry.parse_retry_after("soon") is None
    assert retry.parse_retry_after("nan") is None
    assert retry.parse_retry_after(None) is None


def test_redact_strips_query_strings_and_credentials():
    text = "GET https://user:pw@bucket.example/a.png?X-Goog-Signature=abc123&X-Goog-Credential=me failed"
    out = retry.redact(text)
    assert out == "GET https://bucket.example/a.png?<redacted> failed"
    assert "abc123" not in retry.describe(requests.ConnectionError(text))


def test_call_with_retry_counts_bounds_and_logs(caplog):
    caplog.set_level(logging.WARNING, logger=retry.log.name)
    outcomes = [ConnectionResetError(104, "reset"), TimeoutError("slow"), "ok"]
    waits, tally = [], retry.Tally()

    def flaky():
        out = outcomes.pop(0)
        if isinstance(out, Exception):
            raise out
        return out

    policy = Policy(attempts=3, base_s=1.0, cap_s=8.0)
    what = "image https://h/a.png?sig=SECRET"
    assert retry.call_with_retry(flaky, what, policy, tally, sleep=waits.append) == "ok"
    assert tally.failures == 2 and len(waits) == 2 and 0 <= waits[0] <= 1.0 and 0 <= waits[1] <= 2.0
    lines = _retry_lines(caplog)
    assert len(lines) == 2 and "attempt 1 of 3" in lines[0] and "attempt 2 of 3" in lines[1]
    assert "ConnectionResetError" in lines[0] and "https://h/a.png?<redacted>" in lines[0]
    assert not any("SECRET" in x for x in lines)

    always, tally = [], retry.Tally()
    with pytest.raises(ConnectionResetError):
        retry.call_with_retry(
            lambda: always.append(1) or _raise(ConnectionResetError()), "x", policy, tally, waits.append
        )
    assert len(always) == 3 and tally.failures == 3 and tally.note() == " (3 attempts)"

    with pytest.raises(ValueError):  # permanent: one attempt, no wait
        retry.call_with_retry(lambda: _raise(ValueError("bad")), "x", policy, retry.Tally(), sleep=pytest.fail)


def test_call_with_retry_stops_at_the_deadline_and_honours_retry_after():
    busy = urllib.error.HTTPError("http://h/a.png", 503, "Service Unavailable", {"Retry-After": "5"}, None)
    assert retry.retry_after_of(busy) == 5.0
    policy = Policy(attempts=10, deadline_s=60.0, retry_after_cap_s=2.0)
    waits = []
    with pytest.raises(urllib.error.HTTPError):
        retry.call_with_retry(lambda: _raise(busy), "x", policy, sleep=waits.append)
    assert waits == [2.0] * 9  # the server's 5 s, capped at 2 s

    tally = retry.Tally()
    late = Policy(attempts=10, deadline_s=0.5, retry_after_cap_s=5.0)
    with pytest.raises(urllib.error.HTTPError):  # a 5 s wait would end past the 0.5 s deadline
        retry.call_with_retry(lambda: _raise(busy), "x", late, tally, sleep=pytest.fail)
    assert tally.failures == 1


def _raise(exc: Exception):
    raise exc


# --- http(s) images: a real web server on 127.0.0.1 ------------------------------------


@pytest.fixture
def flaky_web():
    """A web server whose /<name> answers `plan[name]` statuses first, then the image (404 if unknown).

    Yields (base URL, plan {name: [status, ...]}, hits {name: requests seen}).
    """
    image, plan, hits = png_bytes(), {}, {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            name = urlparse(self.path).path.lstrip("/")
            hits[name] = hits.get(name, 0) + 1
            if plan.get(name):
                status = plan[name].pop(0)
                self.send_response(status)
                self.send_header("Retry-After", "1")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if name not in plan:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(image)))
            self.end_headers()
            self.wfile.write(image)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", plan, hits
    server.shutdown()
    server.server_close()


def test_http_image_that_answers_503_once_is_fetched(tmp_path, flaky_web, caplog):
    caplog.set_level(logging.WARNING, logger=retry.log.name)
    url, plan, hits = flaky_web
    plan["a.png"] = [503]
    rows = [row("q0", [f"{url}/a.png?X-Amz-Signature=SECRET"])] + [row(f"q{i}") for i in range(1, 4)]
    result = Run(tmp_path / "out")(
        [write_lines(tmp_path / "train.jsonl", [line(r) for r in rows])], max_invalid_fraction=0
    )
    assert result.counts["n_invalid"] == 0 and hits["a.png"] == 2
    (message,) = _retry_lines(caplog)
    assert "attempt 1 of 3" in message and "HTTP 503" in message
    assert "0.05 s" in message  # the server's Retry-After: 1, capped by the policy
    assert "SECRET" not in message and "a.png?<redacted>" in message


def test_http_404_is_quarantined_at_once(tmp_path, flaky_web, caplog):
    caplog.set_level(logging.WARNING, logger=retry.log.name)
    url, _, hits = flaky_web
    rows = [row(f"q{i}") for i in range(4)] + [row("gone", [f"{url}/gone.png"])]
    result = Run(tmp_path / "out")(
        [write_lines(tmp_path / "train.jsonl", [line(r) for r in rows])], max_invalid_fraction=0.5
    )
    assert [(i.line, i.code) for i in result.issues] == [(5, "E_IMAGE_MISSING")]
    assert "HTTP 404" in result.issues[0].message and "not retried" in result.issues[0].message
    assert hits["gone.png"] == 1 and _retry_lines(caplog) == []


def test_http_retries_are_bounded(tmp_path, flaky_web):
    url, plan, hits = flaky_web
    plan["busy.png"] = [503] * 100
    rows = [row(f"q{i}") for i in range(4)] + [row("busy", [f"{url}/busy.png"])]
    result = Run(tmp_path / "out")(
        [write_lines(tmp_path / "train.jsonl", [line(r) for r in rows])], max_invalid_fraction=0.5
    )
    assert [(i.line, i.code) for i in result.issues] == [(5, "E_IMAGE_FETCH")]
    assert hits["busy.png"] == FAST.attempts
    assert f"gave up after {FAST.attempts} attempts" in result.issues[0].message


# --- gs:// images: a proxy in front of gcp-storage-emulator -------------------------------


class _FlakyProxy(http.server.ThreadingHTTPServer):
    """Forwards GETs to the emulator; a request whose path holds a key of `plan` first gets its statuses."""

    daemon_threads = True

    def __init__(self, upstream: str):
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.upstream = urlparse(upstream)
        self.plan: dict[str, list[int]] = {}
        self.hits: dict[str, int] = {}
        self.lock = threading.Lock()

    def handle_error(self, request, client_address):
        pass  # a client closing its kept-alive connection resets it: not a test failure

    def planned(self, path: str) -> int | None:
        with self.lock:
            for key, statuses in self.plan.items():
                if key in path:
                    self.hits[key] = self.hits.get(key, 0) + 1
                    return statuses.pop(0) if statuses else None
        return None


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _FlakyProxy

    def do_GET(self):  # noqa: N802
        status = self.server.planned(self.path)
        if status is not None:
            body = json.dumps({"error": {"code": status, "message": f"injected {status}"}}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        up = http.client.HTTPConnection(self.server.upstream.hostname, self.server.upstream.port, timeout=10)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        up.request("GET", self.path, headers=headers)
        resp = up.getresponse()
        body = resp.read()
        self.send_response(resp.status)
        for key, value in resp.getheaders():
            if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        up.close()

    def log_message(self, *args):
        pass


@pytest.fixture
def gcs_proxy(gcs_emulator, gcs_client, gcs_bucket, monkeypatch):
    """Object <bucket>/set/a.png on the emulator, and a flaky proxy that STORAGE_EMULATOR_HOST points at.

    Yields (proxy, gs:// URI of the image, its bytes).
    """
    data = png_bytes(color=(7, 77, 177))
    gcs_client.bucket(gcs_bucket).blob("set/a.png").upload_from_string(data)
    proxy = _FlakyProxy(gcs_emulator)
    threading.Thread(target=proxy.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{proxy.server_address[1]}")
    yield proxy, f"gs://{gcs_bucket}/set/a.png", data
    proxy.shutdown()
    proxy.server_close()


MEDIA = "/o/set%2Fa.png?alt=media"  # the media download of set/a.png (the JSON API path is quoted)


def test_gs_image_that_fails_twice_with_503_is_not_quarantined(tmp_path, gcs_proxy, caplog):
    caplog.set_level(logging.WARNING, logger=retry.log.name)
    proxy, uri, data = gcs_proxy
    proxy.plan[MEDIA] = [503, 503]
    rows = [row("q0", [uri])] + [row(f"q{i}") for i in range(1, 4)]
    run = Run(tmp_path / "out")
    result = run([write_lines(tmp_path / "train.jsonl", [line(r) for r in rows])], max_invalid_fraction=0)
    assert result.counts["n_invalid"] == 0 and proxy.hits[MEDIA] == 3
    train, evals = run.rows()
    (image,) = [
        Path(d / r["images"][0]) for d, rs in ((run.train, train), (run.eval, evals)) for r in rs if r.get("images")
    ]
    assert image.read_bytes() == data
    lines = _retry_lines(caplog)
    assert len(lines) == 2 and "attempt 1 of 3" in lines[0] and "attempt 2 of 3" in lines[1] and "HTTP 503" in lines[0]


def test_gs_retries_are_bounded_and_the_message_says_how_many(gcs_proxy):
    proxy, uri, _ = gcs_proxy
    proxy.plan[MEDIA] = [503] * 100
    with pytest.raises(_sources.Reject) as info:
        _sources.read_gs(uri, timeout=5)
    assert info.value.code == "E_IMAGE_FETCH" and proxy.hits[MEDIA] == FAST.attempts
    assert f"gave up after {FAST.attempts} attempts" in info.value.message and uri in info.value.message


def test_gs_404_and_412_are_not_retried(gcs_proxy):
    proxy, uri, _ = gcs_proxy
    with pytest.raises(_sources.Reject) as info:
        _sources.read_gs(uri + ".missing", timeout=5)
    assert info.value.code == "E_IMAGE_MISSING"
    proxy.plan[MEDIA] = [412, 412]
    with pytest.raises(gexc.PreconditionFailed):  # the generation changed: the caller's named error, not a retry
        storage.read_bytes(uri, timeout=5, if_generation_match=1)
    assert proxy.hits[MEDIA] == 1


# --- the hub -----------------------------------------------------------------------------


def test_hub_model_info_that_answers_503_once_is_resolved(hub_server, monkeypatch, caplog):
    from components.common import model_sources
    from tests.conftest import HubRepo

    caplog.set_level(logging.WARNING, logger=retry.log.name)
    hub_server.repos["org/tiny"] = HubRepo({"config.json": b"{}"})
    failures = [503]
    handler = hub_server.RequestHandlerClass  # conftest's class, as pytest loaded it
    real = handler.do_GET

    def flaky(self):
        if self.path.startswith("/api/models/") and failures:
            self._error(failures.pop(0), "Unavailable", head=False)
            return
        real(self)

    monkeypatch.setattr(handler, "do_GET", flaky)
    listing = model_sources.resolve_hf(model_sources.parse_source("hf://org/tiny"), token=None)
    assert listing.files == {"config.json": 2} and not failures
    (message,) = _retry_lines(caplog)
    assert "hf://org/tiny" in message and "attempt 1 of 3" in message and "HTTP 503" in message


def test_http_retry_after_past_the_fetch_timeout_ends_the_retries(tmp_path, flaky_web, monkeypatch):
    url, plan, hits = flaky_web
    monkeypatch.setattr(retry, "DEFAULT", Policy(attempts=5, retry_after_cap_s=60.0))  # honour Retry-After: 1
    plan["later.png"] = [503, 503]
    with pytest.raises(_sources.Reject) as info:
        _sources.fetch(_sources.Source("http", f"{url}/later.png"), "later.png", tmp_path, timeout=0.5)
    assert hits["later.png"] == 1  # waiting 1 s would end past the 0.5 s the download may take in all
    assert info.value.code == "E_IMAGE_FETCH" and "HTTP 503" in info.value.message


def test_modelscope_calls_retry_a_reset_connection():
    from components.common import model_sources

    class FlakyMsApi:
        def __init__(self):
            self.failures = [requests.ConnectionError("reset"), gexc.ServiceUnavailable("busy")]

        def _maybe_fail(self):
            if self.failures:
                raise self.failures.pop(0)

        def get_valid_revision_detail(self, model_id, revision=None):
            self._maybe_fail()
            return {"CommitId": "c0ffee"}

        def get_model_files(self, model_id, revision=None, recursive=True):
            self._maybe_fail()
            return [{"Path": "config.json", "Size": 2, "Type": "blob"}]

    api = FlakyMsApi()
    listing = model_sources.resolve_ms(model_sources.parse_source("ms://Qwen/Tiny"), None, lambda token: api)
    assert listing.revision == "c0ffee" and listing.files == {"config.json": 2} and not api.failures


@pytest.mark.parametrize("uri", ["gs://bucket", "gs://bucket/", "s3://bucket/a.png"])
def test_read_bytes_needs_an_object_uri(uri):
    with pytest.raises(ValueError, match="expected gs://bucket/object"):
        storage.read_bytes(uri)
