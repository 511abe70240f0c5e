"""Liger's fused SiLU-multiply in Qwen3-VL's MLPs (components/train_lora/swiglu.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from components.train_lora.swiglu import fuse_silu_mul, silu_mul_bytes
from tests.tiny_text import qwen3_vl_text_model


def _text_model(layers=2):
    return qwen3_vl_text_model(layers).eval()


def _lora(model):
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules=["gate_proj", "up_proj", "down_proj"])
    )
    for name, param in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.2)
    return peft_model


def test_fused_forward_equals_the_mlp_with_lora_gradients():
    calls = []

    def silu_mul(gate, up):  # the contract Liger's kernel fulfils, in plain torch
        calls.append(gate.shape)
        return F.silu(gate) * up

    reference = _lora(_text_model())
    fused = _lora(_text_model())
    fused.load_state_dict(reference.state_dict())
    assert fuse_silu_mul(fused, silu_mul) == 2
    assert fuse_silu_mul(fused, silu_mul) == 0  # already fused: left as it is

    ids = torch.randint(0, 64, (2, 7))
    outs, grads = [], []
    for model in (reference, fused):
        model.zero_grad()
        out = model(input_ids=ids).last_hidden_state
        out.pow(2).mean().backward()
        outs.append(out)
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert len(calls) == 2  # one fused product per layer
    assert torch.allclose(outs[0], outs[1], atol=1e-6)
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) == 12  # A and B of gate / up / down x 2 layers
    for name, grad in grads[0].items():
        assert torch.allclose(grads[1][name], grad, atol=1e-6), name


def test_only_silu_mlps_of_known_classes_are_fused():
    model = _text_model(layers=1)
    mlp = model.layers[0].mlp
    mlp.act_fn = torch.nn.GELU()
    assert fuse_silu_mul(model, lambda a, b: a * b) == 0  # another activation: untouched

    class OtherMLP(torch.nn.Module):
        act_fn = torch.nn.SiLU()

    assert fuse_silu_mul(OtherMLP(), lambda a, b: a * b) == 0


def test_silu_mul_bytes_for_the_planner():
    config = {"text_config": {"hidden_size": 2560, "intermediate_size": 9728, "hidden_act": "silu"}}
    assert silu_mul_bytes(config) == pytest.approx(7.6)
    assert silu_mul_bytes({"hidden_size": 2560, "intermediate_size": 9728, "hidden_act": "gelu"}) == 0.0
    assert silu_mul_bytes({"hidden_size": 2560}) == 0.0


def test_wanted_only_with_liger_on_and_the_layers_not_compiled(monkeypatch):
    from components.train_lora.swift_plugin import wants_liger_swiglu

    liger = SimpleNamespace(use_liger_kernel=True, liger_kernel_config=None)
    assert wants_liger_swiglu(liger, compile_language=False)
    assert not wants_liger_swiglu(liger, compile_language=True)
    assert not wants_liger_swiglu(SimpleNamespace(use_liger_kernel=False), compile_language=False)
    assert not wants_liger_swiglu(None, compile_language=False)
    off = SimpleNamespace(use_liger_kernel=True, liger_kernel_config={"swiglu": False})
    assert not wants_liger_swiglu(off, compile_language=False)
    monkeypatch.setenv("VLM_LORA_LIGER_SWIGLU", "0")
    assert not wants_liger_swiglu(liger, compile_language=False)


def test_the_task_plans_for_it_only_where_the_plugin_applies_it():
    from components.train_lora.core import _fused_silu_mul

    qwen3_vl = {"model_type": "qwen3_vl", "text_config": {"model_type": "qwen3_vl_text"}}
    liger = {"use_liger_kernel": True}
    assert _fused_silu_mul(liger, {}, qwen3_vl)
    assert not _fused_silu_mul({}, {}, qwen3_vl)  # no Liger
    assert not _fused_silu_mul(liger, {}, {"model_type": "qwen3_vl_moe"})  # experts, not this MLP
    assert not _fused_silu_mul(liger, {"VLM_LORA_LIGER_SWIGLU": "0"}, qwen3_vl)
    assert not _fused_silu_mul(liger, {"VLM_LORA_COMPILE_LAYERS": "1"}, qwen3_vl)


def test_plan_sizes_without_the_silu_output():
    from components.train_lora._plan import GIB, plan_for_run

    config = {
        "text_config": {
            "num_hidden_layers": 36,
            "hidden_size": 2560,
            "intermediate_size": 9728,
            "vocab_size": 151936,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
        }
    }
    stats = {"max_tokens": 1221, "p95_tokens": 1221, "mean_tokens": 1207.0, "rows": 136}
    args = {"per_device_train_batch_size": "auto", "gradient_checkpointing": "auto", "use_liger_kernel": True}
    peaks = [
        plan_for_run(
            args,
            model_config=config,
            weight_bytes=8_880_000_000,
            token_stats=stats,
            gpu_bytes=int(79.1 * GIB),
            world_size=1,
            fused_silu_mul=fused,
        ).peak_bytes
        / GIB
        for fused in (False, True)
    ]
    assert peaks[0] - peaks[1] == pytest.approx(7.6 * 8 * 1221 * 36 * 2560 / GIB, rel=1e-3)  # 6.4 GiB


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_liger_product_keeps_less_and_matches_gpu():
    pytest.importorskip("liger_kernel")
    from components.train_lora.swift_plugin import _liger_silu_mul

    silu_mul = _liger_silu_mul()
    torch.manual_seed(0)
    gate = torch.randn(8, 1200, 9728, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    up = torch.randn_like(gate, requires_grad=True)
    results = []
    saved: list[int] = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    for fn in (lambda a, b: F.silu(a) * b, silu_mul):
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = fn(gate, up)
        grads = torch.autograd.grad(out.float().pow(2).mean(), (gate, up))
        results.append((out.float(), [g.float() for g in grads], sum(saved)))
    (out_ref, grads_ref, saved_ref), (out_fused, grads_fused, saved_fused) = results
    assert saved_fused <= saved_ref - gate.numel() * 2  # no SiLU output kept (one bf16 intermediate less)
    assert (out_fused - out_ref).abs().max().item() <= 0.02 * out_ref.abs().max().item()
    for g_fused, g_ref in zip(grads_fused, grads_ref):
        assert (g_fused - g_ref).abs().max().item() <= 0.02 * g_ref.abs().max().item()
