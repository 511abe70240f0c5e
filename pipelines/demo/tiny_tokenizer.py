"""The tiny model's tokenizer, chat template and processor configs, built offline.

The tokenizer is a small byte-level BPE trained with the ``tokenizers`` library on a
built-in corpus, padded with unused placeholder tokens so that Qwen's special tokens sit
at their real ids (``<|endoftext|>`` = 151643 ... ``</think>`` = 151668): ms-swift's
templates hard-code them. The processor configs have real Qwen3-VL's image semantics
(16 px patches merged 2x2 -> one LLM token per 32x32 px).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

# Ids below this are the "regular" BPE vocabulary (real Qwen: 151643 BPE tokens).
NUM_REGULAR_TOKENS = 151643

# (token, special) at their real Qwen3-VL ids, in id order starting at 151643.
SPECIAL_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),  # 151643
    ("<|im_start|>", True),  # 151644
    ("<|im_end|>", True),  # 151645
    ("<|object_ref_start|>", True),  # 151646
    ("<|object_ref_end|>", True),  # 151647
    ("<|box_start|>", True),  # 151648
    ("<|box_end|>", True),  # 151649
    ("<|quad_start|>", True),  # 151650
    ("<|quad_end|>", True),  # 151651
    ("<|vision_start|>", True),  # 151652
    ("<|vision_end|>", True),  # 151653
    ("<|vision_pad|>", True),  # 151654
    ("<|image_pad|>", True),  # 151655
    ("<|video_pad|>", True),  # 151656
    ("<tool_call>", False),  # 151657
    ("</tool_call>", False),  # 151658
    ("<|fim_prefix|>", False),  # 151659
    ("<|fim_middle|>", False),  # 151660
    ("<|fim_suffix|>", False),  # 151661
    ("<|fim_pad|>", False),  # 151662
    ("<|repo_name|>", False),  # 151663
    ("<|file_sep|>", False),  # 151664
    ("<tool_response>", False),  # 151665
    ("</tool_response>", False),  # 151666
    ("<think>", False),  # 151667
    ("</think>", False),  # 151668
]
SPECIAL_TOKEN_IDS = {tok: NUM_REGULAR_TOKENS + i for i, (tok, _) in enumerate(SPECIAL_TOKENS)}
ENDOFTEXT_ID = SPECIAL_TOKEN_IDS["<|endoftext|>"]
IM_END_ID = SPECIAL_TOKEN_IDS["<|im_end|>"]
IMAGE_PAD_ID = SPECIAL_TOKEN_IDS["<|image_pad|>"]
VIDEO_PAD_ID = SPECIAL_TOKEN_IDS["<|video_pad|>"]
VISION_START_ID = SPECIAL_TOKEN_IDS["<|vision_start|>"]
VISION_END_ID = SPECIAL_TOKEN_IDS["<|vision_end|>"]


# Trained BPE size (the rest of 0..151642 is filled with unreachable placeholders).
BPE_VOCAB_SIZE = 1024

# Vision geometry, identical to real Qwen3-VL.
PATCH_SIZE = 16
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
PIXELS_PER_TOKEN = (PATCH_SIZE * MERGE_SIZE) ** 2  # 32x32 px per merged LLM token
# Demo defaults (real model: 65536 .. 16777216). A 256x256 image -> 8x8 = 64 tokens.
MIN_PIXELS = 4 * PIXELS_PER_TOKEN  # 4096 px  (qwen_vl_utils IMAGE_MIN_TOKEN_NUM=4)
MAX_PIXELS = 256 * PIXELS_PER_TOKEN  # 262144 px = 512x512 (256 tokens)
VIDEO_MIN_PIXELS = 4 * PIXELS_PER_TOKEN
VIDEO_MAX_PIXELS = 64 * PIXELS_PER_TOKEN


# Qwen3-VL-Instruct chat template (text / image / video content, tools, tool responses).
CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' }}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- for message in messages %}
    {%- if message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content_item in message.content %}
                {%- if 'text' in content_item %}
                    {{- content_item.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and message.content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# Qwen2 pre-tokenizer regex (digits are split one by one).
PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

_LABELS = [
    "title_block",
    "dimension",
    "hole",
    "line",
    "circle",
    "text",
    "arc",
    "arrow",
    "table",
    "note",
    "symbol",
    "section",
    "view",
    "border",
    "centerline",
    "leader",
]
_WORDS = """
the a an of to in on for with and or is are be this that these those it its as by from at into
find locate detect list return output give show mark identify all every each any some
engineering drawing drawings technical blueprint sheet page image picture diagram figure scan
objects object elements element regions region boxes box bounding bbox bboxes coordinates
coordinate pixel pixels x y width height top left right bottom center size position
label labels category class type name value values count number numbers answer result
json format array list key keys string integer format only please using following
title block dimension dimensions hole holes line lines circle circles text texts table note
symbol section view border arrow leader centerline tolerance scale material part revision
drawn checked approved date sheet units mm inch radius diameter angle thread depth
you your should must do not no yes none empty found there here what where which how
system user assistant describe description caption question answer reply respond
""".split()


def _tokenizer_corpus() -> list[str]:
    """Deterministic built-in corpus for BPE training (independent of the model seed)."""
    rng = random.Random(1234)
    lines: list[str] = []
    # All printable ASCII, a few times, so every character has a chance to merge sensibly.
    ascii_chars = "".join(chr(c) for c in range(32, 127))
    lines += [ascii_chars] * 4
    lines += [" ".join(_WORDS)] * 8
    lines += [" ".join(w.capitalize() for w in _WORDS)] * 2
    prompts = [
        "Find all {l} regions in this engineering drawing and return them as JSON.",
        "Locate every {l} in the drawing. Output a JSON list of objects with label and bbox.",
        "Detect the {l} and give the bounding box coordinates.",
        "<image>Find the {l}.",
        "<image>Detect all objects: title_block, dimension, hole, line, circle, text.",
        "Return bounding boxes as [x1, y1, x2, y2] in pixel coordinates.",
        "Answer with a fenced ```json``` block only.",
    ]
    for _ in range(300):
        lines.append(rng.choice(prompts).format(l=rng.choice(_LABELS).replace("_", " ")))
        lines.append(rng.choice(prompts).format(l=rng.choice(_LABELS)))
    for _ in range(600):
        n = rng.randint(0, 4)
        items = []
        for _ in range(n):
            x1, y1 = rng.randint(0, 999), rng.randint(0, 999)
            x2, y2 = rng.randint(x1, 1000), rng.randint(y1, 1000)
            items.append({"label": rng.choice(_LABELS), "bbox": [x1, y1, x2, y2]})
        js = json.dumps(items) if rng.random() < 0.7 else json.dumps(items, indent=2)
        lines.append("```json\n" + js + "\n```")
    lines += ['{"key": "value", "n": 12, "ok": true, "none": null, "x": [1, 2.5, -3]}'] * 20
    lines += ["Hello world! How are you? I'm fine, thanks.\n\tTabs, spaces   and\r\nnewlines."] * 10
    return lines


def _build_backend_tokenizer():
    """Return a ``tokenizers.Tokenizer`` laid out like Qwen's (special ids 151643..151668)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    def _configure(tok: Tokenizer) -> None:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
            ]
        )
        tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)

    # 1) Train a small byte-level BPE (no special tokens: they go at the top of the id space).
    trainer_tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    _configure(trainer_tok)
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    trainer_tok.train_from_iterator(_tokenizer_corpus(), trainer=trainer)
    trained = json.loads(trainer_tok.to_str())
    vocab: dict[str, int] = trained["model"]["vocab"]
    merges = trained["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]

    # Renumber densely in id order (deterministic).
    ordered = sorted(vocab.items(), key=lambda kv: kv[1])
    vocab = {tok: i for i, (tok, _) in enumerate(ordered)}
    n_bpe = len(vocab)

    # 2) Fill the id gap with unreachable placeholders so that special ids match the real model.
    i = 0
    while len(vocab) < NUM_REGULAR_TOKENS:
        name = f"<|unused_{i}|>"
        if name not in vocab:
            vocab[name] = len(vocab)
        i += 1

    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=[tuple(m.split(" ", 1)) for m in merges],
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    _configure(tok)
    # 3) Added tokens, appended in order -> ids 151643..151668.
    for content, special in SPECIAL_TOKENS:
        added = AddedToken(content, special=special, normalized=False, single_word=False, lstrip=False, rstrip=False)
        if special:
            tok.add_special_tokens([added])
        else:
            tok.add_tokens([added])
    for content, expected in SPECIAL_TOKEN_IDS.items():
        got = tok.token_to_id(content)
        if got != expected:  # pragma: no cover - guards against tokenizers behaviour changes
            raise RuntimeError(f"special token {content} got id {got}, expected {expected}")
    return tok, vocab, merges, n_bpe


def _tokenizer_config() -> dict:
    added_tokens_decoder = {
        str(SPECIAL_TOKEN_IDS[tok]): {
            "content": tok,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for tok, special in SPECIAL_TOKENS
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added_tokens_decoder,
        "additional_special_tokens": [
            "<|im_start|>",
            "<|im_end|>",
            "<|object_ref_start|>",
            "<|object_ref_end|>",
            "<|box_start|>",
            "<|box_end|>",
            "<|quad_start|>",
            "<|quad_end|>",
            "<|vision_start|>",
            "<|vision_end|>",
            "<|vision_pad|>",
            "<|image_pad|>",
            "<|video_pad|>",
        ],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 262144,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
        "processor_class": "Qwen3VLProcessor",
    }


def _write_tokenizer(out: Path) -> int:
    """Write tokenizer files; return the number of trained (reachable) BPE tokens."""
    tok, vocab, merges, n_bpe = _build_backend_tokenizer()
    tok.save(str(out / "tokenizer.json"), pretty=False)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    write_json(out / "tokenizer_config.json", _tokenizer_config())
    return n_bpe


def _processor_configs() -> tuple[dict, dict]:
    image_mean = [0.5, 0.5, 0.5]
    image_std = [0.5, 0.5, 0.5]
    preprocessor = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": image_mean,
        "image_std": image_std,
        "image_processor_type": "Qwen2VLImageProcessorFast",
        "merge_size": MERGE_SIZE,
        "patch_size": PATCH_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "resample": 3,
        "rescale_factor": 1 / 255,
        # Same semantics as Qwen3-VL: shortest_edge = min_pixels, longest_edge = max_pixels.
        "size": {"longest_edge": MAX_PIXELS, "shortest_edge": MIN_PIXELS},
        "processor_class": "Qwen3VLProcessor",
    }
    video = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "do_sample_frames": True,
        "fps": 2,
        "image_mean": image_mean,
        "image_std": image_std,
        "merge_size": MERGE_SIZE,
        "patch_size": PATCH_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "min_frames": 4,
        "max_frames": 768,
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": VIDEO_MAX_PIXELS * 2, "shortest_edge": VIDEO_MIN_PIXELS},
        "video_processor_type": "Qwen3VLVideoProcessor",
        "processor_class": "Qwen3VLProcessor",
    }
    return preprocessor, video


def write_tokenizer_and_processor(out: str | Path, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS) -> int:
    """Writes the offline tokenizer, the Qwen3-VL chat template and processor configs.

    Also used for the 4B-shaped benchmark model (with the real model's pixel limits).

    Args:
        out: Model folder.
        min_pixels: Image processor's smallest image area, px. Default MIN_PIXELS.
        max_pixels: Image processor's largest image area, px. Default MAX_PIXELS.

    Returns:
        The number of trained (reachable) BPE tokens.
    """
    out = Path(out)
    n_bpe = _write_tokenizer(out)
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    write_json(out / "chat_template.json", {"chat_template": CHAT_TEMPLATE})
    preprocessor, video = _processor_configs()
    preprocessor["size"] = {"longest_edge": max_pixels, "shortest_edge": min_pixels}
    write_json(out / "preprocessor_config.json", preprocessor)
    write_json(out / "video_preprocessor_config.json", video)
    return n_bpe


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=False, ensure_ascii=False) + "\n", encoding="utf-8")
