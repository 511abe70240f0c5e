"""No stack trace at the edges (issue 50): each class of trace as a test of its one-line outcome.

Deeply nested JSON from users and models (validate-data's rows, evaluate's scoring of a degenerate
answer, stage-model's config.json), a closed pipe, a full disk and Ctrl-C for the `vlm-lora`
commands (the real CLI in a subprocess), a compile output that is a folder or not YAML, a NUL byte
in a config.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.common import bounded_json
from components.common.answers import first_json, parse_findings
from components.common.tasks import TASKS
from components.evaluate.metrics import score_sample
from pipelines import cli
from tests.test_validate_data import Run, good_rows, line, png, read_jsonl, row, write_lines

REPO = Path(__file__).resolve().parent.parent
DEEP = "[" * 1000 + "]" * 1000  # within the seed's max_new_tokens (1024): a degenerate model answer
GOLD = '```json\n[{"label": "hole", "bbox": [1, 2, 30, 40]}]\n```'
ENV = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "no_proxy": "127.0.0.1"}


# --- bounded-depth parsing ------------------------------------------------------------------


@pytest.mark.parametrize("answer", [DEEP, f"```json\n{DEEP}\n```", "prose " + DEEP, "{" * 5000, '[{"a":' * 800])
def test_a_deep_answer_is_an_invalid_answer_not_a_recursion_error(answer):
    findings, problem = parse_findings(answer)
    assert findings is None and problem and "\n" not in problem
    scored = score_sample(answer, GOLD)  # evaluate's scoring of one sample
    assert scored["json_valid"] is False and scored["fn"] == 1
    assert first_json(answer, list) is None


@pytest.mark.parametrize("name", sorted(n for n in TASKS if n))  # "": free text, nothing is parsed
def test_every_task_parses_a_deep_answer_to_a_named_problem(name):
    task = TASKS[name]
    parsed, problem = task.parse(f"```json\n{DEEP}\n```")
    assert parsed is None and "nested" in problem


def test_depth_counts_brackets_outside_strings_only():
    assert bounded_json.depth('["[[[[", {"a": "]]]{"}]') == 2
    assert bounded_json.loads('{"a": [1, {"b": "[[[["}]}') == {"a": [1, {"b": "[[[["}]}
    with pytest.raises(bounded_json.TooDeep, match="1000 levels deep, more than 100"):
        bounded_json.loads(DEEP)
    with pytest.raises(ValueError):  # a TooDeep is the ValueError every bad-JSON handler catches
        bounded_json.loads("[" * 101 + "]" * 101)
    assert bounded_json.loads("[" * 100 + "]" * 100)  # the bound itself parses


def test_validate_data_quarantines_a_deep_answer_with_a_code(tmp_path):
    data = tmp_path / "data"
    for i in range(4):
        png(data / "img" / f"d{i}.png", color=(i * 60, 100, 200))
    rows = [*good_rows(), row("deep", ["img/d0.png"], answer=f"```json\n{DEEP}\n```")]
    path = write_lines(data / "train.jsonl", [line(r) for r in rows])
    run = Run(tmp_path / "out")
    run([path], task="detection", max_invalid_fraction=0.5)
    rejected = read_jsonl(run.quarantine)
    assert [(r["code"], r["line"]) for r in rejected] == [("E_ANSWER", 5)]
    assert "nested 1000 levels deep" in rejected[0]["message"]


def test_stage_model_names_a_deeply_nested_config_json(tmp_path):
    from components.stage_model.core import stage_model
    from components.stage_model.errors import StageError
    from tests.test_stage_model import make_model

    model = make_model(tmp_path / "src" / "tiny")
    (model / "config.json").write_text('{"architectures": ["X"], "text_config": ' + "[" * 3000 + "]" * 3000 + "}")
    with pytest.raises(StageError) as info:
        stage_model(str(model), str(tmp_path / "cache"))
    msg = str(info.value)
    assert "config.json: cannot parse (JSON nested 3001 levels deep" in msg and "\n" not in msg


def test_stage_cli_deep_config_is_one_line(tmp_path):
    from tests.test_stage_model import make_model

    model = make_model(tmp_path / "src" / "tiny")
    (model / "config.json").write_text("[" * 5000 + "]" * 5000)
    result = _cli("stage", str(model), "--cache", str(tmp_path / "cache"))
    assert result.returncode != 0 and "Traceback" not in result.stderr and "RecursionError" not in result.stderr
    assert "nested 5000 levels deep" in result.stderr


# --- broken pipe, full disk, Ctrl-C: for every command --------------------------------------


def _cli(*args: str, stdout=subprocess.PIPE, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=REPO,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=timeout,
        env=ENV,
    )


def _closed_pipe_run(*args: str) -> subprocess.CompletedProcess:
    """The command with its stdout a pipe whose reader is already gone (`| head -0`)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return _cli(*args, stdout=write_end)
    finally:
        os.close(write_end)


@pytest.fixture(scope="module")
def commands(tmp_path_factory) -> dict[str, list[str]]:
    """A real invocation of each command that writes to stdout and needs no cloud, network or GPU."""
    tmp = tmp_path_factory.mktemp("edges")
    data = tmp / "data"
    for i in range(4):
        png(data / "img" / f"d{i}.png", color=(i * 60, 100, 200))
    write_lines(data / "train.jsonl", [line(r) for r in good_rows()])
    from tests.test_stage_model import make_model

    model = make_model(tmp / "model")
    return {
        "ls": ["ls"],
        "help": ["--help"],
        "version": ["--version"],
        "compile": ["compile", "--config", "local/tiny_cpu", "--target", "local", "--output", str(tmp / "p.yaml")],
        "run": ["run", "--dry-run", "--local", "--root", str(tmp / "runs")],
        "validate": ["validate", str(data / "train.jsonl"), "--out", str(tmp / "v-out")],
        "snapshot": ["snapshot", str(data / "train.jsonl")],
        "stage": ["stage", str(model), "--cache", str(tmp / "cache")],
    }


SUBPROCESS_COMMANDS = ["ls", "help", "version", "compile", "run", "validate", "snapshot", "stage"]


@pytest.mark.parametrize("name", SUBPROCESS_COMMANDS)
def test_a_closed_pipe_ends_quietly_with_141(commands, name):
    result = _closed_pipe_run(*commands[name])
    assert result.returncode == cli.EXIT_BROKEN_PIPE, result.stderr
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr


@pytest.mark.parametrize("name", ["ls", "help", "compile", "run", "validate", "snapshot"])
def test_a_full_disk_on_stdout_is_one_line_and_1(commands, name):
    with open("/dev/full", "w") as full:
        result = _cli(*commands[name], stdout=full)
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1 and "No space left on device" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
@pytest.mark.parametrize(
    "error, code, words",
    [
        (KeyboardInterrupt(), cli.EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
        (BrokenPipeError(errno.EPIPE, "Broken pipe"), cli.EXIT_BROKEN_PIPE, ""),
        (OSError(errno.ENOSPC, "No space left on device", "/out/x.jsonl"), 1, "cannot write /out/x.jsonl"),
    ],
)
def test_every_command_ends_at_the_edge_with_its_code(name, error, code, words, monkeypatch, capsys):
    """Every `vlm-lora` command goes through the one guard; raised where the command's work runs."""
    import importlib

    def raise_it(argv):
        raise error

    if name == "ls":
        monkeypatch.setattr(cli, "list_configs", lambda: raise_it([]))
    else:
        module = importlib.import_module(cli.COMMANDS[name][0])
        monkeypatch.setattr(module, "main", raise_it)
    assert cli.main([name]) == code
    err = capsys.readouterr().err
    assert err.count("\n") == (1 if words else 0) and words in err and f"vlm-lora {name}" in (err or f"vlm-lora {name}")


def test_an_os_error_that_is_not_the_edge_keeps_its_traceback(monkeypatch):
    monkeypatch.setattr(cli, "list_configs", lambda: (_ for _ in ()).throw(PermissionError(errno.EACCES, "denied")))
    with pytest.raises(PermissionError):
        cli.main(["ls"])


def test_ctrl_c_during_a_command_is_one_line_and_130(tmp_path):
    """validate-data waiting on an image server that never answers; SIGINT as a terminal's Ctrl-C sends it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)  # accepted by the kernel, never answered
    port = server.getsockname()[1]
    data = tmp_path / "in" / "data.jsonl"  # --out may not go inside the data file's folder
    write_lines(data, [line(row("find", [f"http://127.0.0.1:{port}/a.png"]))])
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "validate", str(data), "--out", str(tmp_path / "out")]
        + ["--fetch-timeout", "8"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        # a command typed at a terminal starts with SIGINT at its default; pytest run as a background job (`&` in a
        # script) has it ignored, the child would inherit that and Python would then never raise KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        first = proc.stdout.readline()  # "validate-data: ..." : the command is working
        assert first.startswith("validate-data:"), first
        time.sleep(2)  # inside the image download
        assert proc.poll() is None and time.monotonic() < deadline
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.close()
    assert proc.returncode == cli.EXIT_INTERRUPTED, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines()[-1] == "vlm-lora validate: interrupted (Ctrl-C); nothing more was done"


# --- compile's output path; a NUL byte in a config ------------------------------------------


@pytest.mark.parametrize("output, words", [("folder", "is a folder"), ("p.json", "ending in .yaml"), ("p", ".yaml")])
def test_compile_output_that_is_a_folder_or_not_yaml_is_one_line(tmp_path, output, words):
    (tmp_path / "folder").mkdir()
    result = _cli("compile", "--config", "local/tiny_cpu", "--output", str(tmp_path / output))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert words in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"] and not any((tmp_path / "folder").iterdir())


def test_compile_output_yml_is_written(tmp_path):
    result = _cli("compile", "--config", "local/tiny_cpu", "--target", "local", "--output", str(tmp_path / "p.yml"))
    assert result.returncode == 0, result.stderr
    assert "pipelineInfo" in (tmp_path / "p.yml").read_text()


@pytest.mark.parametrize("char, words", [("\x00", "a NUL byte"), ("\x07", "the control character #x0007")])
def test_a_control_character_in_a_config_is_one_line_with_its_line(tmp_path, char, words):
    path = tmp_path / "bad.yaml"
    path.write_text(f"pipeline:\n  name: tiny\n  root: runs{char}x\n")
    result = _cli("compile", "--config", str(path), "--output", str(tmp_path / "p.yaml"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr == f"error: {path}:3: not valid YAML: {words} is not allowed in a config; remove it " + (
        "(a binary file, or a copy-paste accident?)\n"
    )


def test_json_stays_json():
    """The bounded parser changes nothing for ordinary answers."""
    findings, problem = parse_findings(GOLD)
    assert problem is None and findings == json.loads(GOLD.split("\n")[1])
