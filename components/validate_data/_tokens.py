"""Token-count estimate of a row: text via the model's tokenizer, images via Qwen-VL's resize.

Images: Qwen-VL resizes an image to sides that are multiples of `factor = patch_size *
merge_size` (16 * 2 = 32 px for Qwen3-VL, 14 * 2 = 28 for Qwen2/2.5-VL), keeping the area
within [min_pixels, max_pixels] (`smart_resize`), and spends one LLM token per factor x
factor block, plus two tokens (<|vision_start|>, <|vision_end|>) per image.

Text, with a model folder: its tokenizer (offline) on the row's messages, through the chat
template when it has one, with the `<image>` tags removed (they become the image tokens
above). Without a model, an approximation documented in `approx_text_tokens`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from components.common import boxes

# Qwen3-VL's defaults (preprocessor_config.json of Qwen/Qwen3-VL-*-Instruct).
DEFAULT_PATCH_SIZE = 16
DEFAULT_MERGE_SIZE = 2
DEFAULT_MIN_PIXELS = 65536  # size.shortest_edge
DEFAULT_MAX_PIXELS = 16777216  # size.longest_edge
MAX_ASPECT_RATIO = boxes.MAX_ASPECT_RATIO  # smart_resize refuses images more elongated than this
IMAGE_WRAPPER_TOKENS = 2  # <|vision_start|> ... <|vision_end|>


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen-VL's resize rule (qwen_vl_utils / transformers' Qwen2VLImageProcessor): `boxes.smart_resize`.

    Returns:
        (height, width) after resizing: multiples of `factor`, area within the bounds.

    Raises:
        ValueError: The aspect ratio exceeds MAX_ASPECT_RATIO.
    """
    return boxes.smart_resize(height, width, boxes.ResizeRule(factor, min_pixels, max_pixels))


def approx_text_tokens(text: str) -> int:
    """Approximate token count of text without a tokenizer.

    Qwen's BPE splits numbers into single digits and gives most CJK / non-ASCII
    characters a token each; English averages about 4 characters per token. So:
    digits + non-ASCII characters + ceil(other characters / 4). A rough guide, not a
    measurement: pass the model folder for the real count.
    """
    digits = sum(c.isdigit() for c in text)
    non_ascii = sum(not c.isascii() for c in text)
    return digits + non_ascii + math.ceil((len(text) - digits - non_ascii) / 4)


class TokenCounter:
    """Counts the tokens of rows for one model (or the approximation without one).

    Args:
        model_dir: Model folder with a tokenizer and preprocessor_config.json; "" or None
            = approximate text, Qwen3-VL image defaults. Default None.
        max_pixels: Overrides the preprocessor's max_pixels (like ms-swift's MAX_PIXELS);
            0 = from the model folder, else the Qwen3-VL default. Default 0.

    Raises:
        ValueError: The model folder has no loadable tokenizer.
    """

    per_message_overhead = 5  # <|im_start|>role\n ... <|im_end|>\n

    def __init__(self, model_dir: str | None = None, max_pixels: int = 0):
        self.patch_size, self.merge_size = DEFAULT_PATCH_SIZE, DEFAULT_MERGE_SIZE
        self.min_pixels, self.max_pixels = DEFAULT_MIN_PIXELS, DEFAULT_MAX_PIXELS
        self.tokenizer = None
        self.source = "approx"
        if model_dir:
            self._load(Path(model_dir))
        if max_pixels:
            self.max_pixels = max_pixels
        self.factor = self.patch_size * self.merge_size

    def _load(self, model_dir: Path) -> None:
        config = model_dir / "preprocessor_config.json"
        if config.is_file():
            cfg = json.loads(config.read_text(encoding="utf-8"))
            size = cfg.get("size") or {}
            self.patch_size = int(cfg.get("patch_size", self.patch_size))
            self.merge_size = int(cfg.get("merge_size", self.merge_size))
            self.min_pixels = int(cfg.get("min_pixels") or size.get("shortest_edge") or self.min_pixels)
            self.max_pixels = int(cfg.get("max_pixels") or size.get("longest_edge") or self.max_pixels)
        from transformers import AutoTokenizer  # imported here: only --model needs it

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - any loader error names the folder
            raise ValueError(f"{model_dir}: cannot load a tokenizer ({type(exc).__name__}: {exc})") from None
        self.source = f"tokenizer:{model_dir.name}"
        self.has_template = bool(getattr(self.tokenizer, "chat_template", None))

    def image_tokens(self, width: int, height: int) -> int:
        """Returns the LLM tokens of one image of width x height px (wrapper included).

        Raises:
            ValueError: The aspect ratio exceeds MAX_ASPECT_RATIO.
        """
        h, w = smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
        return h * w // (self.factor * self.factor) + IMAGE_WRAPPER_TOKENS

    def text_tokens(self, messages: list[dict[str, Any]]) -> int:
        """Returns the tokens of the messages' text (<image> tags not counted)."""
        plain = [{"role": m["role"], "content": m["content"].replace("<image>", "")} for m in messages]
        if self.tokenizer is None:
            return sum(approx_text_tokens(m["content"]) + self.per_message_overhead for m in plain)
        if self.has_template:
            try:
                ids = self.tokenizer.apply_chat_template(plain, tokenize=True)
                if isinstance(ids, dict) or hasattr(ids, "keys"):
                    ids = ids["input_ids"]
                return len(ids)
            except Exception:  # noqa: BLE001 - a template that refuses a row: count plainly
                pass
        return sum(
            len(self.tokenizer(m["content"], add_special_tokens=False)["input_ids"]) + self.per_message_overhead
            for m in plain
        )
