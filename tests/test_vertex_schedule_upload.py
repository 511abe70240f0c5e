"""pipelines.schedule, pipelines.upload and the register core against the local recording server."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from google.auth.credentials import AnonymousCredentials
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2
from kfp.registry import ApiAuth

from components.register.core import RegisterError, build_upload_request, label_value, register_model
from pipelines.config import load_config
from pipelines.pipeline import SNAPSHOT_TASK
from pipelines.schedule import change_schedule, create_schedule, list_schedules, schedule_cron
from pipelines.upload import default_tags, upload_template
from pipelines.vertex import VertexError, init_vertex
from tests.pipeline_spec import container_tasks, source, tasks
from tests.test_vertex_submit import PARENT, api, write_config  # noqa: F401 (fixture)

CRED = AnonymousCredentials()


def test_schedule_create_sends_cron_time_zone_and_the_job(api, tmp_path):
    cfg = load_config(
        write_config(
            tmp_path,
            schedule={
                "cron": "30 2 * * 1-5",
                "time_zone": "Europe/Berlin",
                "max_concurrent_runs": 2,
                "start_time": "2026-01-01T00:00:00Z",
                "end_time": "2026-12-31T00:00:00Z",
            },
        )
    )
    schedule = create_schedule(cfg, credentials=CRED, api_endpoint=api.url)
    [create] = api.calls("POST", f"{PARENT}/schedules")
    body = create.body
    assert body["cron"] == "TZ=Europe/Berlin 30 2 * * 1-5"
    assert body["maxConcurrentRunCount"] == "2"
    assert body["startTime"] == "2026-01-01T00:00:00Z" and body["endTime"] == "2026-12-31T00:00:00Z"
    job = body["createPipelineJobRequest"]
    assert job["parent"] == PARENT
    assert job["pipelineJob"]["serviceAccount"] == "vlm-lora@test-project.iam.gserviceaccount.com"
    assert job["pipelineJob"]["labels"]["team"] == "vision"
    assert job["pipelineJob"]["pipelineSpec"]["pipelineInfo"]["name"] == "qwen3-vl-4b-lora-seed"
    assert job["pipelineJob"]["runtimeConfig"]["parameterValues"]["data_train"] == "gs://test-bucket/data/train.jsonl"
    assert schedule.resource_name.startswith(f"{PARENT}/schedules/")


@pytest.mark.parametrize(
    "train", ["gs://test-bucket/drawings/", "gs://test-bucket/drawings/2026-*/part-*.jsonl"], ids=["prefix", "glob"]
)
def test_schedule_create_with_a_prefix_or_glob_source_snapshots_the_data_each_run(api, tmp_path, train):
    """The schedule keeps the source as written; each run's uncached snapshot-data resolves it anew."""
    cfg = load_config(write_config(tmp_path, data={"train": train}))
    create_schedule(cfg, credentials=CRED, api_endpoint=api.url)
    [create] = api.calls("POST", f"{PARENT}/schedules")
    job = create.body["createPipelineJobRequest"]["pipelineJob"]
    assert job["runtimeConfig"]["parameterValues"]["data_train"] == train
    spec = job["pipelineSpec"]
    assert spec["root"]["inputDefinitions"]["parameters"]["data_train"]["defaultValue"] == train
    found = container_tasks(spec)
    snapshot = found[SNAPSHOT_TASK]
    assert snapshot.groups == () and not snapshot.caches  # caching off: new objects under the prefix are seen
    index = tasks(spec)
    assert str(source(index, SNAPSHOT_TASK, "train_sources")) == "pipeline parameter data_train"
    # validate-data reads the snapshot (a parameter: its cache key is the data's content), not the source
    assert str(source(index, "validate-data", "snapshot")) == f"{SNAPSHOT_TASK}.snapshot"
    assert all(
        "data_train" not in str(source(index, "validate-data", k))
        for k in found["validate-data"].spec["inputs"]["parameters"]
    )
    # the other tasks still cache: an unchanged snapshot is a cache hit
    assert all(
        found[name].caches for name in ("stage-model", "validate-data", "train-lora", "merge-export", "evaluate")
    )


def test_schedule_list_pause_resume_delete(api, tmp_path):
    cfg = load_config(write_config(tmp_path))
    name = create_schedule(cfg, credentials=CRED, api_endpoint=api.url).resource_name
    assert [s.resource_name for s in list_schedules(cfg, credentials=CRED, api_endpoint=api.url)] == [name]
    schedule_id = name.rsplit("/", 1)[1]
    change_schedule(cfg, "pause", schedule_id, credentials=CRED, api_endpoint=api.url)
    assert api.calls("POST", f"{name}:pause") and api.resources[name]["state"] == "PAUSED"
    change_schedule(cfg, "resume", name, credentials=CRED, api_endpoint=api.url)
    assert api.calls("POST", f"{name}:resume") and api.resources[name]["state"] == "ACTIVE"
    change_schedule(cfg, "delete", schedule_id, credentials=CRED, api_endpoint=api.url)
    assert api.calls("DELETE", name) and name not in api.resources


@pytest.mark.parametrize(
    "cron, zone, fragment",
    [
        ("0 3 * *", "UTC", "must have 5 fields"),
        ("0 25 * * *", "UTC", "hour field"),
        ("0 3 * * 1", "Mars/Olympus", "not an IANA time zone"),
    ],
)
def test_bad_schedule_stops_before_any_request(api, tmp_path, cron, zone, fragment):
    cfg = load_config(write_config(tmp_path))
    cfg = dataclasses.replace(cfg, schedule=dataclasses.replace(cfg.schedule, cron=cron, time_zone=zone))
    with pytest.raises(VertexError, match=fragment):
        create_schedule(cfg, credentials=CRED, api_endpoint=api.url)
    assert api.requests == []


def test_schedule_cron_keeps_utc_plain():
    assert schedule_cron("0 3 * * 1", "UTC") == "0 3 * * 1"


# --- pipelines.upload -----------------------------------------------------------------


def test_upload_posts_the_template_with_tags(api, tmp_path):
    cfg = load_config(write_config(tmp_path))
    repo = f"{api.url}/test-project/vlm-lora-templates"
    package, version = upload_template(cfg, repo, ["latest", "v0-1-0"], auth=ApiAuth("test-token"))
    [post] = api.calls("POST", "/test-project/vlm-lora-templates")
    assert {k.lower(): v for k, v in post.headers.items()}["authorization"] == "Bearer test-token"
    assert b'name="tags"\r\n\r\nlatest,v0-1-0' in post.raw
    assert b'name="content"; filename="qwen3-vl-4b-lora-seed.yaml"' in post.raw
    boundary = post.headers["Content-Type"].split("boundary=")[1].encode()
    [content] = [part for part in post.raw.split(b"--" + boundary) if b'name="content"' in part]
    spec = yaml.safe_load(content.split(b"\r\n\r\n", 1)[1])  # the compiled template itself
    json_format.ParseDict(spec, pipeline_spec_pb2.PipelineSpec())
    assert spec["pipelineInfo"]["name"] == "qwen3-vl-4b-lora-seed"
    assert (
        spec["root"]["inputDefinitions"]["parameters"]["model_source"]["defaultValue"]
        == "hf://Qwen/Qwen3-VL-4B-Instruct"
    )
    pool = spec["components"]["comp-train-lora"]["inputDefinitions"]["parameters"]["worker_pool_specs"]["defaultValue"][
        0
    ]
    assert pool["machine_spec"]["machine_type"] == "a2-highgpu-1g"
    assert package == "qwen3-vl-4b-lora-seed" and version.startswith("sha256:")


def test_upload_defaults_and_errors(tmp_path):
    assert default_tags() == ["latest", "v0-1-0"]
    cfg = load_config(write_config(tmp_path, vertex={"template_repo": ""}))
    with pytest.raises(VertexError, match="vertex.template_repo is not set"):
        upload_template(cfg)
    with pytest.raises(VertexError, match="tag 'bad tag'"):
        upload_template(cfg, "http://127.0.0.1:9/p/r", ["bad tag"])


# --- register (Vertex Model Registry) ----------------------------------------------------

METRICS = {"tuned_f1": 0.8125, "base_f1": 0.5, "passed": 1.0, "tuned_precision": 0.9}


def test_build_upload_request_is_pure_and_complete():
    req = build_upload_request(
        "gs://b/root/merged/",
        "qwen-drawings",
        "Qwen drawings",
        "img:1",
        "Job-Name-123",
        METRICS,
        "champion",
        {"team": "Vision"},
    )
    assert req["artifact_uri"] == "gs://b/root/merged" and req["model_id"] == "qwen-drawings"
    assert req["labels"] == {
        "team": "vision",
        "run_id": "job-name-123",
        "tuned_f1": "0_8125",
        "base_f1": "0_5000",
        "passed": "1_0000",
    }
    assert req["version_aliases"] == ["champion"] and req["is_default_version"] is True
    assert '"tuned_precision": 0.9' in req["version_description"]
    assert label_value("A.B/c" * 30) == label_value("A.B/c" * 30)[:63]
    with pytest.raises(RegisterError, match="not on Cloud Storage"):
        build_upload_request("/local/model", "m", "", "img", "r", {})
    with pytest.raises(RegisterError, match="serving_image"):
        build_upload_request("gs://b/m", "m", "", "", "r", {})


def test_register_creates_the_parent_then_adds_versions(api):
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    req = build_upload_request("gs://test-bucket/merged", "qwen-drawings", "Qwen drawings", "img:1", "run-1", METRICS)
    first = register_model(req, "test-project", "us-central1", CRED)
    [up1] = api.calls("POST", "models:upload")
    assert up1.body["modelId"] == "qwen-drawings" and "parentModel" not in up1.body
    model = up1.body["model"]
    assert model["artifactUri"] == "gs://test-bucket/merged"
    assert model["containerSpec"]["imageUri"] == "img:1"
    assert (
        model["versionAliases"] == ["default", "champion"]
        or model["versionAliases"] == ["champion", "default"]
        or model["versionAliases"] == ["champion"]
    )
    assert model["labels"]["run_id"] == "run-1" and model["labels"]["tuned_f1"] == "0_8125"
    assert first.created_parent and first.resource_name == f"{PARENT}/models/qwen-drawings"
    second = register_model(
        build_upload_request("gs://test-bucket/merged2", "qwen-drawings", "", "img:1", "run-2", METRICS),
        "test-project",
        "us-central1",
        CRED,
    )
    up2 = api.calls("POST", "models:upload")[1]
    assert up2.body["parentModel"] == f"{PARENT}/models/qwen-drawings" and "modelId" not in up2.body
    assert not second.created_parent and second.version_id == "2"
