"""Vertex deploy: the real aiplatform client (REST) against the local recording server.

Asserted: the endpoint create / look-up, deployModel (machine, GPU, replicas, traffic split),
the smoke test through `:rawPredict`, and undeployModel of the previous champion only after
the new one answers; a failing smoke test undeploys the new model and leaves traffic as it was.
"""

from __future__ import annotations

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud.aiplatform_v1.types import AcceleratorType

from components.deploy.core import (
    DeployError,
    DeployPlan,
    EndpointLocationError,
    SmokeTestError,
    check_plan,
    deploy_to_vertex,
    vertex_raw_predict_ask,
)
from components.register.core import build_upload_request, register_model
from pipelines.vertex import init_vertex
from tests.test_vertex_submit import PARENT, api  # noqa: F401 (fixture)

CRED = AnonymousCredentials()
ROWS = [{"messages": [{"role": "user", "content": "<image>Detect the holes."}], "images": []}]
PLAN = DeployPlan(
    endpoint="qwen-drawings",
    machine_type="g2-standard-12",
    accelerator_type="NVIDIA_L4",
    accelerator_count=1,
    min_replicas=1,
    max_replicas=2,
)


def _register(run: str) -> str:
    req = build_upload_request(f"gs://test-bucket/root/{run}/merged", "qwen-drawings", "", "img:1", run, {})
    reg = register_model(req, "test-project", "us-central1", CRED)
    return f"{reg.resource_name}@{reg.version_id}"


def _deploy(api, model: str, plan: DeployPlan = PLAN):
    return deploy_to_vertex(
        model,
        plan,
        "test-project",
        "us-central1",
        ROWS,
        "detection",
        credentials=CRED,
        ask_for=lambda name: vertex_raw_predict_ask(name, location="us-central1", credentials=CRED, api_base=api.url),
    )


def _deploy_body(call) -> dict:
    return call.body["deployedModel"]


def test_first_deploy_creates_the_endpoint_and_takes_all_traffic(api):
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    model = _register("run-1")
    out = _deploy(api, model)
    [create] = api.calls("POST", "/endpoints")[:1]
    assert create.path == f"/v1/{PARENT}/endpoints" and create.body["displayName"] == "qwen-drawings"
    [deploy] = api.calls("POST", ":deployModel")
    dm = _deploy_body(deploy)
    assert dm["model"].replace("%40", "@") == model  # the registered version, by version ID
    resources = dm["dedicatedResources"]
    spec = dict(resources["machineSpec"])
    spec["acceleratorType"] = AcceleratorType(spec["acceleratorType"]).name  # the REST transport sends the number
    assert spec == {"machineType": "g2-standard-12", "acceleratorType": "NVIDIA_L4", "acceleratorCount": 1}
    assert (resources["minReplicaCount"], resources["maxReplicaCount"]) == (1, 2)
    assert deploy.body["trafficSplit"] == {"0": 100}
    [smoke] = api.calls("POST", ":rawPredict")
    assert smoke.path == f"/v1/{out.endpoint}:rawPredict"
    assert smoke.body["model"] == "tuned" and smoke.body["messages"][0]["content"] == [
        {"type": "text", "text": "Detect the holes."}
    ]
    assert out.created_endpoint and out.undeployed == [] and out.traffic_split == {out.deployed_model_id: 100}
    assert api.calls("POST", ":undeployModel") == []


def test_second_deploy_retires_the_champion_only_after_the_smoke_test(api):
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    first = _deploy(api, _register("run-1"))
    api.requests.clear()
    second = _deploy(api, _register("run-2"))
    assert second.endpoint == first.endpoint and not second.created_endpoint  # found by display name
    assert [r for r in api.requests if r.method == "POST" and r.path.endswith("/endpoints")] == []
    order = [r.path.rsplit(":", 1)[-1] for r in api.requests if r.method == "POST"]
    assert [o for o in order if o in ("deployModel", "rawPredict", "undeployModel")] == [
        "deployModel",
        "rawPredict",
        "undeployModel",
    ]
    [undeploy] = api.calls("POST", ":undeployModel")
    assert undeploy.body["deployedModelId"] == first.deployed_model_id
    assert undeploy.body["trafficSplit"] == {second.deployed_model_id: 100}
    assert second.undeployed == [first.deployed_model_id]
    assert second.traffic_split == {second.deployed_model_id: 100}


def test_canary_keeps_the_champion_deployed(api):
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    first = _deploy(api, _register("run-1"))
    canary = _deploy(api, _register("run-2"), DeployPlan(**{**PLAN.__dict__, "traffic_percent": 10}))
    [_, deploy] = api.calls("POST", ":deployModel")
    assert deploy.body["trafficSplit"] == {"0": 10, first.deployed_model_id: 90}
    assert canary.undeployed == [] and api.calls("POST", ":undeployModel") == []
    assert canary.traffic_split == {canary.deployed_model_id: 10, first.deployed_model_id: 90}


def test_failing_smoke_test_undeploys_the_new_model_and_leaves_traffic(api):
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    first = _deploy(api, _register("run-1"))
    api.raw_answers[:] = ["I cannot see any holes, sorry."]
    with pytest.raises(SmokeTestError, match=r"does not parse for task 'detection'.*raw answer: 'I cannot see any"):
        _deploy(api, _register("run-2"))
    [_, deploy] = api.calls("POST", ":deployModel")
    [undeploy] = api.calls("POST", ":undeployModel")
    assert undeploy.body["deployedModelId"] != first.deployed_model_id
    assert undeploy.body["trafficSplit"] == {first.deployed_model_id: 100}
    endpoint = api.resources[first.endpoint]
    assert endpoint["trafficSplit"] == {first.deployed_model_id: 100}
    assert [m["id"] for m in endpoint["deployedModels"]] == [first.deployed_model_id]


def test_endpoint_in_another_project_or_region_is_refused_before_deploying(api):
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    model = _register("run-1")
    api.requests.clear()
    for other in (
        "projects/other-project/locations/us-central1/endpoints/123",
        "projects/test-project/locations/europe-west4/endpoints/123",
    ):
        with pytest.raises(EndpointLocationError, match="use an endpoint of this project and region"):
            _deploy(api, model, DeployPlan(**{**PLAN.__dict__, "endpoint": other}))
    assert api.requests == []  # nothing was asked, nothing deployed


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"endpoint": ""}, "deploy.endpoint is empty"),
        ({"endpoint": "projects/p/endpoints/1"}, "is not projects/P/locations/R/endpoints/ID"),
        ({"machine_type": ""}, "machine_type is empty"),
        ({"traffic_percent": 0}, "traffic_percent is 0; expected 1..100"),
        ({"min_replicas": 3}, r"min \(3\) <= max \(2\)"),
        ({"accelerator_count": 0}, "go together"),
    ],
)
def test_bad_plans_are_named(change, message):
    with pytest.raises(DeployError, match=message):
        check_plan(DeployPlan(**{**PLAN.__dict__, **change}), "test-project", "us-central1")


def test_component_function_against_the_fake(api, tmp_path, monkeypatch):
    """The KFP wrapper: register's artifact in, the deployment's metadata out, a failure as a clean exit."""
    import json

    from kfp import dsl

    from components.deploy import core
    from components.deploy import deploy as component

    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    real_ask = core.vertex_raw_predict_ask
    monkeypatch.setattr(
        core,
        "vertex_raw_predict_ask",
        lambda name, **kw: real_ask(name, **{**kw, "credentials": CRED, "api_base": api.url}),
    )
    (tmp_path / "data.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    model = _register("run-1")
    registered = dsl.Artifact(uri="x", metadata={"resourceName": model.split("@")[0], "version_id": "1"})
    out = dsl.Artifact(uri=str(tmp_path / "out"))
    args = dict(
        registered_model=registered,
        eval_dataset=dsl.Dataset(uri=str(tmp_path)),
        endpoint="qwen-drawings",
        machine_type="g2-standard-12",
        task="detection",
        deployment=out,
        project="test-project",
        location="us-central1",
    )
    component.python_func(**args)
    assert out.metadata["traffic_split"] == {out.metadata["deployed_model_id"]: 100}
    assert out.uri.endswith(out.metadata["resourceName"])
    api.raw_answers[:] = ["no"]
    with pytest.raises(SystemExit, match="^deploy: SmokeTestError: smoke-test answer 0 does not parse"):
        component.python_func(**{**args, "deployment": dsl.Artifact(uri="y")})
    with pytest.raises(SystemExit, match="^deploy: EndpointLocationError"):
        component.python_func(**{**args, "endpoint": "projects/p/locations/europe-west4/endpoints/1"})
