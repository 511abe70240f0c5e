"""Run the whole DAG on this machine under `kfp.local` (`python -m pipelines.run --local`).

`run_local` checks the inputs before any task starts (`preflight_local`; `demo://` sources
are built once by `resolve_demo_inputs`), runs the DAG with `kfp.local.SubprocessRunner`
(no containers, no cloud, offline) in a run folder of its own (`own_run_dir`), and reads
back every task's outputs, whether it ran or came from the kfp.local cache: the data
lineage, evaluate's metrics and a `.html` copy of each report. What the console shows
meanwhile is `pipelines.local_console`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from components.common.swift import guard_descendants, release_guard
from pipelines.cache_check import cache_entries, check_cache_entries
from pipelines.cli import require_modules
from pipelines.config import (
    DEMO_DATA_EVAL,
    DEMO_DATA_TRAIN,
    DEMO_DOCUMENTS_EVAL,
    DEMO_DOCUMENTS_TRAIN,
    DEMO_DRAWINGS_REGRESSION,
    DEMO_MODEL,
    Config,
    check_local_dirs,
)
from pipelines.local_console import TaskTimer, quiet_console
from pipelines.vertex import strip_ansi

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


def _run_dag(cfg: Config, root_dir: Path, timer: TaskTimer, verbose: bool) -> tuple[Path, bool, str]:
    """Runs the DAG under kfp.local (already initialised) in a run folder of its own.

    Args:
        cfg: The config, inputs resolved.
        root_dir: The pipeline root.
        timer: The root logger's `TaskTimer` (given the quiet console here).
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
    timer = TaskTimer(floor=root_logger.getEffectiveLevel())
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
