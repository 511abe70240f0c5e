"""A tiny randomly initialised Qwen3-VL language model for CPU tests of the train-lora plugin's levers."""

from __future__ import annotations

import torch


def qwen3_vl_text_model(layers: int = 2):
    """Qwen3VLTextModel with 32-wide hidden states, grouped k / v heads and multimodal rotary sections."""
    from transformers import Qwen3VLTextConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextModel

    torch.manual_seed(0)
    config = Qwen3VLTextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=80,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]},
    )
    return Qwen3VLTextModel(config)
