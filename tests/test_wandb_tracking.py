"""W&B (`components.common.wandb_tracking`) with the real `wandb` library in offline mode.

WANDB_MODE=offline and WANDB_DIR in tmp_path: every run is written as `wandb/offline-run-*/run-<id>.wandb`,
read back with wandb's own reader (`wandb.sdk.internal.datastore.DataStore`, records parsed as
`wandb.proto.wandb_internal_pb2.Record`). The config checks and train-lora's swift arguments are unit tests;
one test trains the tiny model (3 steps on the CPU, about 40-60 s) with `report_to wandb`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from components.common import tracking, wandb_tracking
from components.train_lora.job_env import check_job_env
from pipelines.config import ConfigError, load_config
from tests.test_tracking import HF_TOKEN, TINY, _closed_port_uri, _merged_model

WANDB = {"tracking.wandb": {"project": "vlm-lora-tests", "entity": "team-a", "api_key_from": "env:MY_WANDB_KEY"}}
FAKE_KEY = "0123456789abcdef" * 2 + "01234567"  # 40 hex digits, the shape of a W&B key


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """W&B offline into tmp_path; no login, no network, no telemetry."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
    monkeypatch.setenv("WANDB_API_KEY", "")  # recorded as unset: what `login` writes is undone after the test
    monkeypatch.delenv("WANDB_API_KEY")
    return tmp_path


def _records(wandb_dir: Path, ident: str) -> dict[str, list[Any]]:
    """{record kind: [records]} of every offline run folder of run `ident`, read with wandb's DataStore."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal.datastore import DataStore

    out: dict[str, list[Any]] = defaultdict(list)
    files = sorted(Path(wandb_dir).glob(f"wandb/offline-run-*-{ident}/run-{ident}.wandb"))
    assert files, f"no offline run {ident} under {wandb_dir}"
    for path in files:
        store = DataStore()
        store.open_for_scan(str(path))
        while (data := store.scan_data()) is not None:
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            kind = record.WhichOneof("record_type")
            out[kind].append(getattr(record, kind))
    return out


def _items(records: list[Any]) -> dict[str, Any]:
    """The key -> value of config / summary updates (last one wins)."""
    return {u.key: json.loads(u.value_json) for r in records for u in r.update if u.key}


# ---------------------------------------------------------------- config (unit)


def test_wandb_section_accepts_report_to_wandb_and_reaches_train_lora_and_evaluate():
    cfg = load_config(TINY, {**WANDB, "swift.report_to": ["tensorboard", "wandb"]})
    env = cfg.tracking.job_env(cfg.pipeline.name)
    assert env == {"WANDB_PROJECT": "vlm-lora-tests", "WANDB_ENTITY": "team-a", "VLM_LORA_TRACKING_REQUIRED": "1",
                   "VLM_LORA_WANDB_LOGIN_FROM": "env:MY_WANDB_KEY"}  # fmt: skip
    check_job_env({**cfg.environment, **env}, "environment")  # the allow-list takes what the pipeline passes
    assert cfg.tracking.param(cfg.pipeline.name) == {
        "wandb": {"project": "vlm-lora-tests", "entity": "team-a", "api_key_from": "env:MY_WANDB_KEY", "required": True}
    }  # no MLflow: only the wandb entry
    assert load_config(TINY).tracking.param("p") == {} and load_config(TINY).tracking.job_env("p") == {}


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        ({"swift.report_to": "wandb"}, "swift.report_to", "tracking.wandb is not set"),
        ({"tracking.wandb": {"entity": "x"}}, "tracking.wandb.project", "is required"),
        ({"tracking.wandb": {"project": "p", "key": "x"}}, "tracking.wandb.key", "unknown key"),
        ({"tracking.wandb": {"project": "my project"}}, "tracking.wandb.project", "must be a W&B name"),
        ({"tracking.wandb": {"project": "p", "api_key_from": "WANDB_API_KEY"}}, "api_key_from", "env:VAR"),
        ({**WANDB, "environment.WANDB_PROJECT": "other"}, "environment.WANDB_PROJECT", "set it there"),
        ({"swift.report_to": "swanlab"}, "swift.report_to", "'swanlab' is not supported"),
    ],
)
def test_bad_wandb_settings_are_refused_at_load(overrides, key, words):
    with pytest.raises(ConfigError) as err:
        load_config(TINY, overrides)
    assert key in str(err.value) and words in str(err.value) and "\n" not in str(err.value)


def test_a_pasted_api_key_is_refused_without_echoing_it():
    with pytest.raises(ConfigError) as err:
        load_config(TINY, {"tracking.wandb": {"project": "p", "api_key_from": FAKE_KEY}})
    assert "tracking.wandb.api_key_from" in str(err.value) and FAKE_KEY not in str(err.value)


# ---------------------------------------------------------------- train-lora's swift arguments (unit)


def test_prepare_training_adds_wandb_the_run_id_and_reads_the_key_into_the_process_only(offline, monkeypatch):
    monkeypatch.setenv("MY_WANDB_KEY", FAKE_KEY)
    adapter = "/gcs/bucket/runs/1/train-lora/adapter"
    job_env = load_config(TINY, WANDB).tracking.job_env("p")
    tags = {tracking.TRAINING_KEY_TAG: "k" * 16}
    args, env = wandb_tracking.prepare_training({"report_to": "none", "lora_rank": 8}, job_env, adapter, tags)
    assert args == {"report_to": ["wandb"], "lora_rank": 8, "run_name": "train-lora " + "k" * 16}
    ident = wandb_tracking.run_id("gs://bucket/runs/1/train-lora/adapter")  # the URI evaluate sees: the same run
    assert env == {
        "WANDB_RUN_ID": ident,
        "WANDB_RESUME": "allow",
        "WANDB_ERROR_REPORTING": "false",
    } and ident == wandb_tracking.run_id(adapter)
    assert len(ident) == 27 and ident.isalnum() and ident.islower()
    import os

    assert os.environ["WANDB_API_KEY"] == FAKE_KEY  # swift sft inherits it; never in args, env or job_env
    assert FAKE_KEY not in json.dumps([args, env, job_env])
    # the config's list is kept; without a project nothing changes
    kept = wandb_tracking.prepare_training({"report_to": ["tensorboard", "mlflow"]}, job_env, adapter)[0]
    assert kept["report_to"] == ["tensorboard", "mlflow", "wandb"]
    assert wandb_tracking.prepare_training({"report_to": "none"}, {}, adapter) == ({"report_to": "none"}, {})


def test_an_unreachable_wandb_stops_training_in_one_line_or_is_skipped(monkeypatch, capsys):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", _closed_port_uri())
    env = {"WANDB_PROJECT": "p"}
    with pytest.raises(tracking.TrackingError) as err:
        wandb_tracking.prepare_training({"report_to": ["tensorboard", "wandb"]}, env, "/a")
    assert "cannot be reached" in str(err.value) and "tracking.required: false" in str(err.value)
    assert "\n" not in str(err.value)
    out, extra = wandb_tracking.prepare_training(
        {"report_to": ["tensorboard", "wandb"]}, {**env, "VLM_LORA_TRACKING_REQUIRED": "0"}, "/a"
    )
    assert out == {"report_to": ["tensorboard"]} and extra == {}
    settings = {"wandb": {"project": "p", "required": False}}
    assert wandb_tracking.record(settings, "evaluate", model_uri="/m", model_dir="", model_meta={}) == ""
    lines = [line for line in capsys.readouterr().out.splitlines() if "W&B" in line]
    assert len(lines) == 2 and all("WARNING" in line and "going on without W&B" in line for line in lines)


def test_a_missing_key_variable_is_a_named_error_or_one_warning(offline, capsys):
    s = wandb_tracking.WandbSettings("p", api_key_from="env:NOT_SET_ANYWHERE")
    with pytest.raises(tracking.TrackingError, match="NOT_SET_ANYWHERE"):
        wandb_tracking.login(s)
    env = s.job_env()
    with pytest.raises(tracking.TrackingError, match="NOT_SET_ANYWHERE.*tracking.required: false"):
        wandb_tracking.prepare_training({"report_to": "wandb"}, env, "/a")
    out = wandb_tracking.prepare_training({"report_to": "wandb"}, {**env, "VLM_LORA_TRACKING_REQUIRED": "0"}, "/a")
    assert out == ({"report_to": "none"}, {})
    lines = [line for line in capsys.readouterr().out.splitlines() if "W&B" in line]
    assert len(lines) == 1 and "NOT_SET_ANYWHERE" in lines[0] and "going on without W&B" in lines[0]


# ---------------------------------------------------------------- evaluate's record, offline


def test_evaluate_records_figures_lineage_settings_reports_and_the_adapter(offline, tmp_path):
    adapter = tmp_path / "runs" / "r1" / "train-lora" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8}))
    (adapter / "adapter_model.safetensors").write_bytes(b"\0" * 32)
    folder, meta = _merged_model(tmp_path, str(adapter))
    lineage = json.loads((folder / "lineage.json").read_text())
    lineage["training"] = {"hyperparameters": {"lora_rank": 8, "target_modules": ["all-linear"]}}
    (folder / "lineage.json").write_text(json.dumps({**lineage, "adapter": str(adapter)}))
    report = tmp_path / "report"
    report.write_text("<html>evaluation</html>")
    settings = {"wandb": wandb_tracking.WandbSettings("vlm-lora-tests").as_param()}
    ident = wandb_tracking.record(
        settings, "evaluate", model_uri="gs://b/merged", model_dir=str(folder), model_meta=meta,
        metrics={"tuned_f1": 0.8, "passed": True, "reference": "base"}, files={"evaluate/report.html": report},
    )  # fmt: skip
    assert ident == wandb_tracking.run_id(str(adapter))
    records = _records(offline, ident)
    assert records["run"][0].project == "vlm-lora-tests" and records["run"][0].run_id == ident
    summary = _items(records["summary"])
    assert summary["evaluate/tuned_f1"] == 0.8 and summary["evaluate/passed"] == 1.0
    assert summary["data/n_train"] == 10 and "evaluate/reference" not in summary  # text stays in metrics.json
    config = _items(records["config"])
    assert config["vlm_lora.lora_rank"] == "8" and config["vlm_lora.target_modules"] == "['all-linear']"
    assert config["vlm_lora.lineage"][tracking.TRAINING_KEY_TAG] == "0123456789abcdef"
    saved = {f.path for r in records["files"] for f in r.files}
    assert {"lineage/data_snapshot.json", "lineage/lineage.json", "evaluate/metrics.json"} <= saved
    assert "evaluate/report.html" in saved
    run_dir = next(offline.glob(f"wandb/offline-run-*-{ident}/files"))
    assert (run_dir / "evaluate" / "report.html").read_text() == "<html>evaluation</html>"
    artifacts = [a for a in records["artifact"] if a.type == "model"]
    assert [a.name for a in artifacts] == [f"adapter-{ident}"]
    assert {e.path for e in artifacts[0].manifest.contents} == {"adapter_config.json", "adapter_model.safetensors"}
    everything = "".join(str(r) for kind in records.values() for r in kind)
    assert HF_TOKEN not in everything and HF_TOKEN not in (run_dir / "lineage" / "lineage.json").read_text()


# ---------------------------------------------------------------- train-lora on the tiny model, then evaluate


def test_training_curves_reach_wandb_and_evaluate_adds_to_the_same_run(offline, tmp_path):
    from components.train_lora.core import train_lora
    from components.validate_data.core import validate_data
    from pipelines.demo.drawings import generate_dataset
    from pipelines.demo.tiny_model import ensure_tiny_model
    from tests.cpu_training import cpu_swift_args

    raw = generate_dataset(tmp_path / "raw", n_train=4, n_eval=2, image_size=128)
    validate_data(
        [raw["train"]], str(tmp_path / "train"), str(tmp_path / "eval"), str(tmp_path / "q.jsonl"),
        eval_files=[raw["eval"]],
    )  # fmt: skip
    adapter = tmp_path / "adapter"
    result = train_lora(
        model_dir=str(ensure_tiny_model()), model_type="qwen3_vl", train_dir=str(tmp_path / "train"), eval_dir="",
        swift_args=cpu_swift_args(3), adapter_out=str(adapter), work_dir=str(tmp_path / "work"),
        job_env={"WANDB_PROJECT": "tiny-train"},
    )  # fmt: skip
    assert result.metrics["steps"] == 3
    ident = wandb_tracking.run_id(str(adapter))
    records = _records(offline, ident)
    assert records["run"][0].project == "tiny-train" and records["run"][0].display_name.startswith("train-lora ")
    history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in h.item} for h in records["history"]]
    losses = [row["train/loss"] for row in history if "train/loss" in row]
    logged = [e["loss"] for e in json.loads((adapter / "log_history.json").read_text()) if "loss" in e]
    assert losses == pytest.approx(logged, rel=1e-6) and len(losses) == 3  # swift's own trainer, one per step
    config = _items(records["config"])
    assert config["learning_rate"] == 0.001 and config["max_steps"] == 3  # WandbCallback's training arguments

    settings = {"wandb": {"project": "tiny-train"}}
    curve = tmp_path / "loss_curve"  # train-lora's component attaches its report (KFP's file has no suffix)
    curve.write_text("<html>loss</html>")
    assert wandb_tracking.attach_files(settings, str(adapter), {"train-lora/loss_curve.html": curve}, "t") == ident
    attached = _records(offline, ident)
    assert "train-lora/loss_curve.html" in {f.path for r in attached["files"] for f in r.files}

    folder, meta = _merged_model(tmp_path / "merge", str(adapter))
    again = wandb_tracking.record(
        settings, "evaluate", model_uri=str(folder), model_dir=str(folder), model_meta=meta,
        metrics={"tuned_f1": 0.5},
    )  # fmt: skip
    assert again == ident  # the adapter's run, found by the ID its URI gives
    assert _items(_records(offline, ident)["summary"])["evaluate/tuned_f1"] == 0.5


def test_the_compiled_pipeline_gives_train_lora_and_evaluate_the_wandb_settings(tmp_path):
    import yaml

    from pipelines.compile import compile_pipeline
    from tests.pipeline_spec import container_tasks, source
    from tests.test_tracking import ROOT

    config = ROOT / "configs" / "qwen3_vl_4b" / "lora_seed.yaml"
    overrides = {**WANDB, "pipeline.root": str(tmp_path / "runs")}
    out = compile_pipeline(str(config), str(tmp_path / "p.yaml"), target="local", overrides=overrides)
    text = out.read_text()
    index = container_tasks(yaml.safe_load(text))
    assert source(index, "evaluate", "tracking").value["wandb"]["project"] == "vlm-lora-tests"
    job_env = source(index, "train-lora", "settings").value["job_env"]
    assert job_env["WANDB_PROJECT"] == "vlm-lora-tests" and job_env["VLM_LORA_WANDB_LOGIN_FROM"] == "env:MY_WANDB_KEY"
    assert "MLFLOW_TRACKING_URI" not in job_env and "WANDB_API_KEY" not in text


def test_a_second_offline_record_within_one_second_gets_its_own_folder(tmp_path, monkeypatch):
    """wandb names offline folders by the second: a record in the same second as the last would share its folder."""
    import time

    monkeypatch.setenv("WANDB_MODE", "offline")
    ident = "vlm0123"
    stamp = time.strftime("%Y%m%d_%H%M%S")
    (tmp_path / f"offline-run-{stamp}-{ident}").mkdir()
    wandb_tracking.wait_for_free_offline_folder(ident, tmp_path)
    assert time.strftime("%Y%m%d_%H%M%S") != stamp  # a new second, so a new folder
    before = time.time()
    wandb_tracking.wait_for_free_offline_folder("vlm-other", tmp_path)  # nothing to wait for
    assert time.time() - before < 0.5
