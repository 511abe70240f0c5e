"""Token count of a row as ms-swift encodes it: text via the model's tokenizer, images via ms-swift's resize.

Images (ms-swift 4.6, Qwen2/2.5/3-VL templates): with the `max_pixels` argument, an image
of a larger area is first scaled down to about max_pixels (`rescale_image`); then
qwen_vl_utils' `fetch_image` smart-resizes it to sides that are multiples of `factor =
patch_size * merge_size` (16 * 2 = 32 px for Qwen3-VL, 14 * 2 = 28 for Qwen2/2.5-VL), area
within [4, 16384] x factor^2; the processor adds no resize of its own (do_resize=False), so
preprocessor_config.json's min/max pixels do not count. One LLM token per factor x factor
block, plus two (<|vision_start|>, <|vision_end|>) per image. The rule is
`components.common.boxes.ResizeRule` / `model_input_size`, shared with the box checks.

Text, with a model folder: its tokenizer (offline) on the row's messages, through the chat
template when it has one, each `<image>` tag written as ms-swift writes it
(<|vision_start|><|image_pad|><|vision_end|>, when the tokenizer knows those tokens) and
those tokens then left to the image count. Without a model, an approximation documented in
`approx_text_tokens`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from components.common import boxes

# Qwen3-VL's vision geometry (preprocessor_config.json of Qwen/Qwen3-VL-*-Instruct).
DEFAULT_PATCH_SIZE = 16
MAX_ASPECT_RATIO = boxes.MAX_ASPECT_RATIO  # smart_resize refuses images more elongated than this
IMAGE_WRAPPER_TOKENS = 2  # <|vision_start|> ... <|vision_end|>
IMAGE_TAG = "<image>"
# what ms-swift's Qwen-VL templates put where a row says <image> (swift/template/templates/qwen.py replace_tag)
SWIFT_IMAGE_CONTEXT = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")


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


def model_label(model_dir: Path) -> str:
    """Names a model folder as a person knows it: the staged source and revision from its manifest.json
    (`hf://Qwen/Qwen3-VL-4B-Instruct@0a1b2c3d4e5f`), else the folder's name (a staged folder's name
    is its revision hash, which names nothing, so the manifest wins)."""
    import json

    try:
        manifest = json.loads((model_dir / "manifest.json").read_text(encoding="utf-8"))
        source, revision = str(manifest.get("source") or ""), str(manifest.get("revision") or "")
    except (OSError, ValueError, AttributeError):
        source = revision = ""
    if not source:
        return model_dir.name
    prefix, _, digest = revision.rpartition("-")  # a commit hash, or "sha256-<hex>" for a local folder's content
    short = f"{prefix}-{digest[:12]}" if prefix else digest[:12]
    return f"{source}@{short}" if revision and revision not in source else source


class TokenCounter:
    """Counts the tokens of rows for one model as ms-swift encodes them (or approximates without one).

    Args:
        model_dir: Model folder with a tokenizer and preprocessor_config.json; "" or None
            = approximate text, Qwen3-VL's image geometry. Default None.
        max_pixels: ms-swift's `max_pixels` argument (`swift.max_pixels`): images of a
            larger area are scaled down to it before they become tokens; 0 = none (ms-swift's
            default). Default 0.

    Raises:
        ValueError: The model folder has no loadable tokenizer, or max_pixels < 0.
    """

    per_message_overhead = 5  # <|im_start|>role\n ... <|im_end|>\n

    def __init__(self, model_dir: str | None = None, max_pixels: int = 0):
        if not isinstance(max_pixels, int) or isinstance(max_pixels, bool) or max_pixels < 0:
            raise ValueError(f"max_pixels must be a whole number of pixels >= 0 (0 = no limit), got {max_pixels!r}")
        self.max_pixels = max_pixels
        self.rule = boxes.ResizeRule.for_patch_size(DEFAULT_PATCH_SIZE, max_pixels)
        self.tokenizer = None
        self.source = "approx"
        self.model = ""  # the tokenizer's model: its staged source (hub id @ revision) or its folder's name
        self.model_dir = ""
        self.swift_image_context = False
        if model_dir:
            self._load(Path(model_dir))

    @property
    def factor(self) -> int:
        """Side of the image block of one LLM token, px."""
        return self.rule.factor

    def _load(self, model_dir: Path) -> None:
        if (model_dir / "preprocessor_config.json").is_file():
            self.rule = boxes.ResizeRule.from_model(model_dir, self.max_pixels)
        from transformers import AutoTokenizer  # imported here: only --model needs it

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - any loader error names the folder
            raise ValueError(f"{model_dir}: cannot load a tokenizer ({type(exc).__name__}: {exc})") from None
        self.model = model_label(model_dir)
        self.model_dir = str(model_dir)
        self.source = f"tokenizer:{self.model}"
        self.has_template = bool(getattr(self.tokenizer, "chat_template", None))
        vocab = self.tokenizer.get_vocab()
        self.swift_image_context = all(t in vocab for t in SWIFT_IMAGE_CONTEXT)

    def image_tokens(self, width: int, height: int) -> int:
        """Returns the LLM tokens of one image of width x height px (wrapper included).

        Raises:
            ValueError: The aspect ratio exceeds MAX_ASPECT_RATIO.
        """
        h, w = boxes.model_input_size(height, width, self.rule)
        return h * w // (self.factor * self.factor) + IMAGE_WRAPPER_TOKENS

    def text_tokens(self, messages: list[dict[str, Any]]) -> int:
        """Returns the tokens of the messages' text (the tokens of <image> tags not counted)."""
        if self.tokenizer is None:
            plain = [m["content"].replace(IMAGE_TAG, "") for m in messages]
            return sum(approx_text_tokens(text) + self.per_message_overhead for text in plain)
        n_images = sum(m["content"].count(IMAGE_TAG) for m in messages)
        tag = "".join(SWIFT_IMAGE_CONTEXT) if self.swift_image_context else ""
        written = [{"role": m["role"], "content": m["content"].replace(IMAGE_TAG, tag)} for m in messages]
        image_context = len(SWIFT_IMAGE_CONTEXT) * n_images if tag else 0
        if self.has_template:
            try:
                ids = self.tokenizer.apply_chat_template(written, tokenize=True)
                if isinstance(ids, dict) or hasattr(ids, "keys"):
                    ids = ids["input_ids"]
                return len(ids) - image_context
            except Exception:  # noqa: BLE001 - a template that refuses a row: count plainly
                pass
        return (
            sum(
                len(self.tokenizer(m["content"], add_special_tokens=False)["input_ids"]) + self.per_message_overhead
                for m in written
            )
            - image_context
        )
