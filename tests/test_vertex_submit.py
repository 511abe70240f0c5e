"""pipelines.run (Vertex), pipelines.schedule and pipelines.upload against a local recording server.

The real clients (aiplatform over REST, google-cloud-storage, kfp RegistryClient) talk to
`tests/vertex_fake.py` on 127.0.0.1; the recorded request bodies are asserted. No network.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from google.auth.credentials import AnonymousCredentials

from pipelines.config import load_config
from pipelines.local_run import RunError
from pipelines.pipeline import CHAMPION_TASK, SNAPSHOT_TASK, TASK_ORDER, pipeline_arguments
from pipelines.submit import submit_vertex
from pipelines.vertex import VertexError
from tests.pipeline_spec import container_tasks
from tests.vertex_fake import PROJECT_NUMBER, FakeServer

SEED = Path(__file__).resolve().parent.parent / "configs" / "qwen3_vl_4b" / "lora_seed.yaml"
PARENT = "projects/test-project/locations/us-central1"


def write_config(tmp_path: Path, **sections) -> Path:
    """Writes the seed config with test project/buckets and the given section overrides."""
    raw = yaml.safe_load(SEED.read_text())
    raw["pipeline"]["root"] = "gs://test-bucket/root"
    raw["model"]["cache"] = "gs://test-bucket/models"
    raw["data"]["train"] = "gs://test-bucket/data/train.jsonl"
    raw["vertex"] = {
        **raw.get("vertex", {}),
        "project": "test-project",
        "region": "us-central1",
        "service_account": "vlm-lora@test-project.iam.gserviceaccount.com",
        "experiment": "vlm-lora-exp",
        "labels": {"team": "vision"},
    }
    raw["images"] = {  # the default registry holds YOUR_PROJECT, which submit refuses
        "light": "us-docker.pkg.dev/test-project/vlm-lora/light:0.1.0",
        "train": "us-docker.pkg.dev/test-project/vlm-lora/train:0.1.0",
    }
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    path = tmp_path / "cfg.yaml"
    path.write_text("# test config\n" + yaml.safe_dump(raw))
    return path


@pytest.fixture
def api(monkeypatch):
    from google.cloud.aiplatform import initializer
    from google.cloud.aiplatform.utils import resource_manager_utils

    with FakeServer(buckets={"test-bucket"}) as fake:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake.url)
        # aiplatform checks the bucket's owner through Resource Manager (a separate API).
        monkeypatch.setattr(resource_manager_utils, "get_project_number", lambda *a, **k: PROJECT_NUMBER)
        fake.resources[f"{PARENT}/metadataStores/default"] = {"name": f"{PARENT}/metadataStores/default"}
        yield fake
    # aiplatform.init is process-global: point later tests back at the defaults
    initializer.global_config._api_endpoint = None
    initializer.global_config._api_transport = None


def _submit(cfg_path: Path, fake, **kwargs):
    out = io.StringIO()
    result = submit_vertex(
        load_config(cfg_path), credentials=AnonymousCredentials(), api_endpoint=fake.url, poll_s=0, out=out, **kwargs
    )
    return result, out.getvalue()


# --- pipelines.run ------------------------------------------------------------------


def test_run_submits_the_pipeline_job_with_config_values(api, tmp_path):
    cfg_path = write_config(tmp_path)
    result, printed = _submit(cfg_path, api)
    [create] = api.calls("POST", f"{PARENT}/pipelineJobs")
    body = create.body
    assert body["displayName"] == "qwen3-vl-4b-lora-seed"
    assert body["serviceAccount"] == "vlm-lora@test-project.iam.gserviceaccount.com"
    assert body["labels"] == {"team": "vision", "pipeline": "qwen3-vl-4b-lora-seed", "config": "cfg"}
    spec = body["pipelineSpec"]
    assert spec["pipelineInfo"]["name"] == "qwen3-vl-4b-lora-seed"
    found = container_tasks(spec)
    assert set(TASK_ORDER) <= set(found)
    runtime = body["runtimeConfig"]
    assert runtime["gcsOutputDirectory"] == "gs://test-bucket/root"
    values = runtime["parameterValues"]
    expected = pipeline_arguments(load_config(cfg_path))
    assert values["model_source"] == expected["model_source"] == "hf://Qwen/Qwen3-VL-4B-Instruct"
    assert values["data_train"] == "gs://test-bucket/data/train.jsonl"
    assert values["swift_args"]["lora_rank"] == 8
    # caching on: every task caches except the two look-ups whose answer changes between runs:
    # the data snapshot (new files behind the same prefix) and the registry's champion
    assert all(found[name].caches for name in TASK_ORDER if name != SNAPSHOT_TASK)
    assert not found[SNAPSHOT_TASK].caches and not found[CHAMPION_TASK].caches
    # the experiment was looked up / created before the job
    assert api.calls("POST", f"{PARENT}/metadataStores/default/contexts")[0].query["contextId"] == ["vlm-lora-exp"]
    [link] = api.calls("POST", "contexts/vlm-lora-exp:addContextChildren")  # run joins the experiment
    assert link.body["childContexts"] == [
        f"{PARENT}/metadataStores/default/contexts/{result['name'].rsplit('/', 1)[1]}"
    ]
    assert result["name"].startswith(f"{PARENT}/pipelineJobs/qwen3-vl-4b-lora-seed-")
    assert "console.cloud.google.com/vertex-ai/locations/us-central1/pipelines/runs/" in printed
    assert result["link"] in printed


def test_run_no_cache_switch_reaches_the_request(api, tmp_path):
    _submit(write_config(tmp_path), api, enable_caching=False)
    [create] = api.calls("POST", f"{PARENT}/pipelineJobs")
    assert not any(t.caches for t in container_tasks(create.body["pipelineSpec"]).values())


def test_run_wait_streams_states_until_success(api, tmp_path):
    api.job_states[:] = ["PIPELINE_STATE_RUNNING", "PIPELINE_STATE_RUNNING", "PIPELINE_STATE_SUCCEEDED"]
    result, printed = _submit(write_config(tmp_path, vertex={"experiment": ""}), api, wait=True)
    assert result["state"] == "PIPELINE_STATE_SUCCEEDED"
    assert "PIPELINE_STATE_RUNNING" in printed and printed.rstrip().endswith("PIPELINE_STATE_SUCCEEDED")


def test_run_wait_reports_failure(api, tmp_path):
    api.job_states[:] = ["PIPELINE_STATE_FAILED"]
    with pytest.raises(RunError, match="PIPELINE_STATE_FAILED"):
        _submit(write_config(tmp_path, vertex={"experiment": ""}), api, wait=True)


def test_missing_bucket_stops_before_anything_is_created(api, tmp_path):
    cfg_path = write_config(tmp_path, pipeline={"root": "gs://no-such-bucket/root"})
    with pytest.raises(VertexError, match="pipeline.root: bucket gs://no-such-bucket does not exist"):
        _submit(cfg_path, api)
    assert not [r for r in api.requests if r.method in ("POST", "DELETE")]


@pytest.mark.parametrize("project", ["", "YOUR_PROJECT"])
def test_missing_project_stops_before_any_request(api, tmp_path, project):
    cfg_path = write_config(tmp_path, vertex={"project": project})
    with pytest.raises(VertexError, match="vertex.project is not set"):
        _submit(cfg_path, api)
    assert api.requests == []


def test_local_root_is_refused_for_vertex(api, tmp_path):
    with pytest.raises(VertexError, match="must be gs://"):
        _submit(write_config(tmp_path, pipeline={"root": "runs"}), api)
    assert api.requests == []


@pytest.mark.parametrize(
    ("sections", "key"),
    [
        ({"vertex": {"service_account": "sa@YOUR_PROJECT.iam.gserviceaccount.com"}}, "vertex.service_account"),
        ({"images": {"light": ""}}, "images.light"),  # the default light image's registry
        ({"images": {"train": "", "light": "x/light:1"}}, "images.train"),
        ({"register": {"serving_image": "us-docker.pkg.dev/YOUR_PROJECT/serve:1"}}, "register.serving_image"),
        ({"data": {"eval": "gs://YOUR_BUCKET/eval.jsonl"}}, "data.eval"),
        ({"register": {"serving_env": {"BUCKET": "gs://YOUR_BUCKET/x"}}}, "register.serving_env.BUCKET"),
    ],
)
def test_placeholders_anywhere_in_what_a_run_sends_stop_it_before_any_request(api, tmp_path, sections, key):
    with pytest.raises(VertexError, match=rf"{key.replace('.', '[.]')} still holds the placeholder"):
        _submit(write_config(tmp_path, **sections), api)
    assert api.requests == []


def test_run_cli_names_missing_project(tmp_path, capsys):
    from pipelines.run import main

    assert main(["--config", str(SEED)]) == 2
    err = capsys.readouterr().err
    assert "vertex.project is not set" in err and "Traceback" not in err


def test_missing_credentials_are_one_line_with_the_fix(tmp_path, monkeypatch, capsys):
    """No ADC: each entry point prints what is missing and how to fix it, no traceback."""
    from pipelines import schedule, upload
    from pipelines.run import main as run_main

    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing-key.json"))
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    cfg = str(write_config(tmp_path, vertex={"template_repo": "https://us-central1-kfp.pkg.dev/test-project/r"}))
    for main, argv in (
        (run_main, ["--config", cfg]),
        (schedule.main, ["create", "--config", cfg]),
        (upload.main, ["--config", cfg]),
    ):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert err.startswith("error: no Google Cloud credentials found: run `gcloud auth application-default login`")
        assert err.count("\n") == 1 and "Traceback" not in err and "\x1b[" not in err


def test_google_api_errors_read_as_one_line():
    from google.api_core import exceptions

    from pipelines.vertex import google_error_message, strip_ansi

    assert google_error_message(exceptions.Forbidden("\x1b[31mcaller lacks permission\x1b[0m")).startswith(
        "permission denied: 403 caller lacks permission; the account needs roles/aiplatform.user"
    )
    assert "try again" in google_error_message(exceptions.ServiceUnavailable("down"))
    assert google_error_message(ValueError("x")) is None
    assert strip_ansi("\x1b[1;31merror\x1b[0m") == "error"
