"""Merge a LoRA adapter into its base model with `swift export --merge_lora true`.

The merged folder is verified before it counts:

* before merging, the adapter must belong to the staged base model
  (`check_adapter_base`): same architecture and revision where both are recorded, and
  every LoRA matrix must fit the shape of the base weight it adapts;
* the merged folder must hold a config, safetensors weights and the processor/tokenizer
  files, and it must load and run a forward pass;
* its weights must be the base weights plus the adapter's update (`compare_weights`):
  every adapted weight equals ``W + scale * B @ A`` to within one rounding step of the
  stored dtype (bf16 keeps 8 mantissa bits), and every other tensor is bit-identical to
  the base model's. This is exact and cheap, and catches what breaks merges in practice
  (adapter keys that match nothing, a wrong scale, tensors renamed or dropped);
* its logits must match those of the base model with the adapter applied by peft
  (`PeftModel.from_pretrained(base, adapter_dir)`) on a few probe inputs, one text-only
  and one with an image (`compare_logits`). Both sides run in float32; the merged model
  passes when ``max |merged - reference| <= atol + rtol * max |reference|``, with
  (rtol, atol) from `LOGIT_TOLERANCES` by the dtype the merged weights are stored in
  (a float32 merge differs by float rounding only, ~1e-6; a bf16 merge by rounding
  each merged weight to 8 mantissa bits). A mismatch raises `MergeVerificationError`
  naming the max difference. For a bf16/fp16 merge the rounding of every merged weight
  can move the logits of a deep network by more than any fixed tolerance (a 36-layer
  random-weight 4B model: 1.07 against an adapter effect of 2.5); there the weight check
  decides, and the logits must only be finite and closer to base + adapter than the
  base model is (a dropped adapter gives a difference equal to the adapter's effect).

The merged folder also gets `lineage.json` and a model card (`README.md`) naming the base
model and revision, the adapter, the run and the library versions, plus the training
figures (`training_summary`: final / eval loss, steps, samples/s, tokens/s from the
adapter's log_history.json) and the LoRA hyper-parameters (from its args.json); what the
adapter folder does not record is shown as "not recorded".
"""

from __future__ import annotations

import gc
import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.common.adapter import BASE_MODEL_REF, LOG_HISTORY, summarize_log
from components.common.manifest import ManifestError, verify_if_marked, write_manifest
from components.common.snapshot import LINEAGE_FILE
from components.common.swift import run_command, swift_executable, to_cli
from components.merge_export._disk import DiskPeak, plan_disk
from components.merge_export._disk import MergeDiskError as MergeDiskError  # raised by merge_export

REQUIRED_FILES = ("config.json", "tokenizer_config.json", "preprocessor_config.json")

# dtype of the stored merged weights -> (rtol relative to max |reference logit|, atol).
LOGIT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-4, 1e-4),
    "bfloat16": (2e-2, 1e-2),
    "float16": (5e-3, 5e-3),
}
# Text prompts of the probe inputs (an image prompt is added when the processor takes images).
# Training figures of the model card: (key of summarize_log's figures, label).
TRAINING_FIGURES = (
    ("final_loss", "train loss (last logged step)"),
    ("train_loss", "train loss (mean over the run)"),
    ("eval_loss", "eval loss (last evaluation)"),
    ("steps", "optimizer steps"),
    ("train_runtime_s", "train runtime (s)"),
    ("samples_per_second", "train samples/s"),
    ("tokens_per_second", "train tokens/s"),
)
# LoRA hyper-parameters of the model card: (ms-swift argument in args.json, label).
HYPERPARAMETERS = (
    ("lora_rank", "LoRA rank"),
    ("lora_alpha", "LoRA alpha"),
    ("lora_dropout", "LoRA dropout"),
    ("target_modules", "target modules"),
    ("learning_rate", "learning rate"),
    ("num_train_epochs", "epochs"),
    ("max_steps", "max steps (-1 = by epochs)"),
    ("per_device_train_batch_size", "per-device batch size"),
    ("gradient_accumulation_steps", "gradient accumulation steps"),
    ("global_world_size", "processes (world size)"),
    ("max_length", "max length (tokens)"),
    ("torch_dtype", "dtype"),
    ("seed", "seed"),
)
NOT_RECORDED = "not recorded"
PROBE_TEXTS = (
    "Detect the elements of this engineering drawing. Answer with a fenced JSON list.",
    "List every hole and title block with its bounding box.",
)


class MergeError(RuntimeError):
    """Merging failed or the merged model does not verify; the message says why."""


class AdapterBaseMismatch(MergeError):
    """The adapter was trained on a different base model than the staged one."""


class MergeVerificationError(MergeError):
    """The merged model's logits differ from base model + adapter beyond the tolerance."""


@dataclass
class MergeResult:
    """What merging produced.

    Attributes:
        merged_dir: The merged model folder.
        metadata: merge_seconds, total_bytes, num_files, library versions
            (transformers, peft, ms_swift, torch), logit check figures (logits_max_abs_diff,
            logits_tolerance, adapter_effect_max_abs, probe_inputs), base model revision, and the
            disk: disk_need_bytes and disk_free_before_bytes (the check before the export),
            disk_peak_extra_bytes (the most the work folder's file system held above the start).
    """

    merged_dir: str
    metadata: dict[str, Any]


def library_versions() -> dict[str, str]:
    """Returns the versions of the libraries that merge and load models ("" if absent)."""
    from importlib import metadata

    out = {}
    for key, dist in (("transformers", "transformers"), ("peft", "peft"), ("ms_swift", "ms-swift"), ("torch", "torch")):
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[key] = ""
    return out


def build_export_command(
    adapter_dir: str, base_model_dir: str, output_dir: str, extra: dict[str, Any] | None = None
) -> list[str]:
    """Builds the `swift export --merge_lora true` command line (pure).

    Args:
        adapter_dir: Adapter folder (adapter weights + config + args.json).
        base_model_dir: The staged base model (overrides the path recorded in args.json,
            which may not exist on this machine).
        output_dir: Where the merged model goes (must not exist yet).
        extra: More `swift export` arguments. Default None.

    Returns:
        The argv list, starting with "swift", "export".
    """
    args = {"adapters": adapter_dir, "model": base_model_dir, "merge_lora": True, "output_dir": output_dir}
    args.update(extra or {})
    return ["swift", "export", *to_cli(args)]


class QuantizedMergeError(MergeError):
    """The merge would go into quantised weights or over them (merge-export merges into the original bf16 base)."""


def _quant_keys(args: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in args.items() if k.startswith(("quant_", "bnb_", "hqq_")) and v not in (None, "")}


def check_bf16_target(base_model_dir: str | Path, merged_out: str | Path) -> None:
    """Refuses a base folder that holds quantised weights, and an output that writes over the base.

    Raises:
        QuantizedMergeError: The base's config.json has a quantization_config (merge into the
            staged bf16 model instead), or merged_out is the base folder or inside it.
    """
    base = Path(base_model_dir).resolve()
    config = _read_json(base / "config.json")
    quant = config.get("quantization_config") if isinstance(config, dict) else None
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else quant
        raise QuantizedMergeError(
            f"{base}/config.json has a quantization_config ({method}): merge-export merges the adapter into the "
            "original bf16 base, never into quantised weights; give it stage-model's model (model.quantization only "
            "changes how train-lora loads it)"
        )
    out = Path(merged_out).resolve()
    if out == base or base in out.parents:
        raise QuantizedMergeError(
            f"merged output {out} is the base model folder or inside it: merge-export never writes over the base "
            "weights; give the merged model a folder of its own"
        )


def bf16_adapter_view(adapter_dir: Path, work_dir: Path) -> tuple[Path, dict[str, Any]]:
    """The adapter as `swift export` must see it to merge into the bf16 base.

    ms-swift's export reloads quant_method / quant_bits / bnb_4bit_* from the adapter's args.json
    (`load_args_from_ckpt`), which would load the base in 4 or 8 bits and merge into dequantised
    weights. For an adapter trained on a quantised base this returns a folder in `work_dir` whose
    files link to the adapter's and whose args.json lacks those keys.

    Returns:
        (the folder to give `swift export`, the quant arguments training used; {} = a bf16 base,
        and the adapter folder itself is returned).
    """
    args = _read_json(adapter_dir / "args.json")
    # ms-swift records bnb_4bit_* defaults for every run: only a quant_method makes the base a quantised one
    quant = _quant_keys(args) if isinstance(args, dict) and args.get("quant_method") else {}
    if not quant:
        return adapter_dir, {}
    view = work_dir / "adapter-bf16"
    if view.exists():
        shutil.rmtree(view)
    view.mkdir(parents=True)
    for path in adapter_dir.iterdir():
        if path.name != "args.json":
            (view / path.name).symlink_to(path.resolve())
    kept = {k: v for k, v in args.items() if k not in quant}
    (view / "args.json").write_text(json.dumps(kept, indent=2), encoding="utf-8")
    return view, quant


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        return {}


def training_summary(adapter_dir: str | Path) -> dict[str, Any]:
    """Training figures and LoRA hyper-parameters recorded in an adapter folder.

    Reads `log_history.json` (the trainer's log entries, written by train-lora) through
    `components.common.adapter.summarize_log`, and `args.json` (ms-swift's arguments).
    A missing or unreadable file is not an error: its values are left out and the file is
    listed under "missing".

    Args:
        adapter_dir: Adapter folder from train-lora.

    Returns:
        {"metrics": summarize_log's figures (final_loss, train_loss, eval_loss, steps,
        samples_per_second, tokens_per_second, ...), "hyperparameters": the HYPERPARAMETERS
        keys found in args.json plus effective_batch_size when computable, "missing": names
        of the files that were absent or unreadable}.
    """
    adapter = Path(adapter_dir)
    missing: list[str] = []
    history: Any = None
    try:
        history = json.loads((adapter / LOG_HISTORY).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    if not isinstance(history, list):
        missing.append(LOG_HISTORY)
        history = []
    metrics = summarize_log([e for e in history if isinstance(e, dict)]) if history else {}
    args = _read_json(adapter / "args.json")
    if not isinstance(args, dict) or not args:
        missing.append("args.json")
        args = {}
    hyper = {key: args[key] for key, _ in HYPERPARAMETERS if args.get(key) is not None}
    if args.get("max_pixels"):  # the training resize: evaluate and serving apply it too (not a card row)
        hyper["max_pixels"] = args["max_pixels"]
    batch, accum = hyper.get("per_device_train_batch_size"), hyper.get("gradient_accumulation_steps")
    if isinstance(batch, int) and isinstance(accum, int):
        world = hyper.get("global_world_size")
        hyper["effective_batch_size"] = batch * accum * (world if isinstance(world, int) and world > 0 else 1)
    return {"metrics": metrics, "hyperparameters": hyper, "missing": missing}


def _model_facts(model_dir: Path) -> dict[str, Any]:
    """Architecture, sizes and revision of a model folder (from config.json / manifest.json)."""
    config = _read_json(model_dir / "config.json")
    text = config.get("text_config") or config
    archs = config.get("architectures") or []
    return {
        "architecture": archs[0] if archs else "",
        "model_type": config.get("model_type", ""),
        "hidden_size": text.get("hidden_size"),
        "num_hidden_layers": text.get("num_hidden_layers"),
        "vocab_size": text.get("vocab_size"),
        "revision": _read_json(model_dir / "manifest.json").get("revision", ""),
    }


def _weight_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """Names and shapes of a folder's safetensors weights (reads headers only)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for key in f.keys():
                shapes[key] = tuple(f.get_slice(key).get_shape())
    return shapes


def check_adapter_base(adapter_dir: str | Path, base_model_dir: str | Path) -> dict[str, Any]:
    """Refuses an adapter that was trained on another base model than the staged one.

    Compares what the adapter recorded (base_model.json of train-lora; the config of
    adapter_config.json's base_model_name_or_path when that folder exists here) with the
    staged model's config.json / manifest.json: architecture, hidden size, layer count,
    vocabulary and revision, each where both sides know it. Then checks every LoRA pair
    against the base weight it adapts: lora_A is (r, in_features), lora_B (out_features, r).

    Returns:
        The staged model's facts (architecture, model_type, sizes, revision).

    Raises:
        AdapterBaseMismatch: A recorded fact or a weight shape differs; the message names it.
        MergeError: The adapter folder has no adapter_config.json.
    """
    adapter, base = Path(adapter_dir), Path(base_model_dir)
    config = _read_json(adapter / "adapter_config.json")
    if not config:
        raise MergeError(f"{adapter}: no adapter_config.json; this is not a LoRA adapter folder")
    staged = _model_facts(base)
    recorded = dict(_read_json(adapter / BASE_MODEL_REF))
    origin = Path(str(config.get("base_model_name_or_path") or ""))
    if str(origin) not in ("", ".") and (origin / "config.json").is_file() and origin.resolve() != base.resolve():
        for key, value in _model_facts(origin).items():
            if value not in (None, ""):
                recorded.setdefault(key, value)
    for key in ("architecture", "hidden_size", "num_hidden_layers", "vocab_size", "revision"):
        mine, theirs = staged.get(key), recorded.get(key)
        if mine not in (None, "") and theirs not in (None, "") and mine != theirs:
            raise AdapterBaseMismatch(
                f"adapter {adapter} was trained on a base model with {key}={theirs!r}, "
                f"the staged model {base} has {key}={mine!r}"
            )
    adapter_files = sorted(adapter.glob("adapter_model*.safetensors"))
    if adapter_files:
        base_shapes = _weight_shapes(base)
        lora_shapes = _weight_shapes(adapter)
        checked = 0
        for key, shape in sorted(lora_shapes.items()):
            for part, dim in ((".lora_A.", 1), (".lora_B.", 0)):
                if part not in key or len(shape) != 2:
                    continue
                name = key.removeprefix("base_model.model.").replace(part, ".").replace(".default.", ".")
                base_shape = base_shapes.get(name)
                if base_shape is None:
                    continue
                checked += 1
                want = base_shape[1] if dim == 1 else base_shape[0]
                if shape[dim] != want:
                    raise AdapterBaseMismatch(
                        f"adapter {adapter}: {key} has shape {list(shape)}, which does not fit the staged "
                        f"model's {name} of shape {list(base_shape)}: the adapter was trained on another base model"
                    )
        n_pairs = sum(1 for k in lora_shapes if ".lora_A." in k)
        if n_pairs and not checked:
            raise AdapterBaseMismatch(
                f"adapter {adapter}: none of its {n_pairs} LoRA modules exists in the staged model {base}: "
                "the adapter was trained on another base model"
            )
    return staged


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
    config = _read_json(model_dir / "config.json")
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


def _safetensors_index(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file of a model folder that holds it."""
    from safetensors import safe_open

    index: dict[str, Path] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                index[key] = path
    return index


class _Reader:
    """Reads tensors by name from a folder's safetensors files, keeping files open."""

    def __init__(self, folder: Path):
        self.index = _safetensors_index(folder)
        self._open: dict[Path, Any] = {}

    def get(self, key: str) -> Any:
        from safetensors import safe_open

        path = self.index[key]
        if path not in self._open:
            self._open[path] = safe_open(str(path), framework="pt")
        return self._open[path].get_tensor(key)


# Stored mantissa bits by dtype, and how many rounding steps an element may be off.
_MANTISSA_BITS = {"float32": 23, "bfloat16": 7, "float16": 10}
_STEPS_ALLOWED = {"float32": 4, "bfloat16": 1, "float16": 1}


def _ulp(x: Any, bits: int) -> Any:
    """The spacing of representable values at |x| for a float format with `bits` mantissa bits."""
    import torch

    _, exponent = torch.frexp(x.abs())
    return torch.ldexp(torch.ones_like(x), exponent - 1 - bits).clamp_min(2.0**-126)


def _lora_modules(adapter_dir: Path) -> tuple[dict[str, tuple[Any, Any]], float]:
    """Module path -> (lora_A, lora_B) weights, and the scale alpha / r (or / sqrt(r)).

    A path may end in `.base_layer` (peft nests one ParamWrapper per targeted parameter of a
    module: `mlp.experts.base_layer` and `mlp.experts` are the two expert parameters).
    """
    from safetensors.torch import load_file

    config = _read_json(adapter_dir / "adapter_config.json")
    rank = int(config.get("r") or 0)
    alpha = float(config.get("lora_alpha") or rank)
    if rank <= 0:
        raise MergeError(f"{adapter_dir}/adapter_config.json: no LoRA rank `r`")
    scale = alpha / (rank**0.5 if config.get("use_rslora") else rank)
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    modules: dict[str, dict[str, Any]] = {}
    for key, value in tensors.items():
        for part in ("lora_A", "lora_B"):
            marker = f".{part}."
            if marker in key:
                path = key.split(marker)[0].removeprefix("base_model.model.")
                modules.setdefault(path, {})[part] = value
    pairs = {k: (v["lora_A"], v["lora_B"]) for k, v in modules.items() if "lora_A" in v and "lora_B" in v}
    if not pairs:
        raise MergeError(f"{adapter_dir}/adapter_model.safetensors: no lora_A/lora_B weight pairs")
    return pairs, scale


@dataclass
class _Update:
    """One LoRA pair of the adapter and the base tensors it may update.

    Attributes:
        path: The adapter's module path (may end in `.base_layer`).
        lora_a: lora_A weight (r x in; r·E x in for E experts).
        lora_b: lora_B weight (out x r; out x r·E).
        candidates: Base tensor names it may update: the Linear's `.weight`, or, for a
            parameter targeted with peft's `target_parameters`, the module's targeted
            parameters (which pair is which is not in the file: the check tries each).
    """

    path: str
    lora_a: Any
    lora_b: Any
    candidates: list[str]


def _adapter_updates(adapter_dir: Path, base_index: dict[str, Path]) -> tuple[list[_Update], float]:
    """The adapter's LoRA pairs, each with the base tensors it may update.

    Raises:
        MergeVerificationError: A pair updates no tensor of the base model.
    """
    pairs, scale = _lora_modules(adapter_dir)
    targeted = [str(p) for p in _read_json(adapter_dir / "adapter_config.json").get("target_parameters") or []]
    updates = []
    for path, (lora_a, lora_b) in sorted(pairs.items()):
        module = path
        while module.endswith(".base_layer"):
            module = module[: -len(".base_layer")]
        if f"{path}.weight" in base_index:
            candidates = [f"{path}.weight"]
        else:
            names = {f"{module}.{p.rsplit('.', 1)[-1]}" for p in targeted}
            candidates = sorted(n for n in names if n in base_index and any(n.endswith(p) for p in targeted))
        if not candidates:
            raise MergeVerificationError(
                f"{adapter_dir}: adapter module {path} has no weight {path}.weight (nor a targeted parameter "
                f"{targeted or '(target_parameters empty)'}) in the base model's safetensors; "
                "the adapter does not match this base"
            )
        updates.append(_Update(path, lora_a, lora_b, candidates))
    return updates, scale


def _deltas(update: _Update, scale: float, shape: tuple[int, ...], device: str) -> list[Any]:
    """W's possible LoRA updates of `shape` (float32): B @ A, or per expert as peft's ParamWrapper does."""
    import torch

    a = update.lora_a.to(device, torch.float32)
    b = update.lora_b.to(device, torch.float32)
    if len(shape) == 2:
        delta = b @ a
        return [scale * delta] if tuple(delta.shape) == tuple(shape) else []
    experts = shape[0]
    if len(shape) != 3 or a.shape[0] % experts or b.shape[1] % experts:
        return []
    a3 = a.reshape(experts, -1, a.shape[-1])  # experts x r x in
    b3 = b.reshape(b.shape[0], -1, experts)  # out x r x experts
    out = []
    for pattern in ("o r e, e r i -> e i o", "o r e, e r i -> e o i"):
        delta = torch.einsum(pattern, b3, a3)  # square experts: both orders fit, both are tried
        if tuple(delta.shape) == tuple(shape):
            out.append(scale * delta)
    return out


def _aligned(base_tensor: Any, shape: tuple[int, ...]) -> tuple[Any, bool]:
    """The base tensor in the merged model's layout: transformers 5 keeps Qwen3-VL-MoE experts as
    (E, out, in) and saves them so, the released checkpoints store (E, in, out)."""
    if tuple(base_tensor.shape) != tuple(shape) and base_tensor.ndim == 3:
        flipped = base_tensor.transpose(1, 2)
        if tuple(flipped.shape) == tuple(shape):
            return flipped, True
    return base_tensor, False


def _within_fraction(w: Any, delta: Any, got: Any, stored_dtype: Any) -> float:
    """Share of elements of `got` equal to W + delta rounded to the stored dtype (to its rounding steps)."""
    import torch

    dtype_name = str(stored_dtype).removeprefix("torch.")
    bits, steps = _MANTISSA_BITS.get(dtype_name, 7), _STEPS_ALLOWED.get(dtype_name, 1)
    # a merge rounds once (W + update) or, like peft on a bf16 base, rounds the update to
    # the weight dtype first and then the sum; either is accepted, to `steps` rounding steps
    single = (w + delta).to(stored_dtype).float()
    double = (w.to(stored_dtype) + delta.to(stored_dtype)).float()
    err = torch.minimum((got - single).abs(), (got - double).abs())
    return float((err <= steps * _ulp(torch.maximum(single.abs(), got.abs()), bits)).float().mean())


def _check_adapted(
    updates: list[_Update], scale: float, base: _Reader, merged: _Reader, device: str
) -> tuple[dict[str, float], int, int, int]:
    """Each update against its best-fitting candidate tensor.

    Returns:
        (tensor -> share of elements within rounding, changed elements, total elements,
        tensors whose base layout was transposed).
    """
    import torch

    fractions: dict[str, float] = {}
    changed = total = transposed = 0
    for update in updates:
        best, best_key, best_changed, best_total, flipped_best = -1.0, "", 0, 0, False
        for key in update.candidates:
            if key in fractions:  # each targeted tensor takes one pair
                continue
            got_raw = merged.get(key)
            got = got_raw.to(device, torch.float32)
            w, flipped = _aligned(base.get(key), tuple(got.shape))
            w = w.to(device, torch.float32)
            for delta in _deltas(update, scale, tuple(got.shape), device):
                fraction = _within_fraction(w, delta, got, got_raw.dtype)
                if fraction > best:
                    best, best_key, flipped_best = fraction, key, flipped
                    best_changed, best_total = int((got != w).sum()), w.numel()
                del delta
            del w, got, got_raw
        if not best_key:
            raise MergeVerificationError(
                f"update {update.path} (lora_A {tuple(update.lora_a.shape)}, lora_B {tuple(update.lora_b.shape)}) "
                f"fits none of {', '.join(update.candidates)} in shape; the adapter does not match this base"
            )
        fractions[best_key] = best
        changed, total, transposed = changed + best_changed, total + best_total, transposed + int(flipped_best)
    return fractions, changed, total, transposed


def _check_untouched(base: _Reader, merged: _Reader, adapted: set[str]) -> tuple[list[str], int]:
    """Tensors the adapter does not touch that differ from the base (in either expert layout)."""
    import torch

    differing, transposed = [], 0
    for key in base.index:
        if key in adapted:
            continue
        b = merged.get(key)
        a, flipped = _aligned(base.get(key), tuple(b.shape))
        transposed += int(flipped)
        if a.shape != b.shape or not torch.equal(a.to(b.dtype), b):
            differing.append(key)
    return differing, transposed


def compare_weights(
    base_model_dir: str | Path, adapter_dir: str | Path, merged_dir: str | Path, min_fraction: float = 0.999
) -> dict[str, Any]:
    """Checks the merged weights tensor by tensor against base weights + adapter update.

    One tensor at a time is read (safetensors, memory-mapped), so a model of tens of GB is
    checked in a few GB of memory. LoRA on Linear layers (`target_modules`) and on expert
    parameters of a mixture-of-experts model (peft's `target_parameters`, one update per
    expert) are both checked; a base stored in the released checkpoints' expert layout
    (E, in, out) is compared with the merged model's (E, out, in).

    Args:
        base_model_dir: Staged base model.
        adapter_dir: The adapter that was merged.
        merged_dir: The merged model.
        min_fraction: Share of each adapted weight's elements that must equal
            W + scale * B @ A rounded to the merged dtype (rounded once, or the update
            rounded first as peft does on a bf16 base), to one rounding step (four in
            float32, where the update's matmul order differs). Default 0.999. An element
            whose update is below the dtype's resolution must then equal the base value;
            one whose update is representable must show it, so a dropped update fails.

    Returns:
        {"weights_checked", "adapted_weights", "adapted_within_step_min_fraction",
        "adapted_changed_fraction", "layout_transposed", "weights_seconds"}:
        adapted_changed_fraction is the share of adapted elements whose merged value differs
        from the base (below bf16's resolution an update is rounded away: legitimate, but
        worth knowing); layout_transposed counts expert tensors stored transposed in the base.

    Raises:
        MergeVerificationError: An adapted weight is not base + update, another tensor
            differs from the base, or the merged model lacks tensors of the base.
    """
    import torch

    start = time.time()
    base, merged = _Reader(Path(base_model_dir)), _Reader(Path(merged_dir))
    missing = sorted(set(base.index) - set(merged.index))
    if missing:
        raise MergeVerificationError(
            f"{merged_dir}: merged model lacks {len(missing)} tensor(s) of the base model, "
            f"e.g. {', '.join(missing[:3])}; the merge is wrong"
        )
    updates, scale = _adapter_updates(Path(adapter_dir), base.index)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    fractions, changed, total, flipped = _check_adapted(updates, scale, base, merged, device)
    worst_key = min(fractions, key=fractions.get)
    worst = fractions[worst_key]
    if worst < min_fraction:
        raise MergeVerificationError(
            f"{merged_dir}: merged weight {worst_key} is base + adapter update for only {worst:.2%} of its elements "
            f"(need {min_fraction:.1%} within the merged dtype's rounding); the merge is wrong"
        )
    differing, flipped_untouched = _check_untouched(base, merged, set(fractions))
    if differing:
        raise MergeVerificationError(
            f"{merged_dir}: {len(differing)} tensor(s) that the adapter does not touch differ from the base model, "
            f"e.g. {', '.join(differing[:3])}; the merge is wrong"
        )
    return {
        "weights_checked": len(base.index),
        "adapted_weights": len(fractions),
        "adapted_within_step_min_fraction": worst,
        "adapted_changed_fraction": changed / total if total else 0.0,
        "layout_transposed": flipped + flipped_untouched,
        "weights_seconds": round(time.time() - start, 2),
    }


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


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "—"
    return str(value) if value not in (None, "") else "—"


def _training_lines(training: dict[str, Any]) -> list[str]:
    """The model card's training section: figures and LoRA hyper-parameters, gaps named."""
    figures = training.get("metrics") or {}
    hyper = training.get("hyperparameters") or {}
    lines = ["", "## Training", ""]
    missing = training.get("missing") or []
    if missing:
        lines += [f"The adapter folder has no readable {' or '.join(missing)}: those values are not recorded.", ""]
    lines += ["| figure | value |", "|---|---|"]
    for key, label in TRAINING_FIGURES:
        lines.append(f"| {label} | {_fmt(figures[key]) if key in figures else NOT_RECORDED} |")
    lines += ["", "### LoRA hyper-parameters", "", "| argument | value |", "|---|---|"]
    for key, label in HYPERPARAMETERS:
        lines.append(f"| {label} (`{key}`) | {_fmt(hyper[key]) if key in hyper else NOT_RECORDED} |")
    effective = hyper.get("effective_batch_size")
    lines.append(
        "| effective batch size (batch × accumulation × processes) | "
        f"{effective if effective is not None else NOT_RECORDED} |"
    )
    return lines


def model_card(lineage: dict[str, Any], metrics: dict[str, Any] | None = None) -> str:
    """Returns the merged model's README.md (pure): lineage, verification, training, metrics.

    Args:
        lineage: What lineage.json holds (base_model, adapter, run_id, versions,
            verification, training: `training_summary(...)`; a lineage without
            "training" gets no training section).
        metrics: More metrics to list (e.g. evaluation figures). Default None.
    """
    base = lineage.get("base_model") or {}
    name = base.get("source") or base.get("uri") or base.get("model_dir") or "unknown"
    lines = [
        "---",
        f"base_model: {name}",
        "library_name: transformers",
        "tags: [lora, merged, ms-swift, qwen3-vl]",
        "---",
        "",
        f"# LoRA-merged {base.get('architecture') or 'model'}",
        "",
        "The LoRA adapter merged into its base model with `swift export --merge_lora true`, "
        "then verified: its logits match base model + adapter (peft) on probe inputs.",
        "",
        "## Lineage",
        "",
        "| | |",
        "|---|---|",
        f"| base model | `{name}` |",
        f"| base revision | `{_fmt(base.get('revision'))}` |",
        f"| base architecture | {_fmt(base.get('architecture'))} ({_fmt(base.get('model_type'))}) |",
        f"| adapter | `{_fmt(lineage.get('adapter'))}` |",
        f"| run | {_fmt(lineage.get('run_id'))} |",
    ]
    data = lineage.get("data") or {}
    if data:
        lines += [
            f"| data snapshot | `{_fmt(data.get('snapshot'))}` ({_fmt(data.get('files'))} files, "
            f"{_fmt(data.get('rows'))} rows: {_fmt(data.get('train_rows'))} train, {_fmt(data.get('eval_rows'))} eval; "
            f"`{LINEAGE_FILE}` lists every file) |",
            f"| training key (data + settings) | `{_fmt(data.get('training_key'))}` |",
        ]
    for key, value in sorted((lineage.get("versions") or {}).items()):
        lines.append(f"| {key} | {_fmt(value)} |")
    trained = lineage.get("trained_on") or {}
    if trained:
        lines += [
            "",
            "## Quantised training base (QLoRA)",
            "",
            f"The adapter was trained on a {trained.get('quantization')} (bitsandbytes) base: "
            + ", ".join(f"`--{k} {v}`" for k, v in sorted((trained.get("swift_args") or {}).items()))
            + ". It was merged into the original bf16 base model (stage-model's), not into dequantised "
            "4-bit weights, and checked against base + update; the merged model therefore differs slightly "
            "from the quantised model the adapter saw in training.",
        ]
    check = lineage.get("verification") or {}
    if check:
        lines += ["", "## Merge verification", "", "| | |", "|---|---|"]
        lines += [f"| {key} | {_fmt(value)} |" for key, value in sorted(check.items())]
    if "training" in lineage:
        lines += _training_lines(lineage.get("training") or {})
    if metrics:
        lines += ["", "## Metrics", "", "| metric | value |", "|---|---|"]
        lines += [f"| {key} | {_fmt(value)} |" for key, value in sorted(metrics.items())]
    return "\n".join(lines) + "\n"


def merge_export(
    adapter_dir: str,
    base_model_dir: str,
    merged_out: str,
    work_dir: str,
    run_id: str = "",
    metrics: dict[str, Any] | None = None,
    verify_logits: bool = True,
    adapter_marker: str = "",
) -> MergeResult:
    """Merges the adapter into the base model and verifies the result.

    Args:
        adapter_dir: Adapter folder from train-lora.
        base_model_dir: Staged base model folder.
        merged_out: Output folder for the merged model.
        work_dir: Scratch folder.
        run_id: Pipeline run that produced the adapter, for the lineage. Default "".
        metrics: Metrics for the model card (e.g. training figures). Default None.
        verify_logits: Compare merged logits with base + adapter (peft). Default True.
        adapter_marker: The sha256 of the adapter's completion marker as train-lora recorded it
            (its `manifest_sha256`). Default "": checked when the folder has a marker.

    Returns:
        The MergeResult; its folder holds a completion marker (`components.common.manifest`)
        written last, whose sha256 is `metadata["manifest_sha256"]`.

    Raises:
        MergeError: The adapter's files differ from its completion marker (naming the file), the
            adapter is not one, `swift export` failed, or the result does not verify.
        AdapterBaseMismatch: The adapter was trained on another base model.
        MergeVerificationError: The merged logits differ from base + adapter.
        MergeDiskError: The work folder (or the output's file system) has less free space than the
            merged model needs (`_disk.plan_disk`), checked before `swift export` starts.
    """
    adapter = Path(adapter_dir)
    try:  # the adapter as train-lora wrote it, never a truncated or edited copy
        verify_if_marked(adapter, expected_sha256=adapter_marker, fix="train the adapter again (--no-cache)")
    except ManifestError as exc:
        raise MergeError(str(exc)) from None
    staged = check_adapter_base(adapter, base_model_dir)
    check_bf16_target(base_model_dir, merged_out)
    disk = plan_disk(base_model_dir, work_dir, merged_out)
    print(
        f"merge-export: disk: needs {disk.need_work_bytes / 1e9:.2f} GB in {work_dir} "
        f"(merged model ~{disk.weights_bytes / 1e9:.2f} GB), {disk.free_work_bytes / 1e9:.2f} GB free",
        flush=True,
    )
    tmp_out = Path(work_dir) / "merged"
    if tmp_out.exists():
        shutil.rmtree(tmp_out)
    with DiskPeak(work_dir) as peak:
        seconds, quant = _export(adapter, base_model_dir, tmp_out, Path(work_dir))
        facts = verify_merged(tmp_out)
        check = _check(base_model_dir, adapter, tmp_out, verify_logits)
        out = _move(tmp_out, Path(merged_out))
    print(
        f"merge-export: disk: peak {peak.peak_bytes / 1e9:.2f} GB above the start in {work_dir} "
        f"(sampled every 0.5 s; the merged model {facts.get('total_bytes', 0) / 1e9:.2f} GB)",
        flush=True,
    )
    lineage = _lineage(adapter, base_model_dir, staged, out, run_id, check, quant)
    (out / "lineage.json").write_text(json.dumps(lineage, indent=2, sort_keys=True), encoding="utf-8")
    (out / "README.md").write_text(model_card(lineage, metrics), encoding="utf-8")
    metadata = {
        "manifest_sha256": write_manifest(out, producer="merge-export"),  # last: a reuse checks the files
        "merge_seconds": round(seconds, 2),
        **lineage["versions"],
        **facts,
        **{k: v for k, v in check.items() if isinstance(v, (int, float, str))},
        **disk.metadata(),
        "disk_peak_extra_bytes": peak.peak_bytes,
        "base_revision": lineage["base_model"].get("revision", ""),
        "trained_on_quantization": _quant_label(quant) if quant else "none",
    }
    if run_id:
        metadata["run_id"] = run_id
    if lineage["data"]:
        metadata.update({"data_snapshot": lineage["data"]["snapshot"], "training_key": lineage["data"]["training_key"]})
    return MergeResult(str(out), metadata)


def _export(adapter: Path, base_model_dir: str, tmp_out: Path, work_dir: Path) -> tuple[float, dict[str, Any]]:
    """Runs `swift export --merge_lora true` into tmp_out.

    Returns:
        (seconds it took, the adapter's quant arguments: {} when trained on a bf16 base).

    Raises:
        MergeError: swift export exited non-zero (its last line in the message).
    """
    export_adapter, quant = bf16_adapter_view(adapter, work_dir)
    if quant:
        print(f"merge-export: adapter trained on a {_quant_label(quant)} base; merging into the bf16 base", flush=True)
    recorded = _read_json(adapter / BASE_MODEL_REF)
    # ms-swift's model_type (recorded by train-lora; args.json has it too): without it
    # swift cannot tell qwen3_vl from qwen3_vl_emb / qwen3_vl_reranker for an adapter without args.json.
    extra = {"model_type": recorded["model_type"]} if recorded.get("model_type") else None
    cmd = build_export_command(str(export_adapter), base_model_dir, str(tmp_out), extra)
    cmd[0] = swift_executable()
    print("merge-export:", " ".join(cmd), flush=True)
    start = time.time()
    code, tail = run_command(cmd)
    if code != 0:
        last = [line for line in tail.splitlines() if line.strip()][-1:] or ["(no output)"]
        raise MergeError(f"swift export exited with code {code}; last line: {last[0]}")
    return time.time() - start, quant


def _check(base_model_dir: str, adapter: Path, merged: Path, verify_logits: bool) -> dict[str, Any]:
    """The weight check, then (verify_logits) the logits check; their figures, logged."""
    check: dict[str, Any] = compare_weights(base_model_dir, adapter, merged)
    print(
        f"merge-export: {check['adapted_weights']} adapted weights are base + update (worst "
        f"{check['adapted_within_step_min_fraction']:.4%} within one rounding step), the other "
        f"{check['weights_checked'] - check['adapted_weights']} tensors match the base",
        flush=True,
    )
    if verify_logits:
        start_check = time.time()
        check.update(compare_logits(base_model_dir, adapter, merged))
        check["verify_seconds"] = round(time.time() - start_check, 2)
        relation = (
            "<="
            if check["logits_within_tolerance"]
            else "> (rounding of the merged weights; accepted: "
            "the weights check passed and the merged model is closer to base + adapter than the base is)"
        )
        print(
            f"merge-export: logits vs base + adapter: max |diff| {check['logits_max_abs_diff']:.3g} {relation} "
            f"tolerance {check['logits_tolerance']:.3g} (adapter effect {check['adapter_effect_max_abs']:.3g})",
            flush=True,
        )
    return check


def _move(tmp_out: Path, out: Path) -> Path:
    """Moves the checked files into the output folder one by one (renamed on the same file system)."""
    out.mkdir(parents=True, exist_ok=True)
    for path in tmp_out.iterdir():  # moved, not copied: a second copy of tens of GB may not fit the disk
        dst = out / path.name
        if dst.is_dir():
            shutil.rmtree(dst)
        shutil.move(str(path), str(dst))
    return out


def _lineage(
    adapter: Path,
    base_model_dir: str,
    staged: dict[str, Any],
    out: Path,
    run_id: str,
    check: dict[str, Any],
    quant: dict[str, Any],
) -> dict[str, Any]:
    """lineage.json's content: base and revision, adapter, data, run, versions, checks, training."""
    versions = library_versions()
    base_ref = {
        "model_dir": str(base_model_dir),
        **{k: v for k, v in staged.items() if v not in (None, "")},
        **_read_json(adapter / BASE_MODEL_REF),
    }
    lineage = {
        "base_model": base_ref,
        "adapter": str(adapter),
        "data": _data_lineage(adapter, out),
        "run_id": run_id,
        "transformers": versions["transformers"],
        "versions": versions,
        "verification": check,
        "training": training_summary(adapter),
    }
    if quant:
        lineage["trained_on"] = {"quantization": _quant_label(quant), "swift_args": quant, "merged_into": "bf16 base"}
    return lineage


def _quant_label(quant: dict[str, Any]) -> str:
    """nf4 / int8 / the method and bits, from ms-swift's quant arguments."""
    if str(quant.get("quant_method")) == "bnb" and str(quant.get("quant_bits")) == "4":
        return str(quant.get("bnb_4bit_quant_type") or "nf4")
    if str(quant.get("quant_method")) == "bnb" and str(quant.get("quant_bits")) == "8":
        return "int8"
    return f"{quant.get('quant_method', '?')} {quant.get('quant_bits', '?')}-bit"


def _data_lineage(adapter: Path, out: Path) -> dict[str, Any]:
    """Copies the adapter's data lineage (validate-data's snapshot file) beside the merged model.

    Returns:
        {"snapshot": fingerprint, "training_key", "files", "rows", "train_rows", "eval_rows"}
        for lineage.json and the card; {} when the adapter has none (trained without a snapshot).
    """
    src = adapter / LINEAGE_FILE
    if not src.is_file():
        return {}
    shutil.copyfile(src, out / LINEAGE_FILE)
    full = _read_json(src)
    return {
        "snapshot": full.get("snapshot", {}).get("fingerprint", ""),
        "training_key": full.get("training_key", ""),
        "files": len(full.get("files", {})),
        "rows": full.get("n_rows"),
        "train_rows": full.get("n_train"),
        "eval_rows": full.get("n_eval"),
        "task": full.get("task", ""),  # what validate-data checked the rows for ("" = free text)
    }
