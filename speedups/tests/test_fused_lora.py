"""The fused LoRA branch (speedups/fused_lora.py) against peft's own forward."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model
from peft.tuners.lora.layer import Linear as LoraLinear

from speedups import fused_lora, lora_cast_cache, lora_functions, lora_lean, lora_switches
from speedups.tests.peft_routing import peft_forward as _peft_forward
from speedups.tests.peft_routing import routed


class Block(torch.nn.Module):
    """q / k / v read one input (as in attention), o reads their sum."""

    def __init__(self, d=24, d_out=40):
        super().__init__()
        self.q = torch.nn.Linear(d, d_out, bias=False)
        self.k = torch.nn.Linear(d, d_out, bias=False)
        self.v = torch.nn.Linear(d, d_out, bias=False)
        self.o = torch.nn.Linear(d_out, d, bias=False)

    def forward(self, x):
        return self.o(torch.tanh(self.q(x) + self.k(x) * self.v(x)))


def _models(dropout=0.0, **config):
    torch.manual_seed(0)
    base = Block()
    config = {"r": 4, "lora_alpha": 8, "target_modules": ["q", "k", "v", "o"], "lora_dropout": dropout, **config}
    peft_model = get_peft_model(base, LoraConfig(**config))
    for name, param in peft_model.named_parameters():
        if "lora_B" in name:  # non-zero B, else every gradient but B's is zero
            torch.nn.init.normal_(param, std=0.2)
    return peft_model, copy.deepcopy(peft_model)


def _run(model, x, fused: bool, seed=1):
    with routed(fused):
        torch.manual_seed(seed)
        x = x.clone().requires_grad_(True)
        out = model(x)
        out.square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), x.grad, grads


@pytest.fixture(params=[True, False], ids=["layer-in-function", "layer-apart"])
def fused_base(request, monkeypatch):
    """Both plain-LoRA functions: the frozen Linear inside (`_LoraLinear`) or before it (`_LoraDelta`)."""
    monkeypatch.setattr(lora_switches, "FUSED_BASE", request.param)
    return request.param


def _function_node(fused_base: bool) -> str:
    return "_LoraLinearBackward" if fused_base else "_LoraDeltaBackward"


def _close(a, b, **tol):
    torch.testing.assert_close(a, b, **tol)


def test_without_dropout_equals_peft_outputs_and_every_gradient(fused_base):
    peft_model, fused_model = _models()
    x = torch.randn(3, 7, 24)
    out_p, gx_p, g_p = _run(peft_model, x, fused=False)
    out_f, gx_f, g_f = _run(fused_model, x, fused=True)
    assert set(g_p) == set(g_f) and len(g_p) == 8  # A and B of q, k, v, o
    _close(out_f, out_p, rtol=1e-5, atol=1e-6)
    _close(gx_f, gx_p, rtol=1e-5, atol=1e-6)
    for name in g_p:
        assert g_f[name].dtype == torch.float32
        _close(g_f[name], g_p[name], rtol=1e-5, atol=1e-6)


def _reference_branch(x, base_w, a, b, scaling, p, seed, bias=None):
    """The plain autograd graph peft builds, with the dropout kernel the fused path uses."""
    torch.manual_seed(seed)
    dropped, _ = torch.native_dropout(x, p, True)
    base = x @ base_w.t() if bias is None else x @ base_w.t() + bias
    return base + (dropped @ a.t()) @ b.t() * scaling


def test_with_dropout_equals_the_plain_graph_with_the_same_masks(fused_base):
    torch.manual_seed(3)
    x = torch.randn(5, 6, 16, requires_grad=True)
    base_w = torch.randn(12, 16)
    a = torch.randn(4, 16, requires_grad=True)
    b = torch.randn(12, 4, requires_grad=True)
    bias = torch.randn(12) if fused_base else None
    ref = _reference_branch(x, base_w, a, b, 2.0, 0.3, seed=9, bias=bias)
    ref.square().sum().backward()
    ref_grads = [t.grad.clone() for t in (x, a, b)]
    for t in (x, a, b):
        t.grad = None
    torch.manual_seed(9)
    if fused_base:  # the frozen layer (with a bias) inside the function
        out = lora_functions._LoraLinear.apply(x, base_w, bias, a, b, 2.0, 0.3, torch.float32)
    else:
        out = lora_functions.lora_delta(x, x @ base_w.t(), a, b, 2.0, 0.3)
    out.square().sum().backward()
    _close(out, ref, rtol=1e-5, atol=1e-5)
    for got, want in zip((x.grad, a.grad, b.grad), ref_grads):
        _close(got, want, rtol=1e-5, atol=1e-5)
    # the masks really dropped something, and the same elements in both runs
    torch.manual_seed(9)
    _, mask = torch.native_dropout(x.detach(), 0.3, True)
    assert 0.5 < mask.float().mean() < 0.9


def test_dropout_in_eval_mode_is_off_and_training_mode_drops(fused_base):
    peft_model, fused_model = _models(dropout=0.5)
    x = torch.randn(2, 5, 24)
    fused_model.eval()
    peft_model.eval()
    out_p, _, g_p = _run(peft_model, x, fused=False)
    out_f, _, g_f = _run(fused_model, x, fused=True)
    _close(out_f, out_p, rtol=1e-5, atol=1e-6)
    fused_model.train()
    out_t, _, _ = _run(fused_model, x, fused=True)
    assert not torch.allclose(out_t, out_f)  # half the LoRA inputs dropped


def _rel_err(got, want):
    return float((got.float() - want.float()).norm() / want.float().norm())


def test_bf16_autocast_is_as_close_to_float32_as_peft(fused_base):
    peft_model, fused_model = _models()
    exact_model = copy.deepcopy(peft_model)
    x = torch.randn(4, 9, 24)
    out_x, _, g_x = _run(exact_model, x, fused=False)  # float32 throughout: the truth
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_p, _, g_p = _run(peft_model, x, fused=False)
        out_f, _, g_f = _run(fused_model, x, fused=True)
    assert out_f.dtype == out_p.dtype == torch.bfloat16
    assert _rel_err(out_f, out_x) <= 1.5 * _rel_err(out_p, out_x) + 1e-3
    for name in g_x:
        assert g_f[name].dtype == torch.float32  # master weights' gradients stay float32
        assert _rel_err(g_f[name], g_x[name]) <= 1.5 * _rel_err(g_p[name], g_x[name]) + 1e-3, name
        assert _rel_err(g_f[name], g_x[name]) < 0.03, name


def _grad_fn_names(model, x) -> set[str]:
    original = LoraLinear.forward
    LoraLinear.forward = lambda self, inp, *a, **k: fused_lora.fused_forward(self, inp, *a, **k)
    try:
        out = model.base_model.model.q(x)
    finally:
        LoraLinear.forward = original
    return {type(out.grad_fn).__name__, *(type(f).__name__ for f, _ in out.grad_fn.next_functions if f)}


def test_lean_path_without_dropout_equals_the_function_and_uses_autograds_nodes(monkeypatch, fused_base):
    """Without dropout, under autocast: autograd's own nodes (no Python backward), same values."""
    peft_model, fused_model = _models()
    lean_model = copy.deepcopy(fused_model)
    x = torch.randn(4, 9, 24)
    monkeypatch.setattr(lora_switches, "LEAN", False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_f, gx_f, g_f = _run(fused_model, x, fused=True)
        assert _function_node(fused_base) in _grad_fn_names(fused_model, x)  # the Python function
    monkeypatch.setattr(lora_switches, "LEAN", True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_l, gx_l, g_l = _run(lean_model, x, fused=True)
        assert "AddmmBackward0" in _grad_fn_names(lean_model, x)
        out_p, gx_p, g_p = _run(peft_model, x, fused=False)
    assert out_l.dtype == torch.bfloat16 and set(g_l) == set(g_f) and len(g_l) == 8
    _close(out_l, out_f, rtol=1e-2, atol=1e-2)
    _close(gx_l.float(), gx_f.float(), rtol=2e-2, atol=2e-2)
    for name in g_f:
        assert g_l[name].dtype == torch.float32
        # bf16 products either way: as close to each other as to peft's own graph
        assert _rel_err(g_l[name], g_f[name]) <= max(2 * _rel_err(g_p[name], g_f[name]), 1e-2), name
    # with dropout, or without autocast, the function as before
    drop_model, _ = _models(dropout=0.1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert "AddmmBackward0" not in _grad_fn_names(drop_model, x)
    assert "AddmmBackward0" not in _grad_fn_names(lean_model, x)


def _saved_bytes(model, x, fused: bool) -> int:
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    original = LoraLinear.forward
    LoraLinear.forward = _peft_forward()
    if fused:
        LoraLinear.forward = lambda self, inp, *a, **k: fused_lora.fused_forward(self, inp, *a, **k)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(x.clone().requires_grad_(True)).sum()
    finally:
        LoraLinear.forward = original
    return sum(seen.values())


def test_keeps_less_for_backward_when_layers_share_their_input(fused_base):
    peft_model, fused_model = _models(dropout=0.1)
    x = torch.randn(8, 64, 24)
    peft_bytes = _saved_bytes(peft_model, x, fused=False)
    fused_bytes = _saved_bytes(fused_model, x, fused=True)
    # peft keeps a dropped-out copy of the shared input per q / k / v; the fused path one input
    assert fused_bytes < 0.8 * peft_bytes, (fused_bytes, peft_bytes)


@pytest.mark.parametrize(
    "config",
    [{"use_dora": True}, {"lora_bias": True}],
    ids=["dora", "lora_bias"],
)
def test_other_lora_kinds_stay_on_peft(config):
    peft_model, _ = _models(**config)
    layer = peft_model.base_model.model.q
    assert fused_lora.fused_forward(layer, torch.randn(2, 24)) is None


def test_no_grad_several_adapters_and_zero3_stay_on_peft():
    peft_model, _ = _models()
    layer = peft_model.base_model.model.q
    x = torch.randn(2, 24)
    with torch.no_grad():
        assert fused_lora.fused_forward(layer, x) is None
    assert fused_lora.fused_forward(layer, x) is not None
    layer.lora_A["default"].weight.ds_id = 7  # what DeepSpeed ZeRO-3 puts on partitioned parameters
    assert fused_lora.fused_forward(layer, x) is None
    del layer.lora_A["default"].weight.ds_id
    hook = layer.lora_A["default"].register_forward_hook(lambda *a: None)
    assert fused_lora.fused_forward(layer, x) is None
    hook.remove()
    peft_model.add_adapter("second", LoraConfig(r=2, target_modules=["q"]))
    layer.set_adapter(["default", "second"])
    assert fused_lora.fused_forward(layer, x) is None


def test_the_plugin_routes_peft_through_the_fused_branch(monkeypatch, fused_base):
    from speedups import swift_plugin

    assert not swift_plugin.CONTEXT.loaded[3].skipped  # the fused_base fixture set FUSED_BASE on the one copy
    assert getattr(LoraLinear.forward, "_vlm_lora_fused", False)
    assert _peft_forward() is not LoraLinear.forward
    peft_model, _ = _models()
    out = peft_model.base_model.model.q(torch.randn(2, 24, requires_grad=True))
    assert type(out.grad_fn).__name__ == _function_node(fused_base)
    with torch.no_grad():  # inference: peft's own forward
        assert peft_model.base_model.model.q(torch.randn(2, 24)).grad_fn is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_the_same_dropout_masks_as_peft_under_bf16_autocast(monkeypatch):
    """On CUDA nn.Dropout runs the same native_dropout kernel: the same masks from the same seed (with the seeded
    masks turned off; they are checked against autograd in speedups/tests/test_lora_triton.py)."""
    from speedups import swift_plugin

    monkeypatch.setattr(lora_switches, "SEEDED", False)
    assert not swift_plugin.CONTEXT.loaded[2].skipped  # peft's dropout runs on the bf16 input, as in training
    torch.manual_seed(0)
    block = Block(d=256, d_out=512).cuda()
    config = LoraConfig(r=8, lora_alpha=32, target_modules=["q", "k", "v", "o"], lora_dropout=0.1)
    peft_model = get_peft_model(block, config)
    for name, param in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    fused_model = copy.deepcopy(peft_model)
    other_masks = copy.deepcopy(peft_model)
    x = torch.randn(4, 300, 256, device="cuda", dtype=torch.bfloat16)  # hidden states of a bf16 model
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out_p, gx_p, g_p = _run(peft_model, x, fused=False)
        out_f, gx_f, g_f = _run(fused_model, x, fused=True)
        out_o, _, g_o = _run(other_masks, x, fused=True, seed=2)  # another seed: other masks
    masks_matter = _rel_err(out_o, out_p)
    assert masks_matter > 0.05  # dropout changes the output this much ...
    assert _rel_err(out_f, out_p) < 0.01 < masks_matter  # ... and the fused path is peft's up to rounding
    assert _rel_err(gx_f, gx_p) < 0.01
    for name in g_p:
        assert g_f[name].dtype == torch.float32
        assert _rel_err(g_f[name], g_p[name]) < 0.02 < _rel_err(g_o[name], g_p[name]), name


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    """The aten operators a forward runs, by name."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


def _text_lora(dropout=0.0):
    from speedups.tests.tiny_text import qwen3_vl_text_model

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(
        qwen3_vl_text_model(2), LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=targets)
    )
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.2)
    return model


def _text_run(model, ids, autocast=True, ops=None):
    original = LoraLinear.forward
    peft_forward = _peft_forward()

    def forward(self, inp, *args, **kwargs):
        out = fused_lora.fused_forward(self, inp, *args, **kwargs)
        return peft_forward(self, inp, *args, **kwargs) if out is None else out

    LoraLinear.forward = forward
    try:
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            if ops is not None:
                with ops:
                    out = model(input_ids=ids).last_hidden_state
            else:
                out = model(input_ids=ids).last_hidden_state
        out.float().square().mean().backward()
    finally:
        LoraLinear.forward = original
    return out.detach().float(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _matmuls(names: list[str]) -> int:
    return sum(n.split(".")[0] in ("mm", "addmm", "addmm_", "bmm") for n in names)


def test_layers_that_read_one_input_share_one_rank_r_matmul_and_train_the_same(monkeypatch):
    monkeypatch.setattr(lora_switches, "LEAN", True)
    monkeypatch.setattr(lora_switches, "GROUP", True)
    alone = _text_lora()
    grouped, exact = copy.deepcopy(alone), copy.deepcopy(alone)
    assert lora_lean.group_shared_inputs(grouped) == 4  # q/k/v and gate/up in each of 2 layers
    assert lora_lean.group_shared_inputs(grouped) == 0  # once
    ids = torch.randint(0, 64, (2, 7))
    ops_alone, ops_grouped = _Ops(), _Ops()
    out_a, g_a = _text_run(alone, ids, ops=ops_alone)
    out_g, g_g = _text_run(grouped, ids, ops=ops_grouped)
    out_x, g_x = _text_run(exact, ids, autocast=False)  # float32 throughout: the truth
    # per layer: q/k/v's three A products become one, gate/up's two one
    assert _matmuls(ops_alone.names) - _matmuls(ops_grouped.names) == 2 * 3
    torch.testing.assert_close(out_g, out_a, rtol=0, atol=0)  # the same bf16 products forward
    assert set(g_g) == set(g_a) and len(g_g) == 28
    for name in g_x:  # backward sums in another order: as close to float32 as one matmul per layer
        assert _rel_err(g_g[name], g_x[name]) <= 1.5 * _rel_err(g_a[name], g_x[name]) + 2e-3, name
    groups = {
        id(m._vlm_lora_shared_input): m._vlm_lora_shared_input
        for m in grouped.modules()
        if hasattr(m, "_vlm_lora_shared_input")
    }
    assert all(g.enabled and g.slices == {} and g.x is None for g in groups.values())  # nothing held after


class Apart(torch.nn.Module):
    """q_proj and k_proj named like attention's, but fed different inputs."""

    def __init__(self, d=16):
        super().__init__()
        self.q_proj = torch.nn.Linear(d, d, bias=False)
        self.k_proj = torch.nn.Linear(d, d, bias=False)

    def forward(self, x):
        return self.k_proj(torch.tanh(self.q_proj(x)))


def test_a_group_whose_layers_read_different_inputs_turns_itself_off(monkeypatch):
    monkeypatch.setattr(lora_switches, "LEAN", True)
    monkeypatch.setattr(lora_switches, "GROUP", True)
    torch.manual_seed(0)
    alone = get_peft_model(Apart(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj"]))
    for name, param in alone.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.2)
    grouped = copy.deepcopy(alone)
    assert lora_lean.group_shared_inputs(grouped) == 1
    x = torch.randn(3, 5, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_a, _, g_a = _run(alone, x, fused=True)
        out_g, _, g_g = _run(grouped, x, fused=True)
    group = grouped.base_model.model.q_proj._vlm_lora_shared_input
    assert not group.enabled and group.slices == {}
    torch.testing.assert_close(out_g, out_a, rtol=0, atol=0)
    for name in g_a:
        torch.testing.assert_close(g_g[name], g_a[name], rtol=0, atol=0)


@pytest.mark.parametrize(("dropout", "autocast"), [(0.0, True), (0.1, True), (0.1, False)])
def test_the_lora_product_is_added_into_the_layers_output_without_copying_it(monkeypatch, dropout, autocast):
    """An out-of-place addmm copies the frozen layer's output first; the branch adds into it in place."""
    monkeypatch.setattr(lora_switches, "FUSED_BASE", False)  # with the frozen layer inside, always in place
    runs = {}
    for inplace in (True, False):
        monkeypatch.setattr(lora_switches, "INPLACE", inplace)
        model = _text_lora(dropout)
        model.train()
        ops = _Ops()
        torch.manual_seed(3)
        runs[inplace] = (
            *_text_run(
                model,
                torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1)),
                autocast=autocast,
                ops=ops,
            ),
            ops.names,
        )
    names_in, names_out = runs[True][2], runs[False][2]
    assert names_in.count("addmm_.default") == 14 and "addmm.default" not in names_in  # 7 layers x 2
    assert names_out.count("addmm.default") == 14 and "addmm_.default" not in names_out
    # the same arithmetic: equal outputs and gradients
    torch.testing.assert_close(runs[True][0], runs[False][0], rtol=0, atol=0)
    for name, grad in runs[False][1].items():
        torch.testing.assert_close(runs[True][1][name], grad, rtol=1e-6, atol=1e-7)


def test_a_base_layer_someone_else_holds_the_output_of_is_not_added_into(monkeypatch):
    """With a hook on the frozen layer (it may keep the output), the product goes into a new tensor."""
    monkeypatch.setattr(lora_switches, "INPLACE", True)
    _, model = _models(dropout=0.1)
    kept = []
    base_layer = model.base_model.model.q.base_layer
    base_layer.register_forward_hook(lambda module, args, out: kept.append((out, out.clone())))
    ops = _Ops()
    with ops:
        _run(model, torch.randn(2, 5, 24), fused=True)
    held, copy_at_the_time = kept[0]
    torch.testing.assert_close(held, copy_at_the_time, rtol=0, atol=0)  # not changed behind the hook's back
    assert ops.names.count("addmm_.default") == 3 and ops.names.count("addmm.default") >= 1  # k, v, o in place


def test_a_base_layer_that_trains_keeps_its_own_gradient(fused_base):
    """The one-node function returns no weight gradient: a base Linear that trains stays outside it."""
    peft_model, fused_model = _models(dropout=0.1)
    for model in (peft_model, fused_model):
        model.base_model.model.q.base_layer.weight.requires_grad_(True)
    x = torch.randn(2, 5, 24)
    _, gx_p, g_p = _run(peft_model, x, fused=False)
    _, gx_f, g_f = _run(fused_model, x, fused=True)
    name = "base_model.model.q.base_layer.weight"
    assert name in g_p and name in g_f
    _close(g_f[name], g_p[name], rtol=1e-5, atol=1e-6)
    _close(gx_f, gx_p, rtol=1e-5, atol=1e-6)


class _CountCasts(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the dtype casts (`aten._to_copy`) and foreach copies that run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.casts = 0
        self.foreach_copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default:
            self.casts += 1
        elif func.overloadpacket is torch.ops.aten._foreach_copy_:
            self.foreach_copies += 1
        return func(*args, **(kwargs or {}))


def _train(model, xs, cast_cache: bool, monkeypatch) -> tuple[list[torch.Tensor], dict[str, torch.Tensor], list]:
    """Three optimizer steps of the fused branch under bf16 autocast (dropout: the LoRA function); the outputs,
    the adapters' final weights and, per step, the casts counted in the forward."""
    monkeypatch.setattr(lora_switches, "CAST_CACHE", cast_cache)
    monkeypatch.setattr(lora_cast_cache, "CASTS", lora_cast_cache.CastCache())
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=0.05)
    outs, counts = [], []
    for step, x in enumerate(xs):
        with routed(True), torch.autocast("cpu", dtype=torch.bfloat16):
            torch.manual_seed(step)
            with _CountCasts() as counted:
                out = model(x)
            out.float().square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        outs.append(out.detach())
        counts.append((counted.casts, counted.foreach_copies))
    return outs, {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}, counts


def test_cached_adapter_casts_train_the_same_and_cast_once_per_step(monkeypatch, fused_base):
    """The LoRA functions read the adapters' bf16 copies from `CastCache`: the same outputs and weights over three
    optimizer steps as casting in every forward (so no stale copy after a step), with one foreach copy per step
    for all adapters instead of two casts per adapted layer."""
    _, cached_model = _models(dropout=0.2)
    plain_model = copy.deepcopy(cached_model)
    xs = [torch.randn(3, 7, 24) for _ in range(3)]
    outs_c, weights_c, counts_c = _train(cached_model, xs, True, monkeypatch)
    outs_p, weights_p, counts_p = _train(plain_model, xs, False, monkeypatch)
    for got, want in zip(outs_c, outs_p):
        assert torch.equal(got, want)
    for name in weights_p:
        assert torch.equal(weights_c[name], weights_p[name]), name
    assert (
        weights_c["base_model.model.q.lora_A.default.weight"]
        .ne(_models(dropout=0.2)[0].base_model.model.q.lora_A.default.weight)
        .any()
    )  # the weights moved: the copies had to follow them
    # every forward casts the 4 layers' x, and the frozen weight where it is float32 (F.linear / .to); the
    # adapters' A and B add 8 casts per forward without the cache; with it, 8 at the first forward, then none
    # but one foreach copy after each step
    per_forward_plain = {c for c, _ in counts_p}
    assert len(per_forward_plain) == 1 and all(f == 0 for _, f in counts_p)
    assert counts_c[0][0] == counts_p[0][0] and counts_c[0][1] == 0
    assert counts_c[1:] == [(counts_p[1][0] - 8, 1), (counts_p[2][0] - 8, 1)]


def test_the_cast_cache_follows_in_place_changes_and_forgets_freed_weights(monkeypatch):
    monkeypatch.setattr(lora_switches, "CAST_CACHE", True)
    cache = lora_cast_cache.CastCache()
    w = torch.nn.Parameter(torch.randn(4, 6))
    first = cache.get(w, torch.bfloat16)
    assert torch.equal(first, w.detach().to(torch.bfloat16)) and cache.get(w, torch.bfloat16) is first
    with torch.no_grad():
        w.mul_(3)  # a version change (as load_state_dict's copy_ makes)
    again = cache.get(w, torch.bfloat16)
    assert again is first and torch.equal(again, w.detach().to(torch.bfloat16))
    w.data = torch.randn(4, 6)  # another tensor behind the parameter: another address
    assert torch.equal(cache.get(w, torch.bfloat16), w.detach().to(torch.bfloat16))
    assert cache.get(w, torch.float32) is w  # no cast needed: the weight itself

    class ThroughData(torch.optim.Optimizer):  # writes through `.data`: no version change
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    p.data.add_(1.0)

    ThroughData([w], {}).step()
    assert torch.equal(cache.get(w, torch.bfloat16), w.detach().to(torch.bfloat16))  # the step hook told it
    del w
    assert cache.refresh() == 0 and cache.entries == {}
    monkeypatch.setattr(lora_switches, "CAST_CACHE", False)  # the switch: a new cast each time
    v = torch.nn.Parameter(torch.randn(2, 2))
    assert cache.get(v, torch.bfloat16) is not cache.get(v, torch.bfloat16) and cache.entries == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_folded_scaling_gives_the_same_gradients_with_fewer_kernels(monkeypatch):
    """With dropout on a GPU (Triton kernels) LoRA's scaling rides in the kernels' scale and B's float32 gradient
    comes from one float32-output matmul: gradients equal to the separate kernels' up to rounding, fewer kernels."""
    monkeypatch.setattr(lora_switches, "SEEDED", False)
    torch.manual_seed(0)
    x = torch.randn(4096, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(1024, 512, device="cuda", dtype=torch.bfloat16) * 0.05
    a = (torch.randn(8, 512, device="cuda") * 0.05).requires_grad_(True)
    b = (torch.randn(1024, 8, device="cuda") * 0.05).requires_grad_(True)

    def run(fold: bool):
        monkeypatch.setattr(lora_switches, "FOLD", fold)
        for t in (x, a, b):
            t.grad = None
        torch.manual_seed(1)
        out = lora_functions._LoraLinear.apply(x, w, None, a, b, 4.0, 0.1, torch.bfloat16)
        grad = torch.randn_like(out)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            out.backward(grad)
            torch.cuda.synchronize()
        kernels = sum(e.count for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)
        return out.detach(), [t.grad.clone() for t in (x, a, b)], kernels

    out_f, grads_f, kernels_f = run(True)
    out_s, grads_s, kernels_s = run(False)
    assert torch.equal(out_f, out_s)
    for got, want in zip(grads_f, grads_s):
        assert got.dtype == want.dtype and _rel_err(got, want) < 1e-2
    assert grads_f[2].dtype == torch.float32 and kernels_f <= kernels_s - 2, (kernels_f, kernels_s)
