"""Token count of validate-data: ms-swift's image resize rule, a tokenizer from a model folder.

tests/test_validate_data_swift_peer.py compares the counts with ms-swift's own encoding.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from components.common.boxes import ResizeRule, smart_resize
from components.validate_data._tokens import TokenCounter, approx_text_tokens
from components.validate_data.core import training_max_pixels
from components.validate_data.types import DataError
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
            rule = ResizeRule(factor, lo, hi)
            assert smart_resize(h, w, rule) == reference(h, w, factor=factor, min_pixels=lo, max_pixels=hi)


def test_image_tokens_qwen3_vl_defaults():
    counter = TokenCounter()
    assert counter.factor == 32
    # ms-swift's bounds (qwen_vl_utils: 4 .. 16384 tokens), not preprocessor_config's 65536 px minimum
    assert (counter.rule.min_pixels, counter.rule.max_pixels) == (4 * 32 * 32, 16384 * 32 * 32)
    assert counter.image_tokens(1024, 1024) == 1024 + 2  # one token per 32x32 px, plus vision start/end
    assert counter.image_tokens(100, 60) == 2 * 3 + 2  # 64x96 px
    assert counter.image_tokens(5000, 5000) == 16384 + 2  # capped at 4096x4096 px
    assert TokenCounter(max_pixels=512 * 512).image_tokens(1024, 1024) == 256 + 2
    # max_pixels first scales to 182x273 px (ms-swift's rescale_image), then smart resize rounds to 192x288
    assert TokenCounter(max_pixels=50_000).image_tokens(600, 400) == 6 * 9 + 2
    assert TokenCounter(max_pixels=50_000).image_tokens(100, 60) == 2 * 3 + 2  # below max_pixels: unchanged
    with pytest.raises(ValueError, match="aspect ratio"):
        counter.image_tokens(10000, 40)
    with pytest.raises(ValueError, match="max_pixels must be a whole number of pixels >= 0"):
        TokenCounter(max_pixels=-1)


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
    # the folder's patch size counts; its size.longest_edge (512x512) does not: ms-swift resizes with
    # qwen_vl_utils and runs the processor with do_resize=False
    assert counter.rule == ResizeRule(32, 4096, 16384 * 32 * 32, 0)
    assert counter.image_tokens(100, 60) == 6 + 2  # 64x96 px
    assert counter.image_tokens(1024, 1024) == 1024 + 2
    assert TokenCounter(str(tmp_path / "model"), max_pixels=512 * 512).image_tokens(1024, 1024) == 256 + 2


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
    assert "about 1037 tokens (tokenizer:model, full-size images) > max_length 100" in result.issues[0].message
    assert result.stats["token_counts"] == [20] * 4  # 11 text + 1 unknown word ("0".."3") + 8 image
    assert "tokens per valid row (tokenizer:model): median 20" in result.summary()
    assert "(max_length 100, max_pixels none)" in result.summary()


def test_folder_without_tokenizer_is_a_named_error(tmp_path):
    (tmp_path / "empty").mkdir()
    folder = tmp_path / "data"
    path = write_lines(folder / "train.jsonl", [line(row(f"q{i}")) for i in range(3)])
    with pytest.raises(DataError, match="cannot load a tokenizer"):
        Run(tmp_path / "out")([path], model_dir=str(tmp_path / "empty"))


def test_training_max_pixels_comes_from_the_swift_section():
    assert training_max_pixels({"max_length": 3000}) == 0
    assert training_max_pixels({"max_pixels": 1048576}) == 1048576
    assert training_max_pixels({}, 4096) == 4096
    assert training_max_pixels({"max_pixels": 4096}, 4096) == 4096
    with pytest.raises(DataError, match="max_pixels 4096 differs from swift.max_pixels 1048576"):
        training_max_pixels({"max_pixels": 1048576}, 4096)
    with pytest.raises(DataError, match="swift.max_pixels must be a whole number of pixels >= 0"):
        training_max_pixels({"max_pixels": "1M"})


def test_negative_max_pixels_is_a_named_error(tmp_path):
    folder = tmp_path / "data"
    path = write_lines(folder / "train.jsonl", [line(row(f"q{i}")) for i in range(3)])
    with pytest.raises(DataError, match="max_pixels must be a whole number of pixels >= 0"):
        Run(tmp_path / "out")([path], max_pixels=-5)
