"""MLflow's model registry (`components.common.mlflow_registry`) against a real local `mlflow server`.

The server is `tests/test_tracking.py`'s fixture (sqlite backend, a free port). What evaluate and register
leave is read back with MLflow's own client: `search_model_versions`, `get_model_version` and its tags.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from components.common import mlflow_registry, tracking
from pipelines.config import ConfigError, load_config
from tests.test_tracking import HF_TOKEN, TINY, _closed_port_uri, _merged_model, _no_telemetry, mlflow_server  # noqa: F401

FIGURES = {"tuned_f1": 0.8, "base_f1": 0.5, "passed": 1.0, "margin_f1_ci_low": 0.12, "margin_f1_ci_high": 0.47}


def _adapter(tmp_path: Path, name: str) -> Path:
    adapter = tmp_path / "runs" / name / "train-lora" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8}))
    (adapter / "adapter_model.safetensors").write_bytes(b"\0" * 32)
    return adapter


def _evaluated(tmp_path: Path, name: str) -> tuple[SimpleNamespace, SimpleNamespace]:
    """A merged model (with its adapter) and a report as evaluate's `_record` receives them."""
    adapter = _adapter(tmp_path, name)
    folder, meta = _merged_model(tmp_path / name, str(adapter))
    lineage = json.loads((folder / "lineage.json").read_text())
    (folder / "lineage.json").write_text(json.dumps({**lineage, "adapter": str(adapter)}))
    report = tmp_path / name / "report"
    report.write_text("<html>evaluation</html>")
    model = SimpleNamespace(uri=f"gs://b/runs/{name}/merge-export/merged", path=str(folder), metadata=meta)
    return model, SimpleNamespace(uri=f"gs://b/runs/{name}/evaluate/report", path=str(report), metadata={})


# ---------------------------------------------------------------- config (unit, no network)


def test_register_model_loads_with_the_pipeline_name_as_default_model_name():
    uri = {"tracking.mlflow_uri": "http://127.0.0.1:5000"}
    cfg = load_config(TINY, {**uri, "tracking.register_model": True})
    param = cfg.tracking.settings(cfg.pipeline.name).as_param()
    assert param["register_model"] == cfg.pipeline.name and param["mlflow_uri"] == "http://127.0.0.1:5000"
    named = load_config(TINY, {**uri, "tracking.register_model": True, "tracking.model_name": "drawings-lora"})
    assert named.tracking.settings("p").as_param()["register_model"] == "drawings-lora"
    assert "register_model" not in load_config(TINY, uri).tracking.settings("p").as_param()  # off by default
    assert tracking.Settings.from_param(param).model_name == cfg.pipeline.name


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        ({"tracking.register_model": True}, "tracking.register_model", "needs an MLflow server"),
        ({"tracking.mlflow_uri": "http://h:1", "tracking.model_name": "m"}, "tracking.model_name", "register_model"),
        (
            {"tracking.mlflow_uri": "http://h:1", "tracking.register_model": True, "tracking.model_name": "a/b"},
            "tracking.model_name",
            "may not hold /",
        ),
        ({"tracking.register_model": "yes"}, "tracking.register_model", "true or false"),
    ],
)
def test_bad_registry_settings_are_refused_at_load(overrides, key, words):
    with pytest.raises(ConfigError) as err:
        load_config(TINY, overrides)
    assert key in str(err.value) and words in str(err.value) and "\n" not in str(err.value)


def test_gate_tags_hold_the_decision_the_margin_and_its_interval():
    tags = mlflow_registry.gate_tags(FIGURES, "f1", "tuned f1 0.80 >= 0.50 + 0.00", "point")
    assert tags == {
        "vlm_lora.gate": "passed",
        "vlm_lora.gate.metric": "f1",
        "vlm_lora.gate.margin": "0.3000",
        "vlm_lora.gate.margin_ci_low": "0.1200",
        "vlm_lora.gate.margin_ci_high": "0.4700",
        "vlm_lora.gate.on": "point",
        "vlm_lora.gate.reason": "tuned f1 0.80 >= 0.50 + 0.00",
    }
    failed = mlflow_registry.gate_tags({"passed": 0.0, "tuned_f1": 0.2, "base_f1": 0.5}, "f1")
    assert failed == {"vlm_lora.gate": "failed", "vlm_lora.gate.metric": "f1", "vlm_lora.gate.margin": "-0.3000"}


# ---------------------------------------------------------------- evaluate and register, on a real server


def _evaluate_record(settings: dict, model, report, figures: dict, reason: str) -> None:
    from components.evaluate.step import _record

    result = SimpleNamespace(passed=bool(figures["passed"]), reason=reason, quantization="none")
    _record(settings, result, figures, model, report, None, gate=("f1", "point"))


def test_evaluate_registers_the_adapter_run_with_the_gate_decision_and_register_adds_to_it(mlflow_server, tmp_path):
    from mlflow import MlflowClient

    settings = tracking.Settings(mlflow_server, "registry-exp", model_name="drawings-lora").as_param()
    model, report = _evaluated(tmp_path, "r1")
    _evaluate_record(settings, model, report, FIGURES, "tuned f1 0.80 beats base 0.50")
    client = MlflowClient(mlflow_server)
    versions = client.search_model_versions("name = 'drawings-lora'")
    assert len(versions) == 1
    version = client.get_model_version("drawings-lora", versions[0].version)
    run = client.get_run(version.run_id)
    assert run.data.tags[tracking.ADAPTER_TAG] == tracking.adapter_key(
        json.loads((Path(model.path) / "lineage.json").read_text())["adapter"]
    )  # fmt: skip - the adapter's own run
    assert version.source == f"{run.info.artifact_uri}/adapter"  # the adapter files record() uploaded
    assert {a.path for a in client.list_artifacts(version.run_id, "adapter")} == {
        "adapter/adapter_config.json", "adapter/adapter_model.safetensors"}  # fmt: skip
    tags = version.tags
    assert tags["vlm_lora.gate"] == "passed" and tags["vlm_lora.gate.margin"] == "0.3000"
    assert tags["vlm_lora.gate.margin_ci_low"] == "0.1200" and tags["vlm_lora.gate.on"] == "point"
    assert tags["vlm_lora.gate.reason"] == "tuned f1 0.80 beats base 0.50"
    assert tags["vlm_lora.training_key"] == "0123456789abcdef" and tags["vlm_lora.merged_model"] == model.uri
    assert not any(k.startswith("vlm_lora.evaluate.") for k in tags)  # task tags stay on the run
    assert HF_TOKEN not in json.dumps(tags)

    # register (Vertex, after the passed gate): the same version gains the Vertex version; no second version
    vertex = "https://l-aiplatform.googleapis.com/v1/projects/p/locations/l/models/m@3"
    assert mlflow_registry.register_version(
        settings, version.run_id, "register", {"vlm_lora.vertex_model_version": vertex}
    ) == version.version  # fmt: skip
    again = client.get_model_version("drawings-lora", version.version)
    assert again.tags["vlm_lora.vertex_model_version"] == vertex and again.tags["vlm_lora.gate"] == "passed"
    assert len(client.search_model_versions("name = 'drawings-lora'")) == 1

    # a second adapter that fails the gate: version 2, tagged failed
    model2, report2 = _evaluated(tmp_path, "r2")
    failed = {"tuned_f1": 0.4, "base_f1": 0.5, "passed": 0.0}
    _evaluate_record(settings, model2, report2, failed, "tuned f1 0.40 below base 0.50")
    by_version = {v.version: v for v in client.search_model_versions("name = 'drawings-lora'")}
    assert sorted(by_version) == ["1", "2"] and by_version["2"].run_id != version.run_id
    second = client.get_model_version("drawings-lora", "2")
    assert second.tags["vlm_lora.gate"] == "failed" and second.tags["vlm_lora.gate.margin"] == "-0.1000"


def test_without_register_model_evaluate_registers_nothing(mlflow_server, tmp_path):
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_server)
    before = [(v.name, v.version) for v in client.search_model_versions()]
    settings = tracking.Settings(mlflow_server, "no-registry").as_param()
    model, report = _evaluated(tmp_path, "r3")
    _evaluate_record(settings, model, report, FIGURES, "passed")
    assert client.search_runs([client.get_experiment_by_name("no-registry").experiment_id])  # recorded ...
    assert [(v.name, v.version) for v in client.search_model_versions()] == before  # ... but not registered
    assert mlflow_registry.register_version(settings, "abc", "evaluate", {}) == ""  # off: no call at all


def test_a_server_gone_before_registering_is_a_named_error_or_one_warning(capsys):
    uri = _closed_port_uri()
    required = tracking.Settings(uri, "e", model_name="m").as_param()
    with pytest.raises(tracking.TrackingError) as err:
        mlflow_registry.register_version(required, "0" * 32, "evaluate", {"vlm_lora.gate": "passed"})
    assert uri in str(err.value) and "cannot be reached" in str(err.value) and "tracking.required: false" in str(
        err.value)  # fmt: skip
    optional = tracking.Settings(uri, "e", required=False, model_name="m").as_param()
    assert mlflow_registry.register_version(optional, "0" * 32, "register", {}) == ""
    lines = [line for line in capsys.readouterr().out.splitlines() if "MLflow" in line]
    assert len(lines) == 1 and "register: WARNING" in lines[0] and "going on without MLflow" in lines[0]
