"""Two local "nodes" on the CPU (gloo), started as a JobSet starts its pods, train the tiny model to the end
(issue 55, must-show 4): each runs `python -m components.train_lora` (what the manifest's container runs) with
the pod environment of a built 2-node manifest (JOB_COMPLETION_INDEX 0 / 1, the JobSet labels, the node count
and port). The chief's host `<jobset>-node-0-0.<jobset>` resolves to 127.0.0.1 through a private /etc/hosts
in a user + mount namespace (`unshare`), as the headless service resolves it on GKE; skipped where unshare is
not allowed. Then the issue's restart: node 1 is killed once a checkpoint is complete on both nodes, node 0 fails with it,
and both pods started again (what JobSet's failurePolicy does) resume from that checkpoint and finish.
Marker `pipeline` (swift sft on 2 processes, twice: about 4 minutes on 2 cores)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.common import jobset as js
from components.train_lora import _checkpoints as ck
from tests.cpu_training import cpu_swift_args
from tests.test_gke_launch import pod_env

ROOT = Path(__file__).resolve().parent.parent
STEPS = 8
# seconds between durable-copy looks: at 0.25 a checkpoint is complete on both nodes ~1 s after it is saved, while
# a step takes ~1 s; at the default 5 s training ended first and the kill came too late (CI, 2026-12-01)
INTERVAL_S = "0.25"
NAME = "run-1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _namespaced(hosts: Path) -> list[str]:
    """The command prefix that runs a process with `hosts` as its /etc/hosts (a user + mount namespace)."""
    return ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", f'mount --bind "{hosts}" /etc/hosts && exec "$@"', "sh"]  # fmt: skip


def _unshare_works(hosts: Path) -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run([*_namespaced(hosts), "getent", "hosts", f"{NAME}-node-0-0.{NAME}"], capture_output=True, text=True)  # fmt: skip
    return probe.returncode == 0 and "127.0.0.1" in probe.stdout


@pytest.mark.pipeline
def test_two_jobset_pods_on_the_cpu_train_to_the_end(tmp_path):
    from components.validate_data.core import validate_data
    from pipelines.demo.drawings import generate_dataset
    from pipelines.demo.tiny_model import ensure_tiny_model

    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n127.0.0.1 {NAME}-node-0-0.{NAME} {NAME}-node-0-1.{NAME}\n")
    if not _unshare_works(hosts):
        pytest.skip("unshare --user --mount is not allowed here: the chief's JobSet host name cannot resolve locally")
    model = ensure_tiny_model()
    raw = generate_dataset(tmp_path / "raw", n_train=8, n_eval=2, image_size=128)
    validate_data([raw["train"]], str(tmp_path / "train"), str(tmp_path / "eval"), str(tmp_path / "q.jsonl"),
                  eval_files=[raw["eval"]])  # fmt: skip
    durable = tmp_path / "durable"

    # attempt 1: node 1 is killed once a checkpoint is complete on both nodes; node 0 then fails too
    procs = _start_nodes(tmp_path, hosts, model, durable, "a1")
    try:
        deadline = time.monotonic() + 300
        while ck.newest_complete_checkpoint(durable) is None:
            assert all(p.poll() is None for p in procs), _logs(tmp_path, "a1")
            assert time.monotonic() < deadline, "no complete checkpoint within 300 s"
            time.sleep(0.2)
        os.killpg(procs[1].pid, signal.SIGKILL)  # the node's whole pod: train-lora, torchrun, swift
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        _stop(procs)
    assert codes[0] != 0 and codes[1] != 0, "attempt 1 finished before a node was killed; the test proves nothing"
    killed_at = ck.checkpoint_step(ck.newest_complete_checkpoint(durable))
    assert killed_at is not None and killed_at < STEPS

    # attempt 2: the JobSet's restart: both pods again, the same durable folder
    procs = _start_nodes(tmp_path, hosts, model, durable, "a2")
    try:
        codes = [p.wait(timeout=420) for p in procs]
    finally:
        _stop(procs)
    outs = _logs(tmp_path, "a2")
    assert codes == [0, 0], outs
    node0, node1 = ((tmp_path / f"a2-node{i}.log").read_text() for i in range(2))
    assert "--nnodes 2 --node_rank 0 --master_addr run-1-node-0-0.run-1" in node0
    assert "--nnodes 2 --node_rank 1 --master_addr run-1-node-0-0.run-1" in node1
    assert "worker node done" in node1 and "adapter written" in node0
    record = json.loads((tmp_path / "adapter.run.json").read_text())
    assert record["metrics"]["steps"] == STEPS and ck.checkpoint_step(record["resumed_from"]) == killed_at
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert (tmp_path / "adapter.run.json.html").is_file()
    assert f"checkpoint checkpoint-{STEPS} complete on all 2 nodes" in node0
    assert ck.newest_complete_checkpoint(durable) == durable / f"checkpoint-{STEPS}"


def _start_nodes(tmp_path: Path, hosts: Path, model: Path, durable: Path, tag: str) -> list[subprocess.Popen]:
    """Starts the two pods of a built 2-node manifest, each with its pod environment, logs in <tag>-node<i>.log."""
    command, args = js.training_command(
        str(model), str(tmp_path / "train"), "", str(tmp_path / "adapter"), str(durable),
        cpu_swift_args(STEPS, save_steps=2, save_total_limit=10), 0, "off", {"GLOO_SOCKET_IFNAME": "lo"}, "qwen3_vl",
    )  # fmt: skip
    spec = js.JobSetSpec(name=NAME, namespace="ns", image="img", command=command, args=args, nnodes=2,
                         gpus_per_node=0, accelerator="", bucket="b", volume_claim="c", master_port=_free_port())  # fmt: skip
    manifest = js.build_jobset(spec)
    container = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    procs = []
    for index in range(2):
        env = {**os.environ, "PYTHONPATH": str(ROOT), **pod_env(manifest, index)}
        env.pop("CLUSTER_SPEC", None)
        cmd = [*_namespaced(hosts), sys.executable, *container["command"][1:], *container["args"],
               "--checkpoint-interval-s", INTERVAL_S]  # fmt: skip
        with open(tmp_path / f"{tag}-node{index}.log", "w") as log:
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))  # fmt: skip
    return procs


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=60)


def _logs(tmp_path: Path, tag: str) -> str:
    return "\n\n".join((tmp_path / f"{tag}-node{i}.log").read_text()[-3000:] for i in range(2))
