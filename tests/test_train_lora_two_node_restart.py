"""Two local "nodes" (gloo on the CPU): one node's process group is killed mid-run, both restart as Vertex restarts
a multi-node CustomJob with `restart_job_on_worker_restart`, and the run resumes from the newest checkpoint both
nodes completed, then finishes. Every wait is bounded.

Each node is train-lora's core in its own process group with a two-node CLUSTER_SPEC on 127.0.0.1 (`swift sft`
under torchrun, NNODES=2; preflight skips a CPU run, its two-node path is tests/test_preflight.py's), both syncing
into one durable folder (the /gcs folder on Vertex). About 3.5 minutes on 2 cores (two attempts of two nodes); marker `pipeline`, like the
single-node kill-and-resume test (tests/test_train_lora_resume.py). The compiled side, the restart setting in
the two-node config's CustomJob, is tests/test_vertex_machines.py's.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.train_lora import _checkpoints as ck
from tests.cpu_training import cpu_swift_args

ROOT = Path(__file__).resolve().parent.parent
MAX_STEPS = 6
SWIFT_ARGS = cpu_swift_args(MAX_STEPS, save_steps=2, save_total_limit=10)
ATTEMPT_S = 300  # one attempt of both nodes: ~100 s measured (6 steps, 2 cores); a hang guard
NODE = (
    "import json, sys\n"
    "from components.train_lora.core import train_lora\n"
    "r = train_lora(**json.loads(sys.argv[1]), checkpoint_interval_s=0.5, node_timeout_s=60)\n"
    "steps = [int(str(e['global_step/max_steps']).split('/')[0]) for e in r.log_history\n"
    "         if 'loss' in e and 'global_step/max_steps' in e]\n"
    "print('RESULT ' + json.dumps({'resumed_from': str(r.resumed_from or ''), 'steps': steps,\n"
    "      'metrics': r.metrics, 'adapter': r.adapter_dir}, default=str))\n"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp: Path, attempt: int, call: dict) -> list[tuple[subprocess.Popen, Path]]:
    """Starts both nodes of one attempt, each in its own process group (a Vertex replica)."""
    port = _free_port()  # a new job attempt: fresh machines, so a fresh rendezvous port
    spec = {"cluster": {"workerpool0": [f"127.0.0.1:{port}"], "workerpool1": [f"127.0.0.1:{port}"]}}
    nodes = []
    for node, task in enumerate(({"type": "workerpool0", "index": 0}, {"type": "workerpool1", "index": 0})):
        cluster = json.dumps({**spec, "task": task})
        kw = {
            **call,
            "adapter_out": str(tmp / f"adapter-a{attempt}-n{node}"),
            "work_dir": str(tmp / f"work-a{attempt}-n{node}"),
            "environ": {"CLUSTER_SPEC": cluster},
        }
        env = {**os.environ, "CLUSTER_SPEC": cluster, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT)]))}
        log = tmp / f"a{attempt}-n{node}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", NODE, json.dumps(kw)],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        nodes.append((proc, log))
    return nodes


def _stop(proc: subprocess.Popen, sig: int, wait_s: float) -> None:
    """Signals the node's process group and waits for it; SIGKILL when it outlives `wait_s`."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _result(log: Path) -> dict:
    lines = [line for line in log.read_text().splitlines() if line.startswith("RESULT ")]
    assert lines, log.read_text()[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.pipeline
def test_a_killed_node_restarts_with_the_job_and_resumes_from_the_last_complete_checkpoint(tmp_path):
    from components.validate_data.core import validate_data
    from pipelines.demo.drawings import generate_dataset
    from pipelines.demo.tiny_model import ensure_tiny_model

    model = ensure_tiny_model()
    raw = generate_dataset(tmp_path / "raw", n_train=8, n_eval=2, image_size=128)
    validate_data([raw["train"]], str(tmp_path / "train"), str(tmp_path / "eval"), str(tmp_path / "q.jsonl"))
    durable = tmp_path / "durable"
    call = dict(
        model_dir=str(model),
        model_type="qwen3_vl",
        train_dir=str(tmp_path / "train"),
        eval_dir="",
        swift_args=SWIFT_ARGS,
        checkpoint_dir=str(durable),
    )

    # 1) both nodes train; once both completed a checkpoint, node 1's whole process group dies (kill -9)
    t0 = time.monotonic()
    (chief, chief_log), (worker, worker_log) = _start(tmp_path, 1, call)
    try:
        while ck.newest_complete_checkpoint(durable) is None:
            for proc, log in ((chief, chief_log), (worker, worker_log)):
                assert proc.poll() is None, f"attempt 1 ended early: {log.read_text()[-3000:]}"
            assert time.monotonic() - t0 < ATTEMPT_S, "no checkpoint complete on both nodes in time"
            time.sleep(0.2)
        _stop(worker, signal.SIGKILL, 30)
        # Vertex restarts the whole job: the chief gets SIGTERM too (it would otherwise wait on its peer)
        _stop(chief, signal.SIGTERM, 60)
    finally:
        for proc in (chief, worker):
            if proc.poll() is None:
                _stop(proc, signal.SIGKILL, 30)
    assert time.monotonic() - t0 < ATTEMPT_S + 120, "attempt 1 did not stop in time"
    assert chief.returncode != 0 and worker.returncode != 0, "attempt 1 finished before the kill; nothing shown"
    killed_at = ck.checkpoint_step(ck.newest_complete_checkpoint(durable))
    assert killed_at is not None and 2 <= killed_at < MAX_STEPS
    # a checkpoint only one node finished (no marker of the other) is never resumed
    half = durable / f"checkpoint-{MAX_STEPS + 100}"
    half.mkdir()
    (half / "adapter_model.safetensors").write_bytes(b"partial")

    # 2) the job's restart: both nodes again, fresh work dirs and port, the same durable folder
    t1 = time.monotonic()
    nodes = _start(tmp_path, 2, call)
    try:
        for proc, log in nodes:
            remaining = max(1.0, ATTEMPT_S - (time.monotonic() - t1))
            assert proc.wait(timeout=remaining) == 0, log.read_text()[-3000:]
    finally:
        for proc, _ in nodes:
            if proc.poll() is None:
                _stop(proc, signal.SIGKILL, 30)
    chief_result = _result(nodes[0][1])
    resumed = ck.checkpoint_step(Path(chief_result["resumed_from"]))
    assert resumed is not None and killed_at <= resumed < MAX_STEPS
    assert chief_result["steps"][0] == resumed + 1, chief_result["steps"]  # did not start over
    assert chief_result["metrics"]["steps"] == MAX_STEPS
    assert chief_result["metrics"]["resumed_from_step"] == resumed
    assert "RESULT " in nodes[1][1].read_text()  # the worker node finished its part too (its log history is empty)
    assert Path(chief_result["adapter"], "adapter_model.safetensors").is_file()
    assert ck.newest_complete_checkpoint(durable) == durable / f"checkpoint-{MAX_STEPS}"
    worker_log = nodes[1][1].read_text()
    assert "train-lora: args: distributed:" in worker_log and "(node 1/2, " in worker_log  # the second of two nodes
