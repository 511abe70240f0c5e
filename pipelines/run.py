"""Run the pipeline.

    python -m pipelines.run --config F [--wait] [--no-cache] [--project P]   (Vertex AI)
    python -m pipelines.run --local [--config F] [--root DIR] [--no-cache] [-v]
    python -m pipelines.run --dry-run [--local] [--config F]     (the plan, machine, time, cost; nothing runs)

Both print the expected training time, GPU-hours and cost first (`pipelines.estimate`: the
profile's GPU, the measured throughput, the price table or `resources.price_usd_per_hour`).

Without `--local` it compiles the config for Vertex, checks project, region, GPU shape and
buckets, and submits an `aiplatform.PipelineJob` (pipeline root, labels, experiment,
caching switch, service account, network, CMEK key); it prints the console link, and with
`--wait` the job's state until it ends.

`--local` runs the whole DAG on this machine under `kfp.local` (SubprocessRunner, no
containers, no cloud): each task runs in this Python environment, artifacts go to a local
pipeline root. With the default config it builds the tiny offline Qwen3-VL and the
synthetic drawings dataset first (cached), so it needs no download.

`--dry-run` prints the plan (the tasks), the machine, the expected time and cost and what
would be submitted (pipeline name, root, labels, the parameters that differ from the config
file), with no credentials and no network; placeholders left in the config are listed all
at once (exit 2).

The local console is quiet: one line per task start and end (its time and key figures),
the newest progress line at most every 30 s, each warning once; everything the tasks print
goes to `<run folder>/run.log`, whose path is printed. `-v` shows it all on the console.
Each task's HTML report gets a `.html` copy beside its KFP artifact (which has no
extension), so a browser opens it; the summary lists their paths.

It prints the run folder, each task's time or that it came from the kfp.local cache, the
data lineage (snapshot fingerprint, files, rows) and the evaluation metrics, and exits 0
only when every task succeeded. When validate-data and train-lora were cache hits it says
so: no new data since the snapshot, no training ran.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import glob
import io
import json
import logging
import os
import re
import shutil
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from components.common.metrics import SUMMARY_METRICS
from components.common.swift import guard_descendants, release_guard
from pipelines.cache_check import cache_entries, check_cache_entries
from pipelines.cli import program, require_modules
from pipelines.config import (
    DEFAULT_LOCAL_CONFIG,
    DEMO_DATA_EVAL,
    DEMO_DATA_TRAIN,
    DEMO_DOCUMENTS_EVAL,
    DEMO_DOCUMENTS_TRAIN,
    DEMO_DRAWINGS_REGRESSION,
    DEMO_MODEL,
    Config,
    check_local_dirs,
    load_config,
    parse_overrides,
)
from pipelines.estimate import estimate_lines
from pipelines.vertex import (
    VertexError,
    command_errors,
    console_link,
    init_vertex,
    pipeline_job,
    preflight,
    run_labels,
    strip_ansi,
    submission_problems,
)

# The tasks that read the data snapshot, in order: all cache hits when the data did not change.
TRAIN_TASKS = ("validate-data", "train-lora", "merge-export", "evaluate")
# the order the summary lists tasks in (validate-regression: with eval.regression only)
_DAG_ORDER = ("snapshot-data", "stage-model", "validate-data", "validate-regression", *TRAIN_TASKS[1:])

# Everything local runs offline: no hub look-ups from transformers, ms-swift or datasets.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "MODELSCOPE_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


# The HTML artifacts of a local run: (task, output name). Each gets a `.html` copy beside it.
REPORTS = (("validate-data", "report"), ("train-lora", "loss_curve"), ("evaluate", "report"))
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


class RunError(RuntimeError):
    """The run cannot start or failed; the message says what and where."""


def demo_cache_dir() -> Path:
    """Returns the folder where the tiny model and demo data are built once."""
    return Path(os.environ.get("VLM_LORA_CACHE", Path.home() / ".cache" / "vlm-lora"))


def resolve_demo_inputs(cfg: Config) -> Config:
    """Replaces `demo://` sources by the tiny model and the demo datasets, building them once.

    `demo://drawings/{train,eval}` are the synthetic engineering drawings (detection),
    `demo://documents/{train,eval}` the synthetic invoices and forms (key_value), and
    `demo://drawings/regression` (eval.regression) general questions about other drawings.

    Args:
        cfg: The config.

    Returns:
        The config with local paths in place of `demo://` sources.
    """
    model, data = cfg.model, cfg.data
    if model.source == DEMO_MODEL:
        from pipelines.demo.tiny_model import ensure_tiny_model

        model = dataclasses.replace(model, source=str(ensure_tiny_model()))
    for train_uri, eval_uri, module, version in (
        (DEMO_DATA_TRAIN, DEMO_DATA_EVAL, "drawings", "demo-drawings-v2"),
        (DEMO_DOCUMENTS_TRAIN, DEMO_DOCUMENTS_EVAL, "documents", "demo-documents-v1"),
    ):
        if train_uri not in (data.train, data.eval) and eval_uri not in (data.train, data.eval):
            continue
        import importlib  # the generator's module, imported only when its data is asked for

        generate_dataset = importlib.import_module(f"pipelines.demo.{module}").generate_dataset
        folder = demo_cache_dir() / version
        marker = folder / "COMPLETE"
        if not marker.exists():
            paths = generate_dataset(folder)
            marker.write_text(json.dumps(paths))
        paths = json.loads(marker.read_text())
        mapping = {train_uri: paths["train"], eval_uri: paths["eval"]}
        data = dataclasses.replace(
            data, train=mapping.get(data.train, data.train), eval=mapping.get(data.eval, data.eval)
        )
    evaluation = cfg.eval
    if evaluation.regression == DEMO_DRAWINGS_REGRESSION:
        from pipelines.demo.drawings import generate_regression

        folder = demo_cache_dir() / "demo-drawings-regression-v1"
        marker = folder / "COMPLETE"
        if not marker.exists():
            marker.write_text(json.dumps(generate_regression(folder)))
        evaluation = dataclasses.replace(evaluation, regression=json.loads(marker.read_text())["regression"])
    return dataclasses.replace(cfg, model=model, data=data, eval=evaluation)


def preflight_local(cfg: Config) -> None:
    """Checks local inputs exist before any task starts.

    Data sources may be files, folders or globs (snapshot-data resolves them); a file or
    folder must exist, a glob must match something.

    Raises:
        RunError: The model folder or a data file / folder is missing, a glob matches
            nothing, or the root is remote.
    """
    if "://" in cfg.pipeline.root:
        raise RunError(
            f"{cfg.path}: pipeline.root {cfg.pipeline.root!r} is remote; a local run needs a local folder (use --root)"
        )
    if "://" not in cfg.model.source and not Path(cfg.model.source).expanduser().is_dir():
        raise RunError(f"{cfg.path}: model.source: model folder not found: {cfg.model.source}")
    for key, value in (
        ("data.train", cfg.data.train),
        ("data.eval", cfg.data.eval),
        ("eval.regression", cfg.eval.regression),
    ):
        for item in filter(None, (s.strip() for s in value.split(","))):
            if "://" in item:
                continue
            if any(c in item for c in "*?["):  # a glob: snapshot-data says which JSONL files it matches
                if not glob.glob(os.path.expanduser(item), recursive=True):
                    raise RunError(f"{cfg.path}: {key}: no file matches the glob: {item}")
            elif not Path(item).expanduser().exists():
                raise RunError(f"{cfg.path}: {key}: data file not found: {item}")


class _TaskTimer(logging.Filter):
    """Records when kfp.local starts and finishes each task, and its cache hits (from its log lines).

    A filter on the root logger, not a handler: kfp.local replaces the root's handlers
    while a task runs, but keeps its filters. It logs a cache hit at INFO outside that
    context, so `run_local` lowers the root's level to INFO for the run; this filter then
    keeps other records quieter than the level before the run from being shown.
    """

    _start = re.compile(r"Executing task (?:\x1b\[\d+m)?'([\w-]+)'")
    _end = re.compile(r"Task (?:\x1b\[\d+m)?'([\w-]+)'(?:\x1b\[\d+m)? finished with status (?:\x1b\[\d+m)?(\w+)")
    _hit = re.compile(r"Task (?:\x1b\[\d+m)?'?([\w-]+)'?(?:\x1b\[\d+m)? cache hit \(key=([0-9a-f]+)\)")

    def __init__(self, floor: int = logging.WARNING, console: _QuietConsole | None = None):
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


class _QuietConsole(io.TextIOBase):
    """The local run's stdout and stderr in quiet mode: all of it to the log file, little of it to the console.

    The console gets one line per task start and end (from `_TaskTimer`), a running task's
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
def quiet_console(run_dir: Path, verbose: bool) -> Iterator[_QuietConsole | None]:
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
        quiet = _QuietConsole(log, console, run_dir)
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet), warnings.catch_warnings():
            warnings.simplefilter("default")
            yield quiet


@contextlib.contextmanager
def own_run_dir(root: Path, pipeline_name: str) -> Iterator[Path]:
    """Creates this run's folder under the pipeline root and makes kfp.local run in it.

    kfp.local 2.17 names a run `<pipeline>-<timestamp>` in
    `kfp.local.executor_input_utils.get_local_pipeline_resource_name` and keeps the name
    to itself; two runs into one root could only be told apart by guessing. Here the run
    creates its folder first (`<pipeline>-<timestamp>-<pid>`, `mkdir` fails if it exists, so
    no other run has it) and that function returns its name for the run's duration. After
    the block the name must have been taken exactly once (the patch took hold).

    Args:
        root: The pipeline root.
        pipeline_name: The pipeline's name (the config's `pipeline.name`).

    Yields:
        The run folder.

    Raises:
        RunError: This kfp has no such function (another version: the run cannot know its
            folder), or kfp.local did not take the name.
    """
    from kfp import __version__ as kfp_version
    from kfp.local import executor_input_utils

    original = getattr(executor_input_utils, "get_local_pipeline_resource_name", None)
    if original is None:
        raise RunError(f"kfp {kfp_version}: kfp.local no longer names runs in get_local_pipeline_resource_name; "
                       "pipelines.run supports kfp 2.17 (pip install kfp==2.17.0)")  # fmt: skip
    while True:
        stamp = time.strftime("%Y-%m-%d-%H-%M-%S") + f"-{time.time_ns() // 1000 % 1_000_000:06d}-{os.getpid()}"
        run_dir = root / f"{pipeline_name}-{stamp}"
        try:
            run_dir.mkdir()
            break
        except FileExistsError:
            time.sleep(0.001)
    taken: list[str] = []

    def this_run(name: str) -> str:
        taken.append(name)
        return run_dir.name

    executor_input_utils.get_local_pipeline_resource_name = this_run
    try:
        yield run_dir
    finally:
        executor_input_utils.get_local_pipeline_resource_name = original
    if len(taken) != 1:
        raise RunError(f"kfp.local named {len(taken)} runs {taken} instead of taking {run_dir.name} once; "
                       "the run cannot say which folder is its own")  # fmt: skip


def read_task_outputs(run_dir: Path | None, cache_dir: Path, hits: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Returns every task's outputs, whether it ran in this run or came from the kfp.local cache.

    A task that ran wrote `<run_dir>/<task>/executor_output.json`; a cache hit's outputs are
    the cache entry `<cache_dir>/<key>.json` (its artifacts point into the run that made them).

    Args:
        run_dir: This run's folder under the pipeline root (None: no task ran).
        cache_dir: kfp.local's cache folder (`<pipeline root>/.kfp_cache`).
        hits: {task: first hex digits of its cache key}, as kfp.local logs them.

    Returns:
        {task: {output name: parameter value, or {"uri", "metadata"} for an artifact}}.
    """
    outputs: dict[str, dict[str, Any]] = {}
    for path in sorted(run_dir.glob("*/executor_output.json")) if run_dir else []:
        data = json.loads(path.read_text())
        task = dict(data.get("parameterValues", {}))
        for name, value in data.get("artifacts", {}).items():
            for artifact in value.get("artifacts", [])[:1]:
                task[name] = {"uri": artifact.get("uri", ""), "metadata": artifact.get("metadata", {})}
        outputs[path.parent.name] = task
    for name, key in hits.items():
        entries = sorted(cache_dir.glob(f"{key}*.json"))
        if len(entries) != 1:
            continue
        task = {}
        for out, value in json.loads(entries[0].read_text()).items():
            if isinstance(value, dict) and value.get("__kfp_artifact__"):
                value = {"uri": value.get("uri", ""), "metadata": value.get("metadata", {})}
            task[out] = value
        outputs[name] = task
    return outputs


def write_metrics_files(cache_dir: Path, root_dir: Path) -> list[str]:
    """Writes each cached Metrics artifact's figures (JSON) to its file, so the next run can reuse the task.

    kfp.local (2.17, `kfp/local/cache.py`) treats a cache entry whose local artifact file
    does not exist as a miss. A `Metrics` output has no file (its figures are metadata in
    the executor output), so without this every task with a Metrics output (validate-data,
    train-lora, evaluate) would run again on every run with unchanged inputs, and the tasks
    after them too, because their input artifacts would be new.

    Args:
        cache_dir: kfp.local's cache folder (`<pipeline root>/.kfp_cache`); absent = nothing to do.
        root_dir: The pipeline root: only artifact files under it are written.

    Returns:
        The files written.
    """
    written = []
    root = str(root_dir.resolve()) + os.sep
    for _entry, outputs in cache_entries(cache_dir):
        for value in outputs.values():
            if not (isinstance(value, dict) and value.get("schema_title") == "system.Metrics"):
                continue
            uri = str(value.get("uri") or "")
            if uri.startswith(root) and not os.path.exists(uri) and os.path.isdir(os.path.dirname(uri)):
                Path(uri).write_text(json.dumps(value.get("metadata") or {}, indent=1, sort_keys=True))
                written.append(uri)
    return written


def data_lineage(outputs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Returns the run's data lineage: the snapshot, and how many files and rows the model learnt from.

    Args:
        outputs: `read_task_outputs(...)`.

    Returns:
        {"fingerprint": snapshot-data's fingerprint, "files", "rows", "train_rows",
        "eval_rows", "from": where the counts were read}: the counts from the merged
        model's lineage.json `data` section, else from validate-data's metrics; {} when
        there is no snapshot-data output.
    """
    fingerprint = outputs.get("snapshot-data", {}).get("fingerprint", "")
    if not fingerprint:
        return {}
    merged = outputs.get("merge-export", {}).get("merged_model", {}).get("uri", "")
    lineage_file = Path(merged) / "lineage.json" if merged else None
    if lineage_file is not None and lineage_file.is_file():
        data = json.loads(lineage_file.read_text()).get("data") or {}
        if data:
            return {
                "fingerprint": fingerprint,
                "files": data.get("files"),
                "rows": data.get("rows"),
                "train_rows": data.get("train_rows"),
                "eval_rows": data.get("eval_rows"),
                "from": str(lineage_file),
            }
    metrics = outputs.get("validate-data", {}).get("metrics", {}).get("metadata", {})
    return {
        "fingerprint": fingerprint,
        "files": metrics.get("data_files"),
        "rows": metrics.get("n_lines"),
        "train_rows": metrics.get("n_train"),
        "eval_rows": metrics.get("n_eval"),
        "from": "validate-data metrics" if metrics else "",
    }


def with_local_root(cfg: Config, root: str) -> Config:
    """The config with another local pipeline root; a model cache inside the old root moves with it.

    `runs/model-cache` under `pipeline.root: runs` becomes `ROOT/model-cache`: `--root` keeps a
    run's files together. A cache elsewhere (another folder, gs://) is the user's and stays.
    """
    old = Path(cfg.pipeline.root).expanduser().resolve()
    cache = cfg.model.cache
    model = cfg.model
    if "://" not in cache:
        resolved = Path(cache).expanduser().resolve()
        if resolved == old or old in resolved.parents:
            model = dataclasses.replace(cfg.model, cache=str(Path(root) / resolved.relative_to(old)))
    return dataclasses.replace(cfg, pipeline=dataclasses.replace(cfg.pipeline, root=root), model=model)


def require_train_extra() -> None:
    """Checks the modules a local run's tasks import (the `train` extra) are installed, before any task starts.

    Raises:
        ModuleNotFoundError: One is missing (its name in `name`; the command line turns it into
            the one line that names the extra, `pipelines.cli.missing_extra`).
    """
    require_modules("PIL", "torch", "transformers", "swift")


def report_copies(outputs: dict[str, dict[str, Any]], run_dir: Path | None) -> list[dict[str, str]]:
    """Gives each HTML report (`REPORTS`) a `.html` copy beside its KFP artifact, so a browser opens it.

    Args:
        outputs: `read_task_outputs(...)`: a cache hit's artifact URI points into the run that made it.
        run_dir: This run's folder (a report elsewhere came from an earlier run).

    Returns:
        [{"task", "name", "path": the .html copy, "from_run": the run folder that produced it
        when that is not this run's, else ""}], in DAG order; reports whose file is gone are left out.
    """
    found = []
    for task, name in REPORTS:
        uri = str(outputs.get(task, {}).get(name, {}).get("uri") or "")
        source = Path(uri)
        if not uri or not source.is_file():
            continue
        copy = source.with_name(source.name + ".html")
        if not copy.is_file() or copy.stat().st_mtime < source.stat().st_mtime:
            tmp = copy.with_name(f".{copy.name}.{os.getpid()}.tmp")
            shutil.copyfile(source, tmp)
            os.replace(tmp, copy)  # whole or not at all
        producer = source.parent.parent
        elsewhere = run_dir is None or producer.resolve() != run_dir.resolve()
        found.append({"task": task, "name": name, "path": str(copy), "from_run": str(producer) if elsewhere else ""})
    return found


def _run_dag(cfg: Config, root_dir: Path, timer: _TaskTimer, verbose: bool) -> tuple[Path, bool, str]:
    """Runs the DAG under kfp.local (already initialised) in a run folder of its own.

    Args:
        cfg: The config, inputs resolved.
        root_dir: The pipeline root.
        timer: The root logger's `_TaskTimer` (given the quiet console here).
        verbose: Show the tasks' output (true) or keep it in `<run>/run.log` (false).

    Returns:
        (the run folder, whether the gate passed, the full log's path or "" when verbose).

    Raises:
        RunError: A task failed; quiet, the console has its last lines.
    """
    from pipelines.pipeline import build_pipeline, pipeline_arguments

    log = ""
    try:
        with own_run_dir(root_dir, cfg.pipeline.name) as run_dir, quiet_console(run_dir, verbose) as quiet:
            timer.console = quiet
            if quiet:
                log = str(run_dir / "run.log")
                quiet.say(f"run folder {run_dir}; the full log: {log} (-v shows it here)")
            try:
                passed = build_pipeline(cfg, "local")(**pipeline_arguments(cfg)).output
            except RuntimeError:
                if quiet:  # the failing task's own last lines, which the console did not show
                    print("\n".join(["", *list(quiet.tail)[-25:], ""]), file=quiet.console, flush=True)
                raise
    except RunError:
        raise
    except RuntimeError as exc:
        failed = [name for name, (_, status) in timer.times.items() if status != "SUCCESS"]
        where = f"its last lines are above; the full log: {log}" if log else "its error is printed above"
        raise RunError(
            f"pipeline failed at task {', '.join(failed) or '?'} ({where}): {strip_ansi(str(exc)).splitlines()[0]}"
        ) from None
    return run_dir, bool(passed), log


def run_local(
    cfg: Config, root: str | None = None, enable_caching: bool | None = None, verbose: bool = True
) -> dict[str, Any]:
    """Runs the whole DAG under kfp.local.

    Args:
        cfg: The config (demo:// sources are built first).
        root: Pipeline root folder; default the config's `pipeline.root`.
        enable_caching: Reuse unchanged tasks' outputs; default the config's setting.
        verbose: Print everything the tasks print (true, the default for callers of this
            function); false: the quiet console of `quiet_console`, the rest in `<run>/run.log`.

    Returns:
        {"run_dir", "passed", "wall_s", "tasks": {name: seconds} of the tasks that ran,
        "cached": [names of the tasks that came from the kfp.local cache], "metrics":
        evaluate's metrics (also when evaluate was a cache hit), "data": `data_lineage`
        (the snapshot fingerprint, files and rows), "reports": `report_copies`, "log": the
        full log's path ("" when verbose)}.

    Raises:
        RunError: Inputs missing, or a task failed (the task's own message is above).
        ModuleNotFoundError: The `train` extra is not installed.
    """
    from kfp import local

    require_train_extra()
    if root:
        cfg = with_local_root(cfg, root)
    check_local_dirs(cfg, root_from="--root" if root else "")  # under a file / not writable: a named error
    cfg = resolve_demo_inputs(cfg)
    preflight_local(cfg)
    # no Vertex estimate here: this run costs no cloud money; --dry-run (and a Vertex run) prints it
    print("cost: none, a local run on this machine (`--dry-run` prints the Vertex profile's estimate)", flush=True)
    root_dir = Path(cfg.pipeline.root).expanduser().resolve()
    root_dir.mkdir(parents=True, exist_ok=True)
    caching = cfg.pipeline.enable_caching if enable_caching is None else enable_caching
    if caching:  # a reused output must still be what its task wrote
        for line in check_cache_entries(root_dir / ".kfp_cache", root_dir):
            print(line, flush=True)
    local.init(local.SubprocessRunner(use_venv=False), pipeline_root=str(root_dir), enable_caching=caching)

    root_logger = logging.getLogger()
    saved_level = root_logger.level
    timer = _TaskTimer(floor=root_logger.getEffectiveLevel())
    saved_env = dict(os.environ)
    os.environ.update(OFFLINE_ENV)  # the tasks are subprocesses: they inherit it
    # kfp.local logs a cache hit at INFO outside its own logging context: let the record reach the filter
    if root_logger.getEffectiveLevel() > logging.INFO:
        root_logger.setLevel(logging.INFO)
    root_logger.addFilter(timer)
    start = time.time()
    guard = guard_descendants()  # a SIGTERM / kill -9 of this process alone stops kfp.local's tasks too
    try:
        run_dir, passed, log = _run_dag(cfg, root_dir, timer, verbose)
    finally:
        release_guard(guard)
        root_logger.removeFilter(timer)
        root_logger.setLevel(saved_level)
        os.environ.clear()
        os.environ.update(saved_env)
        if caching:
            write_metrics_files(root_dir / ".kfp_cache", root_dir)
    wall = time.time() - start
    outputs = read_task_outputs(run_dir, root_dir / ".kfp_cache", timer.hits)
    metrics = outputs.get("evaluate", {}).get("metrics", {}).get("metadata", {})
    return {
        "run_dir": str(run_dir),
        "passed": bool(passed),
        "wall_s": round(wall, 1),
        "tasks": {name: round(sec, 1) for name, (sec, _) in timer.times.items()},
        "cached": [name for name in timer.order if name in timer.hits],
        "metrics": metrics,
        "reason": str(outputs.get("evaluate", {}).get("reason") or ""),
        "data": data_lineage(outputs),
        "reports": report_copies(outputs, run_dir),
        "log": log,
    }


def submit_vertex(
    cfg: Config,
    *,
    wait: bool = False,
    enable_caching: bool | None = None,
    credentials: Any = None,
    api_endpoint: str | None = None,
    poll_s: float = 30.0,
    out: Any = None,
) -> dict[str, Any]:
    """Compiles the config for Vertex and submits it as a PipelineJob.

    Args:
        cfg: The validated config (`vertex.project` and a gs:// `pipeline.root` needed).
        wait: Print the job's state until it ends. Default false.
        enable_caching: Reuse unchanged tasks; default the config's setting.
        credentials: google-auth credentials; default Application Default Credentials.
        api_endpoint: Vertex API endpoint override (tests). Default the regional endpoint.
        poll_s: Seconds between state checks with `wait`. Default 30.
        out: Stream for progress lines. Default stdout.

    Returns:
        {"name": resource name, "link": console URL, "state": last known state}.

    Raises:
        VertexError: The config cannot be submitted (missing project or bucket, ...);
            raised before anything is created.
        RunError: With `wait`, the job ended in a state other than SUCCEEDED.
    """
    import tempfile

    from kfp import compiler

    from pipelines.pipeline import build_pipeline, pipeline_arguments

    out = out or sys.stdout
    preflight(cfg, credentials)
    print("\n".join(estimate_lines(cfg)), file=out, flush=True)  # what it will cost, before anything is created
    v = cfg.vertex
    init_vertex(
        v.project,
        v.region,
        credentials=credentials,
        api_endpoint=api_endpoint,
        service_account=v.service_account or None,
        encryption_key=v.encryption_key or None,
    )
    with tempfile.TemporaryDirectory(prefix="vlm-lora-") as tmp:
        template = str(Path(tmp) / "pipeline.yaml")
        compiler.Compiler().compile(build_pipeline(cfg, "vertex"), package_path=template)
        job = pipeline_job(
            cfg, template, pipeline_arguments(cfg), enable_caching=enable_caching, credentials=credentials
        )
        job.submit(
            service_account=v.service_account or None, network=v.network or None, experiment=v.experiment or None
        )
    link = console_link(job.resource_name)
    print(f"submitted {job.resource_name}\nconsole: {link}", file=out, flush=True)
    state = job._gca_resource.state.name
    if wait:
        state = wait_for(job, poll_s, out)
        if state != "PIPELINE_STATE_SUCCEEDED":
            raise RunError(f"pipeline job {job.resource_name} ended {state}; see {link}")
    return {"name": job.resource_name, "link": link, "state": state}


def wait_for(job: Any, poll_s: float, out: Any) -> str:
    """Prints a pipeline job's state (and its tasks' states) on every change until it ends."""
    done = {"PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED", "PIPELINE_STATE_CANCELLED"}
    seen: dict[str, str] = {}
    while True:
        job._sync_gca_resource()
        resource = job._gca_resource
        state = resource.state.name
        for detail in resource.job_detail.task_details:
            if detail.task_name and seen.get(detail.task_name) != detail.state.name:
                seen[detail.task_name] = detail.state.name
                print(f"  {detail.task_name:<16} {detail.state.name}", file=out, flush=True)
        if seen.get("") != state:
            seen[""] = state
            print(f"{time.strftime('%H:%M:%S')} {state}", file=out, flush=True)
        if state in done:
            return state
        time.sleep(poll_s)


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


def plan_tasks(spec: dict[str, Any]) -> list[str]:
    """Returns a compiled pipeline's tasks in run order; a task under a condition says which.

    Args:
        spec: The compiled pipeline YAML, parsed.

    Returns:
        e.g. ["find-champion", "snapshot-data", "stage-model (if new data)", ..., "register (if the gate
        passed)", "nothing-to-train (if no new data)"].
    """
    components = spec.get("components", {})

    def when(condition: str) -> str:
        if "up_to_date" in condition:
            return "if no new data" if condition.startswith("!") else "if new data"
        return "if the gate passed" if "passed" in condition else "if ..."

    def walk(dag: dict[str, Any], label: str) -> list[str]:
        tasks, names = dict(dag.get("tasks", {})), []
        while tasks:  # dependencies first; the compiled order is alphabetical
            ready = [n for n, t in tasks.items() if set(t.get("dependentTasks") or ()) & set(tasks) <= {n}]
            name = sorted(ready or tasks, key=lambda n: n.startswith("condition"))[0]
            task = tasks.pop(name)
            inner = components.get(task.get("componentRef", {}).get("name", ""), {}).get("dag")
            condition = task.get("triggerPolicy", {}).get("condition", "")
            if inner is not None:  # a dsl.If / Elif / Else group
                names += walk(inner, when(condition) if condition else label)
            else:
                names.append(f"{name} ({label})" if label else name)
        return names

    return walk(spec.get("root", {}).get("dag", {}), "")


def differing_arguments(cfg: Config) -> dict[str, Any]:
    """The run's pipeline parameters that differ from the config file's own (what the overrides changed).

    Args:
        cfg: The config as the run will use it (overrides, --project, --root applied).

    Returns:
        {parameter: value}; a mapping parameter (the swift arguments) shows only its changed keys.
    """
    from pipelines.pipeline import pipeline_arguments

    ours = pipeline_arguments(cfg)
    try:
        base = pipeline_arguments(load_config(cfg.path))
    except Exception:  # noqa: BLE001 - the file alone may not load (an override fixed it): show all
        return ours
    changed: dict[str, Any] = {}
    for key, value in ours.items():
        old = base.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            keys = {k: v for k, v in value.items() if old.get(k) != v}
            changed.update({f"{key}.{k}": v for k, v in keys.items()})
        elif value != old:
            changed[key] = value
    return changed


def dry_run(cfg: Config, *, local: bool, enable_caching: bool | None, out: Any = None) -> list[str]:
    """Prints what a run would do, without credentials, network or any task: plan, machine, time, cost, job.

    Args:
        cfg: The validated config.
        local: Describe a `--local` run instead of a Vertex submission.
        enable_caching: The --no-cache switch (False), else the config's setting.
        out: Stream for the lines. Default stdout.

    Returns:
        The problems that would stop the run (placeholders, a missing project), all of them; [] if none.
    """
    import tempfile

    import yaml
    from kfp import compiler

    from pipelines.pipeline import build_pipeline

    out = out or sys.stdout
    target = "local" if local else "vertex"
    problems = [] if local else submission_problems(cfg)
    print(f"dry run ({target}): nothing submitted, no credentials or network used", file=out)
    try:
        with tempfile.TemporaryDirectory(prefix="vlm-lora-dry-") as tmp:
            compiler.Compiler().compile(build_pipeline(cfg, target), package_path=f"{tmp}/p.yaml")
            spec = yaml.safe_load(Path(f"{tmp}/p.yaml").read_text())
        print("plan: " + " -> ".join(plan_tasks(spec)), file=out)
    except VertexError as exc:
        problems.append(str(exc))
    print("\n".join(estimate_lines(cfg, local=local)), file=out)
    caching = cfg.pipeline.enable_caching if enable_caching is None else enable_caching
    print("would submit:" if not local else "would run:", file=out)
    rows = [("pipeline", cfg.pipeline.name), ("root", cfg.pipeline.root), ("caching", "on" if caching else "off")]
    if not local:
        v = cfg.vertex
        rows += [("project", v.project or "(not set)"), ("region", v.region)]
        rows += [("service account", v.service_account or "(the project's default)")]
        rows += [("labels", ", ".join(f"{k}={val}" for k, val in run_labels(cfg).items()))]
    changed = differing_arguments(cfg)
    rows.append(
        ("parameters", "as in the config file" if not changed else f"{len(changed)} differ from the config file")
    )
    for key, value in rows:
        print(f"  {key + ':':<17} {value}", file=out)
    for key, value in changed.items():
        print(f"    {key} = {json.dumps(value, default=str)}", file=out)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=program("python -m pipelines.run"), description=__doc__.splitlines()[0])
    parser.add_argument("--local", action="store_true", help="run the whole DAG here under kfp.local")
    parser.add_argument(
        "--config", default=None, help="config YAML (default with --local: configs/local/tiny_cpu.yaml)"
    )
    parser.add_argument("--root", default=None, help="pipeline root: folder (--local) or gs:// (default: the config's)")
    parser.add_argument("--no-cache", action="store_true", help="run every task even if its inputs did not change")
    parser.add_argument("--wait", action="store_true", help="Vertex: print the job's state until it ends")
    parser.add_argument("--project", default=None, help="Vertex: project ID (default: the config's vertex.project)")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan, machine, expected time and cost and what would be submitted; no credentials, no network",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="--local: show every task's full log here (default: in run.log)"
    )
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    args = parser.parse_args(argv)
    vertex_only = [flag for flag, used in (("--wait", args.wait), ("--project", args.project is not None)) if used]
    if args.local and vertex_only:  # else silently ignored: the user thinks they asked for something
        print(
            f"error: {' and '.join(vertex_only)} {'is' if len(vertex_only) == 1 else 'are'} for a Vertex run; "
            "drop it with --local (or drop --local to submit to Vertex AI)",
            file=sys.stderr,
        )
        return 2
    if args.dry_run:
        return _main_dry_run(args)
    if not args.local:
        return _main_vertex(args)
    with command_errors(failures=(RunError,)) as outcome:
        cfg = load_config(args.config or DEFAULT_LOCAL_CONFIG, parse_overrides(args.overrides))
        try:
            result = run_local(cfg, args.root, False if args.no_cache else None, verbose=args.verbose)
        except ImportError as exc:
            from pipelines.cli import exit_for_missing_extra

            return exit_for_missing_extra(exc, f"{program('python -m pipelines.run')} --local")
    if outcome.code:
        return outcome.code
    print(format_summary(result))
    return 0


def _with_flags(cfg: Config, args: argparse.Namespace) -> Config:
    """The config with --project and --root applied (Vertex)."""
    if args.project:
        cfg = dataclasses.replace(cfg, vertex=dataclasses.replace(cfg.vertex, project=args.project))
    if args.root:
        cfg = dataclasses.replace(cfg, pipeline=dataclasses.replace(cfg.pipeline, root=args.root))
    return cfg


def _main_dry_run(args: argparse.Namespace) -> int:
    if not args.config and not args.local:
        print("error: --config is required for a Vertex dry run (or add --local)", file=sys.stderr)
        return 2
    with command_errors(failures=(RunError,)) as outcome:
        cfg = load_config(args.config or DEFAULT_LOCAL_CONFIG, parse_overrides(args.overrides))
        cfg = with_local_root(cfg, args.root) if args.local and args.root else _with_flags(cfg, args)
        if args.local:  # what the real local run refuses before any task (run_local), without building inputs
            check_local_dirs(cfg, root_from="--root" if args.root else "")
            preflight_local(cfg)
        problems = dry_run(cfg, local=args.local, enable_caching=False if args.no_cache else None)
        if problems:
            raise VertexError(
                f"{cfg.path}: {len(problems)} settings to fill in before a run can be submitted "
                "(edit the config, or pass section.key=value words):\n" + "\n".join(f"  {p}" for p in problems)
            )
    return outcome.code


def _main_vertex(args: argparse.Namespace) -> int:
    if not args.config:
        print("error: --config is required to submit to Vertex AI (or use --local)", file=sys.stderr)
        return 2
    with command_errors(failures=(RunError,)) as outcome:
        cfg = _with_flags(load_config(args.config, parse_overrides(args.overrides)), args)
        submit_vertex(cfg, wait=args.wait, enable_caching=False if args.no_cache else None)
    return outcome.code


if __name__ == "__main__":
    sys.exit(main())
