"""Multi-node durable checkpoints: two simulated nodes (two local output dirs) sync into one durable folder.

No training: the local folders hold the files DeepSpeed ZeRO-2 and the HF Trainer write
on a 2-node x 2-GPU job (global ranks 0-1 on the chief, 2-3 on the worker).
"""

import json
import os
import time
from pathlib import Path

import pytest

from components.train_lora import _checkpoints as ck


def _chief_ckpt(out: Path, step: int, payload: bytes = b"c") -> Path:
    """What rank 0's node writes: the adapter, trainer state, `latest`, model states, its ranks' shards."""
    d = out / f"checkpoint-{step}"
    gs = d / f"global_step{step}"
    gs.mkdir(parents=True)
    (d / "adapter_model.safetensors").write_bytes(b"adapter" + payload * 50)
    (d / "adapter_config.json").write_text("{}")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (d / "latest").write_text(f"global_step{step}")
    (gs / "mp_rank_00_model_states.pt").write_bytes(b"model" + payload)
    for rank in (0, 1):
        (gs / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"opt%d" % rank + payload * 20)
        (d / f"rng_state_{rank}.pth").write_bytes(b"rng%d" % rank)
    if (out / "last-checkpoint").is_symlink():
        (out / "last-checkpoint").unlink()
    os.symlink(d.name, out / "last-checkpoint")
    return d


def _worker_ckpt(out: Path, step: int, payload: bytes = b"w", stray_state: bool = True) -> Path:
    """What the worker node writes: only its ranks' shards and RNG states (and, with
    save_on_each_node, its own trainer_state.json, which must not reach the durable copy)."""
    d = out / f"checkpoint-{step}"
    gs = d / f"global_step{step}"
    gs.mkdir(parents=True)
    for rank in (2, 3):
        (gs / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"opt%d" % rank + payload * 20)
        (d / f"rng_state_{rank}.pth").write_bytes(b"rng%d" % rank)
    if stray_state:
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "from": "worker"}))
    return d


@pytest.fixture
def nodes(tmp_path):
    chief_out, worker_out, durable = tmp_path / "node0" / "output", tmp_path / "node1" / "output", tmp_path / "durable"
    chief_out.mkdir(parents=True)
    worker_out.mkdir(parents=True)
    chief = ck.CheckpointSync(chief_out, durable, interval_s=0.02, keep=0, node_rank=0, nnodes=2, node_timeout_s=30)
    worker = ck.CheckpointSync(worker_out, durable, interval_s=0.02, keep=0, node_rank=1, nnodes=2, node_timeout_s=30)
    return chief, worker, durable


def test_per_rank_files_are_recognised():
    assert ck.is_per_rank_file("global_step4/bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt")
    assert ck.is_per_rank_file("global_step4/zero_pp_rank_2_mp_rank_00_model_states.pt")  # ZeRO-3
    assert ck.is_per_rank_file("rng_state_5.pth")
    for shared in (
        "global_step4/mp_rank_00_model_states.pt",
        "trainer_state.json",
        "latest",
        "rng_state.pth",
        "adapter_model.safetensors",
        "scheduler.pt",
    ):
        assert not ck.is_per_rank_file(shared), shared


def test_chief_completes_only_after_the_workers_marker(nodes):
    chief, worker, durable = nodes
    _chief_ckpt(chief.output_dir, 2)
    _worker_ckpt(worker.output_dir, 2)
    dest = durable / "checkpoint-2"

    assert worker.sync_once() == []  # the chief has not marked checkpoint-2: maybe not finished
    assert not dest.exists()

    assert chief.sync_once() == [dest]
    assert ck.node_marker(dest, 0).is_file() and not (dest / ck.MARKER).exists()
    assert chief.outstanding() == [2] and worker.outstanding() == [2]
    assert ck.newest_complete_checkpoint(durable) is None  # the worker's shards are not there yet

    assert worker.sync_once() == [dest]
    part = json.loads(ck.node_marker(dest, 1).read_text())
    assert part["node_rank"] == 1 and set(part["files"]) == {
        "global_step2/bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt",
        "global_step2/bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt",
        "rng_state_2.pth",
        "rng_state_3.pth",
    }
    # the worker's own trainer_state.json did not clobber the chief's
    assert json.loads((dest / "trainer_state.json").read_text()) == {"global_step": 2}
    assert not (dest / ck.MARKER).exists()  # only the chief writes COMPLETE.json

    assert chief.sync_once() == [dest]
    marker = json.loads((dest / ck.MARKER).read_text())
    assert marker["nodes"] == 2 and marker["step"] == 2
    assert {f"global_step2/bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(4)} <= set(marker["files"])
    assert "NODE_0.json" not in marker["files"] and "NODE_1.json" not in marker["files"]
    assert ck.verify_checkpoint(dest) and ck.newest_complete_checkpoint(durable) == dest
    assert chief.outstanding() == [] and worker.outstanding() == [] and not chief.errors and not worker.errors


def test_background_threads_of_both_nodes_complete_each_checkpoint(nodes):
    chief, worker, durable = nodes
    chief.start()
    worker.start()
    try:
        for step in (2, 4):
            _worker_ckpt(worker.output_dir, step, payload=b"%d" % step)
            _chief_ckpt(chief.output_dir, step, payload=b"%d" % step)
            deadline = time.monotonic() + 10
            while not ck.verify_checkpoint(durable / f"checkpoint-{step}") and time.monotonic() < deadline:
                time.sleep(0.02)
            assert ck.verify_checkpoint(durable / f"checkpoint-{step}")
    finally:
        chief.stop(final=False)
        worker.stop(final=False)
    assert ck.newest_complete_checkpoint(durable) == durable / "checkpoint-4"
    assert not chief.errors and not worker.errors


def test_missing_worker_marker_times_out_and_is_never_resumed(nodes):
    chief, _worker, durable = nodes
    chief.node_timeout_s = 0.1
    _chief_ckpt(chief.output_dir, 2)
    chief.sync_once()
    dest = durable / "checkpoint-2"
    assert not chief.drain(0.05)  # a bounded wait, nothing arrives
    time.sleep(0.15)
    chief.sync_once()
    assert chief.pending == {} and any("no marker from node(s) [1]" in e for e in chief.errors)
    assert not (dest / ck.MARKER).exists()
    assert ck.newest_complete_checkpoint(durable) is None


def test_a_complete_checkpoint_needs_every_node_marker(nodes):
    chief, worker, durable = nodes
    for step in (2, 4):
        _chief_ckpt(chief.output_dir, step, payload=b"%d" % step)
        _worker_ckpt(worker.output_dir, step, payload=b"%d" % step)
        chief.sync_once()
        worker.sync_once()
        chief.sync_once()
    assert ck.newest_complete_checkpoint(durable) == durable / "checkpoint-4"
    ck.node_marker(durable / "checkpoint-4", 1).unlink()  # a worker's part lost
    assert not ck.verify_checkpoint(durable / "checkpoint-4", deep=False)
    assert ck.newest_complete_checkpoint(durable) == durable / "checkpoint-2"
    # a worker shard of checkpoint-2 with other bytes (same size): the sha256 check catches it
    shard = durable / "checkpoint-2" / "global_step2" / "bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt"
    shard.write_bytes(shard.read_bytes()[:-1] + b"?")
    assert ck.newest_complete_checkpoint(durable) is None
    # before training, a multi-node chief removes what is not complete
    assert sorted(p.name for p in ck.discard_incomplete(durable)) == ["checkpoint-4"]


def test_two_nodes_writing_the_same_file_is_refused(nodes):
    chief, worker, durable = nodes
    _chief_ckpt(chief.output_dir, 2)
    w = _worker_ckpt(worker.output_dir, 2)
    # a misconfigured job: the worker holds a shard named like one of the chief's
    (w / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").write_bytes(b"opt1c" + b"c" * 20)
    chief.sync_once()
    worker.sync_once()
    chief.sync_once()
    assert not (durable / "checkpoint-2" / ck.MARKER).exists()
    assert any("written by node 0 and node 1" in e for e in chief.errors)


def test_worker_without_shards_still_reports(nodes):
    """Plain DDP on one GPU per node: the worker writes only its RNG state; an empty part is fine too."""
    chief, worker, durable = nodes
    _chief_ckpt(chief.output_dir, 2)
    (worker.output_dir / "checkpoint-2").mkdir()
    chief.sync_once()
    worker.sync_once()
    chief.sync_once()
    assert json.loads(ck.node_marker(durable / "checkpoint-2", 1).read_text())["files"] == {}
    assert ck.newest_complete_checkpoint(durable) == durable / "checkpoint-2"


def test_final_drain_waits_for_the_other_node(nodes):
    """At the end of training each node waits (bounded) until the newest checkpoint is complete."""
    import threading

    chief, worker, durable = nodes
    _worker_ckpt(worker.output_dir, 2)
    result = {}
    t = threading.Thread(target=lambda: result.update(worker=worker.drain(10, final=True)))
    t.start()  # the worker waits for the chief's part
    time.sleep(0.1)
    _chief_ckpt(chief.output_dir, 2)
    assert chief.drain(10, final=True)
    t.join(10)
    assert result == {"worker": True}
    assert ck.newest_complete_checkpoint(durable) == durable / "checkpoint-2"


def test_single_node_sync_writes_no_node_marker(tmp_path):
    out, durable = tmp_path / "output", tmp_path / "durable"
    out.mkdir()
    _chief_ckpt(out, 2)
    sync = ck.CheckpointSync(out, durable, interval_s=0.05, keep=0)
    assert sync.drain(1, final=True)
    assert (durable / "checkpoint-2" / ck.MARKER).is_file()
    assert not list((durable / "checkpoint-2").glob("NODE_*.json"))
    assert "nodes" not in json.loads((durable / "checkpoint-2" / ck.MARKER).read_text())


def test_a_half_written_node_marker_is_waited_for_not_failed(nodes):
    """The chief can read NODE_1.json while the worker writes it: that is 'not yet', not an error."""
    chief, worker, durable = nodes
    _worker_ckpt(worker.output_dir, 2)
    _chief_ckpt(chief.output_dir, 2)
    chief.sync_once()
    worker.sync_once()
    dest = durable / "checkpoint-2"
    full = ck.node_marker(dest, 1).read_text()
    ck.node_marker(dest, 1).write_text(full[: len(full) // 2])  # as seen mid-write
    (dest / ck.MARKER).unlink(missing_ok=True)
    assert ck.complete_multinode(dest, 2) is False
    ck.node_marker(dest, 1).write_text(full)
    assert ck.complete_multinode(dest, 2) is True
    assert ck.verify_checkpoint(dest)
    # markers are written through a temporary file beside the folder, never inside it
    assert not [p for p in dest.rglob("*.tmp")] and not [p for p in durable.glob("*.tmp")]
