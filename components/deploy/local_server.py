"""A local `swift deploy` of a merged model: its command line, its health, its process group.

`build_deploy_command` is the pure `swift deploy` command line; `LocalServer` runs it in its
own process group (stopped as a group, and with this process even on kill -9) and
`wait_healthy` waits, bounded, for its health route.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from components.deploy.errors import ServerNotHealthyError


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
