"""MLflow tracking (`components.common.tracking`) against a real local `mlflow server`.

The server (sqlite backend, artifacts served by the server) is started once for this module on a
free port and stopped after it; starting it takes 10-25 s on a 2-core machine. What the components
record is read back through MLflow's own client (`MlflowClient.search_runs`, `get_metric_history`,
`list_artifacts`). The config checks, the job environment's allow-list and train-lora's swift
arguments are unit tests (no server).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest
import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from components.common import tracking
from components.common.snapshot import LINEAGE_FILE
from components.train_lora.job_env import JobEnvError, check_job_env
from pipelines.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "configs" / "local" / "tiny_cpu.yaml"
HF_TOKEN = "hf_" + "a1B2c3D4e5F6g7H8i9J0kLmNoPqRsT"  # a token-shaped value that must never reach MLflow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """Starts `mlflow server` (sqlite backend, artifacts through the server) on 127.0.0.1; yields its URI."""
    exe = shutil.which("mlflow") or str(Path(sys.executable).parent / "mlflow")
    if not Path(exe).exists():
        pytest.fail("mlflow is not installed (pip install -c requirements.lock -e '.[dev]')")
    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}
    log = open(root / "server.log", "w")
    proc = subprocess.Popen(
        [exe, "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination",
         str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )  # fmt: skip
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:
            try:
                urllib.request.urlopen(f"{uri}/health", timeout=1)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
                time.sleep(0.2)
        yield uri
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=10)
        log.close()


@pytest.fixture(autouse=True)
def _no_telemetry(monkeypatch):
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "true")


def _client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(uri)


def _closed_port_uri() -> str:
    return f"http://127.0.0.1:{_free_port()}"  # nothing listens there: a refused connection


def _merged_model(tmp_path: Path, adapter: str = "/runs/r1/train-lora/adapter") -> tuple[Path, dict]:
    """A merged model folder as merge-export leaves it (lineage files only) and its artifact metadata."""
    folder = tmp_path / "merged"
    folder.mkdir(parents=True)
    snapshot = {
        "snapshot": {"fingerprint": "f" * 64, "train": [{"uri": "gs://b/train.jsonl", "generation": "17"}]},
        "training_key": "0123456789abcdef",
        "n_rows": 12,
        "n_train": 10,
        "n_eval": 2,
        "files": {"gs://b/train.jsonl": {"rows": 12, "quarantined": 0}},
    }
    (folder / LINEAGE_FILE).write_text(json.dumps(snapshot))
    lineage = {"base_model": {"source": "hf://Qwen/Qwen3-VL-4B-Instruct"}, "adapter": adapter, "run_id": "run-7"}
    (folder / "lineage.json").write_text(json.dumps(lineage))
    meta = {
        "adapter": adapter,
        "base_model": "/runs/r1/stage-model/model",
        "training_key": "0123456789abcdef",
        "data_snapshot": "f" * 64,  # merge-export's metadata: the snapshot's fingerprint
        "run_id": "run-7",
        "hub_token": HF_TOKEN,  # a secret that slipped into metadata is not logged
    }
    return folder, meta


# ---------------------------------------------------------------- train-lora's swift arguments (unit)


def test_report_args_add_mlflow_and_its_environment_when_the_job_env_names_a_server():
    env = {"MLFLOW_TRACKING_URI": "http://mlflow.internal:5000", "MLFLOW_EXPERIMENT_NAME": "drawings"}
    tags = {tracking.ADAPTER_TAG: "gs://b/adapter", tracking.TRAINING_KEY_TAG: "0123456789abcdef"}
    args, extra = tracking.report_args({"lora_rank": 8}, env, tags)
    assert args["report_to"] == ["tensorboard", "mlflow"]  # ms-swift's default stays
    assert args["run_name"] == "train-lora 0123456789abcdef" and args["lora_rank"] == 8
    assert json.loads(extra["MLFLOW_TAGS"]) == tags
    assert extra["MLFLOW_DISABLE_TELEMETRY"] == "true" and "MLFLOW_EXPERIMENT_NAME" not in extra  # already in env
    # the config's own list is kept; none becomes just mlflow; a run_name of the config wins
    assert tracking.report_args({"report_to": "tensorboard"}, env, tags)[0]["report_to"] == ["tensorboard", "mlflow"]
    assert tracking.report_args({"report_to": "none"}, env, tags)[0]["report_to"] == ["mlflow"]
    assert tracking.report_args({"report_to": ["mlflow"], "run_name": "mine"}, env, tags)[0] == {
        "report_to": ["mlflow"],
        "run_name": "mine",
    }
    # no experiment in the job env: MLflow's Default, named for swift
    assert tracking.report_args({}, {"MLFLOW_TRACKING_URI": "http://h:1"}, {})[1]["MLFLOW_EXPERIMENT_NAME"] == "Default"
    # without a server: nothing changes
    assert tracking.report_args({"report_to": "none"}, {}, tags) == ({"report_to": "none"}, {})


def test_train_lora_swift_arguments_and_environment_with_tracking_configured(tmp_path):
    """What train-lora passes to `swift sft` through `prepare_training`, for a config with tracking.mlflow_uri."""
    cfg = load_config(TINY, {"tracking.mlflow_uri": "http://127.0.0.1:5000", "tracking.required": False})
    job_env = {**cfg.environment, **cfg.tracking.settings(cfg.pipeline.name).job_env()}
    check_job_env(job_env, "environment")  # the allow-list takes what the pipeline passes
    assert job_env["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5000"
    assert job_env["MLFLOW_EXPERIMENT_NAME"] == cfg.pipeline.name and job_env["VLM_LORA_TRACKING_REQUIRED"] == "0"
    train = tmp_path / "train"
    train.mkdir()
    (train / LINEAGE_FILE).write_text(json.dumps({"snapshot": {"fingerprint": "e" * 64}, "training_key": "k" * 16}))
    tags = tracking.training_tags(str(train), "/gcs/bucket/runs/1/train-lora/adapter")
    assert tags == {
        tracking.ADAPTER_TAG: "gs://bucket/runs/1/train-lora/adapter",  # the /gcs/ path as the URI evaluate sees
        "vlm_lora.task": "train-lora",
        tracking.TRAINING_KEY_TAG: "k" * 16,
        tracking.SNAPSHOT_TAG: "e" * 64,
    }
    args, extra = tracking.report_args(cfg.swift, job_env, tags)
    assert args["report_to"] == ["mlflow"]  # tiny_cpu.yaml says none: only MLflow
    from components.common.swift import to_cli

    cli = to_cli(args)
    assert cli[cli.index("--report_to") + 1] == "mlflow"
    assert json.loads(extra["MLFLOW_TAGS"])[tracking.ADAPTER_TAG] == "gs://bucket/runs/1/train-lora/adapter"


def test_an_unreachable_server_stops_training_in_one_line_or_is_skipped_when_allowed(capsys):
    uri = _closed_port_uri()
    args = {"report_to": ["tensorboard", "mlflow"], "lora_rank": 8}
    with pytest.raises(tracking.TrackingError) as err:
        tracking.prepare_training(args, {"MLFLOW_TRACKING_URI": uri})
    message = str(err.value)
    assert "\n" not in message and uri in message and "cannot be reached" in message
    assert "mlflow server --backend-store-uri" in message and "tracking.required: false" in message
    out, extra = tracking.prepare_training(args, {"MLFLOW_TRACKING_URI": uri, "VLM_LORA_TRACKING_REQUIRED": "0"})
    assert out == {"report_to": ["tensorboard"], "lora_rank": 8} and extra == {}
    lines = [line for line in capsys.readouterr().out.splitlines() if "MLflow" in line]
    assert len(lines) == 1 and "WARNING" in lines[0] and uri in lines[0] and "going on without MLflow" in lines[0]


def test_without_a_server_prepare_training_changes_nothing():
    assert tracking.prepare_training({"lora_rank": 8}, {"NCCL_DEBUG": "INFO"}) == ({"lora_rank": 8}, {})


# ---------------------------------------------------------------- config load (unit, no network)


def test_tracking_keys_load_and_the_environment_variables_fold_into_them():
    cfg = load_config(TINY, {"tracking.mlflow_uri": "https://mlflow.example.com/", "tracking.experiment": "drawings"})
    assert cfg.tracking.settings(cfg.pipeline.name).as_param() == {
        "mlflow_uri": "https://mlflow.example.com/",
        "experiment": "drawings",
        "required": True,
    }
    assert load_config(TINY).tracking.settings("p").as_param() == {}  # off by default
    env_only = load_config(TINY, {"environment.MLFLOW_TRACKING_URI": "http://10.0.0.5:5000"})
    assert env_only.tracking.mlflow_uri == "http://10.0.0.5:5000"
    assert env_only.tracking.settings(env_only.pipeline.name).experiment == env_only.pipeline.name


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        ({"tracking.mlflow_uri": "file:///tmp/mlruns"}, "tracking.mlflow_uri", "is not an MLflow server URI"),
        (
            {"tracking.mlflow_uri": "http://a:1", "environment.MLFLOW_TRACKING_URI": "http://b:1"},
            "environment",
            "differs",
        ),
        ({"environment.VLM_LORA_TRACKING_REQUIRED": 0}, "environment", "use tracking.required"),
        ({"tracking.required": "no"}, "tracking.required", "true or false"),
        ({"swift.report_to": "wandb"}, "swift.report_to", "tracking.wandb is not set"),
        ({"swift.report_to": ["tensorboard", "swanlab"]}, "swift.report_to", "'swanlab' is not supported"),
        ({"swift.report_to": "mlflow"}, "swift.report_to", "tracking.mlflow_uri is not set"),
        ({"tracking.mlflow_url": "http://a:1"}, "tracking.mlflow_url", "did you mean"),
    ],
)
def test_bad_tracking_settings_are_refused_at_load_with_the_key_and_the_fix(overrides, key, words):
    with pytest.raises(ConfigError) as err:
        load_config(TINY, overrides)
    message = str(err.value)
    assert key in message and words in message and "\n" not in message


def test_a_tracking_uri_with_credentials_is_refused_without_echoing_them(tmp_path):
    config = tmp_path / "with_password.yaml"
    config.write_text(TINY.read_text() + "\ntracking:\n  mlflow_uri: http://me:s3cret@mlflow.internal:5000\n")
    with pytest.raises(ConfigError) as err:
        load_config(config)
    message = str(err.value)
    assert f"{config}:" in message and "'tracking.mlflow_uri'" in message and "holds credentials" in message
    assert "s3cret" not in message and "MLFLOW_TRACKING_TOKEN" in message


def test_wandb_needs_its_section_and_other_integrations_stay_refused():
    """W&B only with tracking.wandb (its project; the key read at run time); SwanLab and the rest are in no image."""
    assert "tracking.wandb is not set" in tracking.report_to_problem(["wandb"], "http://h:1")
    assert tracking.report_to_problem(["wandb", "mlflow"], "http://h:1", "vlm-lora") == ""
    assert "not supported" in tracking.report_to_problem(["swanlab"], "http://h:1", "vlm-lora")
    assert tracking.report_to_problem(["tensorboard", "mlflow"], "http://h:1") == ""
    assert tracking.report_to_problem("none", "") == ""


def test_the_job_env_allow_list_takes_mlflow_settings_but_no_credentials():
    check_job_env({"MLFLOW_TRACKING_URI": "http://10.0.0.5:5000", "MLFLOW_EXPERIMENT_NAME": "drawings"}, "environment")
    check_job_env({"VLM_LORA_TRACKING_REQUIRED": "0"}, "environment")
    for name in ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD"):
        with pytest.raises(JobEnvError, match="looks like a secret"):
            check_job_env({name: "x"}, "environment")


def test_scrub_redacts_tokens_secret_keys_and_uri_credentials():
    data = {
        "token_from": "env:HF_TOKEN",
        "note": HF_TOKEN,
        "server": "http://me:pw@mlflow:5000/x",
        "fingerprint": "f" * 64,
        "nested": [{"api_key": "abc"}, "gs://b/x.jsonl"],
        "rows": 12,
    }
    assert tracking.scrub(data) == {
        "token_from": "<redacted>",
        "note": "<redacted>",
        "server": "http://<redacted>@mlflow:5000/x",
        "fingerprint": "f" * 64,  # a hex digest is not a secret
        "nested": [{"api_key": "<redacted>"}, "gs://b/x.jsonl"],
        "rows": 12,
    }


# ---------------------------------------------------------------- the components' records, on a real server


def test_evaluate_and_register_record_into_the_training_run(mlflow_server, tmp_path):
    """train-lora's run (tagged as transformers' MLflowCallback tags it) gets evaluate's and register's records."""
    client = _client(mlflow_server)
    adapter = str(tmp_path / "runs" / "r1" / "train-lora" / "adapter")
    exp = client.create_experiment("drawings-shared")
    train_tags = tracking.training_tags("", adapter)
    training = client.create_run(exp, run_name="train-lora 0123456789abcdef", tags=train_tags)
    client.log_metric(training.info.run_id, "loss", 2.0, step=1)
    client.set_terminated(training.info.run_id)
    folder, meta = _merged_model(tmp_path, adapter)
    settings = tracking.Settings(mlflow_server, "drawings-shared").as_param()

    evaluation = {"tuned_f1": 0.8, "base_f1": 0.5, "passed": True, "reference": "base", "regression": {"overall": {}}}
    run_id = tracking.record(
        settings, "evaluate", model_uri=str(folder), model_dir=str(folder), model_meta=meta, metrics=evaluation,
        tags={"report": "/runs/r1/evaluate/report", "passed": True},
    )  # fmt: skip
    assert run_id == training.info.run_id  # found by the adapter tag, not a run of its own
    second = tracking.record(
        settings, "register", model_uri=str(folder), model_dir=str(folder), model_meta=meta,
        tags={"version": "projects/p/locations/l/models/m@3", "run_name": "vlm-lora-20261128"},
    )  # fmt: skip
    assert second == run_id
    runs = client.search_runs([exp], f"tags.`{tracking.ADAPTER_TAG}` = '{adapter}'")
    assert [r.info.run_id for r in runs] == [run_id]
    run = client.get_run(run_id)
    assert run.data.metrics["evaluate/tuned_f1"] == 0.8 and run.data.metrics["evaluate/passed"] == 1.0
    assert [m.value for m in client.get_metric_history(run_id, "loss")] == [2.0]  # the curve stays
    assert run.data.metrics["data/n_train"] == 10 and run.data.metrics["data/n_eval"] == 2
    tags = run.data.tags
    assert tags[tracking.SNAPSHOT_TAG] == "f" * 64 and tags[tracking.TRAINING_KEY_TAG] == "0123456789abcdef"
    assert tags["vlm_lora.base_model"] == "/runs/r1/stage-model/model" and tags["vlm_lora.merged_model"] == str(folder)
    assert tags["vlm_lora.pipeline_run"] == "run-7" and tags["vlm_lora.evaluate.passed"] == "True"
    assert tags["vlm_lora.register.version"] == "projects/p/locations/l/models/m@3"
    paths = {a.path for a in client.list_artifacts(run_id, "lineage")} | {
        a.path for folder_ in ("evaluate",) for a in client.list_artifacts(run_id, folder_)
    }
    assert paths == {"lineage/data_snapshot.json", "lineage/lineage.json", "evaluate/metrics.json"}
    local = client.download_artifacts(run_id, "evaluate/metrics.json", str(tmp_path / "dl"))
    assert json.loads(Path(local).read_text())["regression"] == {"overall": {}}
    # no secret anywhere MLflow keeps it
    everything = json.dumps([run.data.tags, run.data.params, run.data.metrics]) + Path(local).read_text()
    assert HF_TOKEN not in everything


def test_record_opens_a_run_with_the_lineage_when_training_reported_nowhere(mlflow_server, tmp_path):
    folder, meta = _merged_model(tmp_path, "gs://bucket/runs/9/train-lora/adapter")
    settings = {"mlflow_uri": mlflow_server, "experiment": "fresh-experiment", "required": True}
    run_id = tracking.record(
        settings, "evaluate", model_uri="gs://bucket/runs/9/merge-export/merged", model_dir=str(folder),
        model_meta=meta, metrics={"tuned_f1": 0.25},
    )  # fmt: skip
    client = _client(mlflow_server)
    exp = client.get_experiment_by_name("fresh-experiment")
    runs = client.search_runs([exp.experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]
    assert runs[0].data.tags[tracking.ADAPTER_TAG] == "gs://bucket/runs/9/train-lora/adapter"
    assert runs[0].info.run_name == "evaluate 0123456789abcdef"
    assert [m.value for m in client.get_metric_history(run_id, "evaluate/tuned_f1")] == [0.25]


def test_record_without_settings_or_with_an_unreachable_server(tmp_path, capsys):
    folder, meta = _merged_model(tmp_path)
    kw = dict(model_uri=str(folder), model_dir=str(folder), model_meta=meta, metrics={"tuned_f1": 1.0})
    assert tracking.record({}, "evaluate", **kw) == "" and tracking.record(None, "evaluate", **kw) == ""
    uri = _closed_port_uri()
    with pytest.raises(tracking.TrackingError, match="cannot be reached"):
        tracking.record({"mlflow_uri": uri}, "evaluate", **kw)
    assert tracking.record({"mlflow_uri": uri, "required": False}, "register", **kw) == ""
    assert "register: WARNING: MLflow server" in capsys.readouterr().out


def test_probe_names_a_server_that_is_not_mlflow(tmp_path):
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    server = ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: SimpleHTTPRequestHandler(*a, directory=str(tmp_path)))
    Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert "answers 404" in tracking.probe(f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()


# ---------------------------------------------------------------- the pipeline passes the settings


@pytest.mark.parametrize("target", ["vertex", "local"])
def test_the_compiled_pipeline_gives_train_lora_evaluate_and_register_the_settings(target, tmp_path):
    from pipelines.compile import compile_pipeline
    from tests.pipeline_spec import container_tasks, source

    config = ROOT / "configs" / "qwen3_vl_4b" / "lora_seed.yaml"
    root = str(tmp_path / "runs") if target == "local" else "gs://test-bucket/runs"  # Vertex: gs:// roots only
    overrides = {"tracking.mlflow_uri": "http://10.0.0.5:5000", "pipeline.root": root}
    out = compile_pipeline(str(config), str(tmp_path / "p.yaml"), target=target, overrides=overrides)
    spec = yaml.safe_load(out.read_text())
    index = container_tasks(spec)
    expected = {"mlflow_uri": "http://10.0.0.5:5000", "experiment": load_config(config).pipeline.name, "required": True}
    assert source(index, "evaluate", "tracking").value == expected
    job_env = source(index, "train-lora", "settings").value["job_env"]
    assert job_env["MLFLOW_TRACKING_URI"] == "http://10.0.0.5:5000"
    assert job_env["MLFLOW_EXPERIMENT_NAME"] == expected["experiment"] and job_env["VLM_LORA_TRACKING_REQUIRED"] == "1"
    if target == "vertex":
        assert source(index, "register", "tracking").value == expected
    # without a server nothing is passed (tracking stays off)
    plain = yaml.safe_load(
        compile_pipeline(str(config), str(tmp_path / "q.yaml"), target=target, overrides=overrides | {
            "tracking.mlflow_uri": ""
        }).read_text()
    )  # fmt: skip
    plain_index = container_tasks(plain)
    assert "tracking" not in plain_index["evaluate"].spec["inputs"].get("parameters", {})
    assert not any(k.startswith("MLFLOW") for k in source(plain_index, "train-lora", "settings").value["job_env"])


# ---------------------------------------------------------------- packaging


def test_the_lock_holds_the_tracking_extra_and_the_images_install_it():
    """The dependency image installs the lock alone (--no-deps): it must hold the tracking extra's closure."""
    from importlib import metadata

    lock = {
        canonicalize_name(n): v.strip()
        for n, _, v in (line.partition("==") for line in (ROOT / "requirements.lock").read_text().splitlines())
        if v
    }
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any("mlflow" in r for r in project["dependencies"])  # the light install stays light
    tracking_extra = project["optional-dependencies"]["tracking"]
    env, seen, todo, missing = default_environment(), set(), [Requirement(r) for r in tracking_extra], []
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or name in ("pip", "setuptools"):
            continue
        seen.add(name)
        if name not in lock:
            missing.append(req.name)
            continue
        assert req.specifier.contains(lock[name], prereleases=True), f"{req} vs lock {lock[name]}"
        for sub in map(Requirement, metadata.requires(req.name) or []):
            if sub.marker is None or sub.marker.evaluate({**env, "extra": ""}):
                todo.append(sub)
    assert not missing, f"not in requirements.lock: {missing}"
    assert "mlflow-skinny" in seen and "wandb" in seen
    for dockerfile in ("Dockerfile.train", "Dockerfile.light"):
        text = (ROOT / "images" / dockerfile).read_text()
        assert "tracking" in text.split('-c requirements.lock ".[', 1)[1].split("]", 1)[0], dockerfile


def test_record_logs_the_lora_and_plan_settings_the_adapter_and_the_report(mlflow_server, tmp_path):
    """What MLflow's own client finds after evaluate's record: parameters, the adapter's files, the report."""
    adapter = tmp_path / "runs" / "r2" / "train-lora" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 32}))
    (adapter / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    (adapter / "checkpoint-4").mkdir()  # a folder: not uploaded
    folder, meta = _merged_model(tmp_path, str(adapter))
    lineage = json.loads((folder / "lineage.json").read_text())
    hyper = {"lora_rank": 8, "lora_alpha": 32, "target_modules": ["all-linear"], "per_device_train_batch_size": 4,
             "gradient_accumulation_steps": 2, "effective_batch_size": 8, "learning_rate": 1e-4}  # fmt: skip
    lineage["training"] = {"hyperparameters": hyper, "metrics": {}, "missing": []}
    (folder / "lineage.json").write_text(json.dumps(lineage))
    report = tmp_path / "evaluate" / "report"  # KFP's HTML output file has no suffix
    report.parent.mkdir()
    report.write_text("<html>evaluation</html>")
    settings = tracking.Settings(mlflow_server, "params-and-artifacts").as_param()
    record = dict(model_uri=str(folder), model_dir=str(folder), model_meta={**meta, "adapter": str(adapter)})
    run_id = tracking.record(settings, "evaluate", **record, files={"evaluate/report.html": report})
    assert tracking.record(settings, "register", **record) == run_id  # the same parameters again: accepted

    client = _client(mlflow_server)
    params = client.get_run(run_id).data.params
    assert params["vlm_lora.lora_rank"] == "8" and params["vlm_lora.lora_alpha"] == "32"
    assert params["vlm_lora.target_modules"] == "['all-linear']" and params["vlm_lora.effective_batch_size"] == "8"
    assert {a.path for a in client.list_artifacts(run_id, "adapter")} == {
        "adapter/adapter_config.json", "adapter/adapter_model.safetensors"}  # fmt: skip
    local = client.download_artifacts(run_id, "evaluate/report.html", str(tmp_path / "dl"))
    assert Path(local).read_text() == "<html>evaluation</html>"


def test_train_lora_attaches_its_loss_curve_report_to_the_adapter_run(mlflow_server, tmp_path):
    adapter = str(tmp_path / "runs" / "r3" / "train-lora" / "adapter")
    client = _client(mlflow_server)
    exp = client.create_experiment("curves")
    training = client.create_run(exp, tags=tracking.training_tags("", adapter))  # as MLflowCallback opens it
    curve = tmp_path / "loss_curve"
    curve.write_text("<html>loss</html>")
    settings = tracking.Settings(mlflow_server, "curves").as_param()
    files = {"train-lora/loss_curve.html": curve}
    assert tracking.attach_files(settings, adapter, files, "train-lora") == training.info.run_id
    assert [a.path for a in client.list_artifacts(training.info.run_id, "train-lora")] == ["train-lora/loss_curve.html"]
    assert tracking.attach_files({}, adapter, files, "train-lora") == ""  # no server: nothing, no error
