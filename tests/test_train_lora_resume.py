"""Kill-and-resume of train-lora on the tiny model: a restarted job continues from the durable checkpoint.

Runs `swift sft` twice on the CPU (about 2 minutes on 2 cores); marker `pipeline`.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.train_lora import _checkpoints as ck
from tests.cpu_training import cpu_swift_args

ROOT = Path(__file__).resolve().parent.parent
MAX_STEPS = 8
SWIFT_ARGS = cpu_swift_args(MAX_STEPS, save_steps=2, save_total_limit=10)  # a checkpoint every 2nd step


def _step(entry):
    return int(str(entry["global_step/max_steps"]).split("/")[0])


@pytest.mark.pipeline
def test_killed_training_resumes_from_the_durable_checkpoint(tmp_path):
    from components.train_lora.core import train_lora
    from components.validate_data.core import validate_data
    from pipelines.demo.drawings import generate_dataset
    from pipelines.demo.tiny_model import ensure_tiny_model

    model = ensure_tiny_model()
    raw = generate_dataset(tmp_path / "raw", n_train=8, n_eval=2, image_size=128)
    validate_data(
        [raw["train"]],
        str(tmp_path / "train"),
        str(tmp_path / "eval"),
        str(tmp_path / "q.jsonl"),
        eval_files=[raw["eval"]],
    )
    durable = tmp_path / "durable"
    call = dict(
        model_dir=str(model),
        model_type="qwen3_vl",
        train_dir=str(tmp_path / "train"),
        eval_dir="",
        swift_args=SWIFT_ARGS,
    )

    # 1) first attempt in its own process group, killed once a verified durable checkpoint exists
    script = (
        "import json, sys\n"
        "from components.train_lora.core import train_lora\n"
        "kw = json.loads(sys.argv[1])\n"
        "train_lora(**kw, checkpoint_interval_s=0.5)\n"
    )
    kw = {
        **call,
        "adapter_out": str(tmp_path / "adapter1"),
        "work_dir": str(tmp_path / "work1"),
        "checkpoint_dir": str(durable),
    }
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    log = open(tmp_path / "attempt1.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-c", script, json.dumps(kw)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 150
    try:
        while ck.newest_complete_checkpoint(durable) is None:
            assert proc.poll() is None, f"first attempt ended early: {(tmp_path / 'attempt1.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, "no durable checkpoint within 150 s"
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()
    assert proc.returncode != 0, "the first attempt finished before it was killed; the test proves nothing"
    assert not (tmp_path / "adapter1" / "adapter_model.safetensors").exists()
    killed_at = ck.checkpoint_step(ck.newest_complete_checkpoint(durable))
    assert killed_at is not None and 2 <= killed_at < MAX_STEPS
    # a checkpoint folder cut short (no marker) next to it is ignored
    (durable / f"checkpoint-{MAX_STEPS + 100}").mkdir()
    (durable / f"checkpoint-{MAX_STEPS + 100}" / "adapter_model.safetensors").write_bytes(b"partial")

    # 2) restart on the same checkpoint_dir with a fresh work dir (a new Vertex attempt)
    result = train_lora(
        **call, adapter_out=str(tmp_path / "adapter2"), work_dir=str(tmp_path / "work2"), checkpoint_dir=str(durable)
    )
    resumed = ck.checkpoint_step(result.resumed_from)
    assert resumed is not None and resumed >= killed_at and resumed >= 2
    steps = [_step(e) for e in result.log_history if "loss" in e and "global_step/max_steps" in e]
    assert steps and steps[0] == resumed + 1, steps  # did not start over
    assert result.metrics["steps"] == MAX_STEPS and result.metrics["resumed_from_step"] == resumed
    state = json.loads((Path(result.checkpoint) / "trainer_state.json").read_text())
    assert state["global_step"] == MAX_STEPS
    assert Path(result.adapter_dir, "adapter_model.safetensors").is_file()
    assert ck.newest_complete_checkpoint(durable) == durable / f"checkpoint-{MAX_STEPS}"
