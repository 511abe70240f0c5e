"""`python -m pipelines.serve --local`: finding the model, the smoke run, a clean Ctrl-C.

The two command-line tests start a real `swift deploy` on the tiny model (about 20-40 s each
on 2 cores) and are marked `pipeline`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines.serve import FALLBACK_EXAMPLE, eval_rows_for, example_of, main, newest_merged_model, task_of


def _run_folder(root: Path, name: str, model: Path | None) -> Path:
    merged = root / name / "merge-export" / "merged_model"
    merged.parent.mkdir(parents=True)
    if model is not None:
        merged.symlink_to(model, target_is_directory=True)
    return merged


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """A local pipeline root with one run: merged model (the tiny model) and a validated eval dataset."""
    from pipelines.demo.drawings import generate_dataset
    from pipelines.demo.tiny_model import ensure_tiny_model

    root = tmp_path_factory.mktemp("runs")
    _run_folder(root, "demo-1", ensure_tiny_model())
    eval_dir = root / "demo-1" / "validate-data" / "eval_dataset"
    generate_dataset(eval_dir, n_train=0, n_eval=2)
    (eval_dir / "eval.jsonl").rename(eval_dir / "data.jsonl")
    return root


def test_newest_merged_model_and_its_eval_rows(tmp_path, runs):
    assert newest_merged_model(tmp_path) is None
    model = newest_merged_model(runs)
    assert model == runs / "demo-1" / "merge-export" / "merged_model"
    rows = eval_rows_for(model, runs, 1)
    assert len(rows) == 1 and rows[0]["images"][0].startswith(str(runs / "demo-1" / "validate-data"))
    older = _run_folder(tmp_path, "a-1", None)
    (older / "config.json").parent.mkdir()
    (older / "config.json").write_text("{}")
    time.sleep(0.02)
    newer = _run_folder(tmp_path, "b-0", None)
    newer.mkdir()
    (newer / "config.json").write_text("{}")
    assert newest_merged_model(tmp_path) == newer  # by time, not by name


def test_the_client_snippet_asks_what_the_model_was_trained_on(tmp_path):
    prompt = "Extract the fields of this document as a JSON object with the keys number and total."
    rows = [
        {"messages": [{"role": "system", "content": "s"}], "images": ["/x/0.png"]},  # no user turn: not an example
        {"messages": [{"role": "user", "content": "<image>" + prompt}, {"role": "assistant", "content": "{}"}],
         "images": [str(tmp_path / "doc.png")]},
    ]  # fmt: skip
    assert example_of(rows) == (str(tmp_path / "doc.png"), prompt)
    assert example_of([]) == FALLBACK_EXAMPLE  # no held-out rows anywhere: the demo drawings' question


def test_no_merged_model_says_what_to_do(tmp_path, capsys):
    assert main(["--local", "--root", str(tmp_path)]) == 1
    assert "run `make demo` or pass --model" in capsys.readouterr().out


def test_the_smoke_task_comes_from_the_model_lineage(tmp_path, capsys):
    import json

    from components.common.snapshot import LINEAGE_FILE

    model = tmp_path / "merged_model"
    model.mkdir()
    assert task_of(model) is None
    assert main(["--model", str(model), "--smoke"]) == 1  # refused before any server starts
    assert "has no lineage naming its task" in capsys.readouterr().err
    (model / LINEAGE_FILE).write_text(json.dumps({"task": "detection"}))
    assert task_of(model) == "detection"
    (model / "lineage.json").write_text(json.dumps({"data": {"task": "key_value", "rows": 3}}))
    assert task_of(model) == "key_value"  # merge-export's lineage first
    (model / "lineage.json").write_text(json.dumps({"data": {"task": ""}}))
    assert task_of(model) == ""  # free text is a task too


def _serve(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.serve", "--local", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


@pytest.mark.pipeline
def test_smoke_run_exits_0_and_prints_the_client_snippet(runs, tmp_path):
    proc = _serve(
        "--root",
        str(runs),
        "--smoke",
        "--task",
        "",
        "--rows",
        "2",
        "--max-tokens",
        "16",
        "--log",
        str(tmp_path / "log"),
    )
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert "base URL: http://127.0.0.1:" in out and 'client = OpenAI(base_url="http://127.0.0.1:' in out
    assert "smoke: passed, 2 answers parse for task ''" in out
    first = eval_rows_for(newest_merged_model(runs), runs, 1)[0]
    assert f"open({first['images'][0]!r}, " in out  # the snippet runs as pasted: a held-out image, its question
    assert repr(first["messages"][0]["content"].replace("<image>", "").strip()) in out
    # the random tiny model writes no detection list: exit 1 with the raw answer
    proc = _serve(
        "--root", str(runs), "--smoke", "--task", "detection", "--rows", "1", "--max-tokens", "16",
        "--log", str(tmp_path / "log2"),
    )  # fmt: skip
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "SmokeTestError: smoke-test answer 0 does not parse" in out, out


def _descendants(pid: int) -> list[int]:
    """Returns the pids of a process's children, grandchildren, ... (from `pgrep -P`)."""
    found, todo = [], [pid]
    while todo:
        out = subprocess.run(["pgrep", "-P", str(todo.pop())], capture_output=True, text=True).stdout
        children = [int(p) for p in out.split()]
        found += children
        todo += children
    return found


@pytest.mark.pipeline
def test_ctrl_c_stops_the_server_process_group(runs, tmp_path):
    model = newest_merged_model(runs)
    proc = _serve("--model", str(model), "--log", str(tmp_path / "log"))
    lines = []
    deadline = time.monotonic() + 300
    for line in proc.stdout:
        lines.append(line)
        if "Ctrl-C stops" in line or time.monotonic() > deadline:
            break
    assert "serving; Ctrl-C stops\n" in lines, "".join(lines)
    pids = _descendants(proc.pid)  # this serve's own server and its children (not another test's)
    assert pids
    os.kill(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "serve: stopping" in out
    time.sleep(0.5)
    for pid in pids:  # the server and its children are gone (not merely orphaned)
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
