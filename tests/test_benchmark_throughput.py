"""The FLOP count and steady-state arithmetic of benchmarks/train_throughput.py, and the wheels script it travels with."""

import json
from pathlib import Path

import pytest

from benchmarks.qwen3_vl_4b import QWEN3_VL_4B_CONFIG
from benchmarks.throughput import (
    ArchShape,
    SampleStats,
    flops_per_sample,
    losses_at,
    peak_flops_for,
    steady_state,
    utilisation,
)

ARCH = ArchShape.from_config(QWEN3_VL_4B_CONFIG)


def test_shapes_of_the_4b_architecture():
    # q 2560x4096, k/v 2560x1024, o 4096x2560, gate/up 2560x9728, down 9728x2560
    assert ARCH.lm_layer_params() == 2560 * 4096 * 2 + 2560 * 1024 * 2 + 3 * 2560 * 9728
    assert ARCH.layers * ARCH.lm_layer_params() == pytest.approx(3.633e9, rel=1e-3)
    # rank 8 on all 7 linear layers of 36 layers: 16.5 M trainable parameters
    assert ARCH.lora_params(8) == 36 * 8 * (6656 + 3584 + 3584 + 6656 + 3 * (2560 + 9728))
    assert ARCH.vit_block_params() == 4 * 1024 * 1024 + 2 * 1024 * 4096
    assert ARCH.vit_patch_in == 3 * 2 * 16 * 16 and ARCH.deepstack == 3


def test_flops_of_one_seed_sample_by_hand():
    # one 1024x1024 image: 64x64 patches = 4096, 1024 image tokens; 1221 tokens, 150 labels
    stats = SampleStats.from_samples([(1221, 150, [4096])])
    f = flops_per_sample(ARCH, stats, 8)
    lm_fwd = 2 * 36 * ARCH.lm_layer_params() * 1221
    assert f["lm_linear"] == pytest.approx(2 * lm_fwd)
    assert f["lm_attention"] == pytest.approx(3 * 2 * 36 * 32 * 128 * 1221**2)
    assert f["lm_head"] == pytest.approx(2 * 2 * 2560 * 151936 * 150)
    vit = (
        2 * 24 * ARCH.vit_block_params() * 4096
        + 4 * 24 * 1024 * 4096**2
        + 2 * 1536 * 1024 * 4096
        + 2 * 4 * (4096 * 4096 + 4096 * 2560) * 1024
    )
    assert f["vit_forward"] == pytest.approx(vit)
    assert f["model"] == pytest.approx(
        sum(f[k] for k in ("lm_linear", "lm_attention", "lm_head", "lora", "vit_forward"))
    )
    assert f["hardware"] == f["model"]
    assert 23e12 < f["model"] < 25e12  # ~23.7 TFLOP per sample
    g = flops_per_sample(ARCH, stats, 8, lm_recompute=True, vit_backward=True, vit_recompute=True)
    assert g["model"] == f["model"]
    assert g["hardware"] == pytest.approx(f["model"] + lm_fwd + f["lm_attention"] / 3 + g["vit_backward"] + vit)
    assert g["vit_backward"] > vit  # attention backward is twice its forward


def test_sample_stats_means_and_squares():
    s = SampleStats.from_samples([(10, 2, [4]), (20, 4, [4, 8])])
    assert (s.tokens, s.tokens_sq, s.labels, s.patches, s.patches_sq) == (15, 250, 3, 8, (16 + 16 + 64) / 2)
    with pytest.raises(ValueError):
        SampleStats.from_samples([])


def test_steady_state_skips_the_warm_up_steps():
    # step 1 took 10 s, then 0.5 s per step; 1000 tokens per step
    log = []
    for step in range(1, 11):
        elapsed = 10 + 0.5 * (step - 1)
        log.append(
            {
                "loss": 1.0,
                "step": step,
                "train_speed(s/it)": round(elapsed / step, 6),
                "num_input_tokens_seen": 1000 * step,
            }
        )
    log.append({"train_runtime": 14.5, "step": 10})
    s = steady_state(log, skip_steps=2)
    assert s["seconds_per_step"] == pytest.approx(0.5, abs=1e-4)
    assert s["tokens_per_second"] == pytest.approx(2000, rel=1e-3)
    assert s["steps"] == 8
    assert steady_state(log[:1]) == {}
    # entries logged twice (or out of order) count once, in step order
    assert steady_state(log[::-1] + log)["seconds_per_step"] == pytest.approx(0.5, abs=1e-4)
    assert losses_at(log, [1, 5, 99]) == {1: 1.0, 5: 1.0}


def test_steady_state_median_is_not_moved_by_a_one_off_stall():
    """As measured with torch.compile: step 5 recompiles for a new padded length (+17 s)."""
    durations = {1: 40.0, 2: 1.4, 3: 1.4, 4: 1.4, 5: 18.7, 6: 1.35, 7: 1.37, 8: 1.37}
    log, elapsed = [], 0.0
    for step in range(1, 9):
        elapsed += durations[step]
        log.append({"loss": 1.0, "step": step, "train_speed(s/it)": round(elapsed / step, 6)})
    s = steady_state(log, skip_steps=2)
    assert s["seconds_per_step"] > 3.5  # the mean carries the stall
    assert s["median_seconds_per_step"] == pytest.approx(1.4, abs=0.02)
    assert [round(x, 2) for x in s["single_steps"]] == [1.4, 1.4, 18.7, 1.35, 1.37, 1.37]  # steps 3-8, in order
    swift_shape = [{"loss": 2.5, "global_step/max_steps": "3/10", "train_speed(s/it)": 1.0}]
    assert losses_at(swift_shape, [3]) == {3: 2.5}


def test_utilisation_and_peaks():
    f = {"model": 20e12, "hardware": 30e12}
    u = utilisation(f, samples_per_second=19.78, gpus=1, peak_flops=989e12)
    assert u["mfu"] == pytest.approx(0.4, rel=1e-3) and u["hfu"] == pytest.approx(0.6, rel=1e-3)
    assert utilisation(f, 19.78, 2, 989e12)["mfu"] == pytest.approx(0.2, rel=1e-3)
    assert utilisation(f, 0.0, 1, 989e12)["mfu"] == 0.0
    assert peak_flops_for("NVIDIA H100 80GB HBM3") == 989e12
    with pytest.raises(ValueError):
        peak_flops_for("Tesla T4")


def test_profile_kernel_categories():
    from benchmarks.profile_plugin import category

    assert category("nvjet_sm90_tst_256x152_64x4_1x2_h_bz_coopA_NNT") == "gemm"
    assert category("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16") == "attention"
    assert category("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda") == "dtype_copy"
    assert category("void at::native::fused_dropout_kernel_vec<float, float>") == "dropout"
    assert (
        category("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add")
        == "elementwise_reduce"
    )
    assert category("_triton_rope") == "triton_other"


def test_any_profile_can_run_under_the_profiler():
    from benchmarks.train_throughput import PROFILES, profile_settings

    prof = profile_settings("b8_nogc_liger_allrows_prof")
    assert prof["external_plugins"] == ["PROFILE_PLUGIN"]
    assert prof["env"] == {
        "VLM_LORA_LABEL_ROWS_LOSS": "0",
        "VLM_LORA_PROFILE_START": "4",
        "VLM_LORA_PROFILE_STEPS": "4",
    }
    assert profile_settings("seed_prof") is PROFILES["seed_prof"]  # its own window
    assert "external_plugins" not in PROFILES["b8_nogc_liger_allrows"]  # the base profile is left as it is
    with pytest.raises(SystemExit, match="unknown profile 'nope_prof'"):
        profile_settings("nope_prof")
    stacked = profile_settings("b8_nogc_liger_nodrop_profstack")
    assert stacked["env"]["VLM_LORA_PROFILE_STACK"] == "1" and stacked["lora_dropout"] == 0.0
    assert "VLM_LORA_PROFILE_STACK" not in profile_settings("b8_nogc_liger_nodrop_prof")["env"]


def test_host_sync_lines_are_counted_by_source_line():
    import warnings

    from benchmarks.profile_plugin import SyncSites

    sites = SyncSites()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = sites.showwarning
        for _ in range(3):
            warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
        warnings.warn("something else", UserWarning, stacklevel=1)
    lines = dict(sites.sites)
    assert list(lines.values()) == [3]
    assert next(iter(lines)).startswith(__file__)


def test_a_wait_inside_torch_is_named_with_its_caller_outside_torch():
    import traceback

    from benchmarks.profile_plugin import SyncSites, sync_site

    venv = "/opt/torch/.venv/lib/python3.12/site-packages"  # a virtualenv under a folder named torch
    frames = [
        traceback.FrameSummary("/site/trainer.py", 10, "loop"),
        traceback.FrameSummary(f"{venv}/accelerate/operations.py", 160, "send_to_device"),
        traceback.FrameSummary(f"{venv}/torch/cuda/__init__.py", 1270, "synchronize"),
    ]
    torch_line = f"{venv}/torch/cuda/__init__.py"
    assert sync_site(torch_line, 1281, frames) == (
        f"{torch_line}:1281 <- {venv}/accelerate/operations.py:160 <- /site/trainer.py:10"
    )
    assert sync_site(torch_line, 1281, frames, callers=1) == f"{torch_line}:1281 <- {venv}/accelerate/operations.py:160"
    assert sync_site("/site/mixin.py", 1287, frames) == "/site/mixin.py:1287"  # outside torch: itself
    assert sync_site(torch_line, 5, frames[2:]) == f"{torch_line}:5"  # no caller outside torch
    sites = SyncSites()
    sites.showwarning("called a synchronizing CUDA operation", UserWarning, "/here.py", 3)
    sites.showwarning("something else", UserWarning, "/here.py", 4)
    assert dict(sites.sites) == {"/here.py:3": 1}


def test_profile_regions_split_a_micro_step():
    from benchmarks.profile_plugin import region_summary

    out = region_summary({"training_step": 3.0, "forward_and_loss": 1.2, "vision_forward": 0.3}, wall_s=4.0)
    assert out["seconds"]["backward"] == pytest.approx(1.8)
    assert out["seconds"]["between_micro_steps"] == pytest.approx(1.0)
    assert out["fraction_of_wall"]["vision_forward"] == pytest.approx(0.075)
    assert region_summary({}, 0.0) == {"seconds": {}, "fraction_of_wall": {}}


def test_idle_summary_finds_where_the_gpu_waited_and_who_launched_late():
    from benchmarks.profile_plugin import idle_summary

    def op(name, ts, dur, tid=1):
        return {"cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": tid}

    def launch(ts, corr, tid=1):
        return {
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "ts": ts,
            "dur": 2,
            "tid": tid,
            "args": {"correlation": corr},
        }

    def kernel(ts, dur, corr):
        return {"cat": "kernel", "name": f"k{corr}", "ts": ts, "dur": dur, "tid": 7, "args": {"correlation": corr}}

    events = [
        {"cat": "gpu_user_annotation", "name": "region:forward", "ts": 100, "dur": 300, "tid": 7},
        {"cat": "gpu_user_annotation", "name": "other", "ts": 100, "dur": 900, "tid": 7},
        op("aten::mm", 0, 50),
        launch(10, 1),
        op("aten::nonzero", 60, 200),
        op("aten::add", 240, 10),
        launch(245, 2),  # add is inside nonzero's span
        op("aten::mm", 300, 30),
        launch(305, 3),
        kernel(100, 100, 1),  # busy 100-200
        kernel(205, 45, 2),  # 5 us gap: counted, not a late launch
        kernel(350, 100, 3),  # 100 us gap (250-350): late, launched by aten::mm
    ]
    out = idle_summary(events)
    assert out["regions"] == {
        "forward": {"span_s": 300e-6, "kernel_s": pytest.approx(195e-6), "idle_s": pytest.approx(105e-6)}
    }
    assert out["gaps"]["<10us"] == {"count": 1, "s": pytest.approx(5e-6)}
    assert out["gaps"]["<1000us"] == {"count": 1, "s": pytest.approx(100e-6)}
    assert out["late_launches"] == [{"launched_by": "aten::mm", "gaps": 1, "s": pytest.approx(100e-6)}]
    # the innermost operator: the second kernel was launched inside aten::add, itself inside aten::nonzero
    events[-2]["ts"] = 280  # now an 80 us gap before kernel 2
    events[-1]["ts"] = 330
    late = {r["launched_by"]: r["gaps"] for r in idle_summary(events)["late_launches"]}
    assert late == {"aten::add": 1}
    assert idle_summary([op("x", 0, 1)]) == {}


def test_unprofiled_regions_less_profiled_kernel_time_is_idle():
    from benchmarks.profile_plugin import unprofiled_summary

    profiled = {
        "gpu_kernel_s": 2.0,
        "idle": {"regions": {"forward_and_loss": {"kernel_s": 1.1}, "vision_forward": {"kernel_s": 0.4}}},
    }
    regions = {"training_step": 2.2, "forward_and_loss": 1.2, "vision_forward": 0.45}
    out = unprofiled_summary(regions, 2.3, profiled)
    assert out["gpu_idle_s"]["forward_and_loss"] == pytest.approx(0.1)
    assert out["gpu_idle_s"]["vision_forward"] == pytest.approx(0.05)
    # backward 1.0 + between 0.1 against 2.0 - 1.1 = 0.9 s of kernels
    assert out["gpu_idle_s"]["backward_and_between"] == pytest.approx(0.2)
    assert out["gpu_idle_fraction"] == pytest.approx(1 - 2.0 / 2.3)


def test_long_gaps_name_the_python_code_before_them():
    from benchmarks.profile_plugin import idle_summary

    def ev(cat, name, ts, dur, tid=1, **args):
        return {"cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "args": args}

    events = [
        ev("python_function", "trainer.py(10): training_step", 0, 10000),
        ev("python_function", "torch/nn/modules/module.py(1): _call_impl", 5, 9000),
        ev("python_function", "qwen.py(1002): _deepstack_process", 10, 8000),
        ev("cpu_op", "aten::nonzero", 20, 3000),
        ev("cpu_op", "aten::index", 4000, 100),
        ev("cuda_driver", "cuLaunchKernelEx", 4050, 5, correlation=2),  # Triton-style launch, inside aten::index
        ev("cuda_runtime", "cudaLaunchKernel", 30, 5, correlation=1),
        ev("kernel", "k1", 40, 10, tid=7, correlation=1),
        ev("kernel", "k2", 4060, 10, tid=7, correlation=2),  # 4010 us after k1 ended
    ]
    out = idle_summary(events)
    assert out["late_launches"] == [{"launched_by": "aten::index", "gaps": 1, "s": pytest.approx(4010e-6)}]
    # the module-call plumbing frame is left out; innermost first
    assert out["long_gaps"] == [
        {
            "launched_at": ["aten::index", "qwen.py(1002): _deepstack_process", "trainer.py(10): training_step"],
            "gaps": 1,
            "s": pytest.approx(4010e-6),
        }
    ]
    # without stacks: the operator and the kernel that waited
    plain = idle_summary([e for e in events if e["cat"] != "python_function"])
    assert plain["long_gaps"][0]["launched_at"] == ["aten::index", "k2"]


def test_flops_are_counted_at_the_max_pixels_training_gets(tmp_path, monkeypatch):
    """The benchmark gives training ms-swift's max_pixels and counts tokens from the same, through ms-swift."""
    import json

    from PIL import Image

    from benchmarks.train_throughput import (
        PROFILES,
        RESIZE_ENV,
        check_resize_env,
        profile_args,
        sample_stats,
        seed_swift_args,
    )
    from components.validate_data.core import validate_data
    from pipelines.demo.tiny_model import ensure_tiny_model

    for name in RESIZE_ENV:
        monkeypatch.delenv(name, raising=False)
    max_pixels = 256 * 256
    swift_args = profile_args("seed", PROFILES["seed"], 16, 1, 8, seed_swift_args(max_pixels))
    assert swift_args["max_pixels"] == max_pixels  # what `swift sft` gets
    assert "max_pixels" not in seed_swift_args()  # the seed config itself sets none

    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    rows = []
    for i, size in enumerate([(64, 64), (600, 400), (1024, 1024)]):
        Image.new("RGB", size, (40 * i, 90, 200)).save(data / "images" / f"d{i}.png")
        messages = [{"role": "user", "content": "<image>find the holes"}, {"role": "assistant", "content": "none"}]
        rows.append({"messages": messages, "images": [f"images/d{i}.png"]})
    (data / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = ensure_tiny_model()

    full, full_summary = sample_stats(data, model)
    shrunk, summary = sample_stats(data, model, max_pixels=swift_args["max_pixels"])
    assert summary["max_pixels"] == max_pixels and full_summary["max_pixels"] == 0
    assert shrunk.tokens < full.tokens and shrunk.patches < full.patches  # the large images shrink
    assert shrunk.labels == full.labels
    assert summary["tokens_min"] == full_summary["tokens_min"]  # 64x64 is below max_pixels: unchanged
    # image tokens: 600x400 -> 209x313 -> 224x320 px: 70 instead of 12x19 = 228 (384x608 px);
    # 1024x1024 -> 256x256 px: 64 instead of 1024. ViT patches: 4 per token.
    assert full.tokens - shrunk.tokens == pytest.approx((228 - 70 + 1024 - 64) / 3)
    assert full.patches - shrunk.patches == pytest.approx(4 * (228 - 70 + 1024 - 64) / 3)
    assert flops_per_sample(ARCH, shrunk, 8)["model"] < flops_per_sample(ARCH, full, 8)["model"]

    # validate-data, given the same max_pixels, counts the tokens the benchmark counts
    result = validate_data(
        [str(data / "data.jsonl")], str(tmp_path / "t"), str(tmp_path / "e"), str(tmp_path / "q.jsonl"),
        model_dir=str(model), max_pixels=max_pixels,
    )  # fmt: skip
    assert sum(result.stats["token_counts"]) / 3 == pytest.approx(shrunk.tokens)

    monkeypatch.setenv("MAX_PIXELS", "1048576")  # would resize behind the count's back
    with pytest.raises(SystemExit, match="MAX_PIXELS set in the environment.*--max-pixels"):
        check_resize_env()


def test_unsloth_peer_turns_ms_swift_rows_into_its_conversations():
    from benchmarks.unsloth_peer import to_conversation

    messages = [
        {"role": "user", "content": "<image>Detect the holes of <image> these drawings."},
        {"role": "assistant", "content": '```json\n[{"label": "hole", "bbox": [1, 2, 3, 4]}]\n```'},
    ]
    conv = to_conversation(messages, ["IMG1", "IMG2"])
    assert conv[0]["content"] == [
        {"type": "image", "image": "IMG1"},
        {"type": "text", "text": "Detect the holes of "},
        {"type": "image", "image": "IMG2"},
        {"type": "text", "text": " these drawings."},
    ]
    assert conv[1] == {"role": "assistant", "content": [{"type": "text", "text": messages[1]["content"]}]}
    with pytest.raises(ValueError, match="without an <image> marker"):
        to_conversation(messages[1:], ["IMG"])
    with pytest.raises(ValueError, match="more <image> markers than images"):
        to_conversation(messages[:1], ["IMG1"])


def test_the_wheel_script_says_its_usage_and_refuses_a_folder_git_would_commit(tmp_path):
    import shutil
    import subprocess

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_wheels.sh"
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    assert done.returncode == 2 and "usage: bash benchmarks/gpu_wheels.sh swift|unsloth" in done.stderr
    # in a repository that does not ignore .whl: refused before any download
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    shutil.copy(script, tmp_path / "gpu_wheels.sh")
    done = subprocess.run(["bash", "gpu_wheels.sh", "swift"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "error: .whl is not ignored by git; add '/.whl/' to .git/info/exclude first" in done.stderr
    assert not (tmp_path / ".whl").exists()  # nothing written


def test_the_tiny_strategy_check_refuses_bad_arguments_before_any_work(tmp_path, capsys):
    from benchmarks import strategy_tiny

    with pytest.raises(SystemExit) as exc:
        strategy_tiny.main(["--out", str(tmp_path / "st"), "--steps", "0"])
    assert exc.value.code == 2 and "--steps must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        strategy_tiny.main([])
    assert "--out" in capsys.readouterr().err and not (tmp_path / "st").exists()


def test_rank_profiles_read_every_ranks_summary(tmp_path):
    """The profile plugin writes rank 0's summary to its path and rank R's beside it; the row names each rank's NCCL
    time (how long it waited at the collectives)."""
    from benchmarks.profile_plugin import rank_path
    from benchmarks.train_throughput import rank_profiles

    out = tmp_path / "p.profile.json"
    assert rank_path(str(out), 0) == str(out) and rank_path(str(out), 3) == f"{out}.rank3"
    assert rank_profiles(out, 2) == {}  # nothing written (the run failed before the window)
    for rank, nccl in ((0, 0.061), (1, 0.0123456)):
        Path(rank_path(str(out), rank)).write_text(json.dumps({"by_category_s": {"nccl": nccl, "gemm": 1.0}}))
    row = rank_profiles(out, 2)
    assert row["torch_profile"]["by_category_s"]["nccl"] == 0.061
    assert row["torch_profile_ranks"] == {1: {"by_category_s": {"nccl": 0.0123456, "gemm": 1.0}}}
    assert row["nccl_s_by_rank"] == {0: 0.061, 1: 0.0123}
    assert set(rank_profiles(out, 1)) == {"torch_profile"}  # one GPU: rank 0 only


def test_profile_runs_put_an_unreported_warm_up_first():
    from benchmarks.train_throughput import profile_runs

    a, b = "auto_liger", "auto_liger_log5"
    assert profile_runs([a, "seed"], 30, seed_steps=6) == [(a, 30, True), ("seed", 6, True)]
    assert profile_runs([a, b], 30, warmup_steps=10) == [(a, 10, False), (a, 30, True), (b, 30, True)]
    assert profile_runs([], 30, warmup_steps=10) == []
    with pytest.raises(SystemExit, match="--warmup-steps -1"):
        profile_runs([a], 30, warmup_steps=-1)


def test_a_logging_interval_that_leaves_no_measured_window_is_refused():
    from benchmarks.train_throughput import logged_in_window, profile_runs

    assert logged_in_window(5, 8) == [5] and logged_in_window(5, 30) == [5, 10, 15, 20, 25, 30]
    assert logged_in_window(1, 3) == [2, 3]
    with pytest.raises(SystemExit, match=r"profile auto_liger_log5: it logs every 5 step\(s\), so 8 steps leave 1 "):
        profile_runs(["auto_liger_log5"], 8)  # it printed 0.0 for every figure
    with pytest.raises(SystemExit, match="profile seed: it logs every 1 step"):
        profile_runs(["seed"], 30, seed_steps=2)
    with pytest.raises(SystemExit, match="unknown profile 'nope'"):
        profile_runs(["nope"], 30)
    assert profile_runs(["auto_liger_log5"], 10) == [("auto_liger_log5", 10, True)]
