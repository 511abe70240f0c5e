"""`vlm-lora jobs`: list, show, logs, cancel and fetch a config's Vertex runs.

aiplatform (REST) and Cloud Logging talk to the recording server (`tests/vertex_fake.py`);
fetch downloads from gcp-storage-emulator. No network.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from google.auth.credentials import AnonymousCredentials

from pipelines import job_views, jobs
from pipelines.config import load_config
from tests.test_vertex_submit import PARENT, write_config
from tests.vertex_fake import FakeServer

PIPELINE = "qwen3-vl-4b-lora-seed"
JOBS = f"{PARENT}/pipelineJobs"


def artifact(uri: str, schema: str, metadata: dict | None = None) -> dict:
    return {"artifacts": [{"uri": uri, "schemaTitle": schema, "metadata": metadata or {}}]}


def make_job(run_id: str, *, bucket: str = "test-bucket", state: str = "PIPELINE_STATE_RUNNING", **extra) -> dict:
    """A pipeline job in REST form: the root DAG task and five tasks, train-lora through GCPC's launcher."""
    root = f"gs://{bucket}/root/{run_id}"
    gcp_resources = {
        "resources": [{"resourceType": "CustomJob", "resourceUri": f"https://x/v1/{PARENT}/customJobs/333"}]
    }
    tasks = [
        {"taskId": "100", "taskName": PIPELINE, "state": "RUNNING", "startTime": "2026-11-24T10:00:01Z"},
        {
            "taskId": "101",
            "parentTaskId": "100",
            "taskName": "stage-model",
            "state": "SUCCEEDED",
            "startTime": "2026-11-24T10:00:10Z",
            "endTime": "2026-11-24T10:02:40Z",
            "executorDetail": {"containerDetail": {"mainJob": f"{PARENT}/customJobs/111"}},
            "outputs": {"model": artifact(f"gs://{bucket}/models/hf/Qwen/x/abc", "system.Model")},
        },
        {
            "taskId": "102",
            "parentTaskId": "100",
            "taskName": "train-lora",
            "state": "SUCCEEDED",
            "startTime": "2026-11-24T10:03:00Z",
            "endTime": "2026-11-24T11:13:05Z",
            "executorDetail": {"containerDetail": {"mainJob": f"{PARENT}/customJobs/222"}},
            "execution": {"metadata": {"output:gcp_resources": json.dumps(gcp_resources)}},
            "outputs": {
                "adapter": artifact(f"{root}/train-lora/adapter", "system.Model"),
                "metrics": artifact(f"{root}/train-lora/metrics", "system.Metrics", {"train_loss": 0.5}),
            },
        },
        {
            "taskId": "103",
            "parentTaskId": "100",
            "taskName": "merge-export",
            "state": "SUCCEEDED",
            "startTime": "2026-11-24T11:14:00Z",
            "endTime": "2026-11-24T11:20:00Z",
            "executorDetail": {"containerDetail": {"mainJob": f"{PARENT}/customJobs/444"}},
            "outputs": {"merged_model": artifact(f"{root}/merge-export/merged_model", "system.Model")},
        },
        {
            "taskId": "104",
            "parentTaskId": "100",
            "taskName": "evaluate",
            "state": "FAILED",
            "startTime": "2026-11-24T11:21:00Z",
            "endTime": "2026-11-24T11:30:00Z",
            "error": {"message": "evaluate: tuned model returned 3 answers for 4 prompts\nmore"},
            "executorDetail": {"containerDetail": {"mainJob": f"{PARENT}/customJobs/555"}},
            "outputs": {
                "metrics": artifact(f"{root}/evaluate/metrics", "system.Metrics", {"tuned_f1": 0.8}),
                "report": artifact(f"{root}/evaluate/report", "system.HTML"),
                "predictions": artifact(f"{root}/evaluate/predictions", "system.Dataset"),
            },
        },
        {
            "taskId": "105",
            "parentTaskId": "100",
            "taskName": "validate-data",
            "state": "SUCCEEDED",
            "startTime": "2026-11-24T10:00:20Z",
            "endTime": "2026-11-24T10:01:20Z",
            "executorDetail": {"containerDetail": {"mainJob": f"{PARENT}/customJobs/666"}},
            "outputs": {"train_dataset": artifact(f"{root}/validate-data/train_dataset", "system.Dataset")},
        },
        {"taskId": "106", "parentTaskId": "100", "taskName": "register", "state": "PENDING"},
    ]
    return {
        "name": f"{JOBS}/{run_id}",
        "displayName": PIPELINE,
        "state": state,
        "createTime": "2026-11-24T10:00:00Z",
        "startTime": "2026-11-24T10:00:01Z",
        "labels": {"pipeline": PIPELINE, "config": "cfg"},
        "jobDetail": {"taskDetails": tasks},
        **extra,
    }


@pytest.fixture
def api():
    from google.cloud.aiplatform import initializer

    with FakeServer() as fake:
        yield fake
    # aiplatform.init is process-global: point later tests back at the defaults
    initializer.global_config._api_endpoint = None
    initializer.global_config._api_transport = None
    initializer.global_config._credentials = None


@pytest.fixture
def cfg_path(tmp_path) -> Path:
    return write_config(tmp_path)


def add_job(fake, job: dict) -> None:
    fake.resources[job["name"]] = job


def run_cli(fake, argv: list[str], capsys) -> tuple[int, str, str]:
    code = jobs.main(argv, credentials=AnonymousCredentials(), api_endpoint=fake.url, logging_endpoint=fake.url)
    out, err = capsys.readouterr()
    return code, out, err


# --- the pure part ------------------------------------------------------------------


def as_returned(rest: dict) -> dict:
    """A job in REST form as jobs' I/O part returns it: parsed into the proto, then to a dict."""
    from google.cloud.aiplatform.compat.types import pipeline_job_v1

    return jobs._as_dict(pipeline_job_v1.PipelineJob.from_json(json.dumps(rest), ignore_unknown_fields=True))


def test_task_rows_skip_the_root_find_every_custom_job_and_sort_by_start():
    job = as_returned(make_job("run-1"))
    rows = job_views.task_rows(job)
    assert [r["task"] for r in rows] == [
        "stage-model",
        "validate-data",
        "train-lora",
        "merge-export",
        "evaluate",
        "register",
    ]
    train = rows[2]
    assert train["jobs"] == ["222", "333"]  # the launcher's CustomJob and the one GCPC started
    assert train["duration"] == "1h10m05s" and train["state"] == "SUCCEEDED"
    assert train["job_links"][1] == (
        "https://console.cloud.google.com/vertex-ai/locations/us-central1/training/333/cpu?project=test-project"
    )
    assert train["logs_link"].startswith("https://console.cloud.google.com/logs/query;query=%28resource.type")
    assert rows[4]["error"] == "evaluate: tuned model returned 3 answers for 4 prompts"
    assert rows[-1]["start"] == "-" and rows[-1]["jobs"] == []


def test_log_filter_all_tasks_one_task_and_misspelled_task():
    job = as_returned(make_job("run-1"))
    flt = job_views.log_filter(job)
    assert flt.startswith('((resource.type="ml_job" AND resource.labels.job_id=("111" OR "222" OR "333" OR "444"')
    assert 'resource.labels.pipeline_job_id="run-1")' in flt
    assert flt.endswith('AND timestamp>="2026-11-24T10:00:00Z"')  # entries:list reads 24 h without a time
    one = job_views.log_filter(job, "train-lora", after="2026-11-24T10:30:00Z")
    assert one == (
        '(resource.type="ml_job" AND resource.labels.job_id=("222" OR "333")) AND timestamp>="2026-11-24T10:30:00Z"'
    )
    with pytest.raises(jobs.VertexError, match="run run-1 has no task 'train-lroa'; did you mean 'train-lora'"):
        job_views.log_filter(job, "train-lroa")
    with pytest.raises(jobs.VertexError, match="task 'register' of run run-1 has not started a job yet"):
        job_views.log_filter(job, "register")


def test_fetch_picks_models_reports_metrics_predictions_not_the_base_or_data():
    job = as_returned(make_job("run-1"))
    got = {(a["task"], a["output"]): a["kind"] for a in job_views.output_artifacts(job)}
    assert got == {
        ("train-lora", "adapter"): "model",
        ("train-lora", "metrics"): "metrics",
        ("merge-export", "merged_model"): "model",
        ("evaluate", "metrics"): "metrics",
        ("evaluate", "report"): "report",
        ("evaluate", "predictions"): "predictions",
    }
    only = job_views.output_artifacts(job, job_views.parse_kinds("data"))
    assert [(a["task"], a["output"]) for a in only] == [("validate-data", "train_dataset")]
    with pytest.raises(jobs.VertexError, match="unknown kind 'reprot'; did you mean 'report'"):
        job_views.parse_kinds("model,reprot")


def test_log_entry_lines():
    names = {"333": "train-lora"}
    entry = {
        "timestamp": "2026-11-24T10:05:00.123Z",
        "resource": {"type": "ml_job", "labels": {"job_id": "333"}},
        "textPayload": "{'loss': 1.2}\n",
        "severity": "INFO",
    }
    assert job_views.format_entry(entry, names) == "2026-11-24 10:05:00 train-lora {'loss': 1.2}"
    event = {
        "timestamp": "2026-11-24T10:00:00Z",
        "resource": {"type": job_views.PIPELINE_RESOURCE, "labels": {"pipeline_job_id": "run-1"}},
        "jsonPayload": {"message": "task failed"},
        "severity": "ERROR",
    }
    assert job_views.format_entry(event, names) == "2026-11-24 10:00:00 pipeline ERROR task failed"


# --- against the recording server ---------------------------------------------------


def test_ls_lists_only_the_configs_runs_newest_first(api, cfg_path, capsys):
    add_job(api, make_job("run-old", state="PIPELINE_STATE_SUCCEEDED", endTime="2026-11-24T12:00:00Z"))
    add_job(api, {**make_job("run-new"), "createTime": "2026-11-25T08:00:00Z"})
    other = make_job("other-1")
    other["labels"] = {"pipeline": "someone-else"}
    add_job(api, other)
    code, out, err = run_cli(api, ["ls", "--config", str(cfg_path)], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["RUN", "STATE", "CREATED", "(UTC)", "TIME", "CONFIG"]
    assert [ln.split()[0] for ln in lines[1:]] == ["run-new", "run-old"]
    assert lines[2].split()[1:] == ["SUCCEEDED", "2026-11-24", "10:00:00", "1h59m59s", "cfg"]
    [call] = api.calls("GET", f"{JOBS}")
    assert call.query["filter"] == [f'labels.pipeline="{PIPELINE}"']


def test_show_defaults_to_the_newest_run_and_prints_tasks_with_links(api, cfg_path, capsys):
    api.job_states[:] = ["PIPELINE_STATE_FAILED"]
    add_job(api, make_job("run-1", error={"message": "The DAG failed because some tasks failed."}))
    code, out, err = run_cli(api, ["show", "--config", str(cfg_path)], capsys)
    assert code == 0, err
    assert "run:     run-1 (qwen3-vl-4b-lora-seed)" in out and "state:   FAILED" in out
    assert "console: https://console.cloud.google.com/vertex-ai/locations/us-central1/pipelines/runs/run-1" in out
    assert "error:   The DAG failed because some tasks failed." in out
    assert "    error: evaluate: tuned model returned 3 answers for 4 prompts" in out
    assert "training/333/cpu?project=test-project" in out
    assert PIPELINE + "  " not in out  # the root DAG task is not a task row
    assert out.index("stage-model") < out.index("validate-data") < out.index("train-lora")


def test_cancel_a_running_run_then_refuse_an_ended_one(api, cfg_path, capsys):
    api.job_states[:] = ["PIPELINE_STATE_RUNNING"]
    add_job(api, make_job("run-1"))
    code, out, err = run_cli(api, ["cancel", "run-1", "--config", str(cfg_path)], capsys)
    assert code == 0, err
    assert out.startswith(f"cancel requested: {JOBS}/run-1")
    assert len(api.calls("POST", f"{JOBS}/run-1:cancel")) == 1
    code, out, err = run_cli(api, ["cancel", "run-1", "--config", str(cfg_path)], capsys)
    assert code == 2 and err == "error: run run-1 already ended (CANCELLED)\n"
    assert len(api.calls("POST", ":cancel")) == 1


def _entry(job_id: str, ts: str, text: str, n: int) -> dict:
    return {
        "insertId": f"e{n}",
        "timestamp": ts,
        "resource": {"type": "ml_job", "labels": {"job_id": job_id}},
        "textPayload": text,
    }


def test_logs_of_one_task_newest_lines_in_order(api, cfg_path, capsys):
    api.job_states[:] = ["PIPELINE_STATE_SUCCEEDED"]
    add_job(api, make_job("run-1"))
    api.log_page_size = 2  # the reader follows pages
    api.log_entries += [_entry("333", f"2026-11-24T10:0{i}:00Z", f"step {i}", i) for i in range(6)]
    api.log_entries.append(_entry("111", "2026-11-24T10:01:30Z", "staging", 99))
    code, out, err = run_cli(
        api, ["logs", "run-1", "--task", "train-lora", "--lines", "3", "--config", str(cfg_path)], capsys
    )
    assert code == 0, err
    assert out.splitlines() == [f"2026-11-24 10:0{i}:00 train-lora step {i}" for i in (3, 4, 5)]
    code, out, err = run_cli(api, ["logs", "run-1", "--lines", "0", "--config", str(cfg_path)], capsys)
    assert "2026-11-24 10:01:30 stage-model staging" in out.splitlines()[2] and len(out.splitlines()) == 7


def test_logs_follow_polls_until_the_run_ends_without_repeating_lines(api, cfg_path):
    api.job_states[:] = ["PIPELINE_STATE_RUNNING", "PIPELINE_STATE_RUNNING", "PIPELINE_STATE_SUCCEEDED"]
    add_job(api, make_job("run-1"))
    api.log_entries.append(_entry("333", "2026-11-24T10:05:00Z", "step 1", 1))
    later = iter(
        [_entry("333", "2026-11-24T10:06:00Z", "step 2", 2), _entry("444", "2026-11-24T10:07:00Z", "merged", 3)]
    )
    sleeps = []

    def sleep(s):
        sleeps.append(s)
        api.log_entries.append(next(later))

    out = io.StringIO()
    cfg = load_config(cfg_path)
    printed = jobs.stream_logs(
        cfg,
        "run-1",
        follow=True,
        poll_s=5,
        credentials=AnonymousCredentials(),
        api_endpoint=api.url,
        logging_endpoint=api.url,
        out=out,
        sleep=sleep,
    )
    assert printed == 3 and sleeps == [5, 5]
    assert out.getvalue().splitlines() == [
        "2026-11-24 10:05:00 train-lora step 1",
        "2026-11-24 10:06:00 train-lora step 2",
        "2026-11-24 10:07:00 merge-export merged",
        "(run SUCCEEDED)",
    ]
    # each poll asks only for what is new (from the newest entry seen); once more after the run ended
    since = [c.body["filter"].rsplit(">=", 1)[1] for c in api.calls("POST", "/v2/entries:list")]
    assert since == [
        '"2026-11-24T10:00:00Z"',
        '"2026-11-24T10:05:00Z"',
        '"2026-11-24T10:06:00Z"',
        '"2026-11-24T10:07:00Z"',
    ]


def test_logs_follow_waits_for_a_task_the_run_has_not_reached(api, cfg_path):
    api.job_states[:] = ["PIPELINE_STATE_RUNNING", "PIPELINE_STATE_RUNNING", "PIPELINE_STATE_SUCCEEDED"]
    job = make_job("run-1")
    add_job(api, job)
    api.log_entries.append(_entry("777", "2026-11-24T11:40:00.5Z", "registered", 1))
    api.log_entries.append(_entry("777", "2026-11-24T11:40:00Z", "registering", 2))

    def sleep(s):  # the register task starts its job between two polls
        job["jobDetail"]["taskDetails"][-1]["executorDetail"] = {
            "containerDetail": {"mainJob": f"{PARENT}/customJobs/777"}
        }

    out = io.StringIO()
    jobs.stream_logs(
        load_config(cfg_path),
        "run-1",
        task="register",
        follow=True,
        poll_s=1,
        credentials=AnonymousCredentials(),
        api_endpoint=api.url,
        logging_endpoint=api.url,
        out=out,
        sleep=sleep,
    )
    assert out.getvalue().splitlines() == [
        "(waiting for task register to start)",
        "2026-11-24 11:40:00 register registering",
        "2026-11-24 11:40:00 register registered",
        "(run SUCCEEDED)",
    ]
    # the newest entry seen is the one at .5 s, though '...:00Z' sorts after '...:00.5Z' as text
    assert api.calls("POST", "/v2/entries:list")[-1].body["filter"].endswith('timestamp>="2026-11-24T11:40:00.5Z"')
    with pytest.raises(jobs.VertexError, match="did you mean 'register'"):  # a misspelling is not waited for
        jobs.stream_logs(
            load_config(cfg_path),
            "run-1",
            task="registr",
            follow=True,
            credentials=AnonymousCredentials(),
            api_endpoint=api.url,
            logging_endpoint=api.url,
        )


def test_logs_follow_is_bounded(api, cfg_path):
    api.job_states[:] = ["PIPELINE_STATE_RUNNING"]
    add_job(api, make_job("run-1"))
    now = [0.0]
    out = io.StringIO()
    jobs.stream_logs(
        load_config(cfg_path),
        "run-1",
        follow=True,
        poll_s=10,
        follow_for_s=25,
        credentials=AnonymousCredentials(),
        api_endpoint=api.url,
        logging_endpoint=api.url,
        out=out,
        sleep=lambda s: now.__setitem__(0, now[0] + s),
        clock=lambda: now[0],
    )
    assert now[0] == 20 and out.getvalue().endswith(
        "(stopped following after 25 s; the run is PIPELINE_STATE_RUNNING)\n"
    )


def test_logging_api_errors_and_missing_runs_are_one_line(api, cfg_path, capsys):
    code, out, err = run_cli(api, ["show", "--config", str(cfg_path)], capsys)
    assert code == 2 and err == f"error: no runs of {PIPELINE} in test-project/us-central1 yet\n"
    api.job_states[:] = ["PIPELINE_STATE_RUNNING"]
    add_job(api, make_job("run-1"))
    api.errors["entries:list"] = (403, "PERMISSION_DENIED")
    code, out, err = run_cli(api, ["logs", "--config", str(cfg_path)], capsys)
    assert code == 1 and err.startswith("error: permission denied: ") and err.count("\n") == 1


def test_a_misspelled_action_gets_the_closest_name(capsys):
    assert jobs.main(["lgos", "--config", "x"]) == 2
    err = capsys.readouterr().err
    assert "vlm-lora jobs: unknown action 'lgos'; did you mean 'logs'?" in err and "fetch" in err
    from pipelines.cli import main

    assert main(["jbos"]) == 2
    assert "did you mean 'jobs'?" in capsys.readouterr().err


def test_missing_credentials_are_one_line_with_the_fix(tmp_path, monkeypatch, capsys):
    from google.cloud.aiplatform import initializer

    monkeypatch.setattr(initializer.global_config, "_credentials", None)  # no earlier test's credentials
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing-key.json"))
    cfg = str(write_config(tmp_path))
    for argv in (["ls", "--config", cfg], ["logs", "run-1", "--config", cfg]):
        assert jobs.main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: no Google Cloud credentials found: run `gcloud auth application-default login`")
        assert err.count("\n") == 1


# --- fetch, from the Cloud Storage emulator -----------------------------------------


def test_fetch_downloads_outputs_into_task_folders_and_skips_what_is_there(
    api, cfg_path, gcs_client, gcs_bucket, tmp_path, capsys
):
    bucket = gcs_client.bucket(gcs_bucket)
    root = "root/run-1"
    files = {
        f"{root}/merge-export/merged_model/config.json": b'{"model_type": "qwen3_vl"}',
        f"{root}/merge-export/merged_model/model.safetensors": b"w" * 3000,
        f"{root}/train-lora/adapter/adapter_model.safetensors": b"a" * 100,
        f"{root}/evaluate/report": b"<html>report</html>",
        f"{root}/evaluate/predictions/data.jsonl": b'{"line": 1}\n',
        f"{root}/validate-data/train_dataset/data.jsonl": b"{}\n",
        "models/hf/Qwen/x/abc/model.safetensors": b"base",
    }
    for name, data in files.items():
        bucket.blob(name).upload_from_string(data)
    api.job_states[:] = ["PIPELINE_STATE_SUCCEEDED"]
    add_job(api, make_job("run-1", bucket=gcs_bucket, state="PIPELINE_STATE_SUCCEEDED"))
    dest = tmp_path / "out"
    cfg = str(cfg_path)
    printed = io.StringIO()
    jobs.fetch_outputs(
        load_config(cfg_path),
        "run-1",
        dest,
        credentials=AnonymousCredentials(),
        api_endpoint=api.url,
        out=printed,
        progress_min_bytes=1000,
    )
    got = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert got == [
        "evaluate/metrics.json",
        "evaluate/predictions/data.jsonl",
        "evaluate/report.html",
        "merge-export/merged_model/config.json",
        "merge-export/merged_model/model.safetensors",
        "run.json",
        "train-lora/adapter/adapter_model.safetensors",
        "train-lora/metrics.json",
    ]
    assert (dest / "merge-export/merged_model/model.safetensors").read_bytes() == b"w" * 3000
    assert json.loads((dest / "evaluate/metrics.json").read_text()) == {"tuned_f1": 0.8}
    summary = json.loads((dest / "run.json").read_text())
    assert summary["run"] == f"{JOBS}/run-1" and summary["state"] == "PIPELINE_STATE_SUCCEEDED"
    outputs = {(a["task"], a["output"]): a["uri"] for a in summary["outputs"]}  # fetched or not
    assert outputs[("stage-model", "model")] == f"gs://{gcs_bucket}/models/hf/Qwen/x/abc"
    assert outputs[("validate-data", "train_dataset")].endswith("/validate-data/train_dataset")
    assert "fetch merge-export/merged_model: 3.0 kB / 3.0 kB (100 %)" in printed.getvalue()
    assert "adapter" not in printed.getvalue()  # under progress_min_bytes: no progress lines

    (dest / "merge-export/merged_model/config.json").write_text("changed")
    code, out, err = run_cli(api, ["fetch", "run-1", "--dest", str(dest), "--config", cfg, "--only", "model"], capsys)
    assert code == 0, err
    assert (dest / "merge-export/merged_model/config.json").read_bytes() == files[
        f"{root}/merge-export/merged_model/config.json"
    ]
    assert out.startswith(f"fetched 2 artifacts of run-1 into {dest}\n")
    assert re.search(r"\n  merge-export/merged_model  model +2 files, 1 already there +<- gs://", out)


def test_jobs_needs_only_the_light_install(tmp_path):
    """`vlm-lora jobs` and what its actions import need no training module (aiplatform and storage are
    the light install's; the recording-server tests above exercise them)."""
    from tests.test_cli import HEAVY, _light

    proc = _light(
        f"""
        import sys
        from pipelines import jobs
        from components.common import progress, retry, storage
        assert jobs.main(["lgos"]) == 2
        assert not any(m.split(".")[0] in {HEAVY!r} for m in sys.modules), "a training module was imported"
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "did you mean 'logs'?" in proc.stderr
