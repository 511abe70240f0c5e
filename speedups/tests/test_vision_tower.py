"""The frozen vision tower in fewer kernels (speedups/vision_tower.py, vision_triton.py).

The patch embedding as one matmul, the 16-bit LayerNorms and the rotary kernel are checked against
transformers' own tower: on the CPU (the kernel under Triton's interpreter, in speedups/tests/triton_interpret_checks.py's
process) and compiled on a GPU (skipped without one), where the rotary and the norms must be bit-equal.
"""

from __future__ import annotations

import pytest
import torch

from components.train_lora.job_env import check_job_env
from speedups import vision_tower


def tiny_tower(dtype=torch.float32, seed: int = 0, device: str = "cpu"):
    from transformers import Qwen3VLVisionConfig
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    config = Qwen3VLVisionConfig(
        depth=3, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=96, deepstack_visual_indexes=[1]
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    tower = modeling_qwen3_vl.Qwen3VLVisionModel(config).to(device, dtype)
    tower.requires_grad_(False)
    return tower, config


def tower_inputs(config, dtype=torch.float32, device: str = "cpu"):
    grid = torch.tensor([[1, 8, 8], [1, 8, 12], [2, 4, 4]], device=device)
    patch = config.in_channels * config.temporal_patch_size * config.patch_size**2
    torch.manual_seed(1)
    return torch.randn(int(grid.prod(-1).sum()), patch, device=device).to(dtype), grid


def outputs(tower, pixels, grid, autocast: bool = False):
    device = pixels.device.type
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
        out = tower(pixels, grid_thw=grid)
    return [out.pooler_output, *out.deepstack_features]


def test_the_patch_embedding_as_one_matmul_equals_the_convolution():
    tower, config = tiny_tower(torch.float64)
    pixels, grid = tower_inputs(config, torch.float64)
    reference = tower.patch_embed(pixels)
    assert vision_tower.linear_patch_embed(tower) == 1
    assert vision_tower.linear_patch_embed(tower) == 0  # once
    torch.testing.assert_close(tower.patch_embed(pixels), reference, rtol=1e-12, atol=1e-12)
    assert [name for name, _ in tower.patch_embed.named_parameters()] == ["proj.weight", "proj.bias"]  # saved as before
    # the whole tower (float32): the same outputs up to the order of the sums
    tower32, _ = tiny_tower(torch.float32)
    pixels32 = pixels.float()
    before = outputs(tower32, pixels32, grid)
    vision_tower.linear_patch_embed(tower32)
    for got, want in zip(outputs(tower32, pixels32, grid), before):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_weight_partitioned_by_zero3_keeps_the_convolution():
    tower, config = tiny_tower(torch.float64)
    pixels, _ = tower_inputs(config, torch.float64)
    vision_tower.linear_patch_embed(tower)
    calls = []
    tower.patch_embed.proj.register_forward_hook(lambda *_: calls.append("conv"))
    tower.patch_embed(pixels)
    assert calls == []
    tower.patch_embed.proj.weight.ds_id = 7  # what DeepSpeed ZeRO-3 marks its partitioned parameters with
    tower.patch_embed(pixels)
    assert calls == ["conv"]  # the module's own call: DeepSpeed's hooks on it would gather the weight


def test_a_convolution_that_overlaps_or_pads_keeps_its_own_forward():
    tower, _ = tiny_tower()
    proj = tower.patch_embed.proj
    for conv in (
        torch.nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 2, 2)),  # overlapping
        torch.nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4), padding=(0, 1, 1)),
        torch.nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4), groups=1, dilation=(1, 2, 2)),
    ):
        tower.patch_embed.proj = conv
        assert vision_tower.linear_patch_embed(tower) == 0
    tower.patch_embed.proj = proj
    assert vision_tower.linear_patch_embed(tower) == 1


def test_the_norms_in_16_bits_give_what_autocast_gives_the_linear_layer():
    tower, config = tiny_tower(torch.bfloat16)
    pixels, grid = tower_inputs(config, torch.bfloat16)
    norm = tower.blocks[0].norm1
    torch.nn.init.normal_(norm.weight)
    torch.nn.init.normal_(norm.bias)
    x = (torch.randn(50, 64) * 3 + 1).bfloat16()
    # CUDA's autocast runs layer_norm in float32; the linear layer reading it rounds to bf16
    f32 = [t.float() for t in (x, norm.weight, norm.bias)]
    want = torch.nn.functional.layer_norm(f32[0], (64,), f32[1], f32[2], norm.eps).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = vision_tower.bf16_layer_norm(norm, x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert vision_tower.bf16_layer_norm(norm, x) is None  # no autocast: nothing to change
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert vision_tower.bf16_layer_norm(norm, x.float()) is None  # a float32 input keeps autocast's path
    before = outputs(tower, pixels, grid, autocast=True)
    assert vision_tower.bf16_layer_norms(tower) == 2 * 3 + 2  # two per block, one per merger (deepstack + final)
    assert vision_tower.bf16_layer_norms(tower) == 0
    for got_out, want_out in zip(outputs(tower, pixels, grid, autocast=True), before):
        torch.testing.assert_close(got_out, want_out, rtol=0, atol=0)


def test_the_rotary_wrapper_takes_the_kernel_only_where_it_applies():
    calls = []

    class Kernels:
        @staticmethod
        def usable(q, k, cos, sin):
            return q.shape[0] > 1

        @staticmethod
        def rotary(q, k, cos, sin):
            calls.append("kernel")
            return q + 1, k + 1

    def original(q, k, cos, sin):
        calls.append("transformers")
        return q, k

    fused = vision_tower.fused_rotary(original, Kernels)
    assert fused.__wrapped__ is original
    q = torch.zeros(3, 2, 4)
    assert fused(q, q, None, None)[0].eq(1).all()
    fused(q[:1], q[:1], None, None)
    assert calls == ["kernel", "transformers"]


def test_the_rotary_kernel_refuses_what_it_cannot_take():
    from speedups import vision_triton

    q, k = torch.randn(2, 5, 3, 8).unbind(0)
    cos = sin = torch.randn(5, 8)
    assert not vision_triton.usable(q, k, cos, sin)  # CPU tensors, not interpreting
    meta = [t.to("meta") for t in (q, k, cos, sin)]
    assert not vision_triton.usable(*meta)


def test_the_rotary_is_wrapped_again_before_each_forward_over_whatever_replaced_it(monkeypatch):
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    class Kernels:  # never takes the tensors here: the function it wraps runs
        @staticmethod
        def usable(q, k, cos, sin):
            return False

    own = getattr(modeling_qwen3_vl.apply_rotary_pos_emb_vision, "__wrapped__", None)
    own = own or modeling_qwen3_vl.apply_rotary_pos_emb_vision
    monkeypatch.setattr(modeling_qwen3_vl, "apply_rotary_pos_emb_vision", own)
    seen = []

    def liger_like(q, k, cos, sin):  # what transformers' Liger patch puts in place when training starts
        seen.append(q.shape[0])
        return own(q, k, cos, sin)

    tower, config = tiny_tower()
    pixels, grid = tower_inputs(config)
    assert vision_tower.rotary_before_each_forward(tower, [modeling_qwen3_vl], Kernels) == 1
    assert vision_tower.rotary_before_each_forward(tower, [modeling_qwen3_vl], Kernels) == 0  # one hook per tower
    want = outputs(tower, pixels, grid)  # nothing to wrap again: the forward's arguments untouched
    modeling_qwen3_vl.apply_rotary_pos_emb_vision = liger_like  # replaced after the plugin patched the model
    for _ in range(2):
        assert all(a.equal(b) for a, b in zip(outputs(tower, pixels, grid), want))
    assert modeling_qwen3_vl.apply_rotary_pos_emb_vision.__wrapped__ is liger_like
    assert seen == [int(grid.prod(-1).sum())] * 6  # every block of both forwards went through the wrapper to it


def test_install_reaches_only_a_qwen3_vl_vision_tower():
    from types import SimpleNamespace

    from speedups.tests.tiny_text import qwen3_vl_text_model

    modeling = SimpleNamespace(apply_rotary_pos_emb_vision=lambda q, k, cos, sin: (q, k))
    assert vision_tower.install(qwen3_vl_text_model(2), [modeling], kernels=object()) == {}
    assert not hasattr(modeling.apply_rotary_pos_emb_vision, "__wrapped__")
    tower, _ = tiny_tower()
    assert vision_tower.install(tower, [modeling], kernels=object()) == {"patch_embed": 1, "layer_norm": 8, "rotary": 1}
    assert hasattr(modeling.apply_rotary_pos_emb_vision, "__wrapped__")
    assert vision_tower.install(tower, [modeling], kernels=None) == {}  # once


def test_the_plugin_installs_it_unless_switched_off(monkeypatch):
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    from speedups import plugin

    # on a GPU the plugin wraps the modeling file's rotary: put transformers' own back afterwards
    monkeypatch.setattr(modeling_qwen3_vl, "apply_rotary_pos_emb_vision", modeling_qwen3_vl.apply_rotary_pos_emb_vision)
    tower, _ = tiny_tower()
    monkeypatch.setenv("VLM_LORA_FAST_VISION", "0")
    assert plugin.check_model(tower)[13].line() == "skipped: switch off (VLM_LORA_FAST_VISION=0)"
    assert not getattr(tower.patch_embed.forward, "_vlm_lora_linear_patch", False)
    monkeypatch.delenv("VLM_LORA_FAST_VISION")
    assert plugin.check_model(tower)[13].applied
    counts = plugin.context().state["fast_vision"]
    assert counts["patch_embed"] == 1 and counts["layer_norm"] == 8
    assert ("rotary" in counts) == torch.cuda.is_available()


@pytest.mark.parametrize(("value", "ok"), [("0", True), ("1", True), ("2", False)])
def test_the_switch_is_allowed_with_its_values(value, ok):
    if ok:
        check_job_env({"VLM_LORA_FAST_VISION": value})
    else:
        with pytest.raises(Exception, match="VLM_LORA_FAST_VISION"):
            check_job_env({"VLM_LORA_FAST_VISION": value})


def test_the_rotary_kernel_under_the_interpreter(interpreted):
    cases = interpreted["vision_rotary"]
    assert len(cases) == 12 and all(c["usable"] and c["contiguous"] for c in cases)
    for case in cases:
        if case["dtype"] == "torch.bfloat16":  # the interpreter truncates to bf16: within one unit
            assert case["ulps"] <= 1.0, case
        else:
            assert case["equal"], case


@pytest.fixture(scope="module")
def interpreted():
    pytest.importorskip("triton")
    from speedups.tests.test_lora_triton import run_interpreted

    return run_interpreted("vision")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_the_rotary_kernel_and_the_norms_are_bit_equal_gpu(monkeypatch):
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    from speedups import vision_triton
    from speedups.tests.triton_interpret_checks import vision_rotary_cases

    cases = vision_rotary_cases(vision_triton, "cuda")
    assert all(c["usable"] and c["equal"] for c in cases), [c for c in cases if not c["equal"]]
    tower, config = tiny_tower(torch.bfloat16, device="cuda")
    pixels, grid = tower_inputs(config, torch.bfloat16, "cuda")
    own = modeling_qwen3_vl.apply_rotary_pos_emb_vision
    monkeypatch.setattr(modeling_qwen3_vl, "apply_rotary_pos_emb_vision", getattr(own, "__wrapped__", own))
    before = outputs(tower, pixels, grid, autocast=True)
    assert vision_tower.rotary_before_each_forward(tower, [modeling_qwen3_vl], vision_triton) == 1
    assert vision_tower.bf16_layer_norms(tower) == 8
    for _ in range(2):  # the hook before each forward leaves the arguments alone
        after = outputs(tower, pixels, grid, autocast=True)
        assert all(a.equal(b) for a, b in zip(after, before))
    vision_tower.linear_patch_embed(tower)  # the sums in another order: close, not equal
    for got, want in zip(outputs(tower, pixels, grid, autocast=True), before):
        torch.testing.assert_close(got.float(), want.float(), rtol=0.05, atol=0.05)


def test_the_vision_benchmark_checks_its_arguments_and_says_it_needs_a_gpu(monkeypatch):
    import speedups.benchmarks.vision_forward as bench
    from speedups.tests.benchmark_cli import assert_refuses_then_needs_a_gpu

    assert_refuses_then_needs_a_gpu(
        bench.main, [["--variants", "stock,nope"], ["--size", "100"], ["--images", "0"]], monkeypatch
    )
    # the FLOPs it divides by: the tower's 24 blocks over 16 drawings of 1024² (69.75 TFLOP, as printed on the H100)
    assert bench.vision_flops(16, 1024) == pytest.approx(69.750e12, rel=1e-4)
