"""train-lora on the tiny model with MLflow: `swift sft`'s own `report_to mlflow` sends the curves to a real
local `mlflow server`, and evaluate's record lands in the same run.

Three optimizer steps on the CPU (about 40-60 s on 2 cores, most of it `swift sft` starting); the server
is `tests/test_tracking.py`'s fixture (sqlite backend, started on a free port, stopped after).
"""

import json
from pathlib import Path

import pytest

from components.common import tracking
from tests.cpu_training import cpu_swift_args
from tests.test_tracking import _merged_model, _no_telemetry, mlflow_server  # noqa: F401 - fixtures

STEPS = 3
SWIFT_ARGS = cpu_swift_args(STEPS)  # report_to none as tiny_cpu.yaml: with a tracking server, only MLflow


def test_training_curves_reach_mlflow_and_evaluate_adds_to_the_same_run(mlflow_server, tmp_path):
    from mlflow import MlflowClient

    from components.train_lora.core import train_lora
    from components.validate_data.core import validate_data
    from pipelines.demo.drawings import generate_dataset
    from pipelines.demo.tiny_model import ensure_tiny_model

    raw = generate_dataset(tmp_path / "raw", n_train=4, n_eval=2, image_size=128)
    validate_data(
        [raw["train"]], str(tmp_path / "train"), str(tmp_path / "eval"), str(tmp_path / "q.jsonl"),
        eval_files=[raw["eval"]],
    )  # fmt: skip
    adapter = tmp_path / "adapter"
    result = train_lora(
        model_dir=str(ensure_tiny_model()),
        model_type="qwen3_vl",
        train_dir=str(tmp_path / "train"),
        eval_dir="",
        swift_args=SWIFT_ARGS,
        adapter_out=str(adapter),
        work_dir=str(tmp_path / "work"),
        job_env={"MLFLOW_TRACKING_URI": mlflow_server, "MLFLOW_EXPERIMENT_NAME": "tiny-train"},
    )
    assert result.metrics["steps"] == STEPS

    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("tiny-train")
    runs = client.search_runs([experiment.experiment_id], f"tags.`{tracking.ADAPTER_TAG}` = '{adapter}'")
    assert len(runs) == 1, [r.data.tags for r in runs]
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.tags["vlm_lora.task"] == "train-lora"
    assert run.info.run_name == f"train-lora {adapter}"  # not swift's scratch folder
    losses = client.get_metric_history(run.info.run_id, "loss")
    assert sorted(m.step for m in losses) == [1, 2, 3]  # one point per logged step, from swift's own trainer
    logged = [e["loss"] for e in json.loads((adapter / "log_history.json").read_text()) if "loss" in e]
    assert sorted(m.value for m in losses) == pytest.approx(sorted(logged), rel=1e-6)
    assert run.data.params["learning_rate"] == "0.001" and run.data.params["max_steps"] == str(STEPS)

    # evaluate, as its component calls it, with the merged model that names this adapter
    folder, meta = _merged_model(tmp_path / "merge", str(adapter))
    settings = {"mlflow_uri": mlflow_server, "experiment": "tiny-train", "required": True}
    run_id = tracking.record(
        settings, "evaluate", model_uri=str(folder), model_dir=str(folder), model_meta=meta,
        metrics={"tuned_f1": 0.5, "passed": False},
    )  # fmt: skip
    assert run_id == run.info.run_id
    after = client.get_run(run_id)
    assert after.data.metrics["evaluate/tuned_f1"] == 0.5 and "loss" in after.data.metrics
    assert {a.path for a in client.list_artifacts(run_id, "lineage")} == {
        "lineage/data_snapshot.json",
        "lineage/lineage.json",
    }
    assert Path(adapter, "adapter_model.safetensors").is_file()


def test_an_unreachable_server_stops_train_lora_before_swift_starts(tmp_path):
    from components.train_lora.core import TrainError, train_lora
    from components.validate_data.core import validate_data
    from pipelines.demo.drawings import generate_dataset
    from pipelines.demo.tiny_model import ensure_tiny_model
    from tests.test_tracking import _closed_port_uri

    raw = generate_dataset(tmp_path / "raw", n_train=2, n_eval=1, image_size=128)
    validate_data(
        [raw["train"]], str(tmp_path / "train"), str(tmp_path / "eval"), str(tmp_path / "q.jsonl"),
        eval_files=[raw["eval"]],
    )  # fmt: skip
    uri = _closed_port_uri()
    with pytest.raises(TrainError) as err:
        train_lora(
            model_dir=str(ensure_tiny_model()),
            model_type="qwen3_vl",
            train_dir=str(tmp_path / "train"),
            eval_dir="",
            swift_args=SWIFT_ARGS,
            adapter_out=str(tmp_path / "adapter"),
            work_dir=str(tmp_path / "work"),
            job_env={"MLFLOW_TRACKING_URI": uri},
        )
    assert uri in str(err.value) and "tracking.required: false" in str(err.value) and "\n" not in str(err.value)
    assert (tmp_path / "work" / "train.jsonl").is_file()  # the inputs were ready ...
    assert not (tmp_path / "work" / "swift_sft.log").exists()  # ... and swift never started
    assert not any((tmp_path / "adapter").glob("*"))
