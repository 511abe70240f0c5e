"""A local stand-in for the Vertex AI, Cloud Storage and Artifact Registry KFP APIs.

A `http.server` on 127.0.0.1 that records every request and answers like the REST APIs,
just enough for the real clients (`google.cloud.aiplatform` with the REST transport,
`google.cloud.storage` via STORAGE_EMULATOR_HOST, `kfp.registry.RegistryClient`) to
complete: resources are stored on create and returned on get / list (pipeline jobs filtered by
`labels.KEY="VALUE"` clauses, as Vertex filters them); long-running operations are answered
done; a cancelled pipeline job reports CANCELLED. Cloud Logging's `entries:list` answers from
`log_entries`, filtered by the CustomJob IDs / pipeline job ID and the `timestamp>=` of the
filter, in pages. Model versions are reachable as `models/ID@VERSION` and
`models/ID@ALIAS`; an uploaded version takes its aliases from older versions, as Vertex
does. A version's imported evaluations (`evaluations:import`) and their slices
(`slices:batchImport`) are stored under it and listed on GET. Tests assert on `server.requests`.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

PROJECT_NUMBER = "123456789"


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    raw: bytes
    headers: dict[str, str]


@dataclass
class FakeApis:
    """State of the fake: resources by name, existing buckets, the record of requests."""

    buckets: set[str] = field(default_factory=set)
    resources: dict[str, dict] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    # States a pipeline job reports on successive GETs (the last one repeats).
    job_states: list[str] = field(default_factory=lambda: ["PIPELINE_STATE_RUNNING", "PIPELINE_STATE_SUCCEEDED"])
    # Resource paths (unquoted, without /v1/; "entries:list" for Cloud Logging) answered with an error:
    # path -> (HTTP code, status).
    errors: dict[str, tuple[int, str]] = field(default_factory=dict)
    # Answers of a deployed model's chat route (`.../deployedModels/ID/invoke/...`, `:rawPredict`),
    # in turn (the last one repeats).
    raw_answers: list[str] = field(default_factory=lambda: ['[{"label": "hole", "bbox": [1, 2, 3, 4]}]'])
    # Cloud Logging entries (LogEntry dicts) that `v2/entries:list` selects from; entries per page.
    log_entries: list[dict] = field(default_factory=list)
    log_page_size: int = 1000
    url: str = ""

    def calls(self, method: str, contains: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and contains in r.path]


def _kind_id(query: dict[str, list[str]]) -> str | None:
    for key, values in query.items():
        if key.endswith("Id") and key not in ("$alt",):
            return values[0]
    return None


def _time_key(stamp: str) -> str:
    """An RFC 3339 UTC time ('...:05Z', '...:05.5Z') as text that sorts in time order, as Logging compares."""
    return stamp[:19] + stamp[19:].rstrip("Z").lstrip(".").ljust(9, "0") if len(stamp) >= 19 else stamp


class _Handler(BaseHTTPRequestHandler):
    fake: FakeApis

    def log_message(self, *args):  # quiet
        pass

    def _send(self, code: int, payload: Any, content_type: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _not_found(self, name: str) -> None:
        self._send(404, {"error": {"code": 404, "message": f"{name} not found", "status": "NOT_FOUND"}})

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        try:
            body = json.loads(raw) if raw and "json" in (self.headers.get("Content-Type") or "") else None
        except ValueError:
            body = None
        self.fake.requests.append(Recorded(self.command, url.path, query, body, raw, dict(self.headers)))
        path = unquote(url.path)
        if path.startswith("/storage/v1/b/"):
            return self._storage(path)
        if path == "/v2/entries:list":
            return self._log_entries(body or {})
        if path.startswith("/v1/") or path.startswith("/v1beta1/"):
            return self._vertex(path.split("/", 2)[2], query, body or {})
        return self._registry(path)

    do_GET = do_POST = do_DELETE = do_PATCH = _handle

    # --- Cloud Storage: bucket metadata only ---------------------------------------
    def _storage(self, path: str) -> None:
        bucket = path[len("/storage/v1/b/") :].split("/")[0]
        if bucket in self.fake.buckets:
            return self._send(
                200,
                {
                    "kind": "storage#bucket",
                    "name": bucket,
                    "id": bucket,
                    "projectNumber": PROJECT_NUMBER,
                    "location": "US-CENTRAL1",
                },
            )
        return self._not_found(f"bucket {bucket}")

    # --- Artifact Registry KFP repository: multipart upload ------------------------
    def _registry(self, path: str) -> None:
        if self.command == "POST":
            version = "sha256:" + uuid.uuid4().hex
            return self._send(200, f"{self.fake.package}/{version}".encode(), "text/plain")
        return self._not_found(path)

    # --- Vertex AI ----------------------------------------------------------------
    def _vertex(self, path: str, query: dict[str, list[str]], body: dict) -> None:
        res = self.fake.resources
        if path in self.fake.errors:
            code, status = self.fake.errors[path]
            return self._send(code, {"error": {"code": code, "message": f"{status} on {path}", "status": status}})
        if self.command == "POST" and "/deployedModels/" in path and "/invoke/" in path:
            return self._invoke(path)
        if self.command == "PATCH" and "/endpoints/" in path and path in res:
            mask = (query.get("updateMask") or query.get("update_mask") or [""])[0]
            for key in filter(None, mask.split(",")):
                camel = "".join(w.capitalize() if i else w for i, w in enumerate(key.split("_")))
                res[path][camel] = body.get(camel, {})
            return self._send(200, res[path])
        if self.command == "POST" and path.endswith("models:upload"):
            parent = path[: -len("/models:upload")]
            model = body.get("model", {})
            name = body.get("parentModel") or f"{parent}/models/{body.get('modelId') or uuid.uuid4().hex[:8]}"
            versions = {k.split("@")[1] for k in res if k.startswith(name + "@") and k.split("@")[1].isdigit()}
            version = str(len(versions) + 1)
            # Vertex moves each alias (and "default" for the default version) to the new version
            aliases = list(model.get("versionAliases") or [])
            if version == "1" and "default" not in aliases:
                aliases.insert(0, "default")
            # a custom-container model deploys to dedicated machines, as Vertex says of an uploaded model
            item = {"supportedDeploymentResourcesTypes": ["DEDICATED_RESOURCES"], **model}
            item.update(name=name, versionId=version, versionAliases=aliases)
            for alias in aliases:
                old = res.get(f"{name}@{alias}")
                if old is not None and old is not item:
                    old["versionAliases"] = [a for a in old["versionAliases"] if a != alias]
                res[f"{name}@{alias}"] = item
            res[name] = item
            res[f"{name}@{version}"] = item
            return self._send(
                200,
                self._done_operation(
                    parent,
                    {
                        "@type": "type.googleapis.com/google.cloud.aiplatform.v1.UploadModelResponse",
                        "model": name,
                        "modelVersionId": version,
                    },
                ),
            )
        if self.command == "POST" and path.endswith("/evaluations:import"):
            return self._import_evaluation(path[: -len(":import")], body)
        if self.command == "POST" and path.endswith("/slices:batchImport"):
            return self._import_slices(path[: -len(":batchImport")], body)
        if self.command == "POST" and path.endswith("/endpoints"):  # create: a long-running operation
            name = f"{path}/{_kind_id(query) or uuid.uuid4().hex[:12]}"
            res[name] = {**body, "name": name, "deployedModels": [], "trafficSplit": {}}
            return self._send(
                200,
                self._done_operation(
                    path, {"@type": "type.googleapis.com/google.cloud.aiplatform.v1.Endpoint", **res[name]}
                ),
            )
        if self.command == "POST" and path.rsplit(":", 1)[-1] in ("deployModel", "undeployModel", "rawPredict"):
            return self._endpoint_method(*path.rsplit(":", 1), body)
        if self.command == "POST" and ":" in path.rsplit("/", 1)[-1]:  # custom methods: name:pause, ...
            name, verb = path.rsplit(":", 1)
            if verb == "mergeVersionAliases":
                return self._merge_aliases(name, body)
            if verb == "cancel" and "/pipelineJobs/" in name:
                if name not in res:
                    return self._not_found(name)
                self.fake.job_states[:] = ["PIPELINE_STATE_CANCELLED"]  # what later GETs report
            if name in res and verb in ("pause", "resume"):
                res[name]["state"] = "PAUSED" if verb == "pause" else "ACTIVE"
            return self._send(200, {})
        if self.command == "POST":
            new_id = _kind_id(query) or uuid.uuid4().hex[:12]
            name = f"{path}/{new_id}"
            item = {**body, "name": name, "createTime": "2026-01-01T00:00:00Z"}
            if path.endswith("/pipelineJobs"):
                item["state"] = "PIPELINE_STATE_PENDING"
                store = path.rsplit("/", 1)[0] + "/metadataStores/default/contexts"
                item["jobDetail"] = {
                    "pipelineContext": {"name": f"{store}/{body.get('displayName', 'p')}"},
                    "pipelineRunContext": {"name": f"{store}/{new_id}"},
                }
                res[f"{store}/{new_id}"] = {"name": f"{store}/{new_id}", "schemaTitle": "system.PipelineRun"}
            if path.endswith("/schedules"):
                item["state"] = "ACTIVE"
            res[name] = item
            return self._send(200, item)
        if self.command == "DELETE":
            res.pop(path, None)
            return self._send(200, self._done_operation(path, {"@type": "type.googleapis.com/google.protobuf.Empty"}))
        if self.command == "GET":
            if path in res:
                item = res[path]
                if "/pipelineJobs/" in path:
                    states = self.fake.job_states
                    item["state"] = states.pop(0) if len(states) > 1 else states[0]
                return self._send(200, item)
            collection = path.rsplit("/", 1)[-1]
            children = [r for k, r in res.items() if k.rsplit("/", 1)[0] == path and "@" not in k.rsplit("/", 1)[1]]
            for key, value in re.findall(r'labels\.([\w-]+)\s*=\s*"([^"]*)"', (query.get("filter") or [""])[0]):
                children = [c for c in children if (c.get("labels") or {}).get(key) == value]
            if collection in ("schedules", "pipelineJobs", "models", "endpoints", "evaluations"):
                return self._send(200, {"modelEvaluations" if collection == "evaluations" else collection: children})
            return self._not_found(path)
        return self._send(400, {"error": {"code": 400, "message": "unsupported", "status": "INVALID_ARGUMENT"}})

    def _log_entries(self, body: dict) -> None:
        """`v2/entries:list`: the entries of the filter's CustomJobs (`ml_job`) or pipeline job, from its
        `timestamp>=`, ordered as asked, `log_page_size` per page."""
        if "entries:list" in self.fake.errors:
            code, status = self.fake.errors["entries:list"]
            return self._send(code, {"error": {"code": code, "message": f"{status} on entries:list", "status": status}})
        text = body.get("filter", "")
        ids = re.search(r"resource\.labels\.job_id=\(([^)]*)\)", text)
        job_ids = set(re.findall(r'"([^"]+)"', ids.group(1))) if ids else set()
        pipeline = re.search(r'resource\.labels\.pipeline_job_id="([^"]+)"', text)
        since = re.search(r'timestamp>="([^"]+)"', text)

        def selected(entry: dict) -> bool:
            resource = entry.get("resource", {})
            labels = resource.get("labels", {})
            if resource.get("type") == "ml_job":
                match = labels.get("job_id") in job_ids
            else:
                match = bool(pipeline) and labels.get("pipeline_job_id") == pipeline.group(1)
            return match and (not since or _time_key(entry.get("timestamp", "")) >= _time_key(since.group(1)))

        entries = sorted(
            (e for e in self.fake.log_entries if selected(e)),
            key=lambda e: _time_key(e.get("timestamp", "")),
            reverse="desc" in body.get("orderBy", ""),
        )
        start = int(body.get("pageToken") or 0)
        size = min(int(body.get("pageSize") or 1000), self.fake.log_page_size)
        page = {"entries": entries[start : start + size]}
        if start + size < len(entries):
            page["nextPageToken"] = str(start + size)
        return self._send(200, page)

    def _import_evaluation(self, collection: str, body: dict) -> None:
        """`models/ID@VERSION/evaluations:import`: the evaluation is stored under the version, numbered 1, 2, ..."""
        model = collection[: -len("/evaluations")]
        if model not in self.fake.resources:
            return self._not_found(model)
        # numbered per version, as Vertex's numeric IDs (a test can name the slices' path before the import)
        name = f"{collection}/{sum(k.rsplit('/', 1)[0] == collection for k in self.fake.resources) + 1}"
        item = {**body.get("modelEvaluation", {}), "name": name, "createTime": "2026-01-01T00:00:00Z"}
        self.fake.resources[name] = item
        return self._send(200, item)

    def _import_slices(self, collection: str, body: dict) -> None:
        """`.../evaluations/E/slices:batchImport`: each slice stored under the evaluation; their names answered."""
        evaluation = collection[: -len("/slices")]
        if evaluation not in self.fake.resources:
            return self._not_found(evaluation)
        names = []
        for one in body.get("modelEvaluationSlices") or []:
            name = f"{collection}/{uuid.uuid4().hex[:12]}"
            self.fake.resources[name] = {**one, "name": name}
            names.append(name)
        return self._send(200, {"importedModelEvaluationSlices": names})

    def _merge_aliases(self, name: str, body: dict) -> None:
        """`models/ID@VERSION:mergeVersionAliases`: each alias moves to this version ("-alias" removes it)."""
        res = self.fake.resources
        item = res.get(name)
        if item is None:
            return self._not_found(name)
        parent = name.split("@")[0]
        for alias in body.get("versionAliases") or []:
            if alias.startswith("-"):
                item["versionAliases"] = [a for a in item["versionAliases"] if a != alias[1:]]
                res.pop(f"{parent}@{alias[1:]}", None)
                continue
            old = res.get(f"{parent}@{alias}")
            if old is not None and old is not item:
                old["versionAliases"] = [a for a in old["versionAliases"] if a != alias]
            if alias not in item["versionAliases"]:
                item["versionAliases"].append(alias)
            res[f"{parent}@{alias}"] = item
        if "default" in item["versionAliases"]:
            res[parent] = item
        return self._send(200, item)

    def _invoke(self, path: str) -> None:
        """`{endpoint}/deployedModels/{id}/invoke/{route}`: the named deployed model answers, as Vertex
        routes it: only when it is deployed there and its model's container allows the route."""
        endpoint_name, rest = path.split("/deployedModels/", 1)
        deployed_id, route = rest.split("/invoke", 1)
        endpoint = self.fake.resources.get(endpoint_name)
        if endpoint is None:
            return self._not_found(endpoint_name)
        deployed = [m for m in endpoint["deployedModels"] if m["id"] == deployed_id]
        if not deployed:
            return self._not_found(f"{endpoint_name}/deployedModels/{deployed_id}")
        model = self.fake.resources.get(unquote(deployed[0].get("model", "")), {})
        prefix = model.get("containerSpec", {}).get("invokeRoutePrefix", "")
        if not prefix or not (prefix == "/*" or route.startswith(prefix.rstrip("*"))):
            message = f"invoke route {route} is not allowed: the model's containerSpec.invokeRoutePrefix is {prefix!r}"
            return self._send(400, {"error": {"code": 400, "message": message, "status": "FAILED_PRECONDITION"}})
        answers = self.fake.raw_answers
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        return self._send(200, {"object": "chat.completion", "choices": [{"message": {"content": answer}}]})

    def _endpoint_method(self, name: str, verb: str, body: dict) -> None:
        """An endpoint's deployModel / undeployModel (traffic "0" = the new model) and rawPredict."""
        endpoint = self.fake.resources.get(name)
        if endpoint is None:
            return self._not_found(name)
        if verb == "rawPredict":
            answers = self.fake.raw_answers
            answer = answers.pop(0) if len(answers) > 1 else answers[0]
            return self._send(200, {"object": "chat.completion", "choices": [{"message": {"content": answer}}]})
        split = dict(body.get("trafficSplit") or {})
        if verb == "deployModel":
            deployed = {**body.get("deployedModel", {}), "id": uuid.uuid4().hex[:10]}
            endpoint["deployedModels"].append(deployed)
            split = {(deployed["id"] if k == "0" else k): v for k, v in split.items()} or {deployed["id"]: 100}
            response = {"@type": "type.googleapis.com/google.cloud.aiplatform.v1.DeployModelResponse"}
            response["deployedModel"] = deployed
        else:
            gone = body.get("deployedModelId")
            endpoint["deployedModels"] = [m for m in endpoint["deployedModels"] if m["id"] != gone]
            if not split:
                split = {k: v for k, v in endpoint.get("trafficSplit", {}).items() if k != gone}
            response = {"@type": "type.googleapis.com/google.cloud.aiplatform.v1.UndeployModelResponse"}
        endpoint["trafficSplit"] = split
        return self._send(200, self._done_operation(name, response))

    @staticmethod
    def _done_operation(parent: str, response: dict) -> dict:
        return {"name": f"{parent}/operations/{uuid.uuid4().hex[:8]}", "done": True, "response": response}


class FakeServer:
    """Starts the fake on a free port of 127.0.0.1; use as a context manager."""

    def __init__(self, buckets: set[str] | None = None, package: str = "qwen3-vl-4b-lora-seed"):
        self.fake = FakeApis(buckets=set(buckets or ()))
        self.fake.package = package  # type: ignore[attr-defined]
        handler = type("Handler", (_Handler,), {"fake": self.fake})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.fake.url = self.url

    def __enter__(self) -> FakeApis:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self.fake

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
