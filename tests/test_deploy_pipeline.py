"""The deploy step in the DAG: register (no alias) → deploy + smoke test → promote, all under the gate.

Compiled-spec checks on the seed config with `deploy.endpoint` set, the config's refusals, and
the three components run in order against the recording server: a failing smoke test leaves
the alias, the default version and the endpoint's traffic on the previous champion.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from google.auth.credentials import AnonymousCredentials
from kfp import dsl

from components import images
from pipelines.compile import compile_pipeline
from pipelines.config import ConfigError, load_config
from pipelines.vertex import init_vertex
from tests.pipeline_spec import source, tasks, upstream
from tests.test_vertex_submit import PARENT, api  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "configs" / "qwen3_vl_4b" / "lora_seed.yaml"
CRED = AnonymousCredentials()
DEPLOY = {"endpoint": "qwen-drawings", "traffic_percent": 100, "smoke_rows": 2}


def _config(tmp_path: Path, deploy: dict | None = None, register: dict | None = None, **sections) -> Path:
    raw = yaml.safe_load(SEED.read_text())
    if deploy is not None:
        raw["deploy"] = deploy
    raw["register"] = {**raw["register"], **(register or {})}
    raw.update(sections)
    path = tmp_path / "deploy.yaml"
    path.write_text("# test config\n" + yaml.safe_dump(raw))
    return path


def _compiled(path: Path, tmp_path: Path) -> dict:
    return yaml.safe_load(compile_pipeline(str(path), str(tmp_path / "p.yaml")).read_text())


def _const(index, task: str, name: str):
    return index[task].spec["inputs"]["parameters"][name]["runtimeValue"]["constant"]


def test_deploy_and_promote_sit_under_the_gate_after_register(tmp_path):
    index = tasks(_compiled(_config(tmp_path, DEPLOY), tmp_path))
    for name in ("register", "deploy", "promote"):
        assert index[name].group_names[-1] == "gate-passed", name
    assert _const(index, "register", "promote") is False  # the alias waits for the smoke test
    assert "register" in upstream(index, "deploy") and "deploy" in upstream(index, "promote")
    assert str(source(index, "deploy", "registered_model", artifact=True)) == "register.registered_model"
    assert str(source(index, "deploy", "eval_dataset", artifact=True)) == "validate-data.eval_dataset"
    assert str(source(index, "promote", "deployment", artifact=True)) == "deploy.deployment"
    assert str(source(index, "promote", "registered_model", artifact=True)) == "register.registered_model"
    # the champion is checked again before traffic moves and when the alias moves (another run may have promoted)
    for task in ("deploy", "promote"):
        assert _const(index, task, "check_champion") is True
        assert str(source(index, task, "champion_version")) == "find-champion.version_id"
    assert _const(index, "deploy", "alias") == "champion"
    assert not index["deploy"].caches and not index["promote"].caches
    settings = _const(index, "deploy", "settings")
    assert settings["endpoint"] == "qwen-drawings"
    assert (settings["machine_type"], settings["accelerator_type"]) == ("g2-standard-12", "NVIDIA_L4")
    assert _const(index, "deploy", "task") == "detection" and settings["smoke_rows"] == 2
    container = _const(index, "register", "serving_container")
    assert container["command"] == [] and container["port"] == 8080  # [] = the project's entry point
    assert _const(index, "register", "serving_image").endswith(f"/train:{images.TAG}")  # serving_image: train


def test_the_deploy_task_gets_the_config_section_itself_and_the_core_reads_it(api, tmp_path, monkeypatch):
    """No copy on the way: the compiled task holds the section's fields under their YAML names, and the
    deploy the component runs from that value uses the config's machine, replicas, rows and model name."""
    from components.deploy import core as deploy_core
    from components.deploy import deploy
    from components.deploy.settings import DeploySettings

    section = {**DEPLOY, "min_replicas": 1, "max_replicas": 3, "served_model_name": "drawings", "timeout_s": 900}
    cfg_path = _config(tmp_path, section)
    cfg = load_config(cfg_path)
    settings = _const(tasks(_compiled(cfg_path, tmp_path)), "deploy", "settings")
    assert settings == dataclasses.asdict(cfg.deploy) and DeploySettings.from_dict(settings) == cfg.deploy

    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    real_ask = deploy_core.vertex_invoke_ask
    monkeypatch.setattr(
        deploy_core,
        "vertex_invoke_ask",
        lambda name, dm, **kw: real_ask(name, dm, **{**kw, "credentials": CRED, "api_base": api.url}),
    )
    row = {"messages": [{"role": "user", "content": "Detect the holes."}], "images": []}
    (tmp_path / "data.jsonl").write_text((json.dumps(row) + "\n") * 3)
    reg = _register_run(_components()[3], tmp_path, "run-1", promote=False, champion=None)
    dep = dsl.Artifact(uri=str(tmp_path / "dep"))
    deploy.python_func(
        registered_model=reg,
        eval_dataset=dsl.Dataset(uri=str(tmp_path)),
        settings=settings,
        task="detection",
        deployment=dep,
        project="test-project",
        location="us-central1",
    )
    [call] = api.calls("POST", ":deployModel")
    resources = call.body["deployedModel"]["dedicatedResources"]
    assert resources["machineSpec"]["machineType"] == cfg.deploy.machine_type
    assert (resources["minReplicaCount"], resources["maxReplicaCount"]) == (1, 3)
    smoke = [r for r in api.requests if "/invoke/" in r.path]
    assert len(smoke) == cfg.deploy.smoke_rows == 2 and {r.body["model"] for r in smoke} == {"drawings"}


def test_without_an_endpoint_register_promotes_and_there_is_no_deploy(tmp_path):
    index = tasks(_compiled(SEED, tmp_path))
    assert "deploy" not in index and "promote" not in index
    assert _const(index, "register", "promote") is True


@pytest.mark.parametrize(
    ("deploy", "register", "message"),
    [
        ({"endpoint": "e"}, {"serving_image": ""}, "only a registered model can be deployed"),
        (
            {"endpoint": "projects/test-project/locations/europe-west4/endpoints/1"},
            {},
            "a model is served only in its own region",
        ),
        ({"endpoint": "projects/p/endpoints/1"}, {}, "display name or projects/P/locations/R/endpoints/ID"),
        ({"endpoint": "e", "traffic_percent": 0}, {}, "'deploy.traffic_percent' must be 1..100"),
        ({"endpoint": "e", "min_replicas": 2, "max_replicas": 1}, {}, "'deploy.max_replicas' must be at least"),
        ({"endpoint": "e", "accelerator_count": 0}, {}, "go together"),
        (
            {"endpoint": "e", "machine_type": "g2-standard-12", "accelerator_type": "NVIDIA_H100_80GB"},
            {},
            "comes with exactly 1 x NVIDIA_L4",
        ),
        ({"endpoint": "e", "unknown": 1}, {}, "unknown key 'deploy.unknown'"),
        ({}, {"serving_env": {"HF_TOKEN": "x"}}, "looks like a secret"),
        ({}, {"serving_env": {"1BAD": "x"}}, "not an environment variable name"),
        ({}, {"predict_route": "v1/chat"}, "'register.predict_route' must be a route starting with '/'"),
    ],
)
def test_bad_deploy_and_serving_settings_are_refused_at_load(tmp_path, deploy, register, message):
    with pytest.raises(ConfigError, match=message) as err:
        load_config(_config(tmp_path, deploy, register))
    assert str(err.value).startswith(str(tmp_path / "deploy.yaml") + ":")  # file and line


def _components():
    from components.deploy import core as deploy_core
    from components.deploy import deploy
    from components.register import promote, register

    return deploy_core, deploy, promote, register


def _register_run(register, tmp_path: Path, run: str, *, promote: bool, champion: str | None):
    merged = dsl.Model(uri=f"gs://test-bucket/root/{run}/merged", metadata={"data_snapshot": "abc"})
    metrics = dsl.Metrics(uri=str(tmp_path / f"{run}-metrics"))
    metrics.metadata.update({"tuned_f1": 0.5, "passed": True})
    out = dsl.Artifact(uri=str(tmp_path / f"{run}-reg"))
    register.python_func(
        merged_model=merged,
        eval_metrics=metrics,
        model_id="qwen-drawings",
        display_name="qwen-drawings",
        serving_image="img:1",
        alias="champion",
        labels={},
        run_name=run,
        serving_container={},
        registered_model=out,
        project="test-project",
        location="us-central1",
        check_champion=champion is not None,
        champion_version=champion or "",
        promote=promote,
    )
    return out


def test_a_failing_smoke_test_leaves_alias_default_and_traffic_on_the_champion(api, tmp_path, monkeypatch):
    """register → deploy → promote as the DAG runs them; deploy fails, so promote never runs."""
    deploy_core, deploy, promote, register = _components()
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    real_ask = deploy_core.vertex_invoke_ask
    monkeypatch.setattr(
        deploy_core,
        "vertex_invoke_ask",
        lambda name, dm, **kw: real_ask(name, dm, **{**kw, "credentials": CRED, "api_base": api.url}),
    )
    (tmp_path / "data.jsonl").write_text(
        json.dumps({"messages": [{"role": "user", "content": "Detect the holes."}], "images": []}) + "\n"
    )
    parent = f"{PARENT}/models/qwen-drawings"
    deploy_args = dict(
        eval_dataset=dsl.Dataset(uri=str(tmp_path)),
        settings={"endpoint": "qwen-drawings", "machine_type": "g2-standard-12"},
        task="detection",
        project="test-project",
        location="us-central1",
    )

    def run(name: str, champion: str | None, between=None):
        reg = _register_run(register, tmp_path, name, promote=False, champion=champion)
        if between is not None:
            between()  # what another run does while this one deploys
        dep = dsl.Artifact(uri=str(tmp_path / f"{name}-dep"))
        check = {"alias": "champion", "check_champion": champion is not None, "champion_version": champion or ""}
        deploy.python_func(registered_model=reg, deployment=dep, **deploy_args, **check)
        out = dsl.Artifact(uri=str(tmp_path / f"{name}-promoted"))
        promote.python_func(
            registered_model=reg,
            deployment=dep,
            alias="champion",
            promoted_model=out,
            project="test-project",
            location="us-central1",
            check_champion=champion is not None,
            champion_version=champion or "",
        )
        return reg, dep, out

    reg1, dep1, out1 = run("run-1", champion="")  # the first champion: passes, deployed, promoted
    assert out1.metadata["aliases"] == ["champion", "default"]
    assert api.resources[f"{parent}@champion"]["versionId"] == "1"
    first_id = dep1.metadata["deployed_model_id"]
    endpoint = dep1.metadata["resourceName"]

    api.raw_answers[:] = ["Sorry, I cannot help with drawings."]
    with pytest.raises(SystemExit, match="^deploy: SmokeTestError: .*raw answer: 'Sorry, I cannot help"):
        run("run-2", champion="1")
    assert api.resources[f"{parent}@2"]["versionAliases"] == []  # registered, never promoted
    assert api.resources[f"{parent}@champion"]["versionId"] == "1"
    assert api.resources[f"{parent}@default"]["versionId"] == "1"
    assert api.resources[endpoint]["trafficSplit"] == {first_id: 100}
    assert [m["id"] for m in api.resources[endpoint]["deployedModels"]] == [first_id]
    assert api.calls("POST", ":mergeVersionAliases")[1:] == []  # only run-1's promotion

    api.raw_answers[:] = ['[{"label": "hole", "bbox": [1, 2, 3, 4]}]']
    _, dep3, out3 = run("run-3", champion="1")  # the next good model takes over
    assert api.resources[f"{parent}@champion"]["versionId"] == "3"
    assert api.resources[endpoint]["trafficSplit"] == {dep3.metadata["deployed_model_id"]: 100}
    assert dep3.metadata["undeployed"] == [first_id]
    assert out3.metadata["endpoint"] == endpoint


def test_registry_outputs_are_vertex_models_and_read_only_light_tasks_retry(tmp_path):
    """The console links register's output to the Model Registry (google.VertexModel); a transient
    failure of a task that only reads is retried with backoff; tasks that change state are not."""
    raw = _compiled(_config(tmp_path, DEPLOY), tmp_path)
    comps = raw["components"]

    def out_type(comp: str, name: str) -> str:
        return comps[comp]["outputDefinitions"]["artifacts"][name]["artifactType"]["schemaTitle"]

    assert out_type("comp-register", "registered_model") == "google.VertexModel"
    assert out_type("comp-deploy", "deployment") == "google.VertexEndpoint"
    assert out_type("comp-promote", "promoted_model") == "google.VertexModel"
    index = tasks(raw)
    for name in ("snapshot-data", "stage-model", "validate-data", "find-champion"):
        policy = index[name].spec.get("retryPolicy")
        assert policy and policy["maxRetryCount"] == 2, name
        assert policy["backoffDuration"] == "60s" and policy["backoffFactor"] == 2.0, name
        assert policy["backoffMaxDuration"] == "600s", name
    for name in ("register", "deploy", "promote"):
        assert "retryPolicy" not in index[name].spec, name


def test_a_champion_promoted_meanwhile_stops_the_deploy_before_traffic_moves(api, tmp_path, monkeypatch):
    """Another run promotes version 3 while this one deploys: the new model passed its smoke test but
    gets no traffic, is undeployed, and the run fails before promote."""
    deploy_core, deploy, promote, register = _components()
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    real_ask = deploy_core.vertex_invoke_ask
    monkeypatch.setattr(
        deploy_core,
        "vertex_invoke_ask",
        lambda name, dm, **kw: real_ask(name, dm, **{**kw, "credentials": CRED, "api_base": api.url}),
    )
    (tmp_path / "data.jsonl").write_text(
        json.dumps({"messages": [{"role": "user", "content": "Detect the holes."}], "images": []}) + "\n"
    )
    parent = f"{PARENT}/models/qwen-drawings"
    args = dict(
        eval_dataset=dsl.Dataset(uri=str(tmp_path)),
        settings={"endpoint": "qwen-drawings", "machine_type": "g2-standard-12"},
        task="detection",
        project="test-project",
        location="us-central1",
        alias="champion",
    )
    first = _register_run(register, tmp_path, "run-1", promote=True, champion="")
    dep1 = dsl.Artifact(uri=str(tmp_path / "dep1"))
    deploy.python_func(registered_model=first, deployment=dep1, **args)
    first_id, endpoint = dep1.metadata["deployed_model_id"], dep1.metadata["resourceName"]
    mine = _register_run(register, tmp_path, "run-2", promote=False, champion="1")
    _register_run(register, tmp_path, "run-3", promote=True, champion="1")  # another run promotes version 3
    with pytest.raises(SystemExit, match="^deploy: ChampionChanged: .*now points at version 3.*not given traffic"):
        deploy.python_func(
            registered_model=mine,
            deployment=dsl.Artifact(uri=str(tmp_path / "dep2")),
            **args,
            check_champion=True,
            champion_version="1",
        )
    assert api.resources[endpoint]["trafficSplit"] == {first_id: 100}
    assert [m["id"] for m in api.resources[endpoint]["deployedModels"]] == [first_id]
    assert api.resources[f"{parent}@champion"]["versionId"] == "3"
