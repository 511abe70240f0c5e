"""torch's fused RMSNorm in place of Liger's (speedups/rms_norm.py)."""

from __future__ import annotations

import torch

from speedups import rms_norm


class LigerRMSNorm(torch.nn.Module):
    """Liger's module as its monkey patch leaves it (same name, attributes and arithmetic as its "llama" mode)."""

    def __init__(self, size, eps=1e-6, offset=0.0, casting_mode="llama"):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(size) * 0.1 + 1)
        self.variance_epsilon, self.offset, self.casting_mode = eps, offset, casting_mode

    def forward(self, hidden_states):
        x = hidden_states.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (self.offset + self.weight) * x.to(hidden_states.dtype)


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm = LigerRMSNorm(32)
        self.q_norm = LigerRMSNorm(8, eps=1e-5)
        self.gemma_norm = LigerRMSNorm(32, offset=1.0, casting_mode="gemma")  # other arithmetic: left alone
        self.layer_norm = torch.nn.LayerNorm(32)


def test_swaps_only_qwen3_style_liger_norms_and_computes_rmsnorm():
    torch.manual_seed(0)
    layer = Layer()
    x = torch.randn(3, 5, 32)
    heads = torch.randn(3, 5, 4, 8)
    before = (layer.input_layernorm(x), layer.q_norm(heads), layer.gemma_norm(x))
    assert rms_norm.use_torch_rms_norm(layer) == 2
    assert rms_norm.use_torch_rms_norm(layer) == 0  # once
    after = (layer.input_layernorm(x), layer.q_norm(heads), layer.gemma_norm(x))
    torch.testing.assert_close(after[0], before[0], rtol=1e-5, atol=1e-5)  # float32: the same values
    torch.testing.assert_close(after[1], before[1], rtol=1e-5, atol=1e-5)
    assert torch.equal(after[2], before[2])
    expected = torch.nn.functional.rms_norm(heads, (8,), layer.q_norm.weight, 1e-5)
    assert torch.equal(after[1], expected)
    after[0].square().sum().backward()
    assert layer.input_layernorm.weight.grad is not None and layer.input_layernorm.weight.grad.abs().sum() > 0


def test_in_bf16_within_one_rounding_of_liger_arithmetic():
    torch.manual_seed(1)
    norm = LigerRMSNorm(64).to(torch.bfloat16)
    x = torch.randn(16, 64, dtype=torch.bfloat16) * 3
    exact = torch.nn.functional.rms_norm(x.double(), (64,), norm.weight.double(), 1e-6).detach()
    liger_style = norm(x).detach()
    rms_norm.use_torch_rms_norm(norm)
    torch_style = norm(x).detach()
    assert torch_style.dtype == torch.bfloat16
    err_liger = (liger_style.double() - exact).abs().max()
    err_torch = (torch_style.double() - exact).abs().max()
    assert err_torch <= err_liger + 1e-6  # one rounding instead of two
    assert float((torch_style.double() - liger_style.double()).abs().max()) <= 2 * 2**-7 * float(exact.abs().max())


def test_fused_op_is_detected_per_device():
    # on the CPU torch decomposes rms_norm (no fused kernel): the plugin leaves Liger's norms there
    assert rms_norm.fused_op_on("cpu") is False


def test_wanted_with_more_than_one_process_unless_switched_off():
    from speedups.registry import SWITCHES

    def wanted(environ, world_size):
        return SWITCHES["VLM_LORA_TORCH_RMS_NORM"].on(environ, world_size)

    assert wanted({}, 2) and wanted({"VLM_LORA_TORCH_RMS_NORM": ""}, 8)
    assert not wanted({}, 1)
    assert wanted({"VLM_LORA_TORCH_RMS_NORM": "1"}, 1)
    assert not wanted({"VLM_LORA_TORCH_RMS_NORM": "0"}, 2)
