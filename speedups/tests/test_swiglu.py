"""Liger's fused SiLU-multiply in Qwen3-VL's MLPs (speedups/swiglu.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from speedups.model_config import silu_mul_bytes
from speedups.swiglu import fuse_silu_mul
from speedups.tests.peft_routing import routed
from speedups.tests.tiny_text import qwen3_vl_text_model


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


def test_wanted_only_with_liger_on_and_its_swiglu_not_turned_off(monkeypatch):
    from speedups.swiglu import wants_liger_swiglu

    liger = SimpleNamespace(use_liger_kernel=True, liger_kernel_config=None)
    assert wants_liger_swiglu(liger)
    assert not wants_liger_swiglu(SimpleNamespace(use_liger_kernel=False))
    assert not wants_liger_swiglu(None)
    off = SimpleNamespace(use_liger_kernel=True, liger_kernel_config={"swiglu": False})
    assert not wants_liger_swiglu(off)
    monkeypatch.setenv("VLM_LORA_LIGER_SWIGLU", "0")
    assert not wants_liger_swiglu(liger)


def test_the_task_plans_for_it_only_where_the_plugin_applies_it(monkeypatch):
    from speedups import registry, versions

    real = registry.installed_version  # Liger as the training image has it (this CPU install has none)
    monkeypatch.setattr(versions, "installed_version", lambda d: "0.8.5" if d == "liger-kernel" else real(d))

    def _fused_silu_mul(args, env, config):  # item 8 applied or not, as the planner sees it
        return registry.planned(env, 1, args, config, gpu=False).memory_flags()["fused_silu_mul"]

    qwen3_vl = {"model_type": "qwen3_vl", "text_config": {"model_type": "qwen3_vl_text"}}
    liger = {"use_liger_kernel": True}
    assert _fused_silu_mul(liger, {}, qwen3_vl)
    assert not _fused_silu_mul({}, {}, qwen3_vl)  # no Liger
    assert not _fused_silu_mul(liger, {}, {"model_type": "qwen3_vl_moe"})  # experts, not this MLP
    assert not _fused_silu_mul(liger, {"VLM_LORA_LIGER_SWIGLU": "0"}, qwen3_vl)
    monkeypatch.setattr(versions, "installed_version", lambda d: "0.9.0" if d == "liger-kernel" else real(d))
    assert not _fused_silu_mul(liger, {}, qwen3_vl)  # a Liger outside the verified range: the item is skipped


def test_plan_sizes_without_the_silu_output():
    from components.train_lora._plan import GIB
    from components.train_lora._plan_run import plan_for_run

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
    from speedups.swiglu import liger_silu_mul

    silu_mul, kernels = liger_silu_mul()
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
    # the kernels the down projection calls (forward, then the backward into gate and up) against PyTorch's
    from speedups.lora_functions import TorchSiluMul

    a, b = gate.detach().view(-1, 9728), up.detach().view(-1, 9728)
    dc = torch.randn_like(a)
    assert torch.allclose(kernels.forward(a, b).float(), TorchSiluMul.forward(a, b).float(), atol=0.02, rtol=0.02)
    expected = [t.float() for t in TorchSiluMul.backward(a, b, dc)]
    got = [t.float() for t in kernels.backward(a.clone(), b.clone(), dc)]
    for g, e in zip(got, expected):
        assert (g - e).abs().max().item() <= 0.02 * e.abs().max().item()


class _SavingSiluMul(torch.autograd.Function):
    """A SiLU-multiply that keeps gate and up only, as Liger's does (the reference for the down projection)."""

    @staticmethod
    def forward(ctx, gate, up):
        from speedups.lora_functions import TorchSiluMul

        ctx.save_for_backward(gate, up)
        return TorchSiluMul.forward(gate, up)

    @staticmethod
    def backward(ctx, grad_c):  # autograd's own derivative of F.silu(gate) * up
        gate, up = (t.detach().requires_grad_() for t in ctx.saved_tensors)
        with torch.enable_grad():
            return torch.autograd.grad(F.silu(gate) * up, (gate, up), grad_c)


def _saved_bytes(run):
    """Bytes of the distinct storages autograd keeps for the backward while `run()` builds the graph."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    return out, sum(storages.values())


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_down_projection_keeps_no_product_and_trains_the_same(dropout):
    """`silu_mul_lora`: the same output and every LoRA gradient as down(silu_mul(gate, up)) through the LoRA
    function, the same masks from the same seed; autograd keeps one product's bytes less per MLP."""
    import functools

    from speedups import fused_lora, lora_functions

    def model():
        torch.manual_seed(0)
        m = _lora(_text_model())
        for module in m.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = dropout
        return m.train()

    reference, fused = model(), model()
    fused.load_state_dict(reference.state_dict())
    assert fuse_silu_mul(reference, _SavingSiluMul.apply) == 2
    down = functools.partial(fused_lora.silu_mul_lora, silu_mul=lora_functions.TorchSiluMul)
    assert fuse_silu_mul(fused, _SavingSiluMul.apply, down) == 2
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    results = []
    for m in (reference, fused):
        # every LoRA layer through the LoRA function (the reference's down projection too: same masks, same arithmetic)
        with routed(True):
            torch.manual_seed(5)
            out, kept = _saved_bytes(lambda m=m: m(input_ids=ids).last_hidden_state)
            out.pow(2).mean().backward()
        grads = {n: p.grad for n, p in m.named_parameters() if p.grad is not None}
        results.append((out, kept, grads))
    (out0, kept0, grads0), (out1, kept1, grads1) = results
    assert torch.allclose(out0, out1, atol=1e-6)
    assert grads0.keys() == grads1.keys() and len(grads0) == 12
    for name, grad in grads0.items():
        assert torch.allclose(grads1[name], grad, atol=1e-6), name
    config = reference.base_model.model.config
    product = 2 * 9 * config.intermediate_size * 4  # one float32 product of 2 x 9 tokens
    assert kept0 - kept1 == config.num_hidden_layers * product == 2 * product


def test_down_projection_not_taken_where_it_is_not_plain_lora(monkeypatch):
    from speedups import fused_lora, lora_functions, lora_switches

    m = _lora(_text_model(layers=1)).train()
    mlp = m.base_model.model.layers[0].mlp
    gate = torch.randn(1, 3, mlp.down_proj.in_features, requires_grad=True)
    up = torch.randn_like(gate)
    assert fused_lora.silu_mul_lora(mlp.down_proj, gate, up, lora_functions.TorchSiluMul) is not None
    assert fused_lora.silu_mul_lora(mlp.down_proj, gate, up[..., :-1], lora_functions.TorchSiluMul) is None
    with torch.no_grad():  # inference: peft's forward
        assert fused_lora.silu_mul_lora(mlp.down_proj, gate, up, lora_functions.TorchSiluMul) is None
    mlp.down_proj.base_layer.weight.requires_grad_(True)  # a base that trains: not frozen
    assert fused_lora.silu_mul_lora(mlp.down_proj, gate, up, lora_functions.TorchSiluMul) is None
    mlp.down_proj.base_layer.weight.requires_grad_(False)
    monkeypatch.setattr(lora_switches, "SILU_MUL_DOWN", False)
    assert fused_lora.silu_mul_lora(mlp.down_proj, gate, up, lora_functions.TorchSiluMul) is None
    # a down projection without LoRA (not among the targets): the MLP runs the product and the plain layer
    monkeypatch.setattr(lora_switches, "SILU_MUL_DOWN", True)
    from peft import LoraConfig, get_peft_model

    only_gate_up = get_peft_model(_text_model(layers=1), LoraConfig(r=4, target_modules=["gate_proj", "up_proj"]))
    down = only_gate_up.base_model.model.layers[0].mlp.down_proj
    assert type(down) is torch.nn.Linear
    assert fused_lora.silu_mul_lora(down, gate, up, lora_functions.TorchSiluMul) is None
    import functools

    wrapped = functools.partial(fused_lora.silu_mul_lora, silu_mul=lora_functions.TorchSiluMul)
    assert fuse_silu_mul(only_gate_up, lambda a, b: F.silu(a) * b, wrapped) == 1
    only_gate_up.train()(input_ids=torch.randint(0, 64, (1, 5))).last_hidden_state.sum().backward()


def test_plan_sizes_without_the_product_where_the_down_projection_recomputes_it():
    from components.train_lora._plan import GIB
    from components.train_lora._plan_run import plan_for_run
    from speedups.registry import planned

    def _silu_mul_down(args, env):
        return planned(env, 1, args, {}, gpu=False).silu_mul_down

    assert _silu_mul_down({}, {})  # ms-swift's default targets: all-linear
    assert _silu_mul_down({"target_modules": ["q_proj", "down_proj"]}, {})
    assert not _silu_mul_down({"target_modules": ["q_proj", "v_proj"]}, {})  # no LoRA on the down projection
    assert not _silu_mul_down({}, {"VLM_LORA_SILU_MUL_DOWN": "0"})
    config = {
        "text_config": {
            "num_hidden_layers": 36, "hidden_size": 2560, "intermediate_size": 9728, "vocab_size": 151936,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        }
    }  # fmt: skip
    stats = {"max_tokens": 1221, "p95_tokens": 1221, "mean_tokens": 1207.0, "rows": 136}
    args = {"per_device_train_batch_size": "auto", "gradient_checkpointing": "auto", "use_liger_kernel": True}

    def plan(down, fused_lora=True, **extra):
        return plan_for_run(
            {**args, **extra}, model_config=config, weight_bytes=8_880_000_000, token_stats=stats,
            gpu_bytes=int(79.1 * GIB), world_size=1, fused_lora=fused_lora, fused_silu_mul=True, silu_mul_down=down,
        )  # fmt: skip

    assert plan(False).micro_batch == plan(True).micro_batch == 8  # with the seed's dropout: 8 x 2 either way
    assert (plan(False).peak_bytes - plan(True).peak_bytes) / GIB == pytest.approx(
        7.6 * 8 * 1221 * 36 * 2560 / GIB, rel=1e-3
    )
    assert plan(True, fused_lora=False).peak_bytes == plan(False, fused_lora=False).peak_bytes  # peft's forward
    no_dropout = plan(True, lora_dropout=0)
    assert (no_dropout.micro_batch, no_dropout.grad_accum, no_dropout.gradient_checkpointing) == (16, 1, False)
    assert plan(False, lora_dropout=0).micro_batch == 8  # with the product kept 16 rows do not fit an H100
