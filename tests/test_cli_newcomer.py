"""Issue 43, the command line a newcomer meets: the train extra named in one line, overrides as
users type them, `--version`, program names in help, `serve` without `--local`, whole
sentences in `vlm-lora ls`, "did you mean" in every section, every placeholder at once, and
`run --dry-run` without credentials or network."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipelines.cli import config_summary, main
from pipelines.config import ConfigError, load_config, parse_overrides

ROOT = Path(__file__).resolve().parent.parent

# A meta-path finder that makes PIL (and the rest of the train extra) missing, as after `pip install .`
NO_TRAIN_EXTRA = """
import importlib.abc, sys
class _Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {"PIL", "torch", "torchvision", "transformers", "swift", "peft", "trl"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _Missing())
"""


def _light_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """Runs `vlm-lora ARGS` in a Python where the train extra's modules cannot be imported."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(NO_TRAIN_EXTRA)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    return subprocess.run(
        [sys.executable, "-c", "import sys; from pipelines.cli import main; sys.exit(main(sys.argv[1:]))", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "args",
    [
        ("validate", "--help"),
        ("serve", "--smoke"),
        ("run", "--local", "eval.max_samples=4"),
    ],
)
def test_a_command_that_needs_the_train_extra_says_so_in_one_line(tmp_path, args):
    proc = _light_cli(tmp_path, *args)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"vlm-lora {args[0]}") and ": needs the train extra" in lines[0]
    assert "pip install 'vlm-lora-pipeline[train]'" in lines[0]
    assert "no module named" in lines[0]


def test_the_extra_named_is_the_project_name_in_pyproject():
    from pipelines.cli import PACKAGE

    assert f'name = "{PACKAGE}"' in (ROOT / "pyproject.toml").read_text()


def test_overrides_accept_numbers_as_users_type_them():
    cfg = load_config("lora_seed", parse_overrides(["swift.learning_rate=1e-4", "swift.warmup_ratio=5e-2"]))
    assert cfg.swift["learning_rate"] == pytest.approx(1e-4) and isinstance(cfg.swift["learning_rate"], float)
    assert cfg.swift["warmup_ratio"] == pytest.approx(0.05)
    cfg = load_config("tiny_cpu", parse_overrides(["eval.max_samples=1e1", "data.eval_fraction=2e-1"]))
    assert (cfg.eval.max_samples, cfg.data.eval_fraction) == (10, pytest.approx(0.2))
    # a text field stays text: a pipeline name that looks like a number is still a name
    with pytest.raises(ConfigError, match="pipeline.name"):
        load_config("tiny_cpu", parse_overrides(["pipeline.name=1e4"]))


@pytest.mark.parametrize(
    ("override", "hint"),
    [
        ("eval.max_sample=4", "did you mean 'eval.max_samples'?"),
        ("data.trian=x", "did you mean 'data.train'?"),
        ("resources.machine_typ=x", "did you mean 'resources.machine_type'?"),
        ("evl.max_samples=4", "did you mean 'eval'?"),
    ],
)
def test_an_unknown_key_in_any_section_gets_the_closest_name(override, hint):
    with pytest.raises(ConfigError) as err:
        load_config("lora_seed", parse_overrides([override]))
    assert hint in str(err.value)


def test_version_prints_the_installed_package_version(capsys):
    from importlib import metadata

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"vlm-lora {metadata.version('vlm-lora-pipeline')}"


@pytest.mark.parametrize("sub", ["run", "compile", "schedule", "upload", "serve", "jobs"])
def test_help_names_the_program_as_it_was_called(sub, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["vlm-lora"])
    with pytest.raises(SystemExit):
        main([sub, "--help"])
    out = capsys.readouterr().out
    assert out.startswith(f"usage: vlm-lora {sub}") and "python -m" not in out.splitlines()[0]


def test_serve_needs_no_local_flag(tmp_path, capsys):
    assert main(["serve", "--root", str(tmp_path)]) == 1  # no merged model there: its own message, not argparse's
    out = capsys.readouterr()
    assert "no merged model under" in out.out and "--local" not in out.err


def test_ls_shows_whole_sentences():
    text = (
        "# Qwen LoRA on 1 x H100 80GB (a3, Spot): the seed's training,\n# tuned for speed. More here.\npipeline: {}\n"
    )
    assert config_summary(text) == "Qwen LoRA on 1 x H100 80GB (a3, Spot): the seed's training, tuned for speed."


def test_ls_lines_end_at_a_sentence(capsys):
    assert main(["ls"]) == 0
    out = capsys.readouterr().out
    assert "tiny_cpu_kv" in out
    body = " ".join(line.strip() for line in out.split("\n\n")[0].splitlines())
    assert "no cloud, no download." in body and "key-value extraction" in body
    assert "the seed's training, tuned for speed." in body


def _placeholder_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "YOUR_" in line]


def test_run_lists_every_placeholder_at_once(capsys, monkeypatch):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/credentials.json")
    assert main(["run", "--config", "qwen3_vl_4b/lora_seed"]) == 2
    err = capsys.readouterr().err
    for key in ("vertex.project", "pipeline.root", "model.cache", "data.train", "vertex.service_account"):
        assert key in err, err
    assert "images.light" in err and "images.train" in err
    assert "Traceback" not in err and "credentials" not in err.lower()


def test_dry_run_with_placeholders_lists_them_all_and_exits_2(capsys):
    assert main(["run", "--dry-run", "--config", "qwen3_vl_4b/lora_seed"]) == 2
    captured = capsys.readouterr()
    assert len(_placeholder_lines(captured.err)) >= 6
    assert "estimate" in captured.out.lower() or "plan" in captured.out.lower()


DRY_RUN = """
import socket, sys
def _no_network(*args, **kwargs):
    raise OSError("network blocked by the test")
socket.socket.connect = _no_network
socket.create_connection = _no_network
from pipelines.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_dry_run_prints_what_would_be_submitted_without_credentials_or_network(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOOGLE_")}
    env.update(GOOGLE_APPLICATION_CREDENTIALS=str(tmp_path / "none.json"), PYTHONPATH=str(ROOT))
    args = [
        "run",
        "--dry-run",
        "--config",
        "qwen3_vl_4b/lora_seed",
        "vertex.project=my-proj",
        "vertex.service_account=sa@my-proj.iam.gserviceaccount.com",
        "pipeline.root=gs://my-bucket/root",
        "model.cache=gs://my-bucket/models",
        "data.train=gs://my-bucket/train.jsonl",
        "images.light=us-docker.pkg.dev/my-proj/r/light:1",
        "images.train=us-docker.pkg.dev/my-proj/r/train:1",
        "eval.max_samples=64",
    ]
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(DRY_RUN), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "dry run" in out and "nothing submitted" in out
    assert "qwen3-vl-4b-lora-seed" in out and "gs://my-bucket/root" in out
    assert "eval_settings.max_samples" in out and "64" in out  # a parameter that differs from the file's
    assert "a2-highgpu-1g" in out  # the machine
    assert "USD" in out or "$" in out  # the cost
    assert "config" in out and "labels" in out


def _executor_output(folder: Path, params: dict, artifacts: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    arts = {n: {"artifacts": [{"name": n, "uri": str(folder / n), "metadata": m}]} for n, m in artifacts.items()}
    (folder / "executor_output.json").write_text(json.dumps({"parameterValues": params, "artifacts": arts}))


def test_quiet_console_shows_task_lines_progress_every_30_s_and_each_warning_once(tmp_path):
    from pipelines.local_console import QuietConsole

    _executor_output(tmp_path / "validate-data", {"n_train": 64, "n_eval": 16}, {"metrics": {"n_invalid": 0}})
    log, console = io.StringIO(), io.StringIO()
    quiet = QuietConsole(log, console, tmp_path, interval_s=30.0)
    quiet.task_started("validate-data")
    quiet.last_shown -= 31  # 31 s since the console last heard from this task
    quiet.write("{'loss': '1.01', 'step': 1}\nTrain:  30%|###  | 48/160\r")
    quiet.write("Train:  31%|###  | 49/160\n" * 50)  # within 30 s of the last: not shown
    for _ in range(3):
        quiet.write("x.py:1: UserWarning: pin_memory is set\n  warnings.warn(\n")
        quiet.write('subprocess_task_handler.py:81: RuntimeWarning: non-Python base image "x". Use "DockerRunner"\n')
    quiet.write("[WARNING:swift] Please install the package: `pip install decord -U`.\n")  # a library log line
    quiet.write('executor JSON {\n  "outputs": {}\n}\n')
    quiet.task_ended("validate-data", 12.34, "SUCCESS")
    shown = console.getvalue().splitlines()
    assert len(shown) == 4, shown  # started, one progress line, one warning, finished
    assert "validate-data" in shown[0] and "started" in shown[0]
    assert "'loss'" in shown[1]
    assert shown[2].count("UserWarning") == 1 and "pin_memory" in shown[2]
    assert "success in 12.3 s" in shown[3] and "n_train 64" in shown[3] and "n_invalid 0" in shown[3]
    assert "DockerRunner" in log.getvalue() and log.getvalue().count("48/160") == 1  # everything in the log


def test_reports_get_html_copies_and_the_summary_lists_them_with_the_run_that_made_them(tmp_path):
    from pipelines.local_console import format_summary
    from pipelines.local_run import report_copies

    earlier, now = tmp_path / "demo-1", tmp_path / "demo-2"
    for folder, name in ((earlier / "validate-data", "report"), (earlier / "train-lora", "loss_curve")):
        folder.mkdir(parents=True)
        (folder / name).write_text("<html>report</html>")
    (now / "evaluate").mkdir(parents=True)
    (now / "evaluate" / "report").write_text("<html>eval</html>")
    outputs = {  # validate-data and train-lora were cache hits: their URIs point into the earlier run
        "validate-data": {"report": {"uri": str(earlier / "validate-data" / "report")}},
        "train-lora": {"loss_curve": {"uri": str(earlier / "train-lora" / "loss_curve")}},
        "evaluate": {"report": {"uri": str(now / "evaluate" / "report")}},
    }
    reports = report_copies(outputs, now)
    assert [r["path"] for r in reports] == [
        str(earlier / "validate-data" / "report.html"),
        str(earlier / "train-lora" / "loss_curve.html"),
        str(now / "evaluate" / "report.html"),
    ]
    assert Path(reports[0]["path"]).read_text() == "<html>report</html>"
    assert reports[0]["from_run"] == str(earlier) and reports[2]["from_run"] == ""
    result = {"run_dir": str(now), "wall_s": 1.0, "tasks": {"evaluate": 1.0}, "cached": ["validate-data"],
              "metrics": {}, "passed": True, "reports": reports, "log": str(now / "run.log")}  # fmt: skip
    summary = format_summary(result)
    assert f"{earlier / 'validate-data' / 'report.html'}  (cached: made by the run {earlier.name})" in summary
    assert str(now / "evaluate" / "report.html") in summary and f"full log: {now / 'run.log'}" in summary


def test_compile_without_an_image_tag_says_so_in_one_line(monkeypatch, tmp_path, capsys):
    import components.images as images

    monkeypatch.setattr(images, "TAG", None)
    monkeypatch.setattr(images, "LIGHT_IMAGE", f"{images.REGISTRY}/light:{images._NO_TAG}")
    monkeypatch.setattr(images, "TRAIN_IMAGE", f"{images.REGISTRY}/train:{images._NO_TAG}")
    assert main(["compile", "--config", "lora_seed", "--output", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no default tag" in err[0] and "images.light" in err[0]
    assert main(["compile", "--config", "lora_seed", "--target", "local", "--output", str(tmp_path / "l.yaml")]) == 0


def test_local_dry_run_shows_the_plan_and_runs_nothing(tmp_path, capsys):
    assert main(["run", "--dry-run", "--local", "--root", str(tmp_path / "runs"), "eval.max_samples=4"]) == 0
    out = capsys.readouterr().out
    plan = (
        "snapshot-data -> stage-model -> validate-data -> validate-regression -> train-lora -> merge-export -> evaluate"
    )
    assert f"plan: {plan}" in out  # the demo config has a regression set: its check runs before training
    assert "eval_settings.max_samples = 4" in out and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("module", ["pipelines.serve", "pipelines.run"])
def test_the_python_m_forms_name_the_train_extra_too(tmp_path, module):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_TRAIN_EXTRA)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    proc = subprocess.run(
        [sys.executable, "-m", module, "--local"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        line for line in proc.stderr.strip().splitlines() if "pip install 'vlm-lora-pipeline[train]'" in line
    ]
    assert proc.stderr.startswith(f"python -m {module}")
