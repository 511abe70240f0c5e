"""Randomly initialised models with the real Qwen3-VL-8B-, 32B- and 30B-A3B-Instruct architectures.

No weights can be downloaded on the GPU machine, so the larger-model benchmarks build the
published architectures (config fields below, as in each model's config.json) with random
bf16 weights, plus the project's offline tokenizer and processor files. Training speed,
memory, merge time and sizes depend on the shapes, not on the values.

    python -m benchmarks.qwen3_vl_large 8b OUT_DIR
    python -m benchmarks.qwen3_vl_large 30b-a3b OUT_DIR
    python -m benchmarks.qwen3_vl_large 32b OUT_DIR

The 30B-A3B build needs one GPU with about 62 GB free (weights are created in bf16 on the
GPU) and 62 GB of disk; the 8B build about 18 GB of each; the 32B about 67 GB of each (the H200 machine's 64 GiB
disk holds it alone, nothing else beside it).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

_TOKENS = {
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
}
_ROPE = {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"}
_TEXT_COMMON = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-06,
    "rope_scaling": _ROPE,
    "rope_theta": 5000000,
    "use_cache": True,
    "vocab_size": 151936,
}
# The ViT of the 8B / 32B / 30B-A3B models (27 blocks of 1152); out_hidden_size = the LM's hidden size.
_VISION_LARGE = {
    "deepstack_visual_indexes": [8, 16, 24],
    "depth": 27,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_size": 1152,
    "in_channels": 3,
    "initializer_range": 0.02,
    "intermediate_size": 4304,
    "num_heads": 16,
    "num_position_embeddings": 2304,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
}

# Qwen/Qwen3-VL-8B-Instruct config.json (architecture fields): 8.77 B parameters.
QWEN3_VL_8B_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "model_type": "qwen3_vl",
    **_TOKENS,
    "tie_word_embeddings": False,
    "text_config": {
        **_TEXT_COMMON,
        "model_type": "qwen3_vl_text",
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
    },
    "vision_config": {**_VISION_LARGE, "model_type": "qwen3_vl", "out_hidden_size": 4096},
}

# Qwen/Qwen3-VL-32B-Instruct config.json (architecture fields; its language model is Qwen3-32B's): 33.4 B parameters,
# 64 layers of hidden 5120, 64 query heads and 8 key / value heads of 128, MLP 25600.
QWEN3_VL_32B_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "model_type": "qwen3_vl",
    **_TOKENS,
    "tie_word_embeddings": False,
    "text_config": {
        **_TEXT_COMMON,
        "model_type": "qwen3_vl_text",
        "hidden_size": 5120,
        "intermediate_size": 25600,
        "num_attention_heads": 64,
        "num_hidden_layers": 64,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
    },
    "vision_config": {**_VISION_LARGE, "model_type": "qwen3_vl", "out_hidden_size": 5120},
}

# Qwen/Qwen3-VL-30B-A3B-Instruct config.json (architecture fields): 31.1 B parameters, 128
# experts of which 8 are active per token (about 3 B active), no shared expert.
QWEN3_VL_30B_A3B_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3VLMoeForConditionalGeneration"],
    "model_type": "qwen3_vl_moe",
    **_TOKENS,
    "tie_word_embeddings": False,
    "text_config": {
        **_TEXT_COMMON,
        "model_type": "qwen3_vl_moe_text",
        "decoder_sparse_step": 1,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "mlp_only_layers": [],
        "moe_intermediate_size": 768,
        "norm_topk_prob": True,
        "num_attention_heads": 32,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 48,
        "num_key_value_heads": 4,
    },
    "vision_config": {**_VISION_LARGE, "model_type": "qwen3_vl_moe", "out_hidden_size": 2048},
}

ARCHITECTURES = {
    "8b": ("qwen3_vl", QWEN3_VL_8B_CONFIG),
    "32b": ("qwen3_vl", QWEN3_VL_32B_CONFIG),
    "30b-a3b": ("qwen3_vl_moe", QWEN3_VL_30B_A3B_CONFIG),
}


def shrunk(config: dict[str, Any]) -> dict[str, Any]:
    """The same architecture with tiny dimensions (a CPU smoke run of the benchmark's code path)."""
    text = {**config["text_config"], "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2}
    text.update(num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    text["rope_scaling"] = {**_ROPE, "mrope_section": [8, 4, 4]}
    if "num_experts" in text:
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48)
    vision = {**config["vision_config"], "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2}
    vision.update(out_hidden_size=128, deepstack_visual_indexes=[0, 1])
    return {**config, "text_config": text, "vision_config": vision}


def build_random_model(name: str, out_dir: str | Path, seed: int = 0, tiny: bool = False) -> Path:
    """Writes a random-weight model folder of one of ARCHITECTURES (bf16 safetensors, 5 GB shards).

    Args:
        name: "8b", "32b" or "30b-a3b".
        out_dir: Output folder.
        seed: Weight init seed. Default 0.
        tiny: Tiny dimensions of the same architecture (`shrunk`; CPU smoke runs). Default False.

    Returns:
        The folder.
    """
    import torch
    from transformers import GenerationConfig

    from pipelines.demo import tiny_tokenizer

    model_type, config_dict = ARCHITECTURES[name]
    if model_type == "qwen3_vl_moe":
        from transformers import Qwen3VLMoeConfig as Config
        from transformers import Qwen3VLMoeForConditionalGeneration as Model
    else:
        from transformers import Qwen3VLConfig as Config
        from transformers import Qwen3VLForConditionalGeneration as Model
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fields = {k: v for k, v in (shrunk(config_dict) if tiny else config_dict).items() if k != "model_type"}
    config = Config(**fields)
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # 31 B parameters in float32 would not fit one GPU
    try:
        with torch.device(device):
            model = Model(config)
    finally:
        torch.set_default_dtype(previous)
    model.config.dtype = "bfloat16"
    model.generation_config = GenerationConfig(
        bos_token_id=151643, pad_token_id=151643, eos_token_id=[151645, 151643], do_sample=False
    )
    model.save_pretrained(str(out), safe_serialization=True, max_shard_size="5GB")
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    # the Qwen3-VL processors' limits: 64K..16M px (64..16384 merged tokens)
    tiny_tokenizer.write_tokenizer_and_processor(out, min_pixels=65536, max_pixels=16777216)
    return out


if __name__ == "__main__":
    start = time.time()
    folder = build_random_model(sys.argv[1], sys.argv[2])
    size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    print(f"{folder}: {size / 1e9:.2f} GB of safetensors in {time.time() - start:.0f} s")
