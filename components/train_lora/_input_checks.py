"""Checks of the config and the inputs that fail before the first training step, with the knob to turn.

All of them read only small files (config.json, safetensors headers), never the weights.
The hardware check (GPUs, interconnect) is `components.common.preflight`.
"""

from __future__ import annotations

import json
import re
import struct
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.common import quantization
from components.common.errors import TrainError
from components.common.model_fit import LIGER_WITH_PARAMETERS


class InputCheckError(TrainError):
    """An input makes training fail later; the message names the setting."""


class QuantizationUnavailableError(InputCheckError):
    """model.quantization asks for bitsandbytes where it is missing or cannot run (no CUDA GPU for its kernels)."""


def load_model_config(model_dir: str | Path) -> dict[str, Any]:
    """The base model's config.json ({} when missing or not JSON): train-lora reads it once a run (`_facts`)."""
    try:
        return json.loads(Path(model_dir, "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def expert_count(config: Mapping[str, Any]) -> int:
    """Experts per MoE layer of a (possibly multimodal) HF config; 0 for a dense model."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    experts = text.get("num_experts") or text.get("num_local_experts")  # transformers 5 writes the latter
    return experts if isinstance(experts, int) and experts > 0 else 0


def max_position_embeddings(config: Mapping[str, Any]) -> int | None:
    """The language model's context limit from a (possibly multimodal) HF config."""
    for sub in ("text_config", "llm_config", "language_config"):
        inner = config.get(sub)
        if isinstance(inner, dict) and isinstance(inner.get("max_position_embeddings"), int):
            return inner["max_position_embeddings"]
    value = config.get("max_position_embeddings")
    return value if isinstance(value, int) else None


def check_max_length(swift_args: Mapping[str, Any], config: Mapping[str, Any]) -> None:
    """Raises InputCheckError when swift.max_length exceeds the model's max_position_embeddings."""
    raw = swift_args.get("max_length")
    limit = max_position_embeddings(config)
    if raw is None or limit is None:
        return
    try:
        length = int(float(raw))
    except (TypeError, ValueError):
        return
    if length > limit:
        raise InputCheckError(
            f"swift.max_length {length} is larger than the model's max_position_embeddings {limit}: "
            f"lower swift.max_length to at most {limit}"
        )


_DTYPE_BYTES = {
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F64": 8,
    "I64": 8,
    "I32": 4,
    "I8": 1,
    "U8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}


def _headers(model_dir: str | Path) -> dict[str, dict[str, Any]]:
    """Tensor name -> {"dtype", "shape"} from the safetensors headers (no weights read)."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        try:
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
        except (OSError, ValueError, struct.error):
            continue
        out.update({k: v for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)})
    return out


def weight_names(model_dir: str | Path) -> list[str]:
    """Tensor names of the model's safetensors files (read from the index or the file headers)."""
    base = Path(model_dir)
    index = base / "model.safetensors.index.json"
    if index.is_file():
        try:
            return sorted(json.loads(index.read_text(encoding="utf-8"))["weight_map"])
        except (OSError, ValueError, KeyError):
            pass
    return sorted(_headers(base))


def wrapped_parameter_bytes(swift_args: Mapping[str, Any], model_dir: str | Path) -> int:
    """Bytes, in the training dtype, of the parameters `swift.target_parameters` wraps (0 when none)."""
    wanted = swift_args.get("target_parameters") or []
    wanted = [w for w in (wanted if isinstance(wanted, list) else [wanted]) if isinstance(w, str)]
    if not wanted:
        return 0
    width = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "float32": 4, "fp32": 4}.get(
        str(swift_args.get("torch_dtype", "")), 0
    )
    total = 0
    for name, info in _headers(model_dir).items():
        if name.endswith((".weight", ".bias")) or not any(name == w or name.endswith("." + w) for w in wanted):
            continue
        count = 1
        for dim in info.get("shape", []):
            count *= int(dim)
        total += count * (width or _DTYPE_BYTES.get(str(info.get("dtype")), 2))
    return total


def quantized_weight_bytes(model_dir: str | Path, setting: str) -> int:
    """Bytes of the frozen base once bitsandbytes quantises it (`components.common.quantization`), from the headers."""
    tensors = {}
    for name, info in _headers(model_dir).items():
        shape = [int(d) for d in info.get("shape", [])]
        count = 1
        for dim in shape:
            count *= dim
        tensors[name] = (count, len(shape))
    return quantization.quantized_weight_bytes(tensors, setting)


def check_quantization(swift_args: Mapping[str, Any]) -> str:
    """bitsandbytes quantises and runs a layer here when the swift args ask for a bnb base.

    Returns:
        The setting (none, nf4, int8).

    Raises:
        QuantizationUnavailableError: It cannot (the message names the fix).
    """
    setting = quantization.quantization_of(swift_args)
    try:
        quantization.check_runnable(setting)
    except quantization.QuantizationUnavailable as exc:
        raise QuantizationUnavailableError(str(exc)) from None
    return setting


def module_names(model_dir: str | Path) -> set[str]:
    """Names of the modules that hold weights (tensor names without .weight / .bias), with their suffixes."""
    out: set[str] = set()
    for name in weight_names(model_dir):
        if not name.endswith((".weight", ".bias")):
            continue  # a bare parameter (a MoE block's fused experts), not a module's weight
        module = name.rsplit(".", 1)[0]
        parts = module.split(".")
        for i in range(len(parts)):
            out.add(".".join(parts[i:]))
    return out


def parameter_names(model_dir: str | Path) -> set[str]:
    """Tensors that are parameters of a module but no Linear weight (e.g. `mlp.experts.gate_up_proj`), with suffixes."""
    out: set[str] = set()
    for name in weight_names(model_dir):
        if name.endswith((".weight", ".bias")):
            continue
        parts = name.split(".")
        for i in range(len(parts) - 1):
            out.add(".".join(parts[i:]))
    return out


_PLAIN = re.compile(r"[A-Za-z_][\w.]*")
_NOT_LORA = ("norm", "embed", "lm_head", "bias")


def _candidates(model_dir: str | Path) -> tuple[list[str], list[str]]:
    """(Linear-like module names by their last part, expert-style parameters as `module.param`) of the model."""
    linear = sorted(
        {
            m.rsplit(".", 1)[-1]
            for m in module_names(model_dir)
            if not m.rsplit(".", 1)[-1].isdigit() and not any(x in m.rsplit(".", 1)[-1] for x in _NOT_LORA)
        }
    )
    params = sorted({".".join(n.split(".")[-3:]) for n in parameter_names(model_dir) if n.count(".") >= 2})
    return linear, params


def check_target_modules(swift_args: Mapping[str, Any], model_dir: str | Path) -> None:
    """Raises InputCheckError when a plain swift.target_modules / target_parameters name matches nothing.

    Special values (`all-linear`, `all-embedding`, ...) and regular expressions are left to
    ms-swift; a model folder without readable safetensors skips the check. A name that is a
    parameter rather than a module (a mixture-of-experts model's fused experts) is named as
    such, with the `target_parameters` setting that reaches it.
    """
    known = module_names(model_dir)
    if not known:
        return
    raw = swift_args.get("target_modules")
    entries = raw if isinstance(raw, list) else [] if raw is None else [raw]
    missing = [
        e for e in entries if isinstance(e, str) and not e.startswith("all") and _PLAIN.fullmatch(e) and e not in known
    ]
    linear, params = _candidates(model_dir)
    if missing:
        hint = (
            f"; this is a mixture-of-experts model whose experts are fused parameters, not modules: LoRA reaches "
            f"them with swift.target_parameters: [{', '.join(params)}] and swift.lora_dropout: 0"
            if params
            else ""
        )
        raise InputCheckError(
            f"swift.target_modules {missing} match no module of the model; use all-linear or names such as "
            f"{', '.join(linear[:12])}{hint}"
        )
    wanted = swift_args.get("target_parameters") or []
    wanted = wanted if isinstance(wanted, list) else [wanted]
    if wanted and str(swift_args.get("use_liger_kernel", "")).lower() in ("true", "1"):
        raise InputCheckError(LIGER_WITH_PARAMETERS)
    unmatched = [w for w in wanted if isinstance(w, str) and w not in parameter_names(model_dir) and w not in known]
    if unmatched:
        raise InputCheckError(
            f"swift.target_parameters {unmatched} match no parameter of the model; "
            + (
                f"parameters LoRA can target: {', '.join(params[:12])}"
                if params
                else "the model has no such parameters (not a mixture-of-experts model): use swift.target_modules"
            )
        )


def check_writable(folder: str | Path, what: str) -> None:
    """Creates the folder and writes/deletes a probe file; InputCheckError when it cannot."""
    base = Path(folder)
    probe = base / f".write-probe-{uuid.uuid4().hex}"
    try:
        base.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise InputCheckError(f"{what} {base} is not writable: {exc.strerror or exc}") from None


def check_inputs(
    swift_args: Mapping[str, Any],
    model_dir: str | Path,
    writable: Mapping[str, str | Path] | None = None,
    *,
    model_config: Mapping[str, Any] | None = None,
) -> None:
    """Runs every check (config limits, target modules, writable outputs).

    Args:
        swift_args: The config's `swift` section.
        model_dir: Staged base model folder.
        writable: {description: folder} that must be writable.
        model_config: Its config.json already read (`load_model_config`). Default None (read here).

    Raises:
        InputCheckError: The first failed check.
    """
    for what, folder in (writable or {}).items():
        check_writable(folder, what)
    check_max_length(swift_args, load_model_config(model_dir) if model_config is None else model_config)
    check_target_modules(swift_args, model_dir)
    check_quantization(swift_args)
