"""Unit tests of train-lora's launch logic: CLUSTER_SPEC, GPUs, DDP/ZeRO choice, input checks, durable checkpoints."""

import json
import os
import struct
from pathlib import Path

import pytest

from components.common import cluster
from components.train_lora import _checkpoints as ck
from components.train_lora import _facts, _layers, _swift_args, core
from components.train_lora import _input_checks as pf
from components.train_lora import _launch as la
from components.train_lora.core import TrainError

GIB = 1024**3


def _spec(kind, index, workers=("w0:2222", "w1:2222")):
    return {
        "CLUSTER_SPEC": json.dumps(
            {
                "cluster": {"workerpool0": ["chief-host:2222"], "workerpool1": list(workers)},
                "task": {"type": kind, "index": index},
            }
        )
    }


# --- launch plan -------------------------------------------------------------------------


def test_single_node_cpu_and_one_gpu_run_without_torchrun():
    for gpus in (0, 1):
        plan = cluster.launch_plan({}, gpus)
        assert plan.env == {} and plan.is_chief and not plan.distributed and plan.nnodes == 1


def test_single_node_multi_gpu_sets_only_nproc_per_node():
    plan = cluster.launch_plan({}, 8)
    assert plan.env == {"NPROC_PER_NODE": "8"} and plan.is_chief and plan.world_size == 8


def test_vertex_single_replica_cluster_spec_is_a_single_node():
    env = {
        "CLUSTER_SPEC": json.dumps(
            {
                "cluster": {"workerpool0": ["cmle-training-workerpool0-x-0:2222"]},
                "task": {"type": "workerpool0", "index": 0},
            }
        )
    }
    plan = cluster.launch_plan(env, 2)
    assert plan.nnodes == 1 and plan.env == {"NPROC_PER_NODE": "2"} and plan.is_chief


def test_chief_of_three_nodes():
    plan = cluster.launch_plan(_spec("workerpool0", 0), 8)
    assert plan.is_chief and plan.node_rank == 0 and plan.nnodes == 3
    assert plan.env == {
        "NNODES": "3",
        "NODE_RANK": "0",
        "MASTER_ADDR": "chief-host",
        "MASTER_PORT": "2222",
        "NPROC_PER_NODE": "8",
    }
    assert plan.world_size == 24


@pytest.mark.parametrize("index", [0, 1])
def test_workers_rank_after_the_chief(index):
    plan = cluster.launch_plan(_spec("workerpool1", index), 8)
    assert not plan.is_chief and plan.node_rank == 1 + index
    assert plan.env["NODE_RANK"] == str(1 + index) and plan.env["MASTER_ADDR"] == "chief-host"
    assert plan.env["NNODES"] == "3"


@pytest.mark.parametrize(
    "text, match",
    [
        ("{not json", "not JSON"),
        ('{"cluster": {}}', "expected"),
        ('{"cluster": {"workerpool0": []}, "task": {"type": "workerpool0", "index": 0}}', "exactly one chief"),
        ('{"cluster": {"workerpool0": ["h:1"]}, "task": {"type": "workerpool2", "index": 0}}', "task.type"),
        (
            '{"cluster": {"workerpool0": ["h:1"], "workerpool1": ["w:1"]}, "task": {"type": "workerpool1", "index": 3}}',
            r"workerpool1\[3\]",
        ),
        ('{"cluster": {"workerpool0": ["h:1"]}, "task": {"type": "workerpool0", "index": -1}}', "non-negative"),
        ('{"cluster": {"workerpool0": ["nohostport"]}, "task": {"type": "workerpool0", "index": 0}}', "host:port"),
    ],
)
def test_malformed_cluster_spec_is_a_named_error(text, match):
    with pytest.raises(cluster.ClusterSpecError, match=match) as info:
        cluster.launch_plan({"CLUSTER_SPEC": text}, 1)
    assert isinstance(info.value, TrainError)


def test_gpu_count_check():
    la.check_gpu_count(0, 0)
    la.check_gpu_count(8, 8)
    with pytest.raises(la.GPUCountError, match="asks for 8 GPU.*but 2 are visible"):
        la.check_gpu_count(8, 2)


def test_nccl_timeout_only_for_distributed_runs_and_config_wins():
    single, multi = cluster.launch_plan({}, 1), cluster.launch_plan({}, 2)
    assert la.distributed_swift_args({}, single) == {}
    assert la.distributed_swift_args({}, multi) == {"ddp_timeout": la.DEFAULT_DDP_TIMEOUT_S}
    assert la.distributed_swift_args({}, multi, 600) == {"ddp_timeout": 600}
    assert la.distributed_swift_args({"ddp_timeout": 99}, multi, 600) == {}


# --- strategy ----------------------------------------------------------------------------


def test_strategy_single_gpu_uses_no_deepspeed():
    assert la.choose_strategy(8 * GIB, 1, 80 * GIB, {}).name == "single"
    assert la.choose_strategy(8 * GIB, 0, 0, {}).deepspeed is None


def test_strategy_ddp_when_the_base_fits_one_gpu():
    # LoRA state is too small to shard: ZeRO-2 measured 16 % slower per step than DDP on 2 x H200
    s = la.choose_strategy(9 * GIB, 2, 141 * GIB, {})  # Qwen3-VL-4B bf16 on 2xH200
    assert (s.name, s.deepspeed) == ("ddp", None) and "fits one GPU -> DDP" in s.reason
    assert la.choose_strategy(9 * GIB, 2, 141 * GIB, {}, deepspeed_available=False).name == "ddp"
    assert la.choose_strategy(9 * GIB, 1, 141 * GIB, {}, nnodes=2).name == "ddp"


def test_strategy_a_users_zero2_is_kept_and_told_what_it_costs():
    s = la.choose_strategy(9 * GIB, 2, 141 * GIB, {"deepspeed": "zero2"})
    assert s.name == "user" and "16 % slower per step than DDP" in s.reason
    assert "slower" not in la.choose_strategy(9 * GIB, 2, 141 * GIB, {"deepspeed": "zero3"}).reason


def test_strategy_zero3_only_when_the_base_does_not_fit():
    s = la.choose_strategy(66 * GIB, 8, 80 * GIB, {})  # 32B bf16 on H100 80GB
    assert (s.name, s.deepspeed) == ("zero3", "zero3")
    assert la.choose_strategy(66 * GIB, 8, 141 * GIB, {}).name == "ddp"  # same model fits an H200


def test_strategy_user_choice_wins():
    s = la.choose_strategy(66 * GIB, 8, 80 * GIB, {"deepspeed": "zero2_offload"})
    assert s.name == "user" and s.deepspeed is None and "zero2_offload" in s.reason


@pytest.mark.parametrize("value", ["none", "ddp", ""])
def test_strategy_deepspeed_none_means_plain_ddp(value):
    s = la.choose_strategy(9 * GIB, 2, 141 * GIB, {"deepspeed": value})
    assert (s.name, s.deepspeed) == ("ddp", None)
    assert la.choose_strategy(9 * GIB, 1, 141 * GIB, {"deepspeed": value}).name == "single"


def test_model_weight_bytes_scales_by_dtype(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"dtype": "bfloat16"}}))
    (tmp_path / "model.safetensors").write_bytes(b"x" * 1000)
    assert la.model_weight_bytes(tmp_path) == 1000
    assert la.model_weight_bytes(tmp_path, "float32") == 2000
    assert la.model_weight_bytes(tmp_path, "bfloat16") == 1000


# --- input checks ---------------------------------------------------------------------------


def _model(tmp_path, max_pos=4096):
    m = tmp_path / "model"
    m.mkdir()
    (m / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": max_pos}}))
    header = json.dumps(
        {
            n: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
            for n in (
                "model.language_model.layers.0.self_attn.q_proj.weight",
                "model.language_model.layers.0.self_attn.v_proj.weight",
                "model.visual.blocks.0.attn.qkv.weight",
                "lm_head.weight",
            )
        }
        | {"__metadata__": {"format": "pt"}}
    ).encode()
    (m / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    return m


def test_max_length_beyond_the_model_is_refused(tmp_path):
    m = _model(tmp_path, 2048)
    pf.check_inputs({"max_length": 2048.0}, m)
    with pytest.raises(pf.InputCheckError, match="max_length 3000 .* max_position_embeddings 2048"):
        pf.check_inputs({"max_length": 3000}, m)


def test_target_modules_must_exist(tmp_path):
    m = _model(tmp_path)
    for ok in (["q_proj", "v_proj"], "all-linear", ["self_attn.q_proj"], ["qkv"], [r".*\.q_proj"]):
        pf.check_target_modules({"target_modules": ok}, m)
    with pytest.raises(pf.InputCheckError, match=r"\['qproj'\] match no module.*q_proj"):
        pf.check_target_modules({"target_modules": ["q_proj", "qproj"]}, m)


def test_unwritable_output_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(pf.InputCheckError, match="adapter output .* not writable"):
        pf.check_writable(blocker / "sub", "adapter output")
    pf.check_writable(tmp_path / "new" / "dir", "x")
    assert not any((tmp_path / "new" / "dir").iterdir())


def test_train_lora_fails_before_any_work(tmp_path):
    m = _model(tmp_path, 1024)
    ds = tmp_path / "missing-dataset"
    with pytest.raises(pf.InputCheckError, match="max_length"):
        core.train_lora(
            str(m),
            "qwen3_vl",
            str(ds),
            "",
            {"max_length": 4096},
            str(tmp_path / "a"),
            str(tmp_path / "w"),
            gpus=(0, 0),
            environ={},
        )
    with pytest.raises(la.GPUCountError):
        core.train_lora(
            str(m),
            "qwen3_vl",
            str(ds),
            "",
            {},
            str(tmp_path / "a"),
            str(tmp_path / "w"),
            gpus=(1, 80 * GIB),
            expected_gpus=2,
            environ={},
        )
    with pytest.raises(cluster.ClusterSpecError):
        core.train_lora(
            str(m),
            "qwen3_vl",
            str(ds),
            "",
            {},
            str(tmp_path / "a"),
            str(tmp_path / "w"),
            gpus=(1, 80 * GIB),
            environ={"CLUSTER_SPEC": "nope"},
        )
    (tmp_path / "ro").write_text("file, not a folder")
    with pytest.raises(pf.InputCheckError, match="checkpoint_dir"):
        core.train_lora(
            str(m),
            "qwen3_vl",
            str(ds),
            "",
            {},
            str(tmp_path / "a"),
            str(tmp_path / "w"),
            gpus=(0, 0),
            environ={},
            checkpoint_dir=str(tmp_path / "ro" / "ck"),
        )


# --- durable checkpoints -----------------------------------------------------------------


def _local_ckpt(root: Path, step: int, payload: bytes = b"weights") -> Path:
    d = root / f"checkpoint-{step}"
    (d / "sub").mkdir(parents=True)
    (d / "adapter_model.safetensors").write_bytes(payload * 100)
    (d / "optimizer.pt").write_bytes(b"opt" + payload)
    (d / "sub" / "x.json").write_text("{}")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return d


def test_copy_verifies_and_writes_the_marker_last(tmp_path):
    src = _local_ckpt(tmp_path / "local", 4)
    dest = ck.copy_checkpoint(src, tmp_path / "durable")
    assert dest == tmp_path / "durable" / "checkpoint-4"
    marker = json.loads((dest / ck.MARKER).read_text())
    assert marker["step"] == 4 and set(marker["files"]) == {
        "adapter_model.safetensors",
        "optimizer.pt",
        "sub/x.json",
        "trainer_state.json",
    }
    assert marker["files"]["optimizer.pt"]["sha256"] == ck.sha256_file(src / "optimizer.pt")
    assert ck.verify_checkpoint(dest)
    # second copy is a no-op
    mtime = (dest / ck.MARKER).stat().st_mtime_ns
    ck.copy_checkpoint(src, tmp_path / "durable")
    assert (dest / ck.MARKER).stat().st_mtime_ns == mtime


def test_copy_failure_leaves_no_marker(tmp_path, monkeypatch):
    src = _local_ckpt(tmp_path / "local", 2)
    real = ck.shutil.copyfile

    def corrupt(a, b):
        real(a, b)
        if Path(b).name == "optimizer.pt":
            Path(b).write_bytes(b"truncated")

    monkeypatch.setattr(ck.shutil, "copyfile", corrupt)
    with pytest.raises(ck.CheckpointError, match="does not match"):
        ck.copy_checkpoint(src, tmp_path / "durable")
    assert not (tmp_path / "durable" / "checkpoint-2" / ck.MARKER).exists()
    assert ck.newest_complete_checkpoint(tmp_path / "durable") is None


def test_newest_complete_skips_incomplete_and_corrupt(tmp_path):
    local, durable = tmp_path / "local", tmp_path / "durable"
    for step in (2, 4, 6):
        _local_ckpt(local, step, payload=str(step).encode())
    ck.copy_checkpoint(local / "checkpoint-2", durable)
    ck.copy_checkpoint(local / "checkpoint-4", durable)
    six = ck.copy_checkpoint(local / "checkpoint-6", durable)
    (six / ck.MARKER).unlink()  # copy cut short: no marker
    assert ck.newest_complete_checkpoint(durable) == durable / "checkpoint-4"
    (durable / "checkpoint-4" / "optimizer.pt").write_bytes(b"opt9")  # same size, other bytes
    assert ck.verify_checkpoint(durable / "checkpoint-4", deep=False)
    assert ck.newest_complete_checkpoint(durable) == durable / "checkpoint-2"
    (durable / "checkpoint-2" / ck.MARKER).write_text("{trunc")  # half-written marker
    assert ck.newest_complete_checkpoint(durable) is None
    assert ck.newest_complete_checkpoint(tmp_path / "nothing") is None


def test_incomplete_destination_is_overwritten(tmp_path):
    src = _local_ckpt(tmp_path / "local", 8)
    partial = tmp_path / "durable" / "checkpoint-8"
    partial.mkdir(parents=True)
    (partial / "optimizer.pt").write_bytes(b"half")
    ck.copy_checkpoint(src, tmp_path / "durable")
    assert ck.verify_checkpoint(partial)


def test_prune_keeps_the_newest_complete(tmp_path):
    local, durable = tmp_path / "local", tmp_path / "durable"
    for step in (2, 4, 6, 8):
        ck.copy_checkpoint(_local_ckpt(local, step), durable)
    (durable / "checkpoint-10").mkdir()  # in progress: kept
    deleted = ck.prune_checkpoints(durable, keep=2)
    assert sorted(p.name for p in deleted) == ["checkpoint-2", "checkpoint-4"]
    assert sorted(p.name for p in durable.iterdir()) == ["checkpoint-10", "checkpoint-6", "checkpoint-8"]


def test_locally_complete_follows_swifts_symlink(tmp_path):
    out = tmp_path / "output"
    for step in (2, 4):
        _local_ckpt(out, step)
    assert [p.name for p in ck.locally_complete(out)] == ["checkpoint-2"]  # 4 may still be written
    os.symlink("checkpoint-4", out / "last-checkpoint")
    assert [p.name for p in ck.locally_complete(out)] == ["checkpoint-2", "checkpoint-4"]
    _local_ckpt(out, 6)
    (out / "checkpoint-6" / "trainer_state.json").unlink()
    assert [p.name for p in ck.locally_complete(out, final=True)] == ["checkpoint-2", "checkpoint-4"]


def test_checkpoint_sync_copies_in_the_background(tmp_path):
    out, durable = tmp_path / "output", tmp_path / "durable"
    out.mkdir()
    sync = ck.CheckpointSync(out, durable, interval_s=0.05, keep=0).start()
    _local_ckpt(out, 2)
    _local_ckpt(out, 4)
    import time

    deadline = time.monotonic() + 10
    while not ck.verify_checkpoint(durable / "checkpoint-2") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ck.verify_checkpoint(durable / "checkpoint-2")
    assert not (durable / "checkpoint-4").exists()  # not known to be finished yet
    sync.stop(final=False)
    sync.sync_once(final=True)
    assert ck.newest_complete_checkpoint(durable) == durable / "checkpoint-4" and not sync.errors


def test_build_command_with_strategy_and_resume_keeps_user_args():
    cmd = _swift_args.build_sft_command(
        {"deepspeed": "zero2", "ddp_timeout": 600},
        "/m",
        "qwen3_vl",
        "/t",
        "",
        "/o",
        resume_from="/gcs/b/ck/checkpoint-4",
    )
    args = cmd[2:]
    pairs = dict(zip(args[::2], args[1::2]))
    assert pairs["--deepspeed"] == "zero2" and pairs["--ddp_timeout"] == "600"
    assert pairs["--resume_from_checkpoint"] == "/gcs/b/ck/checkpoint-4"


DENSE = {"model_type": "qwen3_vl", "text_config": {"hidden_size": 2560, "num_hidden_layers": 36}}
MOE = {"model_type": "qwen3_vl_moe", "text_config": {"num_experts": 128, "num_experts_per_tok": 8}}


def test_ddp_over_a_dense_model_with_a_frozen_vision_tower_skips_the_unused_parameter_search():
    ddp_unused_args = la.ddp_unused_args
    assert ddp_unused_args({}, "ddp", DENSE) == {"ddp_find_unused_parameters": False}
    assert ddp_unused_args({"freeze_vit": True, "freeze_aligner": "true"}, "ddp", DENSE) == {
        "ddp_find_unused_parameters": False
    }


@pytest.mark.parametrize(
    ("args", "strategy", "config"),
    [
        ({}, "single", DENSE),  # no DDP
        ({}, "zero3", DENSE),  # DeepSpeed's engine, not DDP
        ({}, "user", DENSE),
        ({}, "ddp", MOE),  # an expert no token reached on a rank has no gradient there
        ({}, "ddp", {"num_local_experts": 8}),  # a text-only MoE config (transformers 5's name)
        ({"freeze_vit": False}, "ddp", DENSE),  # a batch without images skips a vision tower that trains
        ({"freeze_aligner": "false"}, "ddp", DENSE),
        ({"ddp_find_unused_parameters": True}, "ddp", DENSE),  # the config's choice
        ({"ddp_find_unused_parameters": False}, "ddp", MOE),  # ... either way: nothing added
    ],
)
def test_the_unused_parameter_search_stays_where_a_parameter_may_miss_a_step(args, strategy, config):
    assert la.ddp_unused_args(args, strategy, config) == {}


def _job_args(swift: dict, model_dir: str, launch: la.Launch) -> tuple[_layers.Layered, la.Strategy]:
    """The run's argument layers up to durable checkpoints, merged, and the strategy its facts chose."""
    facts = _facts.RunFacts.gather(model_dir, swift, launch)
    layers = _swift_args.task_layers(swift, facts, ddp_timeout_s=None, environ={}, checkpoint_dir=None, job_env={})
    return _layers.merge(layers), facts.strategy


def test_the_job_args_of_ddp_over_a_dense_model_skip_the_search_and_say_so(tmp_path):
    launch = la.Launch(cluster.launch_plan({}, 2), 2, 80 * GIB)
    (tmp_path / "config.json").write_text(json.dumps(DENSE))
    layered, strategy = _job_args({"lora_rank": 8}, str(tmp_path), launch)
    assert strategy.name == "ddp" and layered.final["ddp_find_unused_parameters"] is False
    assert layered.source["ddp_find_unused_parameters"] == "distributed"
    assert any("DDP without the search for unused parameters" in line for line in layered.log_lines())
    (tmp_path / "config.json").write_text(json.dumps(MOE))
    layered, strategy = _job_args({"lora_rank": 8}, str(tmp_path), launch)
    assert strategy.name == "ddp" and "ddp_find_unused_parameters" not in layered.final
    one = la.Launch(cluster.launch_plan({}, 1), 1, 80 * GIB)
    layered, strategy = _job_args({"lora_rank": 8}, str(tmp_path), one)
    assert strategy.name == "single" and "ddp_find_unused_parameters" not in layered.final
