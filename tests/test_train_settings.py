"""`TrainSettings`: train-lora's own settings besides `swift`, built from the config, checked, one task input.

Pure (no model, no GPU): the settings a config gives each target (`pipelines.config.train_settings`);
each check's message names the config field, what it must be and the value, from the type itself,
through `load_config` (with the file and line) and from the step (`checked_settings`, before any
work); `from_dict` takes back what the pipeline hands the task (numbers as JSON doubles, read from
the compiled spec itself, and through kfp.local's executor); the compiled pipeline gives train-lora
one `settings` input and none of the separate inputs it had before.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from components.train_lora import step as train_step_mod
from components.train_lora.settings import CONFIG_KEYS, TrainSettings, TrainSettingsError
from components.train_lora.step import checked_settings
from pipelines.compile import compile_pipeline
from pipelines.config import ConfigError, load_config, train_settings
from tests.pipeline_spec import container_tasks, source

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "configs" / "qwen3_vl_4b" / "lora_seed.yaml"
EIGHT = ROOT / "configs" / "qwen3_vl_4b" / "lora_h100_x8.yaml"
TWO_NODES = ROOT / "configs" / "qwen3_vl_4b" / "lora_h100_x8_2node.yaml"
TINY = ROOT / "configs" / "local" / "tiny_cpu.yaml"
# train-lora's inputs before TrainSettings (each now a field of `settings`)
OLD_INPUTS = ("preflight", "accelerator_count", "checkpoint_root", "checkpoint_dir", "ddp_timeout_s", "job_env")
ENVIRONMENT = {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_NVLS_ENABLE": 0}


def _config_file(tmp_path: Path, base: Path = EIGHT, **sections) -> Path:
    """`base` with `sections` merged in (a mapping section key by key), written as a config file."""
    raw = yaml.safe_load(base.read_text())
    for name, value in sections.items():
        raw[name] = {**raw.get(name, {}), **value} if isinstance(raw.get(name), dict) else value
    path = tmp_path / "train.yaml"
    path.write_text("# test\n" + yaml.safe_dump(raw))
    return path


# --- from the config ---------------------------------------------------------------


def test_a_vertex_config_gives_the_preflight_the_gpu_check_the_checkpoints_and_the_job_environment(tmp_path):
    path = _config_file(
        tmp_path,
        resources={"preflight": "warn"},
        environment=ENVIRONMENT,
        tracking={"mlflow_uri": "http://10.0.0.5:5000"},
    )
    cfg = load_config(path)
    settings = train_settings(cfg, vertex=True)
    bucket = cfg.pipeline.root[len("gs://") :].rstrip("/")
    assert settings == TrainSettings(
        preflight="warn",
        accelerator_count=8,
        checkpoint_root=f"/gcs/{bucket}/checkpoints",  # read through the FUSE mount: a retried job resumes
        job_env={
            **ENVIRONMENT,
            "MLFLOW_TRACKING_URI": "http://10.0.0.5:5000",
            "MLFLOW_EXPERIMENT_NAME": cfg.pipeline.name,
            "VLM_LORA_TRACKING_REQUIRED": "1",
        },
    )
    assert settings.problems() == []


def test_the_local_target_has_no_gpu_check_and_no_durable_checkpoints():
    cfg = load_config(EIGHT)
    local = train_settings(cfg, vertex=False)
    assert local == TrainSettings(preflight=cfg.resources.preflight, job_env={})
    # no accelerator type: no GPU count to check, also on Vertex
    cpu = dataclasses.replace(cfg, resources=dataclasses.replace(cfg.resources, accelerator_type=""))
    assert train_settings(cpu, vertex=True).accelerator_count == 0


def test_every_shipped_config_gives_settings_that_pass_their_checks():
    for path in sorted(ROOT.glob("configs/**/*.yaml")):
        cfg = load_config(path)
        for vertex in (True, False):
            assert train_settings(cfg, vertex).problems() == [], (path, vertex)


# --- the checks and their messages -----------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"preflight": "maybe"}, "'resources.preflight' must be one of fail, warn, off, got 'maybe'"),
        ({"accelerator_count": -1}, "'resources.accelerator_count' must be 0 or a positive integer, got -1"),
        (
            {"ddp_timeout_s": -5},
            "'settings.ddp_timeout_s' must be 0 (the default, 1 hour) or a positive number of seconds, got -5",
        ),
        ({"job_env": {"LD_PRELOAD": "/tmp/x.so"}}, "environment.LD_PRELOAD: "),
        ({"job_env": {"HF_TOKEN": "hf_x"}}, "environment.HF_TOKEN: "),
        (
            {"job_env": {"NCCL_DEBUG": ["INFO"]}},
            "environment.NCCL_DEBUG: the value must be a string, number or boolean",
        ),
    ],
)
def test_each_check_names_the_config_field_what_it_must_be_and_the_value(values, message):
    (problem,) = TrainSettings(**values).problems()
    assert problem.startswith(message)


def test_the_checks_a_config_runs_name_only_config_fields():
    bad = TrainSettings(preflight="x", accelerator_count=-1, ddp_timeout_s=-1)
    keys = [key for key, ok, _ in bad.checks() if not ok]
    assert keys == ["resources.preflight", "resources.accelerator_count"]
    assert len(bad.problems()) == 3  # the direct caller's ddp_timeout_s too
    assert set(CONFIG_KEYS) == {f.name for f in dataclasses.fields(TrainSettings)}


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"resources": {"preflight": "maybe"}}, "'resources.preflight' must be one of fail, warn, off, got 'maybe'"),
        ({"resources": {"preflight": 1}}, "'resources.preflight' must be a string, got 1"),
        ({"environment": {"LD_PRELOAD": "/tmp/x.so"}}, "environment.LD_PRELOAD"),
    ],
)
def test_the_config_refuses_a_bad_setting_with_its_file_and_line(tmp_path, sections, message):
    path = _config_file(tmp_path, **sections)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}:")


# --- the KFP boundary --------------------------------------------------------------


def test_the_settings_come_back_whole_from_json_numbers_as_doubles():
    settings = TrainSettings("warn", 8, "/gcs/b/checkpoints", "", 600, {"NCCL_DEBUG": "INFO", "NCCL_NVLS_ENABLE": 0})
    as_kfp = json.loads(json.dumps(settings.as_param()).replace(": 8,", ": 8.0,").replace(": 600,", ": 600.0,"))
    assert as_kfp["accelerator_count"] == 8.0 and isinstance(as_kfp["accelerator_count"], float)
    back = TrainSettings.from_dict(as_kfp)
    assert back == settings and isinstance(back.accelerator_count, int) and isinstance(back.ddp_timeout_s, int)
    assert TrainSettings.from_dict({}) == TrainSettings()  # keys left out take their defaults
    settings.as_param()["job_env"]["X"] = 1  # a copy: the frozen settings keep theirs
    assert "X" not in settings.job_env


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"preflght": "warn"},
            "unknown train-lora setting 'preflght'; the settings have: preflight, accelerator_count",
        ),
        ({"accelerator_count": 1.5}, "'resources.accelerator_count' must be an integer, got 1.5"),
        ({"accelerator_count": True}, "'resources.accelerator_count' must be an integer, got True"),
        ({"preflight": None}, "'resources.preflight' must be a string, got None"),
        ({"checkpoint_root": 3}, "'pipeline.root' must be a string, got 3"),
        ({"job_env": ["NCCL_DEBUG=INFO"]}, "'environment' must be a mapping of NAME: value, got ['NCCL_DEBUG=INFO']"),
    ],
)
def test_from_dict_refuses_unknown_keys_and_wrong_types(values, message):
    with pytest.raises(TrainSettingsError) as err:
        TrainSettings.from_dict(values)
    assert str(err.value).startswith(message)


def test_from_dict_refuses_what_is_not_a_mapping():
    with pytest.raises(TrainSettingsError, match="train-lora settings must be a mapping, got list"):
        TrainSettings.from_dict(["preflight"])


def test_the_step_refuses_bad_settings_before_any_work(tmp_path, monkeypatch):
    def never(**_):
        raise AssertionError("train_lora ran with refused settings")

    monkeypatch.setattr(train_step_mod, "train_lora", never)
    expected = (
        r"^train-lora: settings: 'resources.preflight' must be one of fail, warn, off, got 'strict'; correct it in "
        r"the config \(resources, pipeline.root, environment, tracking\) and compile the pipeline again$"
    )
    with pytest.raises(SystemExit, match=expected):
        checked_settings({"preflight": "strict"})
    with pytest.raises(SystemExit, match=r"^train-lora: settings: environment\.HF_TOKEN: "):
        checked_settings({"job_env": {"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz0123456789"}})
    with pytest.raises(SystemExit, match=r"^train-lora: settings: unknown train-lora setting 'gpus'"):
        checked_settings({"gpus": 8})
    assert checked_settings({"preflight": "off", "accelerator_count": 2.0}) == TrainSettings("off", 2)


# --- the compiled pipeline ---------------------------------------------------------------


def _train_task(config: Path, tmp_path: Path, target: str, task: str = "train-lora") -> tuple[dict, dict]:
    """(the compiled train-lora component's input definitions, the task's `settings` value)."""
    out = compile_pipeline(str(config), str(tmp_path / f"{target}.yaml"), target=target)
    spec = next(yaml.safe_load_all(out.read_text()))  # gke: the platform spec follows as a second document
    index = container_tasks(spec)
    component = spec["components"][index[task].spec["componentRef"]["name"]]
    return component["inputDefinitions"]["parameters"], source(index, task, "settings").value


@pytest.mark.parametrize(
    ("config", "target", "task", "vertex"),
    [
        (TINY, "local", "train-lora", False),
        (EIGHT, "vertex", "train-lora", True),
        (EIGHT, "gke", "train-lora", True),
        (TWO_NODES, "gke", "train-lora-jobset", True),  # the JobSet launcher takes the same settings
    ],
)
def test_the_compiled_pipeline_gives_train_lora_one_settings_input(tmp_path, config, target, task, vertex):
    params, value = _train_task(config, tmp_path, target, task)
    assert params["settings"]["parameterType"] == "STRUCT" and "defaultValue" not in params["settings"]
    assert not set(OLD_INPUTS) & set(params)
    # what the task gets back from the spec is the config's settings, numbers as doubles included
    assert TrainSettings.from_dict(value) == train_settings(load_config(config), vertex)


def test_the_kfp_executor_hands_the_settings_to_the_step(tmp_path, capfd):
    """Through kfp.local's real executor (JSON struct, numbers as doubles): refused settings end the task
    with the step's message; accepted ones reach the core (which then refuses the empty model folder)."""
    from kfp import dsl, local

    from components.train_lora.component import train_lora

    for name in ("model", "train", "eval"):
        (tmp_path / name).mkdir()

    def run(settings: dict) -> str:
        @dsl.pipeline(name="train-settings")
        def one_task():
            model = dsl.importer(artifact_uri=str(tmp_path / "model"), artifact_class=dsl.Model)
            train = dsl.importer(artifact_uri=str(tmp_path / "train"), artifact_class=dsl.Dataset)
            held_out = dsl.importer(artifact_uri=str(tmp_path / "eval"), artifact_class=dsl.Dataset)
            train_lora(
                base_model=model.output,
                train_dataset=train.output,
                eval_dataset=held_out.output,
                swift_args={},
                settings=settings,
            )

        local.init(
            local.SubprocessRunner(use_venv=False),
            pipeline_root=str(tmp_path / "root"),
            enable_caching=False,
            raise_on_error=False,
        )
        one_task()
        captured = capfd.readouterr()
        return captured.out + captured.err

    refused = run({"preflight": "strict"})
    assert "train-lora: settings: 'resources.preflight' must be one of fail, warn, off, got 'strict'" in refused
    accepted = run(TrainSettings("off", 0, "", "", 600, {"NCCL_NVLS_ENABLE": 0}).as_param())
    assert "train-lora: settings:" not in accepted
    assert f"train-lora: {tmp_path / 'model'}: base model folder has no config.json" in accepted
