"""Build a randomly initialised model with the real Qwen3-VL-4B-Instruct architecture.

No weights can be downloaded here, so GPU benchmarks use the real architecture (config
below, as published with Qwen/Qwen3-VL-4B-Instruct) with random bf16 weights, plus the
project's offline tokenizer and processor files (Qwen special tokens at their real ids).
Throughput, memory and merge time depend on the shapes, not on the weight values.

    python -m benchmarks.qwen3_vl_4b OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

# Qwen/Qwen3-VL-4B-Instruct config.json (architecture fields).
QWEN3_VL_4B_CONFIG = {
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "model_type": "qwen3_vl",
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "tie_word_embeddings": True,
    "text_config": {
        "model_type": "qwen3_vl_text",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 2560,
        "initializer_range": 0.02,
        "intermediate_size": 9728,
        "max_position_embeddings": 262144,
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
        "rope_theta": 5000000,
        "tie_word_embeddings": True,
        "use_cache": True,
        "vocab_size": 151936,
    },
    "vision_config": {
        "model_type": "qwen3_vl",
        "deepstack_visual_indexes": [5, 11, 17],
        "depth": 24,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1024,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": 4096,
        "num_heads": 16,
        "num_position_embeddings": 2304,
        "out_hidden_size": 2560,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
}


def build_qwen3_vl_4b(out_dir: str | Path, seed: int = 0) -> Path:
    """Writes a random-weight Qwen3-VL-4B-shaped model folder (bf16 safetensors).

    Args:
        out_dir: Output folder.
        seed: Weight init seed. Default 0.

    Returns:
        The folder.
    """
    import torch
    from transformers import GenerationConfig, Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from pipelines.demo import tiny_tokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = Qwen3VLConfig(**QWEN3_VL_4B_CONFIG)
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = Qwen3VLForConditionalGeneration(config).to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    model.generation_config = GenerationConfig(
        bos_token_id=151643, pad_token_id=151643, eos_token_id=[151645, 151643], do_sample=False
    )
    model.save_pretrained(str(out), safe_serialization=True, max_shard_size="5GB")
    del model
    # Qwen3-VL-4B-Instruct's processor limits: 64K..16M px (64..16384 merged tokens)
    tiny_tokenizer.write_tokenizer_and_processor(out, min_pixels=65536, max_pixels=16777216)
    return out


def bench_model(out_dir: str | Path, tiny: bool = False, existing: str = "", reuse: bool = True) -> Path:
    """The model a GPU benchmark runs on.

    Args:
        out_dir: The benchmark's output folder (the 4B model goes to `out_dir/model`).
        tiny: The project's tiny CPU model instead (smoke runs). Default False.
        existing: A model folder to use as it is. Default "" (none).
        reuse: Keep a 4B model already built in `out_dir/model`. Default True.

    Returns:
        The model folder.
    """
    if existing:
        return Path(existing)
    if tiny:
        from pipelines.demo.tiny_model import ensure_tiny_model

        return Path(ensure_tiny_model())
    model_dir = Path(out_dir) / "model"
    if reuse and (model_dir / "config.json").is_file():
        return model_dir
    return build_qwen3_vl_4b(model_dir)


if __name__ == "__main__":
    print(build_qwen3_vl_4b(sys.argv[1]))
