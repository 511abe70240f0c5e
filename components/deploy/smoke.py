"""The smoke test: held-out rows as OpenAI chat messages, and every answer must parse for the task.

Pure parts (what tests assert on): `load_rows` / `build_messages` (held-out rows as OpenAI
chat messages), `check_answer` (does an answer parse for the task). `run_smoke` sends the
rows through any `ask(messages) -> text` transport; `smoke_test` does so with the official
`openai` client on a server's `/v1/chat/completions`.
"""

from __future__ import annotations

import base64
import json
import mimetypes
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.common.tasks import get_task
from components.deploy.errors import SmokeTestError

ANSWER_SHOWN_CHARS = 500  # how much of a failing raw answer goes into the error message
IMAGE_TAG_RE = re.compile(r"<image>")

Ask = Callable[[list[dict]], str]


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
