"""A tiny randomly initialised Qwen3-VL-MoE (the Qwen3-VL-30B-A3B architecture, shrunk) for CPU tests.

Same tokenizer, processor and vision tower as the tiny dense model (`pipelines.demo.tiny_model`);
the language model's MLPs are mixture-of-experts blocks: 4 experts, 2 active per token, a
router (`mlp.gate`) and the experts as two fused 3-D parameters (`mlp.experts.gate_up_proj`,
`mlp.experts.down_proj`), as transformers 5 holds Qwen3-VL-MoE. Expert width 48 differs from
the hidden size 128, so no expert matrix is square (a transposed layout is always visible).

    python -m pipelines.demo.tiny_moe OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipelines.demo import tiny_model as tm
from pipelines.demo import tiny_tokenizer as tt

NUM_EXPERTS = 4
EXPERTS_PER_TOKEN = 2
EXPERT_WIDTH = 48


def build_tiny_moe_model(out_dir: str | Path, seed: int = 0) -> Path:
    """Writes a tiny Qwen3VLMoeForConditionalGeneration folder (float32 safetensors + tokenizer / processor).

    Args:
        out_dir: Output folder.
        seed: Weight init seed. Default 0.

    Returns:
        The folder.
    """
    import torch
    from transformers import GenerationConfig, Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = dict(tm.TEXT_CONFIG)
    text.update(
        num_hidden_layers=2,
        num_experts=NUM_EXPERTS,
        num_experts_per_tok=EXPERTS_PER_TOKEN,
        moe_intermediate_size=EXPERT_WIDTH,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        tie_word_embeddings=False,
    )
    config = Qwen3VLMoeConfig(
        text_config=text,
        vision_config=dict(tm.VISION_CONFIG),
        image_token_id=tt.IMAGE_PAD_ID,
        video_token_id=tt.VIDEO_PAD_ID,
        vision_start_token_id=tt.VISION_START_ID,
        vision_end_token_id=tt.VISION_END_ID,
        tie_word_embeddings=False,
    )
    config.architectures = ["Qwen3VLMoeForConditionalGeneration"]
    tt.write_tokenizer_and_processor(out)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3VLMoeForConditionalGeneration(config).to(torch.float32)
    model.config.dtype = "float32"
    model.generation_config = GenerationConfig(
        bos_token_id=tt.ENDOFTEXT_ID,
        pad_token_id=tt.ENDOFTEXT_ID,
        eos_token_id=[tt.IM_END_ID, tt.ENDOFTEXT_ID],
        do_sample=False,
    )
    model.save_pretrained(str(out), safe_serialization=True)
    return out


if __name__ == "__main__":
    print(build_tiny_moe_model(sys.argv[1]))
