"""What a local run prints: the quiet console while the DAG runs, and the summary at its end.

The console is quiet: one line per task start and end (its time and key figures), the
newest progress line at most every `PROGRESS_EVERY_S`, each Python warning once; everything
the tasks print goes to `<run folder>/run.log`. `TaskTimer` reads kfp.local's log lines
(which task started, finished, came from the cache); `QuietConsole` is stdout and stderr
while the run lasts; `format_summary` is the end-of-run text (`pipelines.local_run.run_local`'s
result: tasks, data lineage, the evaluation metrics, the reports, the gate).
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import logging
import re
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from components.common.metrics import SUMMARY_METRICS
from pipelines.vertex import strip_ansi

# The tasks that read the data snapshot, in order: all cache hits when the data did not change.
TRAIN_TASKS = ("validate-data", "train-lora", "merge-export", "evaluate")
# the order the summary lists tasks in (validate-regression: with eval.regression only)
_DAG_ORDER = ("snapshot-data", "stage-model", "validate-data", "validate-regression", *TRAIN_TASKS[1:])
# The figures a task's one console line shows, looked up in its output parameters and artifact metadata.
KEY_FIGURES = {
    "snapshot-data": ("fingerprint", "train_files", "eval_files"),
    "stage-model": ("cache_hit", "num_parameters"),
    "validate-data": ("n_valid", "n_invalid", "n_train", "n_eval"),
    "validate-regression": ("n_valid", "n_invalid"),
    "train-lora": ("first_loss", "final_loss", "eval_loss", "steps"),
    "evaluate": ("base_f1", "tuned_f1", "passed"),
}
PROGRESS_EVERY_S = 30.0  # the quiet console shows a running task's newest progress line at most this often
# Expected locally and said once here instead: the same components run in this Python, not in their images.
_LOCAL_NOISE = re.compile(r"non-Python base image|DockerRunner")
# Python warnings (`UserWarning: ...`) reach the console once; libraries' WARNING log lines stay in the log.
_WARNING = re.compile(r"\b([A-Z]\w*Warning): \s*(.*)")
_PROGRESS = re.compile(r"\d+%\||'loss'|\bprogress\b|\brows?\b|\bstep\b", re.I)


class TaskTimer(logging.Filter):
    """Records when kfp.local starts and finishes each task, and its cache hits (from its log lines).

    A filter on the root logger, not a handler: kfp.local replaces the root's handlers
    while a task runs, but keeps its filters. It logs a cache hit at INFO outside that
    context, so `run_local` lowers the root's level to INFO for the run; this filter then
    keeps other records quieter than the level before the run from being shown.
    """

    _start = re.compile(r"Executing task (?:\x1b\[\d+m)?'([\w-]+)'")
    _end = re.compile(r"Task (?:\x1b\[\d+m)?'([\w-]+)'(?:\x1b\[\d+m)? finished with status (?:\x1b\[\d+m)?(\w+)")
    _hit = re.compile(r"Task (?:\x1b\[\d+m)?'?([\w-]+)'?(?:\x1b\[\d+m)? cache hit \(key=([0-9a-f]+)\)")

    def __init__(self, floor: int = logging.WARNING, console: QuietConsole | None = None):
        super().__init__()
        self.floor = floor  # the root logger's level before the run: quieter records are not shown
        self.console = console  # quiet mode: one line per task start / end / cache hit goes there
        self.handlers = logging.getLogger().handlers[:]  # kfp.local swaps these while a task runs
        self.started: dict[str, float] = {}
        self.times: dict[str, tuple[float, str]] = {}
        self.hits: dict[str, str] = {}  # task -> the first hex digits of its cache key
        self.order: list[str] = []  # tasks in the order they started or were served from the cache

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if m := self._start.search(msg):
            self.started[m.group(1)] = record.created
            self.order.append(m.group(1))
            if self.console:
                self.console.task_started(m.group(1))
        elif m := self._end.search(msg):
            name = m.group(1)
            self.times[name] = (record.created - self.started.get(name, record.created), m.group(2))
            if self.console:
                self.console.task_ended(name, self.times[name][0], m.group(2))
        elif m := self._hit.search(msg):
            self.hits[m.group(1)] = m.group(2)
            self.order.append(m.group(1))
            if self.console:
                self.console.say(f"{m.group(1):<16} from the cache (kfp.local cache hit, key {m.group(2)})")
            return True  # shown: which tasks were reused
        # kfp.local's task logs (its own handlers) pass; other records only at the level set before the run
        return record.levelno >= self.floor or logging.getLogger().handlers != self.handlers


def key_figures(task: str, executor_output: Path) -> str:
    """Returns a finished task's key figures (`KEY_FIGURES`) from its executor output, e.g. "n_train 64, n_eval 16".

    Args:
        task: The task's name.
        executor_output: Its `executor_output.json` (absent or unreadable: "").
    """
    try:
        data = json.loads(executor_output.read_text())
    except (OSError, ValueError):
        return ""
    values = dict(data.get("parameterValues") or {})
    for output in (data.get("artifacts") or {}).values():
        for artifact in output.get("artifacts", [])[:1]:
            values.update(artifact.get("metadata") or {})
    shown = []
    for name in KEY_FIGURES.get(task, ()):
        if name in values:
            value = values[name]
            text = f"{value:.4g}" if isinstance(value, float) and not value.is_integer() else str(value)
            shown.append(f"{name} {text.removesuffix('.0')}")
    return ", ".join(shown)


class QuietConsole(io.TextIOBase):
    """The local run's stdout and stderr in quiet mode: all of it to the log file, little of it to the console.

    The console gets one line per task start and end (from `TaskTimer`), a running task's
    newest progress line at most every `interval_s`, and each Python warning once (kfp.local's
    warnings about running a task's image in this Python are expected here, and libraries'
    WARNING log lines are chatter: both stay in the log). The last lines are kept, so a failure can show its own error.
    """

    def __init__(self, log: io.TextIOBase, console: Any, run_dir: Path, interval_s: float = PROGRESS_EVERY_S):
        super().__init__()
        self.log, self.console, self.run_dir, self.interval_s = log, console, run_dir, interval_s
        self.task, self.task_start, self.last_shown = "", 0.0, 0.0
        self.progress = ""
        self.warned: set[str] = set()
        self.tail: collections.deque[str] = collections.deque(maxlen=40)
        self._partial = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.log.write(text)
        lines = (self._partial + text).replace("\r", "\n").split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._line(strip_ansi(line).strip())
        return len(text)

    def flush(self) -> None:
        self.log.flush()

    def say(self, text: str) -> None:
        """Writes one line to the console (with the clock) and to the log."""
        line = f"{time.strftime('%H:%M:%S')}  {text}"
        print(line, file=self.console, flush=True)
        self.log.write(f"[console] {line}\n")
        self.last_shown = time.time()

    def task_started(self, name: str) -> None:
        self.task, self.task_start, self.progress = name, time.time(), ""
        self.say(f"{name:<16} started")

    def task_ended(self, name: str, seconds: float, status: str) -> None:
        figures = key_figures(name, self.run_dir / name / "executor_output.json")
        self.say(f"{name:<16} {status.lower()} in {seconds:.1f} s" + (f"  ({figures})" if figures else ""))
        self.task = ""

    def _line(self, line: str) -> None:
        if not line:
            return
        self.tail.append(line)
        if m := _WARNING.search(line):
            message = m.group(2).strip() or line
            if not _LOCAL_NOISE.search(line) and message not in self.warned:
                self.warned.add(message)
                self.say(f"warning: {m.group(0)[:400]}")  # from the warning's class on: no file path
            return
        if self.task and _PROGRESS.search(line):
            self.progress = line
            if time.time() - self.last_shown >= self.interval_s:
                elapsed = time.time() - self.task_start
                self.say(f"{self.task:<16} {elapsed:5.0f} s  {line[:120]}")


@contextlib.contextmanager
def quiet_console(run_dir: Path, verbose: bool) -> Iterator[QuietConsole | None]:
    """Sends everything the run prints (task logs, kfp.local's messages, warnings) to `<run_dir>/run.log`.

    Args:
        run_dir: This run's folder.
        verbose: Show everything on the console as it comes instead (nothing is redirected).

    Yields:
        The console writer (None when verbose).
    """
    if verbose:
        yield None
        return
    console = sys.stdout
    with open(run_dir / "run.log", "a", encoding="utf-8") as log:
        quiet = QuietConsole(log, console, run_dir)
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet), warnings.catch_warnings():
            warnings.simplefilter("default")
            yield quiet


def format_summary(result: dict[str, Any]) -> str:
    """Returns the human-readable end-of-run summary."""
    cached = list(result.get("cached", []))
    lines = [f"run folder: {result['run_dir']}", f"wall time: {result['wall_s']:.1f} s", "tasks:"]
    shown = sorted([*result["tasks"], *cached], key=lambda t: _DAG_ORDER.index(t) if t in _DAG_ORDER else 99)
    for name in shown:
        if name in result["tasks"]:
            lines.append(f"  {name:<16} {result['tasks'][name]:7.1f} s")
        else:
            lines.append(f"  {name:<16} from the cache (kfp.local cache hit)")
    data = result.get("data") or {}
    if data:
        counts = f"{data.get('files')} files, {data.get('rows')} rows"
        if data.get("train_rows") is not None:
            counts += f" ({data['train_rows']} train, {data['eval_rows']} eval)"
        lines.append(f"data: snapshot {data['fingerprint']}, {counts}")
    if "validate-data" in cached and "train-lora" in cached:
        tail = [t for t in TRAIN_TASKS if t in cached]
        which = f"{TRAIN_TASKS[0]} .. {TRAIN_TASKS[-1]}" if tail == list(TRAIN_TASKS) else ", ".join(tail)
        lines.append(
            f"no new data since snapshot {data.get('fingerprint', '?')}: {which} came from the cache, no training ran"
        )
    metrics = result["metrics"]
    if metrics:
        reference = str(metrics.get("reference") or "base")
        if reference != "base":
            lines.append(f"reference model: {reference} (the 'ref' column)")
        lines.append(f"eval (held-out):        {'base' if reference == 'base' else ' ref'}      tuned")
        for key in SUMMARY_METRICS:  # components.common.metrics
            if f"base_{key}" in metrics:
                lines.append(f"  {key:<20} {metrics[f'base_{key}']:8.3f}   {metrics[f'tuned_{key}']:8.3f}")
        lines += regression_table(metrics)
    reports = result.get("reports") or []
    if reports:
        lines.append("reports (open in a browser):")
        for item in reports:
            origin = f"  (cached: made by the run {Path(item['from_run']).name})" if item.get("from_run") else ""
            lines.append(f"  {item['task'] + ' ' + item['name']:<24} {item['path']}{origin}")
    if result.get("log"):
        lines.append(f"full log: {result['log']}")
    reason = result.get("reason") or ""
    lines.append(f"gate passed: {result['passed']}" + (f" ({reason})" if reason else ""))
    return "\n".join(lines)


def regression_table(metrics: dict[str, Any]) -> list[str]:
    """The summary's regression lines: overall in the heading, then per kind the gate's metric of both models.

    Args:
        metrics: evaluate's Metrics metadata; without its "regression" entry: no lines.

    Returns:
        The lines: each kind's metric (reference, tuned, tuned - reference, max drop, held or
        FAILED), CER marked as lower-is-better.
    """
    from components.common.regression import KINDS, OVERALL, check_drops

    figures = metrics.get("regression")
    if not isinstance(figures, dict) or not figures.get("kinds"):
        return []
    drops = {d.name: d for d in check_drops(figures, metrics.get("regression_max_drop") or {})}
    ref = "base" if str(metrics.get("reference") or "base") == "base" else "ref"

    def row(name: str, entry: dict[str, Any], metric: str) -> str:
        d = drops[name]
        cells = f"{entry['reference'][metric]:8.3f}   {entry['tuned'][metric]:8.3f}   {entry['delta'][metric]:+7.3f}"
        return f"{cells}   {d.allowed:8.3f}  {'held' if d.ok else 'FAILED'}"

    overall = figures[OVERALL]
    heading = f"regression set ({int(overall['tuned']['n'])} rows):"
    lines = [f"{heading}{ref:>{max(5, 32 - len(heading))}}   {'tuned':>8}   {'delta':>7}   {'max drop':>8}"]
    for kind, entry in figures["kinds"].items():
        spec = KINDS[kind]
        label = f"{kind} {spec.gate_metric}" + ("" if spec.higher_is_better else " (lower better)")
        lines.append(f"  {label:<22}{row(kind, entry, spec.gate_metric)}")
    lines.append(f"  {'overall score':<22}{row(OVERALL, overall, 'score')}")
    return lines
