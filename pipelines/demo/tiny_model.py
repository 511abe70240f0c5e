"""Build a tiny, randomly initialised Qwen3-VL model folder fully offline.

The folder looks like a real ``Qwen/Qwen3-VL-*-Instruct`` checkpoint (same
architecture class, same vocabulary size, same special-token ids, same
image-processing semantics: 16 px patches merged 2x2 -> one LLM token per
32x32 px), but the network is tiny (~20M parameters, 19.4M of them the
151936 x 128 tied embedding; 4 text layers, 2 vision blocks; ~80 MB float32) so that ``swift sft`` /
``swift export`` / inference run on a CPU.

Two deliberate deviations from a plain random init make it LoRA-learnable in a
few dozen steps: the final RMSNorm gain is FINAL_NORM_GAIN (logit range), and the
embedding rows of ids the tokenizer can never produce are zero.

Nothing is downloaded: the tokenizer (:mod:`pipelines.demo.tiny_tokenizer`) is a small
byte-level BPE trained with the ``tokenizers`` library on a built-in corpus, padded with
unused placeholder tokens so that Qwen's special tokens sit at their real ids
(``<|endoftext|>`` = 151643 ... ``</think>`` = 151668).

Usage::

    from pipelines.demo.tiny_model import build_tiny_model, ensure_tiny_model
    model_dir = ensure_tiny_model()          # cached in ~/.cache/vlm-lora/...
    build_tiny_model("/tmp/tiny", seed=0)    # explicit location

    python -m pipelines.demo.tiny_model OUT_DIR [--seed N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from pipelines.demo.tiny_tokenizer import (
    ENDOFTEXT_ID,
    IM_END_ID,
    IMAGE_PAD_ID,
    MAX_PIXELS,
    MERGE_SIZE,
    MIN_PIXELS,
    NUM_REGULAR_TOKENS,
    PATCH_SIZE,
    SPECIAL_TOKENS,
    TEMPORAL_PATCH_SIZE,
    VIDEO_PAD_ID,
    VISION_END_ID,
    VISION_START_ID,
    write_json,
    write_tokenizer_and_processor,
)

__all__ = [
    "TINY_MODEL_VERSION",
    "VOCAB_SIZE",
    "SPECIAL_TOKENS",
    "IMAGE_PAD_ID",
    "MIN_PIXELS",
    "MAX_PIXELS",
    "build_tiny_model",
    "ensure_tiny_model",
    "default_cache_dir",
]

# Bump when anything that changes the produced files changes (cache key).
TINY_MODEL_VERSION = "v2"

# Model embedding rows, as in every Qwen3-VL checkpoint.
VOCAB_SIZE = 151936


# Gain of the final text RMSNorm. With the default 0.02 init and a small hidden size the (tied)
# logits are confined to about +-1.3, which makes the output distribution almost flat
# and unlearnable with LoRA (the final norm is not a LoRA target). A gain of 16 gives a
# realistic logit range (~+-20) so a few hundred LoRA steps can learn an output format.
FINAL_NORM_GAIN = 16.0


TEXT_CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    hidden_act="silu",
    max_position_embeddings=262144,
    initializer_range=0.02,
    rms_norm_eps=1e-6,
    use_cache=True,
    attention_bias=False,
    attention_dropout=0.0,
    # head_dim 32 -> 16 rotary frequencies split T/H/W like the real [24, 20, 20] of 64.
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 5000000.0,
        "mrope_section": [8, 4, 4],
        "mrope_interleaved": True,
    },
    bos_token_id=ENDOFTEXT_ID,
    eos_token_id=IM_END_ID,
    tie_word_embeddings=True,
)

VISION_CONFIG = dict(
    depth=2,
    hidden_size=32,
    intermediate_size=64,
    num_heads=2,
    hidden_act="gelu_pytorch_tanh",
    in_channels=3,
    patch_size=PATCH_SIZE,
    spatial_merge_size=MERGE_SIZE,
    temporal_patch_size=TEMPORAL_PATCH_SIZE,
    out_hidden_size=128,  # == text hidden_size
    num_position_embeddings=2304,  # 48x48 learned grid, as the real model
    deepstack_visual_indexes=[0, 1],  # must be < depth and <= text num_hidden_layers
    initializer_range=0.02,
)


def _make_config():
    from transformers import Qwen3VLConfig

    cfg = Qwen3VLConfig(
        text_config=dict(TEXT_CONFIG),
        vision_config=dict(VISION_CONFIG),
        image_token_id=IMAGE_PAD_ID,
        video_token_id=VIDEO_PAD_ID,
        vision_start_token_id=VISION_START_ID,
        vision_end_token_id=VISION_END_ID,
        tie_word_embeddings=True,
    )
    cfg.architectures = ["Qwen3VLForConditionalGeneration"]
    return cfg


def build_tiny_model(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a complete tiny Qwen3-VL model folder to ``out_dir`` and return its path.

    Deterministic for a given ``seed`` (weights) - the tokenizer does not depend on the seed.
    """
    import torch
    from transformers import GenerationConfig, Qwen3VLForConditionalGeneration

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    cfg = _make_config()
    n_bpe = write_tokenizer_and_processor(out)
    # Deterministic init on CPU, independent of the global RNG state of the caller.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3VLForConditionalGeneration(cfg).to(torch.float32)
        with torch.no_grad():
            model.model.language_model.norm.weight.fill_(FINAL_NORM_GAIN)
            # Rows the tokenizer can never produce (placeholder gap + ids >= len(tokenizer))
            # get zero embeddings (tied -> zero logits), like never-trained rows in real
            # checkpoints. Otherwise, in a small hidden space, some of the ~150k random placeholder
            # rows always sit next to the digit/punctuation rows and a briefly tuned model
            # emits them instead of digits.
            emb = model.get_input_embeddings().weight
            emb[n_bpe:NUM_REGULAR_TOKENS].zero_()
            emb[NUM_REGULAR_TOKENS + len(SPECIAL_TOKENS) :].zero_()
    model.eval()
    model.config.dtype = "float32"
    model.generation_config = GenerationConfig(
        bos_token_id=ENDOFTEXT_ID,
        pad_token_id=ENDOFTEXT_ID,
        eos_token_id=[IM_END_ID, ENDOFTEXT_ID],
        do_sample=False,  # greedy by default (real model samples; greedy keeps the demo reproducible)
        repetition_penalty=1.0,
    )
    model.save_pretrained(str(out), safe_serialization=True)
    write_json(
        out / "tiny_model_info.json",
        {"name": "tiny-qwen3-vl", "version": TINY_MODEL_VERSION, "seed": seed, "random_init": True},
    )
    # README so that nobody mistakes the folder for a real checkpoint.
    (out / "README.md").write_text(
        "# tiny-qwen3-vl (random init)\n\nGenerated by `pipelines.demo.tiny_model` "
        f"(version {TINY_MODEL_VERSION}, seed {seed}). Architecture-compatible with "
        "Qwen3-VL (Qwen3VLForConditionalGeneration), tiny and randomly initialised: for tests/demos only.\n",
        encoding="utf-8",
    )
    return out


def default_cache_dir() -> Path:
    root = os.environ.get("VLM_LORA_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "vlm-lora"
    return base / f"tiny-qwen3-vl-{TINY_MODEL_VERSION}"


def ensure_tiny_model(cache_dir: str | Path | None = None, seed: int = 0) -> Path:
    """Build the tiny model once into ``cache_dir`` (atomic) and return it; reuse afterwards."""
    target = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if seed != 0 and cache_dir is None:
        target = target.with_name(target.name + f"-seed{seed}")
    marker = target / "tiny_model_info.json"
    if marker.is_file() and (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        build_tiny_model(tmp, seed=seed)
        try:
            os.replace(tmp, target)  # atomic when target does not exist (or is an empty dir)
        except OSError:
            # Someone else finished first (target exists and is not empty): keep theirs.
            if not marker.is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build a tiny random Qwen3-VL model folder (offline).")
    parser.add_argument("out_dir", nargs="?", help="output folder (default: the shared cache folder)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    path = build_tiny_model(args.out_dir, seed=args.seed) if args.out_dir else ensure_tiny_model(seed=args.seed)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
