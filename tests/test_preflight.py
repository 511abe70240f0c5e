"""The GPU and interconnect preflight (`components.common.preflight`) and the job environment.

Thresholds, messages and the job environment are tested as pure functions; the measuring
code runs for real on CPU: gloo all-reduce and a DDP step across two processes started by
torchrun, two "nodes" on one host, a node that never joins, a simulated slow GPU, the
wall-clock bound. GPU figures come from benchmarks/preflight_gpu.sh on a GPU machine.
"""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.common import cluster
from components.common import preflight as pf
from components.common.cluster import LaunchPlan
from components.train_lora import core
from components.train_lora.job_env import JobEnvError, check_job_env, job_env_strings

ROOT = Path(__file__).resolve().parent.parent
# Hang guards, not speed checks: each bounded run here takes 3-10 s on a loaded 2-core machine,
# so this is at least 5x that; an unbounded wait (rendezvous timeout_s=60 or more) still fails it.
HANG_BOUND_S = 50
H100 = "NVIDIA H100 80GB HBM3"
GIB = 2**30


def _gpu(rank, node=0, name=H100, tflops=790.0, free=78 * GIB, total=80 * GIB, visible=8, host=None):
    return {
        "rank": rank,
        "node_rank": node,
        "hostname": host or f"host-{node}",
        "gpu_index": rank % 8,
        "gpu_name": name,
        "device": "cuda",
        "gpus_visible": visible,
        "free_bytes": free,
        "total_bytes": total,
        "tflops": tflops,
    }


def _link(kind, busbw, ranks=8, node=0):
    sizes = [{"mb": mb, "algbw_gbps": busbw / 2, "busbw_gbps": busbw} for mb in (4, 32, 256)]
    return {"kind": kind, "node_rank": node, "ranks": ranks, "device": "cuda", "correct": True, "sizes": sizes}


def _figures(gpus, links=(), expected=8, ddp=None):
    return {
        "gpus": list(gpus),
        "links": list(links),
        "expected_gpus": expected,
        "ddp": ddp or {"max_grad_diff": 0.0, "grads_nonzero": True, "seconds": 0.1},
        "nnodes": len({g["node_rank"] for g in gpus}),
        "device": "cuda",
        "backend": "nccl",
        "seconds": 12.5,
    }


def _healthy_two_nodes():
    gpus = [_gpu(r, node=r // 8) for r in range(16)]
    links = [_link("intra-node", 380.0, node=0), _link("intra-node", 390.0, node=1), _link("inter-node", 40.0, 16)]
    return _figures(gpus, links)


# --- expectations and evaluation (pure) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "label"),
    [
        (H100, "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA A100-SXM4-40GB", "A100 SXM"),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM"),
        ("NVIDIA A100 80GB PCIe", "A100 PCIe"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", None),
        ("NVIDIA H200 NVL", None),
        ("Tesla T4", None),
    ],
)
def test_gpu_table_matches_device_names(name, label):
    spec = pf.lookup_gpu(name)
    assert (spec.label if spec else None) == label


def test_busbw_is_nccl_tests_formula():
    assert pf.busbw_gbps(100.0, 8) == pytest.approx(175.0)
    assert pf.busbw_gbps(100.0, 2) == pytest.approx(100.0)
    assert pf.busbw_gbps(100.0, 1) == 0.0


def test_healthy_figures_pass_and_give_metrics():
    figures = _healthy_two_nodes()
    report = pf.evaluate(figures, "fail")
    assert report.ok and report.warnings == []
    pf.enforce(report)  # no raise
    assert pf.metrics_of(figures) == {
        "preflight_seconds": 12.5,
        "preflight_gpus": 16.0,
        "preflight_tflops_min": 790.0,
        "preflight_busbw_gbps": 40.0,  # the widest link (inter-node), at its largest size
    }
    table = pf.format_table(figures, report)
    assert "inter-node" in table and "intra-node node 1" in table and "PASSED" in table and H100 in table


def test_slow_gpu_fails_naming_node_host_gpu_and_figure():
    figures = _healthy_two_nodes()
    figures["gpus"][11]["tflops"] = 200.0  # node 1, GPU 3
    report = pf.evaluate(figures, "fail")
    assert len(report.problems) == 1
    with pytest.raises(pf.PreflightFailed) as info:
        pf.enforce(report)
    msg = str(info.value)
    assert f"node 1 (host-1) GPU 3 ({H100}): bf16 matmul 200.0 TFLOP/s" in msg
    assert ">= 350.0 TFLOP/s (0.5 x 700, H100 SXM: measured" in msg
    for knob in ("NCCL_SOCKET_IFNAME", "NCCL_DEBUG=INFO", "NCCL_P2P_DISABLE", "all-reduce"):
        assert knob in msg
    assert isinstance(info.value, core.TrainError)


def test_warn_logs_and_goes_on_off_checks_nothing():
    figures = _healthy_two_nodes()
    figures["gpus"][0]["tflops"] = 10.0
    lines = []
    pf.enforce(pf.evaluate(figures, "warn"), log=lines.append)
    assert len(lines) == 1 and "WARNING" in lines[0] and "node 0 (host-0) GPU 0" in lines[0]
    off = pf.evaluate(figures, "off")
    assert off.ok
    pf.enforce(off, log=lines.append)
    with pytest.raises(pf.PreflightSettingError, match="'maybe' is not a preflight mode; use one of fail, warn, off"):
        pf.evaluate(figures, "maybe")


def test_unknown_gpu_type_warns_and_records():
    figures = _figures([_gpu(0, name="NVIDIA RTX 9999", tflops=3.0, visible=1)], expected=1)
    report = pf.evaluate(figures)
    assert report.ok
    assert report.warnings == ["node 0 GPU 0 (NVIDIA RTX 9999): not in the expectations table; figures recorded"]
    assert pf.metrics_of(figures)["preflight_tflops_min"] == 3.0


def test_override_of_expected_tflops_simulates_a_fault():
    figures = _figures([_gpu(0, name="NVIDIA RTX 9999", tflops=3.0, visible=1)], expected=1)
    (problem,) = pf.evaluate(figures, expected_tflops=100.0).problems
    assert problem.value == "3.0 TFLOP/s" and problem.expected.startswith(
        ">= 50.0 TFLOP/s (0.5 x 100, --expected-tflops"
    )


def test_link_floors_nvlink_and_inter_node():
    figures = _healthy_two_nodes()
    figures["links"][1] = _link("intra-node", 20.0, node=1)  # node 1 lost NVLink: PCIe speed
    figures["links"][2] = _link("inter-node", 0.3, 16)  # NCCL on a slow interface
    lines = [p.line() for p in pf.evaluate(figures).problems]
    assert len(lines) == 2
    assert lines[0].startswith("node 1 (host-1) intra-node link (8 ranks): all-reduce busbw at 256 MB 20.00 GB/s")
    assert "expected >= 100 GB/s (H100 SXM NVLink floor)" in lines[0]
    assert lines[1].startswith("node 0-1 (host-0, host-1) inter-node link (16 ranks)")
    assert f"expected >= {pf.INTER_NODE_BUSBW_FLOOR_GBPS:g} GB/s (inter-node floor)" in lines[1]


def test_gpu_count_free_memory_ddp_and_corruption_are_problems():
    gpus = [_gpu(r, visible=4) for r in range(4)]
    gpus[2]["free_bytes"] = 10 * GIB
    link = _link("intra-node", 300.0, ranks=4)
    link["correct"] = False
    figures = _figures(gpus, [link], expected=8, ddp={"max_grad_diff": 0.5, "grads_nonzero": True, "seconds": 0.1})
    lines = [p.line() for p in pf.evaluate(figures).problems]
    assert lines[0].startswith("node 0 (host-0) GPUs: visible GPU count 4, expected 8 (resources.accelerator_count)")
    assert any("GPU 2" in line and "free memory 10.0 of 80.0 GiB" in line for line in lines)
    assert any("all-reduce result wrong" in line for line in lines)
    assert any("DDP step (4 ranks)" in line and "TORCH_DISTRIBUTED_DEBUG=DETAIL" in line for line in lines)


def test_launch_command_is_a_standalone_torchrun_on_the_preflight_port():
    plan = LaunchPlan(nnodes=2, node_rank=1, master_addr="chief", master_port=2222, nproc_per_node=8)
    opts = pf.Options(expect_gpus=8, json_path="/w/p.json", expected_tflops=900.0)
    cmd = pf.launch_command(opts, plan, 2223, ["chief", "w0"], python="py")
    assert cmd[:6] == ["py", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "8"]
    text = " ".join(cmd)
    assert "-m components.common.preflight --nnodes 2 --node-rank 1 --master-addr chief --master-port 2223" in text
    assert "--hosts chief,w0" in text and "--expect-gpus 8" in text and "--expected-tflops 900" in text
    assert "--json /w/p.json" in text and "--sizes-mb 4,32,256" in text


def test_cluster_hosts_in_node_rank_order():
    spec = {
        "cluster": {"workerpool0": ["c:2222"], "workerpool1": ["w0:2222", "w1:2222"]},
        "task": {"type": "workerpool0"},
    }
    assert cluster.cluster_hosts({"CLUSTER_SPEC": json.dumps(spec)}) == ["c", "w0", "w1"]
    assert cluster.cluster_hosts({}) == []


# --- job environment ----------------------------------------------------------------------------


def test_job_env_accepts_the_train_lora_plugins_own_switches():
    """README: VLM_LORA_GPU_MEMORY_GIB (a memory cap) goes in the environment section; so do the LoRA-branch switches."""
    env = {"VLM_LORA_GPU_MEMORY_GIB": 39.4, "VLM_LORA_FUSED_LORA": 0.0, "VLM_LORA_TORCH_RMS_NORM": "1"}
    check_job_env(env)  # no error
    assert job_env_strings(env) == {
        "VLM_LORA_GPU_MEMORY_GIB": "39.4",
        "VLM_LORA_FUSED_LORA": "0",
        "VLM_LORA_TORCH_RMS_NORM": "1",
    }


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"VLM_LORA_TORCH_RMS_NORM": "yes"}, r"job_env\.VLM_LORA_TORCH_RMS_NORM: 'yes' is not a value it takes: use 1"),
        ({"VLM_LORA_FUSED_LORA": 2}, r"VLM_LORA_FUSED_LORA: 2 is not a value it takes"),
        ({"VLM_LORA_GPU_MEMORY_GIB": "40GB"}, r"VLM_LORA_GPU_MEMORY_GIB: '40GB' is not a memory size"),
        ({"VLM_LORA_GPU_MEMORY_GIB": 0}, r"is not a memory size: use GiB per GPU"),
        ({"VLM_LORA_RIGHT_PAD_CAUSAL": "off"}, r"VLM_LORA_RIGHT_PAD_CAUSAL: 'off' is not a value it takes: use 0"),
        ({"VLM_LORA_LIGER_SWIGLU": 3}, r"VLM_LORA_LIGER_SWIGLU: 3 is not a value it takes"),
        ({"VLM_LORA_LABEL_ROWS_LOSS": "no"}, r"VLM_LORA_LABEL_ROWS_LOSS: 'no' is not a value it takes"),
        ({"VLM_LORA_HOST_VISION_SEQLENS": "2"}, r"VLM_LORA_HOST_VISION_SEQLENS: '2' is not a value it takes"),
        ({"VLM_LORA_FAST_VISION": "y"}, r"VLM_LORA_FAST_VISION: 'y' is not a value it takes"),
        ({"VLM_LORA_LEAN_LORA": "lean"}, r"VLM_LORA_LEAN_LORA: 'lean' is not a value it takes"),
        ({"VLM_LORA_TORCH_RMS_NORM": "torch"}, r"VLM_LORA_TORCH_RMS_NORM: 'torch' is not a value it takes"),
        ({"VLM_LORA_ASYNC_TOKENS": "no"}, r"VLM_LORA_ASYNC_TOKENS: 'no' is not a value it takes"),
        ({"VLM_LORA_INDEX_DEEPSTACK": "yes"}, r"VLM_LORA_INDEX_DEEPSTACK: 'yes' is not a value it takes"),
    ],
)
def test_job_env_refuses_values_the_plugin_does_not_take(env, match):
    with pytest.raises(JobEnvError, match=match):
        check_job_env(env)
    check_job_env({"VLM_LORA_TORCH_RMS_NORM": True, "VLM_LORA_FUSED_LORA": 0.0, "VLM_LORA_GPU_MEMORY_GIB": 22})
    check_job_env(
        {
            "VLM_LORA_RIGHT_PAD_CAUSAL": "0",
            "VLM_LORA_LIGER_SWIGLU": 0,
            "VLM_LORA_LABEL_ROWS_LOSS": "1",
            "VLM_LORA_HOST_VISION_SEQLENS": 0,
            "VLM_LORA_FAST_VISION": "1",
            "VLM_LORA_LEAN_LORA": "0",
        }
    )


def test_job_env_accepts_nccl_torch_and_cuda_settings():
    env = {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_NVLS_ENABLE": 0.0,  # KFP passes numbers as floats
        "NCCL_IB_PKEY": "0",  # PKEY is not KEY
        "NCCL_NET_PLUGIN": "libnccl-net_gcp_fastrak1.so",
        "NCCL_TOPO_FILE": "/usr/local/nvidia/lib64/a3plus_tuner_config.textproto",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": True,
        "NVSHMEM_DISABLE_NVLS": "1",
        "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": 3,
        "CUDA_DEVICE_MAX_CONNECTIONS": 1,
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }
    check_job_env(env)
    strings = job_env_strings(env)
    assert strings["NCCL_NVLS_ENABLE"] == "0" and strings["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert strings["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and strings["NCCL_DEBUG"] == "INFO"
    check_job_env({})


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"nccl_debug": "INFO"}, r"job_env\.nccl_debug: .*did you mean NCCL_DEBUG"),
        ({"TORCH_DISTRIBUTED_DEBUGG": "INFO"}, "did you mean TORCH_DISTRIBUTED_DEBUG"),
        ({"LD_PRELOAD": "/x.so"}, r"not a variable train-lora passes.*allowed: names starting with NCCL_"),
        ({"HF_TOKEN": "x"}, r"job_env\.HF_TOKEN: 'HF_TOKEN' looks like a secret \(TOKEN in the name\)"),
        ({"WANDB_API_KEY": "x"}, "looks like a secret"),
        ({"NCCL_PASSWORD": "x"}, "looks like a secret"),
        ({"MASTER_ADDR": "h"}, r"'MASTER_ADDR' is reserved \(train-lora sets it"),
        ({"CUDA_VISIBLE_DEVICES": "0"}, "reserved"),
        ({"NCCL_DEBUG": "hf_abcdefghijklmnopqrstuvwxyz"}, r"job_env\.NCCL_DEBUG: the value looks like a secret"),
        ({"NCCL_ALGO": "AbCdEf0123456789xyzXYZ0987uvw"}, "value looks like a secret"),
        ({"NCCL_ALGO": "0123456789abcdef0123456789abcdef"}, "value looks like a secret"),
        ({"NCCL_ALGO": ["Ring"]}, "must be a string, number or boolean"),
    ],
)
def test_job_env_refusals_name_the_key_and_the_fix(env, match):
    with pytest.raises(JobEnvError, match=match):
        check_job_env(env)


# --- real runs on CPU (gloo) --------------------------------------------------------------------


def _free_port() -> int:
    """A port P with P and P + 1 (the preflight's rendezvous: PORT_OFFSET) both free, below the ephemeral range.

    A port the kernel hands out for `bind(0)` comes from the ephemeral range (32768-60999 on
    Linux), the same range that every outgoing connection of the tests running beside this
    one (gloo's pairs, HTTP clients) takes its local port from: such a port, and P + 1 even
    more, can be taken between this check and the preflight's bind. Ports below that range
    are only ever handed out by an explicit bind.
    """
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + pf.PORT_OFFSET))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair in 20000-32000")


def _cli(args, env_extra=None, timeout=60):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "components.common.preflight", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_gloo_all_reduce_and_ddp_across_two_processes_pass(tmp_path, capsys):
    t0 = time.monotonic()
    metrics = core.run_node_preflight(
        LaunchPlan(nproc_per_node=2), 0, "fail", work_dir=str(tmp_path), device="cpu", sizes_mb=(1.0, 4.0)
    )
    assert time.monotonic() - t0 < HANG_BOUND_S
    assert set(metrics) == {"preflight_seconds", "preflight_gpus", "preflight_tflops_min", "preflight_busbw_gbps"}
    assert (
        metrics["preflight_busbw_gbps"] > 0 and metrics["preflight_tflops_min"] > 0 and metrics["preflight_gpus"] == 0
    )
    result = json.loads((tmp_path / "preflight.json").read_text())
    figures = result["figures"]
    assert result["ok"] and figures["backend"] == "gloo" and figures["world_size"] == 2
    assert [g["rank"] for g in figures["gpus"]] == [0, 1]
    (link,) = figures["links"]
    assert link["kind"] == "intra-node" and link["correct"] and [s["mb"] for s in link["sizes"]] == [1.0, 4.0]
    assert figures["ddp"]["max_grad_diff"] == 0.0 and figures["ddp"]["grads_nonzero"]
    out = capsys.readouterr().out
    assert "intra-node node 0" in out and "preflight: PASSED" in out and "train-lora: preflight passed" in out


def test_two_nodes_on_one_host_pass_across_node_ranks(tmp_path):
    port = _free_port()
    spec = {"cluster": {"workerpool0": [f"127.0.0.1:{port}"], "workerpool1": [f"127.0.0.1:{port}"]}}
    procs = []
    for node, task in enumerate(({"type": "workerpool0", "index": 0}, {"type": "workerpool1", "index": 0})):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "CLUSTER_SPEC": json.dumps({**spec, "task": task})}
        args = [
            "--launch",
            "--device",
            "cpu",
            "--sizes-mb",
            "1",
            "--budget-s",
            "0.2",
            "--json",
            str(tmp_path / f"n{node}.json"),
        ]
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "components.common.preflight", *args],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    figures = json.loads((tmp_path / "n0.json").read_text())["figures"]
    assert figures["nnodes"] == 2 and [g["node_rank"] for g in figures["gpus"]] == [0, 1]
    assert [link["kind"] for link in figures["links"]] == ["inter-node"]
    assert "preflight: node 0: PASSED" in outs[0] and "preflight: node 1: PASSED" in outs[1]


def test_a_node_that_never_joins_is_named_within_the_timeout(tmp_path):
    plan = LaunchPlan(nnodes=2, node_rank=0, master_addr="127.0.0.1", master_port=_free_port(), nproc_per_node=1)
    opts = pf.Options(device="cpu", timeout_s=3, json_path=str(tmp_path / "p.json"))
    t0 = time.monotonic()
    with pytest.raises(pf.RendezvousTimeout) as info:
        pf.run_launch(opts, plan, hosts=["127.0.0.1", "worker-b"], log=lambda line: None)
    assert time.monotonic() - t0 < HANG_BOUND_S  # a hang guard: the 3 s timeout ends it in ~5-10 s
    assert "1 of 2 rank(s) did not join the preflight within 3 s: rank 1 (node 1, worker-b)" in str(info.value)
    assert "Traceback" not in str(info.value)


def test_a_worker_without_its_chief_fails_after_the_timeout():
    port = _free_port()
    spec = {
        "cluster": {"workerpool0": [f"127.0.0.1:{port}"], "workerpool1": ["127.0.0.1:1"]},
        "task": {"type": "workerpool1", "index": 0},
    }
    t0 = time.monotonic()
    run = _cli(
        ["--launch", "--device", "cpu", "--timeout-s", "3"],
        {"CLUSTER_SPEC": json.dumps(spec)},
        timeout=2 * HANG_BOUND_S,
    )
    assert time.monotonic() - t0 < HANG_BOUND_S  # a hang guard: the 3 s timeout ends it in ~5-10 s
    assert run.returncode == 1
    assert (
        f"RendezvousTimeout: rank 1 (node 1, 127.0.0.1) could not reach rank 0's rendezvous at 127.0.0.1:{port + 1}"
        in (run.stderr)
    )


@pytest.mark.parametrize("mode", ["fail", "warn"])
def test_simulated_slow_gpu_fails_or_warns(tmp_path, mode):
    opts = pf.Options(mode=mode, device="cpu", expected_tflops=1e6, json_path=str(tmp_path / "p.json"))
    lines = []
    if mode == "fail":
        with pytest.raises(pf.PreflightFailed, match=r"node 0 \(.+\) rank 0 \(cpu\): fp32 matmul .* >= 500000") as info:
            pf.run_launch(opts, LaunchPlan(), log=lines.append)
        assert "NCCL_SOCKET_IFNAME" in str(info.value)
    else:
        outcome = pf.run_launch(opts, LaunchPlan(), log=lines.append)
        assert not outcome.ok and "fp32 matmul" in outcome.message and outcome.metrics["preflight_tflops_min"] > 0
        assert any("WARNING (mode warn, training goes on)" in line for line in lines)


def test_expecting_more_gpus_than_visible_is_a_named_error():
    run = _cli(["--launch", "--device", "cpu", "--expect-gpus", "2"])
    assert run.returncode == 1
    assert "PreflightFailed: preflight failed 1 check(s):" in run.stderr
    assert "GPUs: visible GPU count 0, expected 2 (resources.accelerator_count)" in run.stderr


def test_the_wall_clock_bound_kills_a_hung_preflight(tmp_path):
    plan = LaunchPlan(nnodes=2, node_rank=0, master_addr="127.0.0.1", master_port=_free_port(), nproc_per_node=1)
    opts = pf.Options(device="cpu", timeout_s=60, json_path=str(tmp_path / "p.json"))
    t0 = time.monotonic()
    with pytest.raises(pf.PreflightFailed, match="did not finish within 4 s and was stopped"):
        pf.run_launch(opts, plan, wall_s=4, log=lambda line: None)
    assert time.monotonic() - t0 < HANG_BOUND_S  # a hang guard: without the bound it waits out timeout_s=60


def test_under_torchrun_directly(tmp_path):
    out = tmp_path / "pf.json"
    args = ["--nproc-per-node", "2", "-m", "components.common.preflight", "--device", "cpu", "--sizes-mb", "1"]
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", *args, "--budget-s", "0.2", "--json", str(out)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "preflight: PASSED" in run.stdout
    assert json.loads(out.read_text())["metrics"]["preflight_busbw_gbps"] > 0


def test_one_process_checks_without_all_reduce(tmp_path):
    run = _cli(["--device", "cpu", "--json", str(tmp_path / "p.json")])
    assert run.returncode == 0, run.stderr
    result = json.loads((tmp_path / "p.json").read_text())
    assert result["ok"] and result["figures"]["links"] == [] and "preflight_busbw_gbps" not in result["metrics"]


# --- train-lora ---------------------------------------------------------------------------------

FAKE_SWIFT = """#!{python}
import json, os, sys
out = sys.argv[sys.argv.index("--output_dir") + 1]
ckpt = os.path.join(out, "checkpoint-1")
os.makedirs(ckpt)
for name in ("adapter_model.safetensors", "adapter_config.json"):
    with open(os.path.join(ckpt, name), "w") as f:
        f.write("{{}}")
with open(os.path.join(out, "logging.jsonl"), "w") as f:
    f.write(json.dumps({{"loss": 1.5, "global_step/max_steps": "1/1"}}) + "\\n")
with open(os.path.join(out, "..", "swift_env.json"), "w") as f:
    json.dump({{k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_"))}}, f)
"""


def _train_inputs(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 4096}}))
    ds = tmp_path / "ds"
    ds.mkdir()
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}
    (ds / "data.jsonl").write_text(json.dumps(row) + "\n")
    return dict(
        model_dir=str(model),
        model_type="qwen3_vl",
        train_dir=str(ds),
        eval_dir="",
        swift_args={},
        adapter_out=str(tmp_path / "adapter"),
        work_dir=str(tmp_path / "work"),
        gpus=(0, 0),
        environ={},
    )


def test_train_lora_on_cpu_skips_the_preflight_and_passes_job_env_to_swift(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "swift"
    fake.write_text(FAKE_SWIFT.format(python=sys.executable))
    fake.chmod(0o755)
    monkeypatch.setattr(core, "swift_executable", lambda: str(fake))
    result = core.train_lora(**_train_inputs(tmp_path), job_env={"NCCL_DEBUG": "INFO", "NCCL_NVLS_ENABLE": 0.0})
    out = capsys.readouterr().out
    assert "train-lora: preflight skipped: no GPU on this node (CPU run)" in out
    assert not any(k.startswith("preflight_") for k in result.metrics) and result.metrics["final_loss"] == 1.5
    seen = json.loads((tmp_path / "work" / "swift_env.json").read_text())
    assert seen["NCCL_DEBUG"] == "INFO" and seen["NCCL_NVLS_ENABLE"] == "0"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"preflight": "strict"}, pf.PreflightSettingError, "preflight: 'strict' is not a preflight mode"),
        ({"job_env": {"HF_TOKEN": "x"}}, JobEnvError, r"job_env\.HF_TOKEN: .*looks like a secret"),
    ],
)
def test_train_lora_refuses_bad_preflight_settings_before_any_work(tmp_path, kwargs, error, match):
    inputs = _train_inputs(tmp_path)
    with pytest.raises(error, match=match):
        core.train_lora(**inputs, **kwargs)
    assert not (tmp_path / "work").exists()


def test_preflight_off_and_cpu_skip_need_no_torchrun(tmp_path, capsys):
    assert core.run_node_preflight(LaunchPlan(), 8, "off", work_dir=str(tmp_path)) == {}
    assert core.run_node_preflight(LaunchPlan(), 0, "fail", work_dir=str(tmp_path)) == {}
    out = capsys.readouterr().out
    assert "train-lora: preflight off" in out and "preflight skipped: no GPU on this node (CPU run)" in out


def _processes_naming(text: str) -> list[int]:
    """Live processes (not zombies) whose command line holds `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_kill_9_of_the_task_stops_the_preflight_it_started(tmp_path):
    """#41: torchrun and its workers run in a session of their own; the watchdog stops them when the task dies."""
    marker = str(tmp_path / "orphan-check.json")
    runner = (
        "import sys\n"
        "from components.common import preflight as pf\n"
        "from components.common.cluster import LaunchPlan\n"
        "plan = LaunchPlan(nnodes=2, node_rank=0, master_addr='127.0.0.1', master_port=int(sys.argv[2]), "
        "nproc_per_node=1)\n"
        "pf.run_launch(pf.Options(device='cpu', timeout_s=120, json_path=sys.argv[1]), plan, log=print)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    task = subprocess.Popen(
        [sys.executable, "-c", runner, marker, str(_free_port())],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + HANG_BOUND_S
        while len(_processes_naming(marker)) < 3:  # the task, torchrun, its worker (waiting for node 1)
            assert time.monotonic() < deadline, "the preflight's worker never started"
            time.sleep(0.2)
        os.killpg(task.pid, signal.SIGKILL)  # the task's whole group, as a killed local run
        task.wait()
        deadline = time.monotonic() + HANG_BOUND_S  # a hang guard: the watchdog stops them in ~1-6 s
        while _processes_naming(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_naming(marker) == []
    finally:
        for pid in _processes_naming(marker):
            os.kill(pid, signal.SIGKILL)
