"""The JobSet submit-and-follow client (issue 55, must-show 3): the real `kubernetes` Python client against a
local recording HTTP server on 127.0.0.1 that plays the Kubernetes API: create, watch to success; to failure
(a named error with the failed pod's last log lines); cancel (SIGTERM) deletes the JobSet with its pods;
a retried task follows the JobSet already there."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
from kubernetes import client

from components.common import jobset as js
from components.common import kube_jobs as kj

NS, NAME = "team", "vlm-lora-abc"
BASE = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NS}/jobsets"


def jobset(state: str = "", active: int = 0, restarts: int = 0, version: str = "1") -> dict:
    status: dict = {"restarts": restarts, "replicatedJobsStatus": [{"name": "node", "active": active, "failed": 0}]}
    if state:
        status["conditions"] = [{"type": state, "status": "True", "reason": f"All{state}", "message": f"jobset {state.lower()}"}]  # fmt: skip
    meta = {"name": NAME, "namespace": NS, "resourceVersion": version}
    return {"apiVersion": js.API_VERSION, "kind": "JobSet", "metadata": meta, "status": status}


class Api:
    """What the fake API server plays, and every request it got."""

    def __init__(self, events: list[dict], exists: bool = False, hang: bool = False, gets: list | None = None):
        self.events, self.exists, self.hang = events, exists, hang
        self.gets = list(gets or [])  # what GET of the JobSet answers in turn (an int: that status); then running
        self.requests: list[tuple[str, str, dict, object]] = []
        self.watching = threading.Event()
        self.stop = threading.Event()


def handler_for(api: Api) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def _send(self, code: int, body, content_type: str = "application/json") -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _record(self) -> tuple[str, dict]:
            url = urlparse(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            query = parse_qs(url.query)
            api.requests.append((self.command, url.path, query, body))
            return url.path, query

        def do_POST(self):
            path, _ = self._record()
            assert path == BASE
            if api.exists:
                api.exists = False
                return self._send(409, {"kind": "Status", "status": "Failure", "reason": "AlreadyExists", "code": 409})
            self._send(201, api.requests[-1][3])

        def do_DELETE(self):
            self._record()
            self._send(200, {"kind": "Status", "status": "Success"})

        def do_GET(self):
            path, query = self._record()
            if path == f"{BASE}/{NAME}":
                answer = api.gets.pop(0) if api.gets else jobset(version="7")
                if isinstance(answer, int):
                    return self._send(answer, {"kind": "Status", "code": answer})
                return self._send(200, answer)
            if path == BASE and query.get("watch", [""])[0].lower() == "true":
                return self._watch()
            if path == f"/api/v1/namespaces/{NS}/pods":
                pods = [("vlm-lora-abc-node-0-0-x", "Running"), ("vlm-lora-abc-node-0-1-y", "Failed")]
                items = [{"metadata": {"name": n, "namespace": NS}, "status": {"phase": p}} for n, p in pods]
                return self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})
            if path.endswith("/log"):
                text = "".join(f"line {i}\n" for i in range(100))
                tail = int(query["tailLines"][0])
                return self._send(200, "".join(text.splitlines(True)[-tail:]).encode(), "text/plain")
            self._send(404, {"kind": "Status", "code": 404})

        def _watch(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            api.watching.set()
            for event in api.events:
                line = (json.dumps({"type": "MODIFIED", "object": event}) + "\n").encode()
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()
            while api.hang and not api.stop.wait(0.05):
                pass
            self.wfile.write(b"0\r\n\r\n")

    return Handler


@pytest.fixture
def serve():
    servers = []

    def start(api: Api) -> client.ApiClient:
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(api))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append((server, api))
        conf = client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
        return client.ApiClient(conf)

    yield start
    for server, api in servers:
        api.stop.set()
        server.shutdown()
        server.server_close()


def manifest() -> dict:
    spec = js.JobSetSpec(name=NAME, namespace=NS, image="img", command=["python3"], args=[], nnodes=2,
                         gpus_per_node=8, accelerator="nvidia-h100-80gb", bucket="b", volume_claim="c")  # fmt: skip
    return js.build_jobset(spec)


def test_create_then_watch_to_success(serve):
    api = Api([jobset(active=2), jobset(active=2), jobset("Completed", restarts=1)])
    lines: list[str] = []
    outcome = kj.follow_jobset(serve(api), manifest(), log=lines.append)
    assert (outcome.name, outcome.state, outcome.restarts) == (NAME, "Completed", 1)
    methods = [(m, p) for m, p, _, _ in api.requests]
    assert methods == [("POST", BASE), ("GET", f"{BASE}/{NAME}"), ("GET", BASE)]
    assert api.requests[0][3] == manifest(), "the manifest is created as built"
    watch_query = api.requests[2][2]
    assert watch_query["fieldSelector"] == [f"metadata.name={NAME}"] and watch_query["resourceVersion"] == ["7"]
    assert lines == [
        f"jobset {NS}/{NAME}: created",
        f"jobset {NS}/{NAME}: running, restarts 0 (node: 2 active, 0 failed)",
        f"jobset {NS}/{NAME}: Completed, restarts 1 (node: 0 active, 0 failed)",
    ]


def test_failure_is_a_named_error_with_the_failed_pods_last_log_lines(serve):
    api = Api([jobset(active=2), jobset("Failed", restarts=2)])
    with pytest.raises(kj.JobSetFailed) as failed:
        kj.follow_jobset(serve(api), manifest(), log=lambda _: None)
    text = str(failed.value)
    assert text.startswith(
        f"jobset {NS}/{NAME} failed after 2 restart(s): jobset failed; last log lines of pod vlm-lora-abc-node-0-1-y:"
    )
    assert "line 99" in text and "line 60" in text and "line 59\n" not in text  # the last 40 lines only
    pods = next(q for m, p, q, _ in api.requests if p.endswith("/pods"))
    assert pods["labelSelector"] == [f"{kj.NAME_LABEL}={NAME}"]
    log = next(q for m, p, q, _ in api.requests if p.endswith("/log"))
    assert log["tailLines"] == ["40"] and not any(m == "DELETE" for m, *_ in api.requests)


def test_sigterm_cancels_and_deletes_the_jobset_with_its_pods(serve):
    api = Api([jobset(active=2)], hang=True)
    api_client = serve(api)

    def cancel():
        assert api.watching.wait(10)
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=cancel, daemon=True).start()
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(kj.JobSetCancelled, match="cancelled and deleted"):
        kj.follow_jobset(api_client, manifest(), log=lambda _: None)
    method, path, _, body = api.requests[-1]
    assert (method, path) == ("DELETE", f"{BASE}/{NAME}") and body["propagationPolicy"] == "Foreground"
    assert signal.getsignal(signal.SIGTERM) is before, "the previous handler is back"


def test_a_retried_task_follows_the_jobset_already_there(serve):
    api = Api([jobset("Completed")], exists=True)
    lines: list[str] = []
    assert kj.follow_jobset(serve(api), manifest(), log=lines.append).state == "Completed"
    assert lines[0] == f"jobset {NS}/{NAME}: already exists (a retried task): following it"


def test_a_failed_jobset_of_the_same_inputs_is_replaced_not_followed(serve):
    api = Api([jobset("Completed")], exists=True, gets=[jobset("Failed"), jobset(), 404])
    lines: list[str] = []
    assert kj.follow_jobset(serve(api), manifest(), log=lines.append).state == "Completed"
    calls = [(m, p.rsplit("/", 1)[-1]) for m, p, _, _ in api.requests]
    assert calls[:6] == [
        ("POST", "jobsets"),
        ("GET", NAME),
        ("DELETE", NAME),
        ("GET", NAME),
        ("GET", NAME),
        ("POST", "jobsets"),
    ]
    assert "deleting it and starting anew" in lines[0] and lines[1] == f"jobset {NS}/{NAME}: created"
