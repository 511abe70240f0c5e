"""Item 3 over a bitsandbytes base (speedups/quantized_lora.py): peft's LoRA over Linear4bit / Linear8bitLt routed
through the fused branch against peft's own forward, on the CPU (bitsandbytes runs there) and on a GPU."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

bnb = pytest.importorskip("bitsandbytes")

from peft import LoraConfig, get_peft_model  # noqa: E402
from peft.tuners.lora import bnb as peft_bnb  # noqa: E402

from speedups import fused_lora, lora_functions, lora_switches, quantized_lora  # noqa: E402

D, D_OUT = 64, 96  # multiples of bitsandbytes' 64-element nf4 blocks


class Block(torch.nn.Module):
    """q / k read one input, o reads their product (as an attention block's projections)."""

    def __init__(self, make):
        super().__init__()
        self.q, self.k, self.o = make(D, D_OUT), make(D, D_OUT), make(D_OUT, D)

    def forward(self, x):
        return self.o(torch.tanh(self.q(x) * self.k(x)))


def _quantised(kind: str, device: str = "cpu", seed: int = 0) -> torch.nn.Module:
    """A Block whose layers are bitsandbytes `kind` layers made from one random bf16-free float32 Block."""
    torch.manual_seed(seed)
    plain = Block(lambda i, o: torch.nn.Linear(i, o, bias=False))
    if kind == "nf4":
        dtype = torch.bfloat16 if device == "cuda" else torch.float32

        def make(i, o):
            return bnb.nn.Linear4bit(i, o, bias=False, compute_dtype=dtype, quant_type="nf4")
    else:

        def make(i, o):
            return bnb.nn.Linear8bitLt(i, o, bias=False, has_fp16_weights=False, threshold=0.0)

    block = Block(make)
    for name in ("q", "k", "o"):
        weight = getattr(plain, name).weight.data.clone()
        layer = getattr(block, name)
        if kind == "nf4":
            layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type="nf4")
        else:
            layer.weight = bnb.nn.Int8Params(weight.half(), requires_grad=False, has_fp16_weights=False)
    block = block.to(device)
    block.is_loaded_in_4bit, block.is_loaded_in_8bit = kind == "nf4", kind == "int8"
    return block


def _lora(kind: str, dropout: float = 0.0, device: str = "cpu"):
    model = get_peft_model(
        _quantised(kind, device), LoraConfig(r=4, lora_alpha=8, target_modules=["q", "k", "o"], lora_dropout=dropout)
    )
    for name, param in model.named_parameters():
        if "lora_B" in name:  # non-zero B, else every gradient but B's is zero
            torch.nn.init.normal_(param, std=0.2)
    return model, copy.deepcopy(model)


@contextlib.contextmanager
def _routed(fused: bool):
    """peft's LoRA classes over bitsandbytes layers through `fused_forward` (or their own forward)."""
    classes = list(quantized_lora.peft_classes().values())
    saved = {cls: cls.forward for cls in classes}
    for cls in classes:
        own = getattr(cls.forward, "_vlm_lora_original", cls.forward)
        cls.forward = own
        if fused:

            def forward(self, inp, *args, _own=own, **kwargs):
                out = fused_lora.fused_forward(self, inp, *args, **kwargs)
                return _own(self, inp, *args, **kwargs) if out is None else out

            cls.forward = forward
    try:
        yield
    finally:
        for cls, forward in saved.items():
            cls.forward = forward


def _run(model, x, fused: bool, seed: int = 1, autocast: bool = False):
    with _routed(fused), torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
        torch.manual_seed(seed)
        x = x.clone().requires_grad_(True)
        out = model(x)
        out.float().square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach().float(), x.grad.float(), grads


def _rel(got, want) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


@pytest.fixture(params=[True, False], ids=["layer-in-function", "layer-apart"])
def fused_base(request, monkeypatch):
    monkeypatch.setattr(lora_switches, "FUSED_BASE", request.param)
    return request.param


def test_peft_builds_its_bitsandbytes_lora_classes_here():
    model, _ = _lora("nf4")
    assert type(model.base_model.model.q) is peft_bnb.Linear4bit
    assert type(model.base_model.model.q.base_layer) is bnb.nn.Linear4bit
    assert quantized_lora.quantization_of_model(model) == "nf4"
    assert isinstance(quantized_lora.frozen(model.base_model.model.q.base_layer), quantized_lora.Dequantized)


def test_nf4_without_dropout_equals_peft_outputs_and_every_gradient(fused_base):
    peft_model, fused_model = _lora("nf4")
    x = torch.randn(3, 7, D)
    out_p, gx_p, g_p = _run(peft_model, x, fused=False)
    out_f, gx_f, g_f = _run(fused_model, x, fused=True)
    assert set(g_p) == set(g_f) and len(g_p) == 6  # A and B of q, k, o
    torch.testing.assert_close(out_f, out_p, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx_f, gx_p, rtol=1e-5, atol=1e-5)
    for name in g_p:
        assert g_f[name].dtype == torch.float32
        torch.testing.assert_close(g_f[name], g_p[name], rtol=1e-4, atol=1e-5)


def test_nf4_runs_in_the_fused_function_and_keeps_no_dense_weight():
    """The layer is one `_LoraLinear` node that saves the input, h, A and B, not the [out, in] dense weight."""
    _, model = _lora("nf4")
    q = model.base_model.model.q
    saved: list[tuple[int, ...]] = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    x = torch.randn(2, 5, D, requires_grad=True)
    with _routed(True), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = q(x)
    assert type(out.grad_fn).__name__ == "_LoraLinearBackward"
    assert (D_OUT, D) not in saved and (D, D_OUT) not in saved
    assert (10, D) in saved  # the input, once


def test_nf4_dropout_in_eval_mode_equals_peft_and_training_mode_drops():
    peft_model, fused_model = _lora("nf4", dropout=0.5)
    x = torch.randn(2, 5, D)
    peft_model.eval()
    fused_model.eval()
    out_p, gx_p, _ = _run(peft_model, x, fused=False)
    out_f, gx_f, _ = _run(fused_model, x, fused=True)
    torch.testing.assert_close(out_f, out_p, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx_f, gx_p, rtol=1e-5, atol=1e-5)
    fused_model.train()
    out_t, _, _ = _run(fused_model, x, fused=True)
    assert not torch.allclose(out_t, out_f)


def test_nf4_down_projection_from_silu_mul_equals_peft():
    """The MLP's down projection over nf4 computes silu(gate) * up itself (`silu_mul_lora`), same values."""
    model, _ = _lora("nf4")
    o = model.base_model.model.o
    torch.manual_seed(4)
    gate = torch.randn(6, D_OUT, requires_grad=True)
    up = torch.randn(6, D_OUT, requires_grad=True)
    with _routed(False):
        want = o(torch.nn.functional.silu(gate) * up)
    want.square().sum().backward()
    want_grads = [gate.grad.clone(), up.grad.clone(), o.lora_A["default"].weight.grad.clone()]
    for t in (gate, up, o.lora_A["default"].weight, o.lora_B["default"].weight):
        t.grad = None
    got = fused_lora.silu_mul_lora(o, gate, up, lora_functions.TorchSiluMul)
    assert got is not None and type(got.grad_fn).__name__ == "_SiluMulLoraLinearBackward"
    got.square().sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for got_grad, want_grad in zip((gate.grad, up.grad, o.lora_A["default"].weight.grad), want_grads):
        torch.testing.assert_close(got_grad, want_grad, rtol=1e-4, atol=1e-5)


def test_int8_matches_its_dequantised_weight_and_trains_like_peft():
    """int8: the fused branch multiplies by CB * SCB / 127 (bitsandbytes' dequantisation); peft's own forward takes
    bitsandbytes' int8 matmul, which rounds the input too: the same within that rounding."""
    peft_model, fused_model = _lora("int8")
    layer = fused_model.base_model.model.q.base_layer
    dense = quantized_lora.frozen(layer).dense(torch.float32)
    assert dense.shape == (D_OUT, D)
    x = torch.randn(3, 7, D)
    out_p, gx_p, g_p = _run(peft_model, x, fused=False)
    out_f, gx_f, g_f = _run(fused_model, x, fused=True)
    assert set(g_p) == set(g_f) and len(g_p) == 6
    assert _rel(out_f, out_p) < 0.02
    assert _rel(gx_f, gx_p) < 0.03
    for name in g_p:
        assert _rel(g_f[name], g_p[name]) < 0.05, name
    with _routed(True):
        node = fused_model.base_model.model.q(torch.randn(2, D, requires_grad=True)).grad_fn
    assert type(node).__name__ == "_LoraLinearBackward"


def test_the_plugin_routes_bitsandbytes_lora_and_says_so_in_its_table():
    from speedups import plugin, registry

    model, _ = _lora("nf4")
    outcomes = plugin.check_model(model)
    assert outcomes[3].applied, outcomes[3].line()
    assert "3 LoRA layers (3 over bitsandbytes layers" in outcomes[3].detail
    assert getattr(peft_bnb.Linear4bit.forward, "_vlm_lora_fused", False)
    out = model.base_model.model.q(torch.randn(2, D, requires_grad=True))
    assert type(out.grad_fn).__name__ == "_LoraLinearBackward"
    assert registry.item(3).quantized == ("nf4", "int8")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_on_a_gpu_nf4_under_bf16_autocast_equals_peft(monkeypatch, dropout):
    """On CUDA, bf16 autocast, the same dropout masks as peft (kept masks: `SEEDED` off)."""
    monkeypatch.setattr(lora_switches, "SEEDED", False)
    peft_model, fused_model = _lora("nf4", dropout=dropout, device="cuda")
    x = torch.randn(4, 300, D, device="cuda", dtype=torch.bfloat16)
    out_p, gx_p, g_p = _run(peft_model, x, fused=False, autocast=True)
    out_f, gx_f, g_f = _run(fused_model, x, fused=True, autocast=True)
    assert _rel(out_f, out_p) < 0.01
    assert _rel(gx_f, gx_p) < 0.01
    for name in g_p:
        assert g_f[name].dtype == torch.float32
        assert _rel(g_f[name], g_p[name]) < 0.02, name
