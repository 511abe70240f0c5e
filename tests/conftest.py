"""Shared fixtures: a Cloud Storage emulator (`gcs_*`), a fake Hugging Face hub (`hub_*`), and
fast retries (the real backoff of `components.common.retry` would make every refused
connection in a test wait seconds; tests that measure the policy set their own)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch):
    from components.common import retry

    monkeypatch.setattr(retry, "DEFAULT", retry.Policy(attempts=3, base_s=0.01, cap_s=0.02, deadline_s=30.0))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def gcs_emulator():
    """Starts gcp-storage-emulator (in memory) on 127.0.0.1 and points STORAGE_EMULATOR_HOST at it.

    Yields the emulator's base URL; the process is stopped at the end of the session.
    """
    exe = shutil.which("gcp-storage-emulator") or str(Path(os.sys.executable).parent / "gcp-storage-emulator")
    if not Path(exe).exists():
        pytest.fail("gcp-storage-emulator is not installed (pip install -e '.[dev]')")
    port = _free_port()
    proc = subprocess.Popen(
        [exe, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("gcp-storage-emulator did not start within 20 s")
            time.sleep(0.05)
    old = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = url
    try:
        yield url
    finally:
        if old is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = old
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture
def gcs_client(gcs_emulator):
    """A storage client on the emulator (anonymous credentials)."""
    from components.stage_model import _gcs

    return _gcs.client()


@pytest.fixture
def gcs_bucket(gcs_client):
    """A fresh, empty bucket on the emulator; yields its name."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    gcs_client.create_bucket(name)
    return name


# --- fake Hugging Face hub -----------------------------------------------------------


class HubRepo:
    """One model repo of the fake hub: files per commit, branches, gating."""

    def __init__(self, files: dict[str, bytes], gated: bool = False, token: str | None = None):
        self.gated = gated
        self.token = token
        self.commits: dict[str, dict[str, bytes]] = {}
        self.refs: dict[str, str] = {}
        self.add_commit("main", files)

    def add_commit(self, ref: str, files: dict[str, bytes]) -> str:
        sha = hashlib.sha1(
            json.dumps(sorted((k, hashlib.sha256(v).hexdigest()) for k, v in files.items())).encode()
            + str(len(self.commits)).encode()
        ).hexdigest()
        self.commits[sha] = dict(files)
        self.refs[ref] = sha
        return sha

    def resolve(self, rev: str) -> str | None:
        if rev in self.refs:
            return self.refs[rev]
        return rev if rev in self.commits else None


class _HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HubServer

    def log_message(self, *args):  # keep test output quiet
        pass

    def _send(self, code: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _error(self, code: int, error_code: str, head: bool):
        self._send(
            code,
            json.dumps({"error": error_code}).encode(),
            {"X-Error-Code": error_code, "Content-Type": "application/json"},
            head,
        )

    def _repo(self, repo_id: str):
        return self.server.repos.get(repo_id)

    def _handle(self, head: bool):
        self.server.requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
        path = unquote(urlparse(self.path).path)
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo_id = "/".join(parts[2:4])
            rev = parts[5] if len(parts) >= 6 and parts[4] == "revision" else "main"
            repo = self._repo(repo_id)
            if repo is None:
                return self._error(401, "RepoNotFound", head)
            sha = repo.resolve(rev)
            if sha is None:
                return self._error(404, "RevisionNotFound", head)
            siblings = []
            for name, data in sorted(repo.commits[sha].items()):
                item = {"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest()}
                if name.endswith(".safetensors"):
                    item["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
                siblings.append(item)
            body = {
                "id": repo_id,
                "modelId": repo_id,
                "sha": sha,
                "private": False,
                "gated": "manual" if repo.gated else False,
                "siblings": siblings,
            }
            return self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head)
        if len(parts) >= 5 and parts[2] == "resolve":
            repo_id, rev, rel = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            repo = self._repo(repo_id)
            if repo is None:
                return self._error(401, "RepoNotFound", head)
            if repo.gated:
                auth = self.headers.get("Authorization", "")
                if not auth:
                    return self._error(401, "GatedRepo", head)
                if auth != f"Bearer {repo.token}":
                    return self._error(403, "GatedRepo", head)
            sha = repo.resolve(rev)
            if sha is None:
                return self._error(404, "RevisionNotFound", head)
            data = repo.commits[sha].get(rel)
            if data is None:
                return self._error(404, "EntryNotFound", head)
            etag = hashlib.sha256(data).hexdigest() if rel.endswith(".safetensors") else hashlib.sha1(data).hexdigest()
            return self._send(
                200, data, {"X-Repo-Commit": sha, "ETag": f'"{etag}"', "Content-Type": "application/octet-stream"}, head
            )
        return self._error(404, "NotFound", head)

    def do_GET(self):
        self._handle(head=False)

    def do_HEAD(self):
        self._handle(head=True)


class _HubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _HubHandler)
        self.repos: dict[str, HubRepo] = {}
        self.requests: list = []


@pytest.fixture
def hub_server(monkeypatch, tmp_path):
    """A fake Hugging Face hub on 127.0.0.1 (HF_ENDPOINT points at it; HF_TOKEN unset).

    Add repos with `hub_server.repos["org/name"] = HubRepo({...})`.
    """
    server = _HubServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "5")
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "5")
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
