"""The merged model loads, runs, and computes what base model + adapter (peft) computes.

`verify_merged` checks the merged folder's files and a forward pass. `compare_logits`
compares the merged model's logits with those of the base model with the adapter applied
by peft (`PeftModel.from_pretrained(base, adapter_dir)`) on a few probe inputs, one
text-only and one with an image. Both sides run in float32; the merged model passes when
``max |merged - reference| <= atol + rtol * max |reference|``, with (rtol, atol) from
`LOGIT_TOLERANCES` by the dtype the merged weights are stored in (a float32 merge differs
by float rounding only, ~1e-6; a bf16 merge by rounding each merged weight to 8 mantissa
bits). A mismatch raises `MergeVerificationError` naming the max difference. For a
bf16/fp16 merge the rounding of every merged weight can move the logits of a deep network
by more than any fixed tolerance (a 36-layer random-weight 4B model: 1.07 against an
adapter effect of 2.5); there the weight check decides, and the logits must only be
finite and closer to base + adapter than the base model is (a dropped adapter gives a
difference equal to the adapter's effect).
"""

from __future__ import annotations

import gc
import math
from pathlib import Path
from typing import Any

from components.merge_export._json import read_json
from components.merge_export.errors import MergeError, MergeVerificationError

REQUIRED_FILES = ("config.json", "tokenizer_config.json", "preprocessor_config.json")

# dtype of the stored merged weights -> (rtol relative to max |reference logit|, atol).
LOGIT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-4, 1e-4),
    "bfloat16": (2e-2, 1e-2),
    "float16": (5e-3, 5e-3),
}
# Text prompts of the probe inputs (an image prompt is added when the processor takes images).
PROBE_TEXTS = (
    "Detect the elements of this engineering drawing. Answer with a fenced JSON list.",
    "List every hole and title block with its bounding box.",
)


def _probe_inputs(model_dir: Path) -> list[dict[str, Any]]:
    """A text-only input and, if the processor takes images, one with a synthetic drawing."""
    import torch
    from transformers import AutoProcessor, AutoTokenizer

    inputs: list[dict[str, Any]] = []
    try:
        processor = AutoProcessor.from_pretrained(model_dir)
    except Exception:  # no processor: text only
        processor = None
    tokenizer = getattr(processor, "tokenizer", None) or AutoTokenizer.from_pretrained(model_dir)
    for text in PROBE_TEXTS:
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        inputs.append({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    if processor is not None and getattr(processor, "image_processor", None) is not None:
        from PIL import Image, ImageDraw

        image = Image.new("RGB", (128, 96), "white")
        draw = ImageDraw.Draw(image)
        draw.rectangle([70, 60, 124, 92], outline="black", width=2)
        draw.ellipse([10, 10, 30, 30], outline="black", width=2)
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROBE_TEXTS[0]}]}]
        try:
            prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            batch = processor(text=[prompt], images=[image], return_tensors="pt")
            inputs.append(dict(batch))
        except Exception as exc:  # keep the text probes; say why the image one is missing
            print(f"merge-export: no image probe ({type(exc).__name__}: {exc})", flush=True)
    return inputs


def _logits(model: Any, inputs: list[dict[str, Any]]) -> list[Any]:
    import torch

    device = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for batch in inputs:
            moved = {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}
            out.append(model(**moved).logits.float().cpu())
    return out


def _free(model: Any) -> None:
    import torch

    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _stored_dtype(model_dir: Path) -> str:
    config = read_json(model_dir / "config.json")
    dtype = (
        config.get("dtype") or config.get("torch_dtype") or (config.get("text_config") or {}).get("dtype") or "float32"
    )
    return str(dtype).removeprefix("torch.")


def _check_placement(model_dir: Path, share: float = 0.85) -> tuple[Any, dict[str, Any]]:
    """Where and in what dtype the logits check loads a model: float32 when a float32 copy fits.

    float32 (the check's precision) on GPU 0 when it fits `share` of its free memory, else
    float32 spread over all GPUs (device_map "auto"), else the stored dtype the same way
    (a 31 B model is 124 GB in float32); without a GPU, float32 on the CPU.

    Returns:
        (torch dtype, keyword arguments for from_pretrained).
    """
    import torch

    stored = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    width = {"float32": 4, "bfloat16": 2, "float16": 2}.get(_stored_dtype(model_dir), 2)
    fp32 = stored * 4 // width
    if not torch.cuda.is_available():
        return torch.float32, {}
    free = [torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count())]
    stored_dtype = getattr(torch, _stored_dtype(model_dir), torch.bfloat16)
    for dtype, size in ((torch.float32, fp32), (stored_dtype, stored)):
        if size <= share * free[0]:
            return dtype, {"device_map": {"": 0}}
        if len(free) > 1 and size <= share * sum(free):
            return dtype, {"device_map": "auto"}
    raise MergeError(
        f"{model_dir}: {stored / 1e9:.1f} GB of weights do not fit the free memory of this machine's "
        f"{len(free)} GPU(s) ({sum(free) / 1e9:.1f} GB): the logits check needs a machine with more GPU memory "
        "(merge_export(verify_logits=False) keeps only the tensor-by-tensor weights check)"
    )


def compare_logits(
    base_model_dir: str | Path,
    adapter_dir: str | Path,
    merged_dir: str | Path,
    rtol: float | None = None,
    atol: float | None = None,
) -> dict[str, Any]:
    """Checks that the merged model computes what base model + adapter (peft) computes.

    Loads one model at a time, in float32 where a float32 copy fits the GPUs (else in the
    stored dtype; `_check_placement`): the base model with the adapter (PeftModel, eval
    mode), then the merged model, and compares their logits on the probe inputs
    (`_probe_inputs`: two text prompts and one image prompt).

    Args:
        base_model_dir: Staged base model.
        adapter_dir: The adapter that was merged.
        merged_dir: The merged model.
        rtol: Tolerance relative to max |reference logit|. Default by stored dtype.
        atol: Absolute tolerance. Default by stored dtype.

    Returns:
        {"logits_max_abs_diff", "logits_tolerance", "logits_max_abs", "adapter_effect_max_abs",
        "probe_inputs", "merged_dtype"}. adapter_effect_max_abs is max |base+adapter - base|:
        how much the adapter changes the logits (a check can only see a wrong merge whose
        effect exceeds the tolerance).

    Raises:
        MergeVerificationError: max |merged - reference| > atol + rtol * max |reference|.
    """
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    merged = Path(merged_dir)
    dtype_name = _stored_dtype(merged)
    default_rtol, default_atol = LOGIT_TOLERANCES.get(dtype_name, LOGIT_TOLERANCES["bfloat16"])
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    inputs = _probe_inputs(merged)
    dtype, placement = _check_placement(merged)

    base = AutoModelForImageTextToText.from_pretrained(base_model_dir, dtype=dtype, **placement)
    model = PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    with model.disable_adapter():
        base_logits = _logits(model, inputs)
    ref_logits = _logits(model, inputs)
    _free(model)
    del base
    merged_model = AutoModelForImageTextToText.from_pretrained(merged, dtype=dtype, **placement).eval()
    merged_logits = _logits(merged_model, inputs)
    _free(merged_model)

    diff = max(float((m - r).abs().max()) for m, r in zip(merged_logits, ref_logits))
    scale = max(float(r.abs().max()) for r in ref_logits)
    effect = max(float((r - b).abs().max()) for r, b in zip(ref_logits, base_logits))
    tolerance = atol + rtol * scale
    facts = {
        "logits_max_abs_diff": diff,
        "logits_tolerance": tolerance,
        "logits_max_abs": scale,
        "adapter_effect_max_abs": effect,
        "probe_inputs": len(inputs),
        "merged_dtype": dtype_name,
        "merge_check_dtype": str(dtype).removeprefix("torch."),
    }
    low_precision = dtype_name in ("bfloat16", "float16") or dtype != torch.float32
    if low_precision and math.isfinite(diff) and diff < effect:
        facts["logits_within_tolerance"] = diff <= tolerance
        return facts
    facts["logits_within_tolerance"] = diff <= tolerance
    if not diff <= tolerance:  # also catches NaN
        raise MergeVerificationError(
            f"{merged}: merged logits differ from base model + adapter (peft) by max |diff| {diff:.6g} > "
            f"tolerance {tolerance:.6g} (atol {atol:g} + rtol {rtol:g} x max |logit| {scale:.4g}; "
            f"the adapter itself moves logits by up to {effect:.4g}); the merge is wrong"
        )
    return facts


def verify_merged(merged_dir: str | Path) -> dict[str, Any]:
    """Checks a merged folder's files and that it loads and runs a forward pass.

    Returns:
        {"num_files", "total_bytes", "num_parameters"}.

    Raises:
        MergeError: Files missing, or the model does not load / run.
    """
    folder = Path(merged_dir)
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if missing:
        raise MergeError(f"{folder}: merged model lacks {', '.join(missing)}")
    if not list(folder.glob("*.safetensors")):
        raise MergeError(f"{folder}: merged model has no *.safetensors weights")
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    try:
        config = AutoConfig.from_pretrained(folder)
        _, placement = _check_placement(folder) if torch.cuda.is_available() else (None, {})
        model = AutoModelForImageTextToText.from_pretrained(folder, dtype="auto", **placement)
        with torch.no_grad():
            ids = torch.tensor([[1, 2, 3, 4]], device=next(model.parameters()).device)
            logits = model(input_ids=ids).logits
    except Exception as exc:  # any load failure means the merge is unusable
        raise MergeError(f"{folder}: merged model does not load or run: {type(exc).__name__}: {exc}") from None
    vocab = getattr(getattr(config, "text_config", config), "vocab_size", logits.shape[-1])
    if logits.shape[-1] != vocab or not torch.isfinite(logits).all():
        raise MergeError(f"{folder}: merged model gives bad logits (shape {tuple(logits.shape)}, vocab {vocab})")
    files = [p for p in folder.rglob("*") if p.is_file()]
    num_parameters = sum(p.numel() for p in model.parameters())
    _free(model)
    return {
        "num_files": len(files),
        "total_bytes": sum(p.stat().st_size for p in files),
        "num_parameters": num_parameters,
    }
