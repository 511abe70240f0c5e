"""Running ms-swift's `swift` command line: argument formatting, the launcher, the process group.

Shared by train-lora (`swift sft`) and merge-export (`swift export`). `to_cli` is pure;
`run_command` runs a command in its own process group so that stopping it (an exception
here, or a SIGTERM forwarded by `SigtermForwarder`) stops every process it started
(swift → torchrun → its workers), and beside it a watchdog (`_watchdog.py`, in a session of
its own) that stops all of them when the task process dies without a word (`kill -9`, the
out-of-memory killer): a trainer never outlives the task that started it.
"""

from __future__ import annotations

import difflib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any


def to_cli(args: dict[str, Any]) -> list[str]:
    """Turns {name: value} into ['--name', 'value', ...] as ms-swift's parser expects.

    Booleans become 'true'/'false', lists become several values, dicts become JSON, and
    whole floats become integers (KFP passes dict parameters as protobuf Structs, whose
    numbers are all floats: `gradient_accumulation_steps: 1` arrives as 1.0).
    """
    out: list[str] = []
    for key, value in args.items():
        out.append(f"--{key}")
        if isinstance(value, bool):
            out.append("true" if value else "false")
        elif isinstance(value, list):
            out.extend(_scalar(v) for v in value)
        elif isinstance(value, dict):
            out.append(json.dumps(value))
        else:
            out.append(_scalar(value))
    return out


def _scalar(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return str(value)


def swift_executable() -> str:
    """Returns the `swift` launcher of this Python environment (or the one on PATH)."""
    beside = Path(sys.executable).parent / "swift"
    return str(beside) if beside.exists() else "swift"


def _killpg(pgid: int, sig: int) -> bool:
    """Sends a signal to a process group; False when no process is left in it."""
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


class SigtermForwarder:
    """While entered (main thread only), SIGTERM to this process is forwarded to the command's process group.

    The first SIGTERM sends SIGTERM to the group (swift → torchrun → its workers), and
    SIGKILL after `term_wait_s` if any of it is still alive. Further SIGTERMs are ignored
    (the task is busy saving). The previous handler is restored on exit. Outside the main
    thread (where Python cannot install handlers) nothing is installed. Whether a SIGTERM
    came, and what that means for the task, is the caller's to decide (`received_at`).

    Args:
        term_wait_s: Seconds the group gets to exit before SIGKILL. Default 10.
        log_name: Prefix of the messages printed (the task's name). Default "swift".
        notice: What the task does after a SIGTERM, for the message printed when one
            arrives. Default "stopping swift".
    """

    def __init__(self, term_wait_s: float = 10.0, log_name: str = "swift", notice: str = "stopping swift"):
        self.term_wait_s = term_wait_s
        self.log_name = log_name
        self.received_at: float | None = None
        self.proc: subprocess.Popen | None = None
        self._message = f"{log_name}: SIGTERM received (preemption): {notice}\n".encode()
        self._previous: Any = None
        self._installed = False
        self._timer: threading.Timer | None = None

    @property
    def received(self) -> bool:
        return self.received_at is not None

    def __enter__(self) -> SigtermForwarder:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
            self._installed = False

    def _handle(self, signum: int, frame: object) -> None:
        if self.received:
            return
        self.received_at = time.monotonic()
        # os.write, not print: the main thread may be inside sys.stdout.write (a reentrant call would fail)
        try:
            os.write(2, self._message)
        except OSError:
            pass
        self.forward()

    def attach(self, proc: subprocess.Popen) -> None:
        """Sets the command to forward to (a SIGTERM that came before is forwarded now)."""
        self.proc = proc
        if self.received:
            self.forward()

    def forward(self) -> None:
        proc = self.proc
        if proc is None or self._timer is not None:
            return
        _killpg(proc.pid, signal.SIGTERM)
        self._timer = threading.Timer(self.term_wait_s, _killpg, (proc.pid, signal.SIGKILL))
        self._timer.daemon = True
        self._timer.start()

    def wait_group_gone(self) -> None:
        """After a forwarded SIGTERM: waits (until term_wait_s after it) for the group to exit, then SIGKILLs it."""
        if self.proc is None or self.received_at is None:
            return
        deadline = self.received_at + self.term_wait_s
        while time.monotonic() < deadline and _killpg(self.proc.pid, 0):
            time.sleep(0.05)
        if _killpg(self.proc.pid, signal.SIGKILL):
            print(f"{self.log_name}: swift's processes did not exit after SIGTERM; killed", flush=True)


WATCHDOG = Path(__file__).with_name("_watchdog.py")
ORPHAN_GRACE_S = 5.0  # seconds a command's processes get between SIGTERM and SIGKILL once the task is gone


def start_watchdog(pid: int, grace_s: float = ORPHAN_GRACE_S) -> subprocess.Popen | None:
    """Starts the watchdog that stops process `pid` (its group and descendants) once this process is gone.

    The watchdog runs in a session of its own (a signal to this process's group does not
    reach it) and reads a pipe whose write end only this process holds: end-of-file
    without "done" means this process died. See `_watchdog.py`.

    Args:
        pid: The command's process id, leader of its own process group.
        grace_s: Seconds between SIGTERM and SIGKILL. Default ORPHAN_GRACE_S (5).

    Returns:
        The watchdog process (pass it to `end_watchdog`), or None when it could not be
        started (a warning is printed; the command runs unguarded).
    """
    try:
        return subprocess.Popen(
            [sys.executable, "-I", "-S", str(WATCHDOG), str(os.getpid()), str(pid), str(grace_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as exc:
        print(f"WARNING: cannot start the watchdog of process {pid} ({exc}); it may outlive this task", flush=True)
        return None


def end_watchdog(watchdog: subprocess.Popen | None, grace_s: float = ORPHAN_GRACE_S) -> None:
    """Tells the watchdog the command has exited (it stops any process of it still alive) and waits for it.

    Args:
        watchdog: What `start_watchdog` returned (None: nothing to do).
        grace_s: The watchdog's grace, to bound the wait. Default ORPHAN_GRACE_S (5).
    """
    if watchdog is None or watchdog.stdin is None:
        return
    try:
        watchdog.stdin.write(b"done\n")
        watchdog.stdin.close()
    except OSError:
        pass  # it is gone already
    try:
        watchdog.wait(timeout=grace_s + 10)
    except subprocess.TimeoutExpired:
        watchdog.kill()
        watchdog.wait()


def guard_descendants() -> subprocess.Popen | None:
    """Starts a watchdog that stops this process's descendants (and its group, if it leads one) once it is gone.

    For a process that starts task processes it does not control (kfp.local's runner starts
    each task with a plain Popen): a SIGTERM or `kill -9` of this process alone would leave
    them running under PID 1, and with them the commands they started. The watchdog is the
    same as `run_command`'s (`start_watchdog`) with this process as the command. Release it
    with `release_guard` when this process ends normally: that stops the watchdog without
    signalling anything.

    Returns:
        The watchdog process, or None when it could not be started (a warning is printed).
    """
    return start_watchdog(os.getpid())


def release_guard(watchdog: subprocess.Popen | None) -> None:
    """Stops a `guard_descendants` watchdog without letting it signal anything (this process lives on)."""
    if watchdog is None:
        return
    watchdog.kill()
    watchdog.wait()
    if watchdog.stdin is not None:
        watchdog.stdin.close()


def run_command(
    cmd: list[str],
    env: dict[str, str] | None = None,
    log_path: Path | None = None,
    guard: SigtermForwarder | None = None,
) -> tuple[int, str]:
    """Runs a command in its own process group, streaming its output; its processes never outlive this one.

    Args:
        cmd: The argv.
        env: Variables added to this process's environment. Default None.
        log_path: File the output is appended to. Default None.
        guard: Forwards SIGTERM to the command's group (see SigtermForwarder). Default None.

    Returns:
        (exit code, last 20 kB of output). An exception here (e.g. KeyboardInterrupt)
        stops the whole group before it propagates. If this process dies without a word
        (`kill -9`), the watchdog stops the command's group and descendants within
        ORPHAN_GRACE_S seconds; processes of the command still alive after it exits are
        stopped too.
    """
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        text=True,
        bufsize=1,
        start_new_session=True,
    )
    watchdog = start_watchdog(proc.pid)
    output = _Output(proc, log_path)
    try:
        if guard is not None:
            guard.attach(proc)
        proc.wait()
        if guard is not None:
            guard.wait_group_gone()
    except BaseException:
        _killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        _killpg(proc.pid, signal.SIGKILL)
        raise
    finally:
        end_watchdog(watchdog)  # stops what the command left running: it may hold the output pipe open
        output.finish()
    return proc.returncode, output.tail


class _Output:
    """Streams a command's output to stdout and a log file in a thread, keeping its last 20 kB.

    A thread, so that the command's exit (not the end of its output, which a process it left
    behind may hold open) is what `run_command` waits for.
    """

    DRAIN_S = 30.0  # after the command and its leftovers are stopped, seconds to wait for the end of the output

    def __init__(self, proc: subprocess.Popen, log_path: Path | None):
        self.tail = ""
        self._proc = proc
        self._log_path = log_path
        self._thread = threading.Thread(target=self._pump, name="command-output", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        assert self._proc.stdout is not None
        with open(self._log_path or os.devnull, "a", encoding="utf-8") as log:
            for line in self._proc.stdout:
                sys.stdout.write(line)
                log.write(line)
                self.tail = (self.tail + line)[-20000:]

    def finish(self) -> None:
        """Waits for the end of the output (bounded by DRAIN_S) and closes the pipe."""
        self._thread.join(self.DRAIN_S)
        if self._thread.is_alive():
            print(f"WARNING: the command's output is still open {self.DRAIN_S:.0f} s after it exited; not read further")
        elif self._proc.stdout is not None:
            self._proc.stdout.close()


# `swift sft` arguments the pipeline sets from its inputs: a config must not set them.
RESERVED_ARGS = ("model", "model_type", "dataset", "val_dataset", "output_dir", "add_version", "resume_from_checkpoint")
# The argument names of `swift sft` in the pinned ms-swift, so that a config is checked in
# milliseconds without importing ms-swift (8 s) on a machine that only compiles or submits;
# a test keeps the file equal to the installed ms-swift's `SftArguments`.
SFT_ARGS_FILE = Path(__file__).with_name("swift_sft_args.json")


def pinned_sft_args() -> tuple[str, set[str]]:
    """Returns (ms-swift version, `swift sft` argument names) of the pinned ms-swift (`SFT_ARGS_FILE`)."""
    data = json.loads(SFT_ARGS_FILE.read_text(encoding="utf-8"))
    return data["ms_swift"], set(data["names"])


def swift_arg_problem(key: str, known: set[str], version: str = "") -> str:
    """Returns why a `swift` config key is refused ("" when it is fine).

    Args:
        key: The key (ms-swift's name).
        known: The names `swift sft` accepts.
        version: ms-swift's version, for the message. Default "".
    """
    if key in RESERVED_ARGS:
        return f"'swift.{key}' is set by the pipeline from its inputs; remove it from the config"
    if key in known:
        return ""
    close = difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see `swift sft --help`"
    release = f" {version}" if version else ""
    return f"'swift.{key}' is not an argument of ms-swift{release} `swift sft`{hint}"


# The choices ms-swift's `swift sft` parser enforces (its `Literal` arguments) and those of the
# transformers enums it takes (optimizer, scheduler, strategies), plus the attention kernels, pinned
# like the names so that `swift.optim: bogus` is refused at load, not in the GPU job; a test keeps
# the file equal to the installed ms-swift and transformers (`installed_sft_choices`).
SFT_CHOICES_FILE = Path(__file__).with_name("swift_sft_choices.json")


def pinned_sft_choices() -> dict[str, list]:
    """Returns {argument: its allowed values} of the pinned ms-swift (`SFT_CHOICES_FILE`)."""
    return json.loads(SFT_CHOICES_FILE.read_text(encoding="utf-8"))["choices"]


def installed_sft_choices() -> dict[str, list]:
    """The same table read from the installed ms-swift and transformers (imports both: seconds)."""
    import dataclasses
    import typing

    from swift.arguments import SftArguments
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.trainer_utils import IntervalStrategy, SaveStrategy, SchedulerType
    from transformers.training_args import OptimizerNames

    def literal_values(tp: Any) -> list | None:
        if typing.get_origin(tp) is typing.Literal:
            return [v for v in typing.get_args(tp) if v is not None]
        if typing.get_origin(tp) is typing.Union:
            parts = [literal_values(a) for a in typing.get_args(tp) if a is not type(None)]
            return None if any(p is None for p in parts) else [v for p in parts for v in p]
        return None

    hints = typing.get_type_hints(SftArguments)
    out = {f.name: v for f in dataclasses.fields(SftArguments) if (v := literal_values(hints[f.name]))}
    out["optim"] = [o.value for o in OptimizerNames]
    out["lr_scheduler_type"] = [s.value for s in SchedulerType]
    out["save_strategy"] = [s.value for s in SaveStrategy]
    out["eval_strategy"] = out["logging_strategy"] = [s.value for s in IntervalStrategy]
    kernels = sorted({*ALL_ATTENTION_FUNCTIONS, "eager", "flash_attn"})  # flash_attn: ms-swift's alias
    out["attn_impl"] = sorted({*kernels, *(f"paged|{k}" for k in kernels if "|" not in k)})
    return dict(sorted(out.items()))


def choice_problem(key: str, value: Any, choices: dict[str, list]) -> str:
    """Why `swift.<key>: value` is not one of ms-swift's choices ("" when it is, or the key has none).

    A Hub kernel (`kernels-community/flash-attn`, a name with '/') is left to transformers.
    """
    allowed = choices.get(key)
    if allowed is None or value in allowed or (key == "attn_impl" and isinstance(value, str) and "/" in value):
        return ""
    close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    shown = ", ".join(map(str, allowed[:12])) + (f", ... ({len(allowed)} in all)" if len(allowed) > 12 else "")
    return f"'swift.{key}' must be one of {shown}; got {value!r}{hint}"
