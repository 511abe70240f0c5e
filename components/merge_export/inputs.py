"""What merge-export accepts: an adapter of the staged base, merged into bf16 weights.

* `check_adapter_base`: the adapter must belong to the staged base model (same
  architecture and revision where both are recorded, every LoRA matrix fits the base
  weight it adapts);
* `check_bf16_target`: the base holds no quantised weights and the output is not over it;
* `bf16_adapter_view`: an adapter trained on a quantised base, as `swift export` must see
  it to merge into the bf16 base.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from components.common.adapter import BASE_MODEL_REF
from components.merge_export._json import read_json
from components.merge_export.errors import AdapterBaseMismatch, MergeError, QuantizedMergeError


def _quant_keys(args: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in args.items() if k.startswith(("quant_", "bnb_", "hqq_")) and v not in (None, "")}


def check_bf16_target(base_model_dir: str | Path, merged_out: str | Path) -> None:
    """Refuses a base folder that holds quantised weights, and an output that writes over the base.

    Raises:
        QuantizedMergeError: The base's config.json has a quantization_config (merge into the
            staged bf16 model instead), or merged_out is the base folder or inside it.
    """
    base = Path(base_model_dir).resolve()
    config = read_json(base / "config.json")
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
    args = read_json(adapter_dir / "args.json")
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


def _model_facts(model_dir: Path) -> dict[str, Any]:
    """Architecture, sizes and revision of a model folder (from config.json / manifest.json)."""
    config = read_json(model_dir / "config.json")
    text = config.get("text_config") or config
    archs = config.get("architectures") or []
    return {
        "architecture": archs[0] if archs else "",
        "model_type": config.get("model_type", ""),
        "hidden_size": text.get("hidden_size"),
        "num_hidden_layers": text.get("num_hidden_layers"),
        "vocab_size": text.get("vocab_size"),
        "revision": read_json(model_dir / "manifest.json").get("revision", ""),
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
    config = read_json(adapter / "adapter_config.json")
    if not config:
        raise MergeError(f"{adapter}: no adapter_config.json; this is not a LoRA adapter folder")
    staged = _model_facts(base)
    recorded = dict(read_json(adapter / BASE_MODEL_REF))
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


def quant_label(quant: dict[str, Any]) -> str:
    """nf4 / int8 / the method and bits, from ms-swift's quant arguments."""
    if str(quant.get("quant_method")) == "bnb" and str(quant.get("quant_bits")) == "4":
        return str(quant.get("bnb_4bit_quant_type") or "nf4")
    if str(quant.get("quant_method")) == "bnb" and str(quant.get("quant_bits")) == "8":
        return "int8"
    return f"{quant.get('quant_method', '?')} {quant.get('quant_bits', '?')}-bit"
