"""Serve a merged model and prove it answers: the smoke test, a local `swift deploy`, Vertex endpoints.

Pure parts (what tests assert on): `load_rows` / `build_messages` (held-out rows as OpenAI chat
messages), `check_answer` (does an answer parse for the task), `build_deploy_command` (the
`swift deploy` command line), `check_plan` (endpoint, machine, traffic of a Vertex
deployment), `shifted_split` (the traffic split after a new model passed). Side effects sit in
small functions: `smoke_test` (the official `openai` client on a server's
`/v1/chat/completions`), `run_smoke` (any `ask(messages) -> text` transport), `wait_healthy` /
`LocalServer` (a local `swift deploy` in its own process group) and `deploy_to_vertex`
(aiplatform).

Order on Vertex (`deploy_to_vertex`): the new version is deployed beside the champion's
deployed models with no traffic, smoke-tested directly (the endpoint's per-deployed-model
`invoke` route), and only then takes its traffic share; the old deployed models are undeployed
only after that and only when the new one takes 100 %. A failed smoke test undeploys the new
deployment: traffic never left the champion.
"""

from __future__ import annotations

import base64
import json
import mimetypes
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.common.tasks import get_task

ANSWER_SHOWN_CHARS = 500  # how much of a failing raw answer goes into the error message
IMAGE_TAG_RE = re.compile(r"<image>")

Ask = Callable[[list[dict]], str]


class DeployError(RuntimeError):
    """Serving or deploying failed; the message says what and how to fix it."""


class ServerNotHealthyError(DeployError):
    """A server did not become healthy within the bounded wait (or exited before)."""


class SmokeTestError(DeployError):
    """A smoke-test request failed or its answer does not parse for the task (raw answer in the message)."""


class EndpointLocationError(DeployError):
    """The endpoint named in the config is in another project or region than the deployment."""


@dataclass(frozen=True)
class SmokeResult:
    """What the smoke test saw.

    Attributes:
        answers: Per row: {"row": index, "answer": raw text, "seconds": request time}.
        seconds: Total time of all requests, s.
        task: The task whose parser accepted every answer.
    """

    answers: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    task: str = ""


# ----------------------------------------------------------------------------- rows


def load_rows(dataset_dir: str | os.PathLike, limit: int = 3) -> list[dict[str, Any]]:
    """Reads the first rows of a validated eval dataset folder (`data.jsonl` + `images/`).

    Args:
        dataset_dir: Folder with `data.jsonl` (ms-swift rows, image paths relative to it).
        limit: How many rows to read; <= 0 = all. Default 3.

    Returns:
        The rows as parsed, with every `images` path made absolute.

    Raises:
        SmokeTestError: No `data.jsonl`, no rows, or a row that is not JSON.
    """
    folder = Path(dataset_dir)
    data = folder / "data.jsonl" if folder.is_dir() else folder
    if not data.is_file():
        raise SmokeTestError(f"no smoke-test rows: {data} does not exist (expected a validated eval dataset folder)")
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(data.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise SmokeTestError(f"{data}:{number}: not JSON ({exc})") from None
        row["images"] = [str((data.parent / p).resolve()) if "://" not in p else p for p in row.get("images") or []]
        rows.append(row)
        if 0 < limit <= len(rows):
            break
    if not rows:
        raise SmokeTestError(f"no smoke-test rows in {data}")
    return rows


def _data_url(path: str) -> str:
    if "://" in path:
        return path
    mime = mimetypes.guess_type(path)[0] or "image/png"
    return f"data:{mime};base64,{base64.b64encode(Path(path).read_bytes()).decode()}"


def build_messages(row: dict[str, Any]) -> list[dict[str, Any]]:
    """Turns an ms-swift row into OpenAI chat messages, without the answer.

    System messages are kept; the last user message carries the row's images (base64 data
    URLs, before the text) and its text without `<image>` tags. The assistant's answer and
    anything after the last user message are dropped.

    Args:
        row: A row of `load_rows` (`messages`, absolute `images`).

    Returns:
        The `messages` of a chat completions request.

    Raises:
        SmokeTestError: The row has no user message.
    """
    messages = row.get("messages") or []
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    if last_user < 0:
        raise SmokeTestError(f"smoke-test row has no user message: {json.dumps(row)[:200]}")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages[: last_user + 1]):
        text = IMAGE_TAG_RE.sub("", str(message.get("content") or "")).strip()
        if i == last_user:
            content = [{"type": "image_url", "image_url": {"url": _data_url(p)}} for p in row.get("images") or []]
            out.append({"role": "user", "content": [*content, {"type": "text", "text": text}]})
        else:
            out.append({"role": message["role"], "content": text})
    return out


def check_answer(answer: Any, task: str) -> str:
    """Returns "" when the answer parses for the task, else why not.

    "detection": `components.common.answers.parse_findings`; "json": a fenced or plain JSON
    value; "" (free text): any non-empty text.

    Raises:
        ValueError: An unknown task.
    """
    if not isinstance(answer, str) or not answer.strip():
        return "empty answer"
    _, reason = get_task(task).parse(answer)
    return reason or ""


def run_smoke(ask: Ask, rows: Sequence[dict[str, Any]], task: str) -> SmokeResult:
    """Sends each row through `ask` and checks that every answer parses for the task.

    Args:
        ask: messages -> answer text (the transport: `openai_ask`, `vertex_invoke_ask`).
        rows: Rows of `load_rows`.
        task: "detection", "json" or "" (free text).

    Returns:
        The answers and timings.

    Raises:
        SmokeTestError: A request failed, or an answer does not parse (its raw text, truncated,
            is in the message).
    """
    get_task(task)  # unknown task: ValueError before any request
    if not rows:
        raise SmokeTestError("no smoke-test rows")
    answers: list[dict[str, Any]] = []
    start = time.monotonic()
    for index, row in enumerate(rows):
        t0 = time.monotonic()
        try:
            answer = ask(build_messages(row))
        except SmokeTestError:
            raise
        except Exception as exc:  # the transport's own errors (connection, HTTP status, timeout)
            raise SmokeTestError(f"smoke-test request {index} failed: {type(exc).__name__}: {exc}") from exc
        reason = check_answer(answer, task)
        if reason:
            shown = answer if isinstance(answer, str) else repr(answer)
            if len(shown) > ANSWER_SHOWN_CHARS:
                shown = shown[:ANSWER_SHOWN_CHARS] + f"... ({len(answer)} characters)"
            raise SmokeTestError(
                f"smoke-test answer {index} does not parse for task {task or 'text'!r}: {reason}; raw answer: {shown!r}"
            )
        answers.append({"row": index, "answer": answer, "seconds": round(time.monotonic() - t0, 3)})
    return SmokeResult(answers, round(time.monotonic() - start, 3), task)


def openai_ask(base_url: str, model_name: str, *, timeout_s: float, api_key: str | None = None, max_tokens: int = 512):
    """Returns an `ask` that calls `/v1/chat/completions` of an OpenAI-compatible server with the `openai` client.

    Args:
        base_url: Server root, e.g. http://127.0.0.1:8000 (`/v1` is added).
        model_name: Served model name.
        timeout_s: Per-request timeout, s.
        api_key: Bearer key; None = "EMPTY" (servers without a key accept any). Default None.
        max_tokens: Generation limit per answer. Default 512.
    """
    import openai

    client = openai.OpenAI(
        base_url=f"{base_url.rstrip('/')}/v1", api_key=api_key or "EMPTY", timeout=timeout_s, max_retries=0
    )

    def ask(messages: list[dict]) -> str:
        reply = client.chat.completions.create(
            model=model_name, messages=messages, max_tokens=max_tokens, temperature=0.0
        )
        return reply.choices[0].message.content or ""

    return ask


def smoke_test(
    base_url: str,
    model_name: str,
    rows: Sequence[dict[str, Any]],
    task: str,
    *,
    timeout_s: float,
    api_key: str | None = None,
    max_tokens: int = 512,
) -> SmokeResult:
    """Sends held-out rows to an OpenAI-compatible server and checks every answer parses for the task.

    Args:
        base_url: Server root, e.g. http://127.0.0.1:8000.
        model_name: Served model name (the `model` of each request).
        rows: Rows of `load_rows` (images are sent as base64 data URLs).
        task: "detection", "json" or "" (non-empty text).
        timeout_s: Per-request timeout, s.
        api_key: Bearer key; None = none. Default None.
        max_tokens: Generation limit per answer. Default 512.

    Returns:
        The answers and timings.

    Raises:
        SmokeTestError: A request failed or an answer does not parse.
    """
    ask = openai_ask(base_url, model_name, timeout_s=timeout_s, api_key=api_key, max_tokens=max_tokens)
    return run_smoke(ask, rows, task)


# ----------------------------------------------------------------------------- local server


def wait_healthy(
    base_url: str,
    timeout_s: float,
    *,
    process: subprocess.Popen | None = None,
    route: str = "/health",
    interval_s: float = 0.5,
    log_path: str | os.PathLike | None = None,
) -> float:
    """Waits until `GET {base_url}{route}` answers 200, at most `timeout_s`.

    Args:
        base_url: Server root.
        timeout_s: Longest wait, s.
        process: The server process; when it exits first the wait stops at once. Default None.
        route: Health route. Default "/health".
        interval_s: Pause between tries, s. Default 0.5.
        log_path: The server's log; its last lines go into the error. Default None.

    Returns:
        Seconds waited.

    Raises:
        ServerNotHealthyError: The process exited, or no 200 within `timeout_s`.
    """
    start = time.monotonic()
    url = f"{base_url.rstrip('/')}{route}"
    last = "no answer"
    while True:
        if process is not None and process.poll() is not None:
            raise ServerNotHealthyError(
                f"the server exited with code {process.returncode} before {url} answered{_log_tail(log_path)}"
            )
        try:
            with urllib.request.urlopen(url, timeout=min(5.0, max(timeout_s, 0.1))) as reply:
                if reply.status == 200:
                    return round(time.monotonic() - start, 2)
                last = f"HTTP {reply.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except OSError as exc:
            last = type(exc).__name__
        if time.monotonic() - start > timeout_s:
            raise ServerNotHealthyError(
                f"{url} did not answer 200 within {timeout_s:g} s (last: {last}); the server is still loading or "
                f"stuck: raise the timeout or read its log{_log_tail(log_path)}"
            )
        time.sleep(interval_s)


def _log_tail(log_path: str | os.PathLike | None, lines: int = 5) -> str:
    if not log_path or not Path(log_path).is_file():
        return ""
    tail = [line for line in Path(log_path).read_text(errors="replace").splitlines() if line.strip()][-lines:]
    return f"; last log lines ({log_path}):\n" + "\n".join(tail) if tail else ""


def model_type_of(model_dir: str | os.PathLike) -> str:
    """Returns the ms-swift model_type of a model folder: its config.json `model_type` ("" if unknown).

    `swift deploy` needs it for Qwen3-VL, whose folder also matches qwen3_vl_emb / _reranker.
    """
    try:
        return str(json.loads((Path(model_dir) / "config.json").read_text()).get("model_type") or "")
    except (OSError, ValueError):
        return ""


def trained_max_pixels(model_dir: str | os.PathLike) -> int:
    """The `swift.max_pixels` the merged model was trained with (merge-export's lineage.json); 0 = none.

    Serving shrinks images the same way, as evaluate did: a model trained on resized drawings
    answers for resized drawings.
    """
    try:
        lineage = json.loads((Path(model_dir) / "lineage.json").read_text())
        value = lineage["training"]["hyperparameters"].get("max_pixels") or 0
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return 0
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def build_deploy_command(
    model_dir: str,
    port: int,
    *,
    host: str = "127.0.0.1",
    model_type: str = "",
    served_model_name: str = "",
    infer_backend: str = "transformers",
    max_pixels: int = 0,
    extra: dict[str, Any] | None = None,
) -> list[str]:
    """Returns the `swift deploy` command line that serves a merged model.

    Args:
        model_dir: Merged model folder.
        port: TCP port.
        host: Address to bind. Default 127.0.0.1.
        model_type: ms-swift model_type; "" = none passed. Default "".
        served_model_name: The `model` name clients use; "" = the folder's name. Default "".
        infer_backend: transformers (CPU and GPU) or vllm. Default transformers.
        max_pixels: Shrink larger images to this many pixels, as in training
            (`trained_max_pixels`); 0 = not passed. Default 0.
        extra: More `swift deploy` arguments, by ms-swift's names (e.g. {"template": "qwen2_5_vl"}).

    Returns:
        ["swift", "deploy", "--model", model_dir, ...].
    """
    from components.common.swift import to_cli

    args: dict[str, Any] = {"model": model_dir, "infer_backend": infer_backend, "host": host, "port": int(port)}
    if model_type:
        args["model_type"] = model_type
    if served_model_name:
        args["served_model_name"] = served_model_name
    if max_pixels:
        args["max_pixels"] = int(max_pixels)
    args.update(extra or {})
    return ["swift", "deploy", *to_cli(args)]


class LocalServer:
    """A `swift deploy` process in its own process group, stopped as a group.

    Use as a context manager: entering starts it and waits until it is healthy; leaving (or
    `stop`) sends SIGTERM to the group, then SIGKILL after `term_wait_s`.

    Args:
        model_dir: Merged model folder.
        port: TCP port on 127.0.0.1.
        log_path: Where the server's output goes.
        start_timeout_s: Longest wait for health, s. Default 300.
        model_type: ms-swift model_type; "" = the folder's config.json model_type. Default "".
        served_model_name: The `model` name clients use; "" = the folder's name. Default "".
        extra: More `swift deploy` arguments. Default none.
        term_wait_s: Seconds between SIGTERM and SIGKILL on stop. Default 10.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike,
        port: int,
        log_path: str | os.PathLike,
        *,
        start_timeout_s: float = 300.0,
        model_type: str = "",
        served_model_name: str = "",
        extra: dict[str, Any] | None = None,
        term_wait_s: float = 10.0,
    ):
        self.model_dir = str(Path(model_dir).resolve())
        self.port = int(port)
        self.log_path = Path(log_path)
        self.start_timeout_s = start_timeout_s
        self.model_name = served_model_name or Path(self.model_dir).name
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.term_wait_s = term_wait_s
        self.command = build_deploy_command(
            self.model_dir,
            self.port,
            model_type=model_type or model_type_of(self.model_dir),
            served_model_name=self.model_name,
            max_pixels=trained_max_pixels(self.model_dir),
            extra=extra,
        )
        self.process: subprocess.Popen | None = None
        self.watchdog: subprocess.Popen | None = None

    def start(self) -> float:
        """Starts the server and waits until healthy; returns the seconds waited.

        Raises:
            ServerNotHealthyError: Not a model folder, the server exited, or no health in time
                (the server is stopped).
        """
        from components.common.swift import start_watchdog, swift_executable

        if not (Path(self.model_dir) / "config.json").is_file():
            raise ServerNotHealthyError(f"{self.model_dir} is not a model folder (no config.json)")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [swift_executable(), *self.command[1:]]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.watchdog = start_watchdog(self.process.pid)  # the server dies with this process, even on kill -9
        try:
            return wait_healthy(self.base_url, self.start_timeout_s, process=self.process, log_path=self.log_path)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stops the server's process group (SIGTERM, then SIGKILL after `term_wait_s`)."""
        proc = self.process
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, self.term_wait_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # the leader may be gone while others of its group live on: make sure the group is empty
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.process = None
        from components.common.swift import end_watchdog

        end_watchdog(self.watchdog)
        self.watchdog = None

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# ----------------------------------------------------------------------------- Vertex AI

_ENDPOINT_RE = re.compile(r"^projects/([^/]+)/locations/([^/]+)/endpoints/([^/]+)$")


@dataclass(frozen=True)
class DeployPlan:
    """Where and how a model version is deployed on Vertex AI.

    Attributes:
        endpoint: Endpoint display name (created when missing) or resource name
            `projects/P/locations/R/endpoints/ID` (must exist, in the deployment's project and region).
        machine_type: Serving machine, e.g. g2-standard-12.
        accelerator_type: e.g. NVIDIA_L4; "" = none. Default "".
        accelerator_count: GPUs per replica. Default 0.
        min_replicas: Default 1.
        max_replicas: Default 1.
        traffic_percent: Share of the endpoint's traffic the new version takes, 1..100; 100 =
            all traffic, and the previous deployed models are undeployed after the smoke test.
            Default 100.
        deployed_name: Display name of the deployed model ("" = the model's). Default "".
        deploy_timeout_s: Longest wait for the deployment, s. Default 3600.
        served_model_name: The serving container's model name (its `--served_model_name`),
            sent as `model` in the smoke test. Default "tuned".
    """

    endpoint: str
    machine_type: str
    accelerator_type: str = ""
    accelerator_count: int = 0
    min_replicas: int = 1
    max_replicas: int = 1
    traffic_percent: int = 100
    deployed_name: str = ""
    deploy_timeout_s: float = 3600.0
    served_model_name: str = "tuned"


@dataclass(frozen=True)
class Deployed:
    """Result of `deploy_to_vertex`.

    Attributes:
        endpoint: Endpoint resource name.
        deployed_model_id: ID of the new DeployedModel.
        created_endpoint: True when this deployment created the endpoint.
        undeployed: IDs of the previous DeployedModels undeployed after the smoke test.
        traffic_split: The endpoint's traffic split at the end.
        smoke: The smoke test's result.
    """

    endpoint: str
    deployed_model_id: str
    created_endpoint: bool
    undeployed: list[str]
    traffic_split: dict[str, int]
    smoke: SmokeResult


def check_plan(plan: DeployPlan, project: str, location: str) -> None:
    """Checks a plan before anything is deployed.

    Raises:
        EndpointLocationError: The endpoint resource name is in another project or region.
        DeployError: No machine type, traffic outside 1..100, replicas out of order, or a GPU
            type without a count.
    """
    if not plan.endpoint:
        raise DeployError("deploy.endpoint is empty: give an endpoint display name or resource name")
    m = _ENDPOINT_RE.match(plan.endpoint)
    if plan.endpoint.startswith("projects/") and not m:
        raise DeployError(f"deploy.endpoint {plan.endpoint!r} is not projects/P/locations/R/endpoints/ID")
    if m and (m.group(1), m.group(2)) != (project, location):
        raise EndpointLocationError(
            f"deploy.endpoint {plan.endpoint!r} is in project {m.group(1)!r}, region {m.group(2)!r}, but this run "
            f"deploys in project {project!r}, region {location!r}: a model is served only in its own region; "
            "use an endpoint of this project and region (or its display name to create one)"
        )
    if not plan.machine_type:
        raise DeployError("deploy.machine_type is empty")
    if not 1 <= int(plan.traffic_percent) <= 100:
        raise DeployError(f"deploy.traffic_percent is {plan.traffic_percent}; expected 1..100")
    if not 1 <= int(plan.min_replicas) <= int(plan.max_replicas):
        raise DeployError(f"deploy replicas: need 1 <= min ({plan.min_replicas}) <= max ({plan.max_replicas})")
    if bool(plan.accelerator_type) != (int(plan.accelerator_count) > 0):
        raise DeployError("deploy.accelerator_type and deploy.accelerator_count go together (both set or neither)")


def vertex_invoke_ask(
    endpoint: str,
    deployed_model_id: str,
    *,
    location: str,
    credentials: Any = None,
    api_base: str = "",
    model_name: str = "tuned",
    route: str = "/v1/chat/completions",
    timeout_s: float = 300.0,
    max_tokens: int = 512,
) -> Ask:
    """Returns an `ask` that posts an OpenAI chat request to one deployed model of an endpoint.

    It uses the endpoint's `deployedModels/{id}/invoke/{route}` method, which reaches the named
    deployed model whatever the endpoint's traffic split says (so a new model is smoke-tested
    while it still takes no traffic). Vertex forwards the body unchanged to the container's
    route; the model's container spec must allow it (`invokeRoutePrefix`, set by register).

    Args:
        endpoint: Endpoint resource name.
        deployed_model_id: ID of the deployed model that must answer.
        location: Vertex region (the API host).
        credentials: google-auth credentials; default ADC.
        api_base: API root; "" = https://{location}-aiplatform.googleapis.com. Default "".
        model_name: The `model` of each request: the container's served model name (`swift
            deploy` refuses any other). Default "tuned".
        route: The container's chat route. Default "/v1/chat/completions".
        timeout_s: Per-request timeout, s. Default 300.
        max_tokens: Generation limit per answer. Default 512.
    """
    import google.auth
    from google.auth.transport.requests import AuthorizedSession

    if credentials is None:
        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    session = AuthorizedSession(credentials)
    root = (api_base or f"https://{location}-aiplatform.googleapis.com").rstrip("/")
    url = f"{root}/v1/{endpoint}/deployedModels/{deployed_model_id}/invoke{route}"

    def ask(messages: list[dict]) -> str:
        body = {"model": model_name, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0}
        reply = session.post(url, json=body, timeout=timeout_s)
        if reply.status_code != 200:
            raise SmokeTestError(f"{url} answered HTTP {reply.status_code}: {reply.text[:ANSWER_SHOWN_CHARS]}")
        try:
            return reply.json()["choices"][0]["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError):
            raise SmokeTestError(
                f"{url} did not answer a chat completion: {reply.text[:ANSWER_SHOWN_CHARS]!r}"
            ) from None

    return ask


def shifted_split(old_split: dict[str, int], new_id: str, percent: int) -> dict[str, int]:
    """Returns the traffic split that gives `new_id` `percent` and the rest to the old models, in proportion.

    The old models keep their relative shares of the remaining `100 - percent` (rounded down;
    the remainder goes to the largest). Models with no share stay at none; with no old share
    at all the new model takes everything.

    Args:
        old_split: The endpoint's split before (deployed model ID -> percent).
        new_id: The new deployed model's ID.
        percent: The new model's share, 1..100.
    """
    old = {k: int(v) for k, v in old_split.items() if k != new_id and int(v) > 0}
    total = sum(old.values())
    if percent >= 100 or total == 0:
        return {new_id: 100}
    rest = 100 - int(percent)
    split = {k: v * rest // total for k, v in old.items()}
    largest = max(old, key=lambda k: (old[k], k))
    split[largest] += rest - sum(split.values())
    split[new_id] = int(percent)
    return split


def find_or_create_endpoint(plan: DeployPlan, project: str, location: str, credentials: Any = None):
    """Returns (the aiplatform Endpoint, created?) for the plan's endpoint name or display name."""
    from google.cloud import aiplatform

    where = {"project": project, "location": location, "credentials": credentials}
    if plan.endpoint.startswith("projects/"):
        return aiplatform.Endpoint(plan.endpoint, **where), False
    found = [e for e in aiplatform.Endpoint.list(**where) if e.display_name == plan.endpoint]
    if len(found) > 1:
        names = ", ".join(e.resource_name for e in found)
        raise DeployError(f"{len(found)} endpoints are named {plan.endpoint!r} ({names}); set deploy.endpoint to one")
    if found:
        return found[0], False
    return aiplatform.Endpoint.create(display_name=plan.endpoint, sync=True, **where), True


def deploy_to_vertex(
    model_name: str,
    plan: DeployPlan,
    project: str,
    location: str,
    rows: Sequence[dict[str, Any]],
    task: str,
    *,
    credentials: Any = None,
    ask_for: Callable[[str, str], Ask] | None = None,
    before_traffic: Callable[[], None] | None = None,
) -> Deployed:
    """Deploys a registered model version, smoke-tests it, then gives it traffic and retires the old models.

    Order: check the plan (nothing touched on error) → find or create the endpoint → deploy
    the version beside the deployed models already there, with no traffic while they serve
    (all traffic on an empty endpoint) → smoke test that deployed model directly (its
    `invoke` route, whatever the split) → only when it passes, the new split (the new model
    takes `traffic_percent`, the old ones keep their proportions of the rest) → at 100 %,
    undeploy the models that were there before. A failed smoke test undeploys the new model;
    the endpoint's traffic never reached it.

    Args:
        model_name: Model version resource name, `projects/P/locations/R/models/ID@VERSION`.
        plan: Endpoint, machine, GPU, replicas, traffic.
        project: Google Cloud project ID.
        location: Vertex region.
        rows: Smoke-test rows (`load_rows`).
        task: Smoke-test task ("detection", "json", "").
        credentials: google-auth credentials; default ADC.
        ask_for: (endpoint resource name, deployed model ID) -> `ask` transport; default
            `vertex_invoke_ask`.
        before_traffic: Called after the smoke test passed, before any traffic moves (the
            champion check: another run may have promoted a model meanwhile); when it raises,
            the new model is undeployed like after a failed smoke test. Default none.

    Returns:
        The endpoint, the new deployed model's ID, what was undeployed, the traffic split.

    Raises:
        EndpointLocationError: The endpoint is in another project or region (before deploying).
        DeployError: The plan is invalid, or the endpoint name is ambiguous.
        SmokeTestError: The deployed model's answers do not parse (it was undeployed again).
    """
    from google.cloud import aiplatform

    check_plan(plan, project, location)
    get_task(task)
    if not rows:
        raise SmokeTestError("no smoke-test rows")
    model = aiplatform.Model(model_name, project=project, location=location, credentials=credentials)
    endpoint, created = find_or_create_endpoint(plan, project, location, credentials)
    new_id, before, old_split = _deploy_without_traffic(endpoint, model, plan)
    ask = (ask_for or _invoke_transport(plan, location, credentials))(endpoint.resource_name, new_id)
    try:
        smoke = run_smoke(ask, rows, task)
        if before_traffic is not None:
            before_traffic()
    except Exception as exc:
        why = "smoke test failed" if isinstance(exc, SmokeTestError) else f"{type(exc).__name__}"
        print(f"deploy: {why}; undeploying {new_id}, traffic stays {old_split or 'none'}", flush=True)
        endpoint.undeploy(new_id)
        raise
    split = shifted_split(old_split, new_id, int(plan.traffic_percent))
    if split != {k: int(v) for k, v in dict(endpoint.traffic_split).items()}:
        endpoint.update(traffic_split=split)
    undeployed: list[str] = []
    if split == {new_id: 100}:
        for old_id in sorted(before):
            endpoint._sync_gca_resource()  # noqa: SLF001 - the SDK's own refresh
            endpoint.undeploy(old_id)
            undeployed.append(old_id)
    endpoint._sync_gca_resource()  # noqa: SLF001
    final = {k: int(v) for k, v in dict(endpoint.traffic_split).items()}
    return Deployed(endpoint.resource_name, new_id, created, undeployed, final, smoke)


def _invoke_transport(plan: DeployPlan, location: str, credentials: Any) -> Callable[[str, str], Ask]:
    def ask_for(endpoint: str, deployed_model_id: str) -> Ask:
        return vertex_invoke_ask(
            endpoint, deployed_model_id, location=location, credentials=credentials, model_name=plan.served_model_name
        )

    return ask_for


def _deploy_without_traffic(endpoint: Any, model: Any, plan: DeployPlan) -> tuple[str, set[str], dict[str, int]]:
    """Deploys `model` to `endpoint` taking no traffic while other models serve; returns (new ID, old IDs, old split)."""
    before = {m.id for m in endpoint.list_models()}
    old_split = {k: int(v) for k, v in dict(endpoint.traffic_split).items()}
    serving = sum(old_split.values()) > 0
    endpoint.deploy(
        model,
        deployed_model_display_name=plan.deployed_name or None,
        traffic_percentage=0 if serving else 100,
        machine_type=plan.machine_type,
        min_replica_count=int(plan.min_replicas),
        max_replica_count=int(plan.max_replicas),
        accelerator_type=plan.accelerator_type or None,
        accelerator_count=int(plan.accelerator_count) or None,
        deploy_request_timeout=plan.deploy_timeout_s,
        sync=True,
    )
    endpoint._sync_gca_resource()  # noqa: SLF001 - the SDK's own refresh after deploy
    new = [m.id for m in endpoint.list_models() if m.id not in before]
    if len(new) != 1:
        raise DeployError(f"expected one new deployed model on {endpoint.resource_name}, found {new}")
    return new[0], before, old_split
