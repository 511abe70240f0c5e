"""The serving container's entry point, as Vertex starts it: AIP_STORAGE_URI on Cloud Storage
(the emulator), AIP_HTTP_PORT, then `swift deploy` answering the `openai` client.

The copy and the errors are unit tests; the whole container (a real `swift deploy` of the tiny
model copied from the emulator) is marked `pipeline`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from components.deploy.container import ModelCopyError, copy_model, serving_command
from components.deploy.local_server import wait_healthy
from components.deploy.smoke import load_rows, smoke_test

ROOT = Path(__file__).resolve().parent.parent


def _upload(client, bucket: str, folder: Path, prefix: str) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            client.bucket(bucket).blob(f"{prefix}/{path.relative_to(folder)}").upload_from_filename(str(path))


def test_copy_from_cloud_storage_keeps_the_layout(gcs_client, gcs_bucket, tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text('{"model_type": "qwen3_vl"}')
    (src / "sub" / "x.bin").write_bytes(b"\x00" * 10)
    _upload(gcs_client, gcs_bucket, src, "runs/1/merged")
    out = copy_model(f"gs://{gcs_bucket}/runs/1/merged/", tmp_path / "model")
    assert (out / "config.json").read_text() == '{"model_type": "qwen3_vl"}'
    assert (out / "sub" / "x.bin").read_bytes() == b"\x00" * 10
    cmd = serving_command(out, {"AIP_HTTP_PORT": "7001"})
    assert cmd[:4] == ["swift", "deploy", "--model", str(out)]
    flags = dict(zip(cmd[4::2], cmd[5::2], strict=True))
    assert flags["--port"] == "7001" and flags["--host"] == "0.0.0.0" and flags["--served_model_name"] == "tuned"
    assert flags["--model_type"] == "qwen3_vl"


def test_empty_or_non_model_folders_are_named(gcs_client, gcs_bucket, tmp_path):
    with pytest.raises(ModelCopyError, match="no files under gs://.*registered artifact is empty"):
        copy_model(f"gs://{gcs_bucket}/nothing", tmp_path / "a")
    gcs_client.bucket(gcs_bucket).blob("m/readme.txt").upload_from_string("hi")
    with pytest.raises(ModelCopyError, match="holds 1 files but no config.json"):
        copy_model(f"gs://{gcs_bucket}/m", tmp_path / "b")
    with pytest.raises(ModelCopyError, match="is not a folder"):
        copy_model(str(tmp_path / "missing"), tmp_path / "c")


def test_cli_without_storage_uri_exits_2_with_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "AIP_STORAGE_URI"}
    proc = subprocess.run(
        [sys.executable, "-m", "components.deploy.container"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "serving container: AIP_STORAGE_URI is not set (Vertex sets it to the model's folder)"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.pipeline
def test_the_container_serves_the_model_vertex_copied(gcs_emulator, gcs_client, gcs_bucket, tmp_path):
    """As on Vertex: the merged model in a bucket, the entry point copies it and serves OpenAI chat."""
    from pipelines.demo.drawings import generate_dataset
    from pipelines.demo.tiny_model import ensure_tiny_model

    _upload(gcs_client, gcs_bucket, ensure_tiny_model(), "registry/merged")
    generate_dataset(tmp_path / "data", n_train=0, n_eval=1)
    rows = load_rows(tmp_path / "data" / "eval.jsonl", limit=1)
    port = _free_port()
    env = {
        **os.environ,
        "AIP_STORAGE_URI": f"gs://{gcs_bucket}/registry/merged",
        "AIP_HTTP_PORT": str(port),
        "MODEL_DIR": str(tmp_path / "model"),
    }
    log = tmp_path / "container.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "components.deploy.container"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_healthy(f"http://127.0.0.1:{port}", 240, process=proc, log_path=log)
        result = smoke_test(f"http://127.0.0.1:{port}", "tuned", rows, "", timeout_s=120, max_tokens=8)
        assert result.answers[0]["answer"].strip()
        assert "copied to" in log.read_text()
        assert (tmp_path / "model" / "config.json").is_file()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_model_trained_with_max_pixels_is_served_with_it(tmp_path):
    """merge-export's lineage records swift.max_pixels; the container passes it to swift deploy."""
    import json

    (tmp_path / "config.json").write_text('{"model_type": "qwen3_vl"}')
    (tmp_path / "lineage.json").write_text(json.dumps({"training": {"hyperparameters": {"max_pixels": 1048576}}}))
    cmd = serving_command(tmp_path, {})
    assert cmd[cmd.index("--max_pixels") + 1] == "1048576"
    (tmp_path / "lineage.json").write_text(json.dumps({"training": {"hyperparameters": {}}}))
    assert "--max_pixels" not in serving_command(tmp_path, {})
