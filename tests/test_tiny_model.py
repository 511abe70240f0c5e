"""Tests for pipelines.demo.tiny_model (offline tiny random Qwen3-VL)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
import transformers

from pipelines.demo import tiny_model as tm  # noqa: E402
from pipelines.demo import tiny_tokenizer  # noqa: E402

REAL_SPECIAL_IDS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|object_ref_start|>": 151646,
    "<|object_ref_end|>": 151647,
    "<|box_start|>": 151648,
    "<|box_end|>": 151649,
    "<|quad_start|>": 151650,
    "<|quad_end|>": 151651,
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
    "<tool_call>": 151657,
    "</tool_call>": 151658,
    "<|fim_prefix|>": 151659,
    "<|fim_middle|>": 151660,
    "<|fim_suffix|>": 151661,
    "<|fim_pad|>": 151662,
    "<|repo_name|>": 151663,
    "<|file_sep|>": 151664,
    "<tool_response>": 151665,
    "</tool_response>": 151666,
    "<think>": 151667,
    "</think>": 151668,
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tm.build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def _digest(folder: Path, names) -> dict[str, str]:
    return {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in names}


def test_files_present(model_dir: Path):
    for name in [
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.json",
        "merges.txt",
        "chat_template.jinja",
        "preprocessor_config.json",
        "video_preprocessor_config.json",
    ]:
        assert (model_dir / name).is_file(), name
    cfg = transformers.AutoConfig.from_pretrained(model_dir)
    assert cfg.model_type == "qwen3_vl"
    assert cfg.architectures == ["Qwen3VLForConditionalGeneration"]
    assert cfg.text_config.vocab_size == 151936
    assert cfg.vision_config.patch_size == 16 and cfg.vision_config.spatial_merge_size == 2
    assert all(i < cfg.vision_config.depth for i in cfg.vision_config.deepstack_visual_indexes)
    assert cfg.image_token_id == 151655 and cfg.video_token_id == 151656
    assert cfg.vision_start_token_id == 151652 and cfg.vision_end_token_id == 151653


def test_special_token_ids(model_dir: Path):
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    for token, expected in REAL_SPECIAL_IDS.items():
        assert tok.convert_tokens_to_ids(token) == expected, token
        assert tok.encode(token, add_special_tokens=False) == [expected], token
    assert len(tok) == 151669  # same as the real Qwen3-VL tokenizer
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    text = '```json\n[{"label": "title_block", "bbox": [10, 20, 100, 200]}]\n```'
    ids = tok.encode(text, add_special_tokens=False)
    assert max(ids) < tiny_tokenizer.BPE_VOCAB_SIZE
    assert tok.decode(ids) == text
    # Decoding arbitrary ids (what a random model emits) must not fail.
    tok.decode([0, 5000, 151642, 151643, 151700, 151935])


def test_processor_image_tokens(model_dir: Path):
    from PIL import Image

    proc = transformers.AutoProcessor.from_pretrained(model_dir)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Find the title_block."}]}]
    text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>")
    assert text.endswith("<|im_start|>assistant\n")
    image = Image.new("RGB", (256, 256), "white")
    inputs = proc(text=[text], images=[image], return_tensors="pt")
    # 256x256 px -> 16x16 patches of 16 px -> 2x2 merge -> 8x8 = 64 LLM tokens.
    assert inputs["image_grid_thw"].tolist() == [[1, 16, 16]]
    assert int((inputs["input_ids"] == 151655).sum()) == (256 // 32) ** 2
    # ms-swift style '<image>' prompt through the plain tokenizer + processor expansion.
    text2 = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Find ...<|im_end|>\n"
    inputs2 = proc(text=[text2], images=[image], return_tensors="pt")
    assert int((inputs2["input_ids"] == 151655).sum()) == 64


def test_forward_logits(model_dir: Path):
    from PIL import Image

    proc = transformers.AutoProcessor.from_pretrained(model_dir)
    model = transformers.Qwen3VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Find the hole."}]}]
    text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = proc(text=[text], images=[Image.new("RGB", (256, 256), "white")], return_tensors="pt")
    with torch.no_grad():
        out = model(**inputs)
    assert out.logits.shape == (1, inputs["input_ids"].shape[1], 151936)
    assert torch.isfinite(out.logits).all()
    gen = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert gen.shape[1] == inputs["input_ids"].shape[1] + 4 or int(gen[0, -1]) in (151643, 151645)


def test_deterministic(model_dir: Path, tmp_path: Path):
    names = ["model.safetensors", "config.json", "tokenizer.json", "vocab.json", "merges.txt"]
    again = tm.build_tiny_model(tmp_path / "again", seed=0)
    assert _digest(model_dir, names) == _digest(again, names)
    other = tm.build_tiny_model(tmp_path / "other", seed=1)
    assert _digest(model_dir, ["model.safetensors"]) != _digest(other, ["model.safetensors"])
    assert _digest(model_dir, ["tokenizer.json"]) == _digest(other, ["tokenizer.json"])


def test_ensure_tiny_model_caches(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("VLM_LORA_CACHE", str(tmp_path / "cache"))
    first = tm.ensure_tiny_model()
    assert first == tmp_path / "cache" / f"tiny-qwen3-vl-{tm.TINY_MODEL_VERSION}"
    mtime = (first / "model.safetensors").stat().st_mtime_ns
    second = tm.ensure_tiny_model()
    assert second == first
    assert (second / "model.safetensors").stat().st_mtime_ns == mtime
    # No temp build folders left behind.
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [first.name]
