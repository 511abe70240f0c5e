"""Vertex deploy: the real aiplatform client (REST) against the local recording server.

Asserted: the endpoint create / look-up, deployModel (machine, GPU, replicas; no traffic while
the champion serves), the smoke test through the new deployed model's own `invoke` route, the
traffic split only after it passed, undeployModel of the previous champion only after that; a
failing smoke test undeploys the new model, which never had traffic. Then the registry side:
register without the alias, promote after the deploy, the champion check at promote.
"""

from __future__ import annotations

import dataclasses

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud.aiplatform_v1.types import AcceleratorType

from components.deploy.core import check_settings, deploy_to_vertex, shifted_split, vertex_invoke_ask
from components.deploy.errors import DeployError, EndpointLocationError, SmokeTestError
from components.deploy.settings import DeploySettings
from components.register.core import RegisterError, build_upload_request, promote_version, register_model
from pipelines.vertex import init_vertex
from tests.test_vertex_submit import PARENT, api  # noqa: F401 (fixture)

CRED = AnonymousCredentials()
ROWS = [{"messages": [{"role": "user", "content": "<image>Detect the holes."}], "images": []}]
PLAN = DeploySettings(
    endpoint="qwen-drawings",
    machine_type="g2-standard-12",
    accelerator_type="NVIDIA_L4",
    accelerator_count=1,
    min_replicas=1,
    max_replicas=2,
)


def _register(run: str, promote: bool = True, **container) -> str:
    req = build_upload_request(
        f"gs://test-bucket/root/{run}/merged", "qwen-drawings", "", "img:1", run, {}, promote=promote
    )
    req.update(container)
    reg = register_model(req, "test-project", "us-central1", CRED)
    return f"{reg.resource_name}@{reg.version_id}"


def _deploy(api, model: str, plan: DeploySettings = PLAN):
    return deploy_to_vertex(
        model,
        plan,
        "test-project",
        "us-central1",
        ROWS,
        "detection",
        credentials=CRED,
        ask_for=lambda name, dm: vertex_invoke_ask(
            name, dm, location="us-central1", credentials=CRED, api_base=api.url
        ),
    )


def _deploy_body(call) -> dict:
    return call.body["deployedModel"]


def _verbs(api) -> list[str]:
    """The deploy-relevant calls in order: deployModel, invoke, patch (traffic split), undeployModel."""
    out = []
    for r in api.requests:
        if r.method == "PATCH" and "/endpoints/" in r.path:
            out.append("patch")
        elif r.method == "POST" and "/invoke/" in r.path:
            out.append("invoke")
        elif r.method == "POST" and r.path.rsplit(":", 1)[-1] in ("deployModel", "undeployModel"):
            out.append(r.path.rsplit(":", 1)[-1])
    return out


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
    assert deploy.body["trafficSplit"] == {"0": 100}  # nothing else serves on a new endpoint
    [smoke] = [r for r in api.requests if "/invoke/" in r.path]
    assert smoke.path == f"/v1/{out.endpoint}/deployedModels/{out.deployed_model_id}/invoke/v1/chat/completions"
    assert smoke.body["model"] == "tuned" and smoke.body["messages"][0]["content"] == [
        {"type": "text", "text": "Detect the holes."}
    ]
    assert out.created_endpoint and out.undeployed == [] and out.traffic_split == {out.deployed_model_id: 100}
    assert _verbs(api) == ["deployModel", "invoke"]


def test_second_deploy_gets_traffic_and_retires_the_champion_only_after_the_smoke_test(api):
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    first = _deploy(api, _register("run-1"))
    api.requests.clear()
    second = _deploy(api, _register("run-2"))
    assert second.endpoint == first.endpoint and not second.created_endpoint  # found by display name
    assert [r for r in api.requests if r.method == "POST" and r.path.endswith("/endpoints")] == []
    assert _verbs(api) == ["deployModel", "invoke", "patch", "undeployModel"]
    [deploy] = api.calls("POST", ":deployModel")
    assert deploy.body["trafficSplit"] == {"0": 0, first.deployed_model_id: 100}  # no traffic before the test
    [patch] = [r for r in api.requests if r.method == "PATCH"]
    assert patch.body["trafficSplit"] == {second.deployed_model_id: 100}
    [undeploy] = api.calls("POST", ":undeployModel")
    assert undeploy.body["deployedModelId"] == first.deployed_model_id
    assert second.undeployed == [first.deployed_model_id]
    assert second.traffic_split == {second.deployed_model_id: 100}
    assert [m["id"] for m in api.resources[first.endpoint]["deployedModels"]] == [second.deployed_model_id]


def test_canary_keeps_the_champion_deployed(api):
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    first = _deploy(api, _register("run-1"))
    api.requests.clear()
    canary = _deploy(api, _register("run-2"), dataclasses.replace(PLAN, traffic_percent=10))
    [deploy] = api.calls("POST", ":deployModel")
    assert deploy.body["trafficSplit"] == {"0": 0, first.deployed_model_id: 100}
    assert _verbs(api) == ["deployModel", "invoke", "patch"]
    assert canary.undeployed == []
    assert canary.traffic_split == {canary.deployed_model_id: 10, first.deployed_model_id: 90}


def test_failing_smoke_test_undeploys_the_new_model_which_never_had_traffic(api):
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    first = _deploy(api, _register("run-1"))
    api.requests.clear()
    api.raw_answers[:] = ["I cannot see any holes, sorry."]
    with pytest.raises(SmokeTestError, match=r"does not parse for task 'detection'.*raw answer: 'I cannot see any"):
        _deploy(api, _register("run-2"))
    assert _verbs(api) == ["deployModel", "invoke", "undeployModel"]  # no traffic change at any time
    [deploy] = api.calls("POST", ":deployModel")
    assert deploy.body["trafficSplit"] == {"0": 0, first.deployed_model_id: 100}
    [undeploy] = api.calls("POST", ":undeployModel")
    assert undeploy.body["deployedModelId"] != first.deployed_model_id
    endpoint = api.resources[first.endpoint]
    assert endpoint["trafficSplit"] == {first.deployed_model_id: 100}
    assert [m["id"] for m in endpoint["deployedModels"]] == [first.deployed_model_id]


def test_a_container_without_the_invoke_route_fails_the_smoke_test_and_is_undeployed(api):
    """Vertex reaches a deployed model's routes only when its container spec allows them (register sets "/*")."""
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    first = _deploy(api, _register("run-1"))
    api.requests.clear()
    with pytest.raises(SmokeTestError, match=r"HTTP 400: .*invokeRoutePrefix"):
        _deploy(api, _register("run-2", serving_container_invoke_route_prefix=None))
    assert _verbs(api) == ["deployModel", "invoke", "undeployModel"]
    assert api.resources[first.endpoint]["trafficSplit"] == {first.deployed_model_id: 100}


def test_shifted_split_keeps_the_old_proportions():
    assert shifted_split({}, "new", 10) == {"new": 100}
    assert shifted_split({"a": 100}, "new", 100) == {"new": 100}
    assert shifted_split({"a": 100}, "new", 10) == {"a": 90, "new": 10}
    assert shifted_split({"a": 70, "b": 30}, "new", 10) == {"a": 63, "b": 27, "new": 10}
    split = shifted_split({"a": 50, "b": 25, "c": 25}, "new", 33)
    assert sum(split.values()) == 100 and split["new"] == 33 and split["a"] >= split["b"]
    assert shifted_split({"a": 100, "z": 0}, "new", 20) == {"a": 80, "new": 20}


def test_register_without_alias_then_promote_moves_alias_and_default(api):
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    parent = f"{PARENT}/models/qwen-drawings"
    _register("run-1")  # the champion: version 1
    assert api.resources[f"{parent}@champion"]["versionId"] == "1"
    model = _register("run-2", promote=False)
    [upload] = api.calls("POST", "models:upload")[1:]
    assert upload.body["model"].get("versionAliases", []) == []
    assert api.resources[f"{parent}@champion"]["versionId"] == "1"  # not promoted by register
    container = upload.body["model"]["containerSpec"]
    assert container["command"] == ["python3", "-m", "components.deploy.container"]
    assert container["ports"] == [{"containerPort": 8080}]
    assert (container["predictRoute"], container["healthRoute"]) == ("/v1/chat/completions", "/health")
    assert container["invokeRoutePrefix"] == "/*"
    moved = promote_version(parent, model.split("@")[1], "champion", "test-project", "us-central1", CRED, "1")
    assert moved == ["champion", "default"]
    assert api.resources[f"{parent}@champion"]["versionId"] == "2"
    assert api.resources[f"{parent}@default"]["versionId"] == "2"
    assert "champion" not in api.resources[f"{parent}@1"]["versionAliases"]


def test_promote_refuses_when_the_champion_moved_meanwhile(api):
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    parent = f"{PARENT}/models/qwen-drawings"
    _register("run-1")
    mine = _register("run-2", promote=False)
    _register("run-3")  # another run promoted version 3 while this one deployed
    with pytest.raises(RegisterError, match="evaluate compared with version 1 .* now points at version 3"):
        promote_version(parent, mine.split("@")[1], "champion", "test-project", "us-central1", CRED, "1")
    assert api.resources[f"{parent}@champion"]["versionId"] == "3"
    assert api.calls("POST", ":mergeVersionAliases") == []


def test_endpoint_in_another_project_or_region_is_refused_before_deploying(api):
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    model = _register("run-1")
    api.requests.clear()
    for other in (
        "projects/other-project/locations/us-central1/endpoints/123",
        "projects/test-project/locations/europe-west4/endpoints/123",
    ):
        with pytest.raises(EndpointLocationError, match="use an endpoint of this project and region"):
            _deploy(api, model, dataclasses.replace(PLAN, endpoint=other))
    assert api.requests == []  # nothing was asked, nothing deployed


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"endpoint": ""}, "'deploy.endpoint' is empty"),
        ({"endpoint": "projects/p/endpoints/1"}, "'deploy.endpoint' must be a display name or projects/P/locations/R/"),
        ({"machine_type": ""}, "'deploy.machine_type' must be a Vertex serving machine type"),
        ({"traffic_percent": 0}, r"'deploy.traffic_percent' must be 1..100 \(100 = all traffic\), got 0"),
        ({"min_replicas": 3}, "'deploy.max_replicas' must be at least deploy.min_replicas, got 2"),
        ({"accelerator_count": 0}, "'deploy.accelerator_type' must be set together with deploy.accelerator_count"),
        ({"timeout_s": 0}, "'deploy.timeout_s' must be a positive number of seconds, got 0"),
    ],
)
def test_bad_settings_are_named_before_anything_is_deployed(change, message):
    with pytest.raises(DeployError, match=message) as err:
        check_settings(dataclasses.replace(PLAN, **change), "test-project", "us-central1")
    assert type(err.value) is DeployError  # not the location error: these are the section's own fields


def test_component_function_against_the_fake(api, tmp_path, monkeypatch):
    """The KFP wrapper: register's artifact in, the deployment's metadata out, a failure as a clean exit."""
    import json

    from kfp import dsl

    from components.deploy import core
    from components.deploy import deploy as component

    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    real_ask = core.vertex_invoke_ask
    monkeypatch.setattr(
        core,
        "vertex_invoke_ask",
        lambda name, dm, **kw: real_ask(name, dm, **{**kw, "credentials": CRED, "api_base": api.url}),
    )
    (tmp_path / "data.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    model = _register("run-1")
    registered = dsl.Artifact(uri="x", metadata={"resourceName": model.split("@")[0], "version_id": "1"})
    out = dsl.Artifact(uri=str(tmp_path / "out"))
    args = dict(
        registered_model=registered,
        eval_dataset=dsl.Dataset(uri=str(tmp_path)),
        # whole numbers as doubles, as a JSON struct may carry them
        settings={**dataclasses.asdict(PLAN), "max_replicas": 2.0, "timeout_s": 600.0},
        task="detection",
        deployment=out,
        project="test-project",
        location="us-central1",
    )
    component.python_func(**args)
    assert out.metadata["traffic_split"] == {out.metadata["deployed_model_id"]: 100}
    assert out.uri.endswith(out.metadata["resourceName"])
    [deployed] = api.calls("POST", ":deployModel")
    assert _deploy_body(deployed)["dedicatedResources"]["maxReplicaCount"] == 2
    api.raw_answers[:] = ["no"]
    with pytest.raises(SystemExit, match="^deploy: SmokeTestError: smoke-test answer 0 does not parse"):
        component.python_func(**{**args, "deployment": dsl.Artifact(uri="y")})
    elsewhere = {**args["settings"], "endpoint": "projects/p/locations/europe-west4/endpoints/1"}
    with pytest.raises(SystemExit, match="^deploy: EndpointLocationError"):
        component.python_func(**{**args, "settings": elsewhere})
    with pytest.raises(SystemExit, match="^deploy: DeployError: unknown deploy setting 'deploy.deploy_timeout_s'"):
        component.python_func(**{**args, "settings": {**args["settings"], "deploy_timeout_s": 1}})
