"""End-to-end: the whole DAG under kfp.local on the tiny model and the demo drawings.

Marked `pipeline` (minutes on 2 cores); CI runs it. The second runs a short DAG with a
gate the tuned model cannot meet.
"""

import dataclasses
import json
from pathlib import Path

import pytest

from pipelines.config import DEFAULT_LOCAL_CONFIG, load_config
from pipelines.pipeline import TASK_ORDER
from pipelines.run import main, run_local

pytestmark = pytest.mark.pipeline


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pipeline-root")


@pytest.fixture(scope="module")
def first_run(root):
    cfg = load_config(DEFAULT_LOCAL_CONFIG)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, cache=str(root / "model-cache")))
    return run_local(cfg, root=str(root / "runs"), enable_caching=True)


def test_whole_dag_runs_and_the_tuned_model_beats_the_base(first_run):
    run_dir = Path(first_run["run_dir"])
    assert set(first_run["tasks"]) == set(TASK_ORDER)
    m = first_run["metrics"]
    assert m["tuned_n"] == m["base_n"] > 0
    assert m["tuned_json_valid_rate"] > m["base_json_valid_rate"], m
    assert first_run["passed"] is True
    # locally there is no registry: the reference is the base model, and evaluate says so
    assert m["reference"] == "base" and m["reference_is_champion"] == 0.0

    adapter = run_dir / "train-lora" / "adapter"
    assert (adapter / "adapter_model.safetensors").is_file()
    ref = json.loads((adapter / "base_model.json").read_text())
    assert ref["model_type"] == "qwen3_vl" and ref["revision"].startswith("sha256-")

    merged = run_dir / "merge-export" / "merged_model"
    assert (merged / "model.safetensors").is_file() and (merged / "lineage.json").is_file()
    card = (merged / "README.md").read_text()  # the model card carries the training figures and LoRA settings
    assert "| LoRA rank (`lora_rank`) | 32 |" in card and "train loss (last logged step) | not recorded" not in card

    predictions = (run_dir / "evaluate" / "predictions").read_text().splitlines()
    n_eval = len((run_dir / "validate-data" / "eval_dataset" / "data.jsonl").read_text().splitlines())
    assert len(predictions) == n_eval == m["tuned_n"]


def test_unreachable_gate_fails(root):
    """The same DAG with a gate no model can meet (f1 >= 1.01) ends with passed=False.

    Training quality does not matter here, so this run trains 4 steps only.
    """
    cfg = load_config(DEFAULT_LOCAL_CONFIG)
    cfg = dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, cache=str(root / "model-cache")),
        swift={**cfg.swift, "max_steps": 4},
        eval=dataclasses.replace(cfg.eval, metric="f1", min_value=1.01, max_samples=4, max_new_tokens=32),
    )
    second = run_local(cfg, root=str(root / "runs-gate"), enable_caching=False)
    assert second["passed"] is False
    assert second["metrics"]["tuned_f1"] < 1.01 and second["metrics"]["tuned_n"] == 4
    assert set(second["tasks"]) == set(TASK_ORDER)


def test_bad_config_stops_before_any_work(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "pipeline: {name: demo, root: " + str(tmp_path / "runs") + "}\n"
        "model: {source: demo://tiny-qwen3-vl, cache: c}\n"
        "data: {train: t.jsonl}\n"
        "eval:\n  batch_size: eight\n"
    )
    assert main(["--local", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:5" in err and "eval.batch_size" in err and "an integer" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_missing_data_file_is_a_named_error(tmp_path, capsys):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(
        "pipeline: {name: demo, root: " + str(tmp_path / "runs") + "}\n"
        f"model: {{source: {tmp_path}, cache: {tmp_path / 'cache'}}}\n"
        f"data: {{train: {tmp_path / 'nope.jsonl'}}}\n"
    )
    assert main(["--local", "--config", str(cfg_file)]) == 1
    err = capsys.readouterr().err
    assert "data.train: data file not found" in err and "nope.jsonl" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_the_tuned_demo_model_serves_and_its_answers_parse(first_run, tmp_path):
    """#16: the merged model of the run, served by `swift deploy` on CPU, answers held-out rows
    through the official `openai` client, and every answer parses as a detection list."""
    import socket

    from components.deploy.core import LocalServer, load_rows, smoke_test

    run_dir = Path(first_run["run_dir"])
    rows = load_rows(run_dir / "validate-data" / "eval_dataset", limit=2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    merged = run_dir / "merge-export" / "merged_model"
    with LocalServer(merged, port, tmp_path / "server.log", start_timeout_s=240, served_model_name="tuned") as srv:
        result = smoke_test(srv.base_url, "tuned", rows, "detection", timeout_s=180, max_tokens=160)
    assert len(result.answers) == 2 and all(a["answer"].lstrip().startswith("```json") for a in result.answers)


def test_two_cached_runs_into_one_root_each_report_their_own_folder(first_run, root):
    """#41 must-show 2: two `pipelines.run --local` started together into one --root (beside the
    first run and its cache); each prints the folder it made, holding its own tasks' outputs."""
    import subprocess
    import sys

    runs = root / "runs"
    cmd = [sys.executable, "-m", "pipelines.run", "--local", "--root", str(runs), f"model.cache={root / 'model-cache'}"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    folders = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        folder = Path(next(x for x in stdout.splitlines() if x.startswith("run folder: ")).split(": ", 1)[1])
        assert folder.name.endswith(f"-{proc.pid}") and (folder / "snapshot-data" / "executor_output.json").is_file()
        assert "gate passed: True" in stdout
        folders.append(folder)
    assert folders[0] != folders[1]


def test_a_truncated_cached_eval_set_runs_validate_data_again(first_run, root, capsys):
    """#41 must-show 3: the first run's cached eval set cut from its rows to 3; the re-run drops the
    cache entry (one line naming validate-data and the file), validates again and scores every row."""
    eval_file = Path(first_run["run_dir"]) / "validate-data" / "eval_dataset" / "data.jsonl"
    rows = eval_file.read_text().splitlines(keepends=True)
    assert len(rows) > 3
    eval_file.write_text("".join(rows[:3]))
    cfg = load_config(DEFAULT_LOCAL_CONFIG)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, cache=str(root / "model-cache")))
    again = run_local(cfg, root=str(root / "runs"), enable_caching=True)
    out = capsys.readouterr().out
    assert (
        f"cache: validate-data's output eval_dataset changed since validate-data wrote it ({eval_file.parent}/"
        "data.jsonl: size" in out
    )
    assert "validate-data" in again["tasks"] and "evaluate" in again["tasks"]
    assert again["metrics"]["tuned_n"] == len(rows) == again["data"]["eval_rows"]


def test_reports_open_as_html_and_a_cached_rerun_is_quiet_and_names_the_run_that_made_them(first_run, root, capsys):
    """#43: each report has a `.html` copy the summary lists; a cached re-run through the command line
    prints a short console (the full log in run.log) and points to the run folder that made each report."""
    assert [(r["task"], r["name"]) for r in first_run["reports"]] == [
        ("validate-data", "report"),
        ("train-lora", "loss_curve"),
        ("evaluate", "report"),
    ]
    for report in first_run["reports"]:
        path = Path(report["path"])
        assert path.suffix == ".html" and path.read_bytes() == path.with_suffix("").read_bytes()
    capsys.readouterr()
    assert main(["--local", "--root", str(root / "runs"), f"model.cache={root / 'model-cache'}"]) == 0
    captured = capsys.readouterr()
    console = captured.out + captured.err
    assert len(console.splitlines()) < 45, console
    assert "executor_output" not in console and "Streamed logs" not in console
    run_dir = Path(next(x for x in console.splitlines() if x.startswith("run folder: ")).split(": ", 1)[1])
    assert f"full log: {run_dir / 'run.log'}" in console and (run_dir / "run.log").stat().st_size > 0
    listed = [line for line in console.splitlines() if line.strip().endswith(")") and ".html" in line]
    assert len(listed) == 3, console  # all three came from the cache: each names the earlier run that made it
    for line in listed:
        path = Path(line.split()[2])
        made_by = line.rsplit("made by the run ", 1)[1].rstrip(")")
        assert path.is_file() and path.parent.parent.name == made_by != run_dir.name
