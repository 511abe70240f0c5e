"""`vlm-lora`: the installed command, `section.key=value` overrides, the shipped configs, and the
light install (compile and submit without torch, transformers, ms-swift or PIL importable)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from pipelines.cli import main
from pipelines.config import ConfigError, load_config, parse_overrides, resolve_config_path, shipped_configs

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "torchvision", "transformers", "swift", "peft", "trl", "deepspeed", "PIL", "safetensors", "scipy")
BLOCKER = f"""
import importlib.abc, sys
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {HEAVY!r}:
            raise ImportError("not installed in the light install: " + name)
sys.meta_path.insert(0, _Block())
"""


def test_ls_lists_every_shipped_config(capsys):
    assert main(["ls"]) == 0
    out = capsys.readouterr().out
    for path in shipped_configs():
        assert str(path.relative_to(ROOT / "configs").with_suffix("")) in out
    assert "local/tiny_cpu" in out and "Local demo" in out


def test_a_misspelled_command_gets_the_closest_name(capsys):
    assert main(["compil"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'compil'; did you mean 'compile'?" in err and "commands:" in err


def test_configs_by_name_and_overrides_through_the_schema(tmp_path):
    assert resolve_config_path("lora_seed") == ROOT / "configs" / "qwen3_vl_4b" / "lora_seed.yaml"
    assert resolve_config_path("local/tiny_cpu.yaml") == ROOT / "configs" / "local" / "tiny_cpu.yaml"
    cfg = load_config("lora_seed", parse_overrides(["eval.max_samples=4", "swift.lora_rank=16", "data.eval=gs://b/e"]))
    assert (cfg.eval.max_samples, cfg.swift["lora_rank"], cfg.data.eval) == (4, 16, "gs://b/e")
    with pytest.raises(ConfigError, match=r"\(override eval.max_sample=4\): unknown key 'eval.max_sample'"):
        load_config("lora_seed", parse_overrides(["eval.max_sample=4"]))
    with pytest.raises(ConfigError, match=r"'eval.max_samples' must be an integer, got \"four\""):
        load_config("lora_seed", parse_overrides(["eval.max_samples=four"]))
    with pytest.raises(ConfigError, match="expected section.key=value"):
        parse_overrides(["max_samples"])
    with pytest.raises(ConfigError, match="no shipped config has that name"):
        resolve_config_path("nope")


def test_compile_with_overrides_sets_the_parameter_defaults(tmp_path, capsys):
    out = tmp_path / "p.yaml"
    assert main(["compile", "--config", "lora_seed", "--output", str(out), "eval.max_samples=4"]) == 0
    params = yaml.safe_load(out.read_text())["root"]["inputDefinitions"]["parameters"]
    settings = params["eval_settings"]["defaultValue"]
    assert settings["max_samples"] == 4 and settings["metric"] == "f1"  # the override's key; the rest the file's


def _light(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "light.py"
    path.write_text(BLOCKER + textwrap.dedent(script))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_light_install_compiles_without_the_training_stack(tmp_path):
    proc = _light(
        f"""
        from pipelines.cli import main
        raise SystemExit(main(["compile", "--config", "lora_seed", "--output", {str(tmp_path / "c.yaml")!r}]))
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "c.yaml").is_file()


def test_light_install_submits_to_the_recording_server_without_the_training_stack(tmp_path):
    proc = _light(
        f"""
        import io, os, sys
        from google.auth.credentials import AnonymousCredentials
        from google.cloud.aiplatform.utils import resource_manager_utils
        from tests.test_vertex_submit import PARENT, write_config
        from tests.vertex_fake import PROJECT_NUMBER, FakeServer
        from pathlib import Path
        from pipelines.config import load_config
        from pipelines.submit import submit_vertex

        resource_manager_utils.get_project_number = lambda *a, **k: PROJECT_NUMBER
        with FakeServer(buckets={{"test-bucket"}}) as fake:
            os.environ["STORAGE_EMULATOR_HOST"] = fake.url
            fake.resources[PARENT + "/metadataStores/default"] = {{"name": PARENT + "/metadataStores/default"}}
            cfg = load_config(write_config(Path({str(tmp_path)!r})))
            submit_vertex(cfg, credentials=AnonymousCredentials(), api_endpoint=fake.url, poll_s=0, out=io.StringIO())
            jobs = fake.calls("POST", PARENT + "/pipelineJobs")
            print("JOBS", len(jobs))
        assert not any(m.split(".")[0] in {HEAVY!r} for m in sys.modules), "a training module was imported"
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "JOBS 1" in proc.stdout


def test_the_package_installs_the_configs_and_the_command():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'vlm-lora = "pipelines.cli:main"' in text
    # the configs ship inside `pipelines` (setup.py), not as a top-level package (tests/test_packaging.py builds it)
    assert "configs" not in text.split("[tool.setuptools.packages.find]")[1].split("\n[")[0]
    assert '"pipelines", "configs"' in (ROOT / "setup.py").read_text()
    base = text.split("dependencies = [")[1].split("]")[0]
    assert "torch" not in base and "ms-swift" not in base  # the light install


def test_command_errors_give_one_line_and_the_exit_code(capsys):
    """The one error tail of run / schedule / upload / jobs: user errors 2, failures 1, API errors 1."""
    from google.auth.exceptions import DefaultCredentialsError

    from pipelines.config import ConfigError
    from pipelines.local_run import RunError
    from pipelines.vertex import VertexError, command_errors

    cases = [
        (ConfigError("cfg.yaml: swift.not_a_flag: unknown"), (), 2, "cfg.yaml: swift.not_a_flag"),
        (VertexError("vertex.project is not set"), (), 2, "vertex.project is not set"),
        (RunError("pipeline failed at task train-lora"), (RunError,), 1, "failed at task train-lora"),
        (DefaultCredentialsError("File x was not found"), (), 1, "gcloud auth application-default login"),
    ]
    for exc, failures, code, text in cases:
        with command_errors(failures=failures) as outcome:
            raise exc
        err = capsys.readouterr().err
        assert outcome.code == code and err.startswith("error: ") and text in err and err.count("\n") == 1
    with command_errors() as outcome:
        pass
    assert outcome.code == 0
    with pytest.raises(ZeroDivisionError):  # a bug keeps its traceback
        with command_errors(failures=(RunError,)):
            raise ZeroDivisionError("a bug")
    with pytest.raises(RunError):  # a failure the command does not expect is not swallowed
        with command_errors():
            raise RunError("x")
