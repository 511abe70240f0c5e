"""QLoRA on a mixture of experts (issue 45), on the CPU: what nf4 reaches in the tiny Qwen3-VL-MoE.

The tiny MoE (`pipelines.demo.tiny_moe`: attention, a router `mlp.gate`, the experts as fused 3-D
parameters) is loaded in nf4 by bitsandbytes 0.50 on the CPU, with the BitsAndBytesConfig that ms-swift
builds for `swift sft` from `swift_quant_args("nf4")` (train-lora's path) and with a bare transformers
one. Checked on the loaded model: which tensors become Params4bit, that a forward with an image runs,
and that the rule train-lora sizes a staged model by (`quantized_weight_bytes` over the safetensors
headers) gives the loaded model's bytes. Then the same rule over the published 30B-A3B and 8B shapes
(`benchmarks.quantized_sizes`, meta device, no weights).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from components.common import quantization as q

bnb = pytest.importorskip("bitsandbytes")

NF4 = q.swift_quant_args("nf4")
KINDS = {
    "attention q/k/v/o": r"^model\.language_model\..*\.self_attn\.[qkvo]_proj\.weight$",
    "router mlp.gate": r"\.mlp\.gate\.weight$",
    "experts (3-D)": r"\.mlp\.experts\.(gate_up_proj|down_proj)$",
    "vision tower linear": r"^model\.visual\.(blocks|merger|deepstack_merger_list).*\.(qkv|proj|linear_fc[12])\.weight$",
    "embeddings": r"^model\.language_model\.embed_tokens\.weight$",
    "lm_head": r"^lm_head\.weight$",
}
CODE_TABLES_MAX = 1100  # bytes a Params4bit keeps besides weights and absmax: nf4 code, nested code, offset


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory) -> Path:
    from pipelines.demo.tiny_moe import build_tiny_moe_model

    return build_tiny_moe_model(tmp_path_factory.mktemp("moe") / "base")


def _load(folder: Path, quantization_config=None):
    import torch
    from transformers import AutoModelForImageTextToText

    kwargs = {"quantization_config": quantization_config} if quantization_config else {}
    return AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.bfloat16, device_map="cpu", **kwargs)


@pytest.fixture(scope="module")
def swift_config(tiny_moe):
    """The BitsAndBytesConfig `swift sft` loads the base with (ms-swift's own argument handling)."""
    from swift.arguments import BaseArguments

    return BaseArguments(model=str(tiny_moe), torch_dtype="bfloat16", **NF4).get_quantization_config()


@pytest.fixture(scope="module")
def swift_nf4(tiny_moe, swift_config):
    return _load(tiny_moe, swift_config)


def _kinds(model) -> dict[str, set[str]]:
    """{tensor kind: the parameter classes its tensors load as}."""
    found: dict[str, set[str]] = {kind: set() for kind in KINDS}
    for name, param in model.named_parameters():
        for kind, pattern in KINDS.items():
            if re.search(pattern, name):
                found[kind].add(type(param).__name__)
    return found


def test_swift_nf4_quantises_attention_only(swift_config, swift_nf4):
    assert {"mlp.gate", "model.visual", "lm_head"} <= set(swift_config.llm_int8_skip_modules)
    assert _kinds(swift_nf4) == {
        "attention q/k/v/o": {"Params4bit"},
        "router mlp.gate": {"Parameter"},
        "experts (3-D)": {"Parameter"},
        "vision tower linear": {"Parameter"},
        "embeddings": {"Parameter"},
        "lm_head": {"Parameter"},
    }
    experts = [p for n, p in swift_nf4.named_parameters() if ".mlp.experts." in n]
    assert len(experts) == 4 and all(p.ndim == 3 and str(p.dtype) == "torch.bfloat16" for p in experts)
    assert sum(isinstance(m, bnb.nn.Linear4bit) for m in swift_nf4.modules()) == 2 * 4  # 2 layers x q/k/v/o


def test_bare_bitsandbytes_config_also_quantises_the_vision_tower_but_not_router_or_experts(tiny_moe):
    import torch
    from transformers import BitsAndBytesConfig

    bare = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch.bfloat16,
        bnb_4bit_use_double_quant=True,
    )
    kinds = _kinds(_load(tiny_moe, bare))
    assert kinds["vision tower linear"] == kinds["attention q/k/v/o"] == {"Params4bit"}
    assert kinds["router mlp.gate"] == kinds["experts (3-D)"] == kinds["lm_head"] == {"Parameter"}


def test_nf4_moe_runs_a_forward_with_an_image_close_to_bf16(tiny_moe, swift_config):
    import numpy as np
    import torch
    from PIL import Image
    from transformers import AutoProcessor

    image = Image.fromarray((np.random.default_rng(0).random((64, 64, 3)) * 255).astype("uint8"))
    text = ["<|vision_start|><|image_pad|><|vision_end|>a red circle"]
    inputs = AutoProcessor.from_pretrained(tiny_moe)(text=text, images=[image], return_tensors="pt")
    # a fresh load: an eval-mode no-grad forward on a CPU repacks the 4-bit weights (absmax to fp32)
    with torch.no_grad():
        nf4 = _load(tiny_moe, swift_config)(**inputs).logits.float()
        bf16 = _load(tiny_moe)(**inputs).logits.float()
    assert nf4.shape == (1, inputs["input_ids"].shape[1], 151936) and bool(torch.isfinite(nf4).all())
    assert not torch.equal(nf4, bf16)  # the 4-bit layers took part
    assert torch.nn.functional.cosine_similarity(nf4.flatten(), bf16.flatten(), dim=0) > 0.95  # 0.986 measured


def _param_bytes(param) -> tuple[int, int]:
    """(bytes the rule counts, per-tensor code tables) of a loaded parameter.

    A Params4bit counts its packed uint8 weights (2 a byte), the 8-bit absmax of each 64-weight block and
    the fp32 absmax of each 256 blocks (double quantisation); its code tables (nf4 code: 16 fp32, nested
    code: 256 fp32, offset) are the rule's left-out constant. Any other parameter: numel x element size.
    """
    state = getattr(param, "quant_state", None)
    if state is None:
        return param.numel() * param.element_size(), 0
    counted = [param, state.absmax, state.state2.absmax]
    tables = [state.code, state.state2.code, state.offset]
    return tuple(sum(t.numel() * t.element_size() for t in group) for group in (counted, tables))


def test_stored_tensor_rule_gives_the_loaded_nf4_bytes(tiny_moe, swift_nf4):
    from safetensors import safe_open

    from components.train_lora._input_checks import quantized_weight_bytes

    with safe_open(str(tiny_moe / "model.safetensors"), "pt") as f:
        stored = {name: len(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118 - safe_open
    loaded = dict(swift_nf4.named_parameters())
    assert set(stored) == set(loaded)
    wrong = [
        n for n, ndim in stored.items() if q.is_quantized_tensor(n, ndim) != isinstance(loaded[n], bnb.nn.Params4bit)
    ]
    assert wrong == []
    sizes = [_param_bytes(p) for p in loaded.values()]
    quantised = sum(isinstance(p, bnb.nn.Params4bit) for p in loaded.values())
    assert quantised == 8 and all(tables < CODE_TABLES_MAX for _, tables in sizes)
    # within 4 bytes a quantised tensor: the fp32 absmax of a partial 256-block group, rounded up
    assert abs(quantized_weight_bytes(tiny_moe, "nf4") - sum(b for b, _ in sizes)) <= 4 * quantised + 1


def test_30b_a3b_stays_near_bf16_in_nf4_by_arithmetic():
    from benchmarks.quantized_sizes import sizes, stored_tensors

    tensors = stored_tensors("30b-a3b")
    assert tensors["model.language_model.layers.0.mlp.experts.gate_up_proj"] == (128 * 2048 * 2 * 768, 3)
    assert not q.is_quantized_tensor("model.language_model.layers.0.mlp.gate.weight", 2)
    moe, dense = sizes("30b-a3b"), sizes("8b")
    assert round(moe.params / 1e9, 2) == 31.07 and round(dense.params / 1e9, 2) == 8.77  # published: 31.1 B, 8.77 B
    assert moe.expert_share > 0.93 and 0.97 < moe.nf4 / moe.bf16 < 0.99
    assert moe.nf4 < moe.int8 < moe.bf16 and dense.nf4 / dense.bf16 < 0.42
    assert q.known_quantized_bytes(moe.bf16, "nf4", moe=True) == pytest.approx(moe.nf4, rel=0.002)
    assert dense.nf4 <= q.known_quantized_bytes(dense.bf16, "nf4") <= 1.01 * dense.nf4
