"""Smoke test core, then a real `swift deploy` on the tiny model and the real `openai` client.

The server tests start ms-swift on 127.0.0.1 (CPU, about 20-40 s to load on 2 cores) and are
marked `pipeline`; CI runs them with `make test`.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.deploy.errors import ServerNotHealthyError, SmokeTestError
from components.deploy.local_server import LocalServer, build_deploy_command, wait_healthy
from components.deploy.smoke import build_messages, check_answer, load_rows, run_smoke, smoke_test

GOOD = '```json\n[{"label": "hole", "bbox": [1, 2, 30, 40]}]\n```'
PROMPT = "<image>Detect the holes. Answer with a JSON list."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def dataset(tmp_path) -> Path:
    """A validated-eval-dataset-like folder: data.jsonl + images/ (2 rows, 1x1 PNG)."""
    from PIL import Image

    (tmp_path / "images").mkdir()
    Image.new("RGB", (64, 48), "white").save(tmp_path / "images" / "a.png")
    row = {
        "messages": [
            {"role": "system", "content": "You read drawings."},
            {"role": "user", "content": PROMPT},
            {"role": "assistant", "content": GOOD},
        ],
        "images": ["images/a.png"],
    }
    (tmp_path / "data.jsonl").write_text(json.dumps(row) + "\n\n" + json.dumps(row) + "\n")
    return tmp_path


# --- pure parts ------------------------------------------------------------------------


def test_rows_become_chat_messages_with_the_image_as_a_data_url(dataset):
    rows = load_rows(dataset, limit=5)
    assert len(rows) == 2 and rows[0]["images"] == [str(dataset / "images" / "a.png")]
    system, user = build_messages(rows[0])  # the assistant's answer is not sent
    assert system == {"role": "system", "content": "You read drawings."}
    image, text = user["content"]
    assert image["image_url"]["url"].startswith("data:image/png;base64,iVBOR")
    assert text == {"type": "text", "text": "Detect the holes. Answer with a JSON list."}
    assert len(load_rows(dataset, limit=1)) == 1


def test_missing_or_broken_rows_are_named(tmp_path):
    with pytest.raises(SmokeTestError, match="data.jsonl does not exist"):
        load_rows(tmp_path)
    (tmp_path / "data.jsonl").write_text("{not json\n")
    with pytest.raises(SmokeTestError, match=r"data.jsonl:1: not JSON"):
        load_rows(tmp_path)
    with pytest.raises(SmokeTestError, match="no user message"):
        build_messages({"messages": [{"role": "assistant", "content": "x"}]})


@pytest.mark.parametrize(
    ("answer", "task", "ok"),
    [
        (GOOD, "detection", True),
        ('[{"label": "hole", "bbox_2d": [1, 2, 3, 4]}]', "detection", True),
        ('[{"label": "hole", "bbox": [1, 2]}]', "detection", False),
        ("I see a hole.", "detection", False),
        ('```json\n{"part": "A-1"}\n```', "json", True),
        ('{"part": "A-1"}', "json", True),
        ('```json\n{"part": \n```', "json", False),
        ("anything", "", True),
        ("  \n", "", False),
        (None, "", False),
    ],
)
def test_check_answer_per_task(answer, task, ok):
    assert (check_answer(answer, task) == "") is ok


def test_a_failing_answer_is_named_with_the_raw_answer_truncated(dataset):
    rows = load_rows(dataset)
    asked = []
    ok = run_smoke(lambda m: asked.append(m) or GOOD, rows, "detection")
    assert [a["answer"] for a in ok.answers] == [GOOD, GOOD] and len(asked) == 2
    garbage = "no boxes here " * 100
    with pytest.raises(
        SmokeTestError, match=r"answer 0 does not parse for task 'detection'.*raw answer: 'no boxes"
    ) as e:
        run_smoke(lambda m: garbage, rows, "detection")
    assert "(1400 characters)" in str(e.value) and len(str(e.value)) < 800
    with pytest.raises(SmokeTestError, match="request 0 failed: ConnectionError: refused"):
        run_smoke(lambda m: (_ for _ in ()).throw(ConnectionError("refused")), rows, "")
    with pytest.raises(ValueError, match="task 'boxes' is not one of"):
        run_smoke(lambda m: GOOD, rows, "boxes")


def test_deploy_command_is_built_from_names():
    cmd = build_deploy_command("/m/merged", 8123, model_type="qwen3_vl", served_model_name="tuned")
    assert cmd == [
        "swift", "deploy", "--model", "/m/merged", "--infer_backend", "transformers", "--host", "127.0.0.1",
        "--port", "8123", "--model_type", "qwen3_vl", "--served_model_name", "tuned",
    ]  # fmt: skip


def test_wait_healthy_is_bounded_and_names_the_failure(tmp_path):
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        start = time.monotonic()
        with pytest.raises(ServerNotHealthyError, match=r"did not answer 200 within 1 s"):
            wait_healthy(f"http://127.0.0.1:{silent.getsockname()[1]}", 1.0, interval_s=0.1)
        assert time.monotonic() - start < 20  # a hang guard: the 1 s bound ends it in ~1-3 s
    log = tmp_path / "log"
    log.write_text("loading\nOSError: broken weights\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(ServerNotHealthyError, match=r"exited with code 3(.|\n)*broken weights"):
        wait_healthy(f"http://127.0.0.1:{_free_port()}", 60, process=proc, log_path=log, interval_s=0.1)


def test_a_folder_without_a_model_is_refused_before_starting(tmp_path):
    with pytest.raises(ServerNotHealthyError, match="not a model folder"):
        LocalServer(tmp_path, _free_port(), tmp_path / "log").start()


# --- a real server: swift deploy on the tiny model, the openai client -------------------


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    from pipelines.demo.tiny_model import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="module")
def demo_rows(tmp_path_factory) -> list[dict]:
    from pipelines.demo.drawings import generate_dataset

    folder = tmp_path_factory.mktemp("drawings")
    generate_dataset(folder, n_train=0, n_eval=2)
    return load_rows(folder / "eval.jsonl", limit=2)


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with LocalServer(tiny_model, _free_port(), log, start_timeout_s=240, served_model_name="tiny") as srv:
        yield srv
    assert srv.process is None


@pytest.mark.pipeline
def test_real_server_answers_an_image_and_prompt_through_the_openai_client(server, demo_rows):
    result = smoke_test(server.base_url, "tiny", demo_rows, "", timeout_s=120, max_tokens=16)
    assert len(result.answers) == 2 and all(a["answer"].strip() for a in result.answers)


@pytest.mark.pipeline
def test_real_server_answer_that_does_not_parse_is_a_named_error(server, demo_rows):
    # the tiny model is random: its answer is no detection list, and the error shows it raw
    with pytest.raises(SmokeTestError, match=r"answer 0 does not parse for task 'detection'.*raw answer: "):
        smoke_test(server.base_url, "tiny", demo_rows, "detection", timeout_s=120, max_tokens=16)
    with pytest.raises(SmokeTestError, match="request 0 failed: BadRequestError.*not in the model_list"):  # not served
        smoke_test(server.base_url, "other", demo_rows, "", timeout_s=120, max_tokens=4)


@pytest.mark.pipeline
def test_corrupted_model_fails_with_a_named_error_in_bounded_time(tiny_model, tmp_path):
    broken = tmp_path / "merged_model"
    broken.mkdir()
    for f in tiny_model.iterdir():
        if f.is_file():
            data = f.read_bytes()
            (broken / f.name).write_bytes(data[: len(data) // 3] if f.suffix == ".safetensors" else data)
    start = time.monotonic()
    with pytest.raises(ServerNotHealthyError, match="exited with code"):
        LocalServer(broken, _free_port(), tmp_path / "log", start_timeout_s=180).start()
    assert time.monotonic() - start < 180
