"""speedups/benchmarks/layer_host_time.py builds one 4B decoder layer per LoRA variant (run on the CPU here)."""

from __future__ import annotations

import pytest
import torch

import speedups.benchmarks.layer_host_time as bench
from speedups import lora_switches


@pytest.fixture(autouse=True)
def _cpu(monkeypatch):
    from peft.tuners.lora.layer import Linear

    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(Linear, "forward", Linear.forward)  # restored after the variants swap it
    for flag in ("LEAN", "GROUP", "INPLACE", "FUSED_BASE", "TRITON", "CAST_CACHE", "FOLD"):  # the variants set them
        monkeypatch.setattr(lora_switches, flag, getattr(lora_switches, flag))


def _run(variant: str, dropout: float):
    bench._set_variant(variant)
    _model, layer, rotary = bench.build_layer(
        dropout, liger=False, lora=variant != "nolora", group=variant.startswith("group")
    )
    x, cos_sin = bench._inputs(layer, rotary, 1, 6)
    torch.manual_seed(5)
    bench._step(layer, x, cos_sin)
    return layer, x.grad


def test_variants_train_the_same_layer_their_own_way():
    grads = {}
    for variant in ("peft", "function", "functionapart", "functiontorch", "functionnormold", "lean", "group", "nolora"):
        layer, grads[variant] = _run(variant, 0.0)
        if variant != "peft":
            assert lora_switches.TRITON == (variant != "functiontorch"), variant
            assert lora_switches.CAST_CACHE == lora_switches.FOLD == (variant != "functionnormold"), variant
        lora_b = getattr(layer.self_attn.q_proj, "lora_B", None)
        grouped = getattr(layer.self_attn.q_proj, "_vlm_lora_shared_input", None)
        assert (grouped is not None) == (variant == "group"), variant
        if grouped is not None:  # q / k / v took their slices of one matmul
            assert grouped.enabled and grouped.slices == {}
            assert layer.mlp.up_proj._vlm_lora_shared_input.layers == (layer.mlp.gate_proj, layer.mlp.up_proj)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            node = type(layer.self_attn.q_proj(torch.randn(1, 2, 2560)).grad_fn).__name__
        expected = {
            "peft": "AddBackward0",
            "function": "_LoraLinearBackward",
            "functionapart": "_LoraDeltaBackward",
            "functiontorch": "_LoraLinearBackward",
            "functionnormold": "_LoraLinearBackward",
            "lean": "ViewBackward0",
            "group": "ViewBackward0",
        }
        assert node == expected.get(variant, "NoneType"), (variant, node)
        if variant == "nolora":
            assert lora_b is None and not any(p.requires_grad for p in layer.parameters())
        else:
            assert lora_b["default"].weight.grad is not None
    assert grads["nolora"].shape == (1, 6, 2560)  # the 4B's hidden size
    # the same layer and input (B starts at zero): the three LoRA paths give the same input gradient
    for variant in ("function", "functionapart", "functiontorch", "functionnormold", "lean", "group"):
        torch.testing.assert_close(grads[variant], grads["peft"], rtol=0, atol=0)


@pytest.mark.parametrize("bad", ["lean", "leen:0", "lean:x", "lean:1.5"])
def test_a_variant_it_does_not_know_is_a_usage_error(bad, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--variants", bad])
    assert exit_info.value.code == 2
    assert f"--variants: {bad!r} is not name:dropout" in capsys.readouterr().err
