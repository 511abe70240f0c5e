"""Token estimate of validate-data: Qwen-VL image resize rule, a tokenizer from a model folder."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from components.validate_data._tokens import TokenCounter, approx_text_tokens, smart_resize
from components.validate_data.core import DataError
from tests.test_validate_data import Run, line, png, row, write_lines

TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def tiny_model(folder: Path, chat_template: bool = True) -> Path:
    """A model folder with a word-level tokenizer and a Qwen3-VL-style preprocessor config."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "<|im_start|>", "<|im_end|>", "user", "assistant", "find", "the", "holes", "none", "here"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]"}
    if chat_template:
        config["chat_template"] = TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    preprocessor = {"patch_size": 16, "merge_size": 2, "size": {"shortest_edge": 4096, "longest_edge": 262144}}
    (folder / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    return folder


MESSAGES = [{"role": "user", "content": "<image>find the holes"}, {"role": "assistant", "content": "none here"}]


def test_smart_resize_matches_transformers():
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize as reference

    rnd = random.Random(0)
    for _ in range(300):
        h, w = rnd.randint(28, 5000), rnd.randint(28, 5000)
        if max(h, w) / min(h, w) > 150:
            continue
        for factor, lo, hi in ((32, 65536, 16777216), (32, 4096, 262144), (28, 3136, 1003520)):
            assert smart_resize(h, w, factor, lo, hi) == reference(h, w, factor=factor, min_pixels=lo, max_pixels=hi)


def test_image_tokens_qwen3_vl_defaults():
    counter = TokenCounter()
    assert counter.factor == 32
    assert counter.image_tokens(1024, 1024) == 1024 + 2  # one token per 32x32 px, plus vision start/end
    assert counter.image_tokens(100, 60) == 7 * 11 + 2  # scaled up past min_pixels 65536: 224x352 px
    assert TokenCounter(max_pixels=512 * 512).image_tokens(1024, 1024) == 256 + 2
    with pytest.raises(ValueError, match="aspect ratio"):
        counter.image_tokens(10000, 40)


def test_approximation_counts_digits_one_by_one():
    assert approx_text_tokens("") == 0
    assert approx_text_tokens("abcdefgh") == 2
    assert approx_text_tokens("[12, 345]") == 5 + 1  # 5 digits + ceil(4 other characters / 4)
    assert approx_text_tokens("图纸") == 2
    counter = TokenCounter()
    assert counter.source == "approx"
    assert counter.text_tokens(MESSAGES) == approx_text_tokens("find the holes") + approx_text_tokens("none here") + 10


def test_tokenizer_from_model_folder(tmp_path):
    counter = TokenCounter(str(tiny_model(tmp_path / "model")))
    assert counter.source == "tokenizer:model"
    # <|im_start|> role \n? content <|im_end|> per message: (1+1+3+1) + (1+1+2+1)
    assert counter.text_tokens(MESSAGES) == 11
    assert (counter.min_pixels, counter.max_pixels, counter.factor) == (4096, 262144, 32)
    assert counter.image_tokens(100, 60) == 6 + 2  # 64x96 px
    assert counter.image_tokens(1024, 1024) == 256 + 2  # capped at 512x512


def test_tokenizer_without_chat_template_counts_messages(tmp_path):
    counter = TokenCounter(str(tiny_model(tmp_path / "model", chat_template=False)))
    assert counter.text_tokens(MESSAGES) == 3 + 2 + 2 * TokenCounter.per_message_overhead


def test_max_length_with_model_quarantines_long_rows(tmp_path):
    model = tiny_model(tmp_path / "model")
    folder = tmp_path / "data"
    png(folder / "small.png", size=(100, 60))
    png(folder / "big.png", size=(1024, 1024))
    rows = [row("find the holes", ["small.png"], answer=f"none here {i}") for i in range(4)]
    rows.append(row("find the holes", ["big.png"], answer="none here"))
    path = write_lines(folder / "train.jsonl", [line(r) for r in rows])
    run = Run(tmp_path / "out")
    result = run([path], model_dir=str(model), max_length=100, max_invalid_fraction=0.25)
    assert [(i.line, i.code) for i in result.issues] == [(5, "E_TOKENS")]
    assert "about 269 tokens (tokenizer:model) > max_length 100" in result.issues[0].message
    assert result.stats["token_counts"] == [20] * 4  # 11 text + 1 unknown word ("0".."3") + 8 image
    assert "tokens per valid row (tokenizer:model): median 20" in result.summary()


def test_folder_without_tokenizer_is_a_named_error(tmp_path):
    (tmp_path / "empty").mkdir()
    folder = tmp_path / "data"
    path = write_lines(folder / "train.jsonl", [line(row(f"q{i}")) for i in range(3)])
    with pytest.raises(DataError, match="cannot load a tokenizer"):
        Run(tmp_path / "out")([path], model_dir=str(tmp_path / "empty"))
