"""What a staged model must be: a config, tokenizer, processor and safetensors of a supported architecture.

`check_model` reads only config.json, the safetensors index and the safetensors headers
(never a tensor) and returns the model facts the artifact carries: architecture, ms-swift
model_type, parameter count and dtype. Every malformed file is a StageError naming the file,
the field and the fix.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from components.common import bounded_json
from components.stage_model.errors import StageError

# Architectures ms-swift can LoRA-tune with this pipeline, mapped to ms-swift model_type.
SUPPORTED_ARCHITECTURES = {
    "Qwen3VLForConditionalGeneration": "qwen3_vl",
    "Qwen3VLMoeForConditionalGeneration": "qwen3_moe_vl",
    "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
    "Qwen2VLForConditionalGeneration": "qwen2_vl",
}


def _safetensors_header(path: Path) -> dict[str, Any]:
    """Reads a safetensors file's JSON header without loading tensors."""
    try:
        with open(path, "rb") as f:
            raw_len = f.read(8)
            if len(raw_len) != 8:
                raise ValueError("file shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", raw_len)
            if n > 100 * 1024 * 1024 or n > path.stat().st_size - 8:
                raise ValueError(f"header length {n} exceeds the file")
            header = bounded_json.loads(f.read(n))
            if not isinstance(header, dict):
                raise ValueError("header is not a JSON object")
            header.pop("__metadata__", None)
            for name, info in header.items():
                if not (
                    isinstance(info, dict)
                    and isinstance(info.get("dtype"), str)
                    and isinstance(info.get("shape"), list)
                    and all(isinstance(d, int) for d in info["shape"])
                    and isinstance(info.get("data_offsets"), list)
                    and len(info["data_offsets"]) == 2
                    and all(isinstance(o, int) for o in info["data_offsets"])
                ):
                    raise ValueError(f"tensor {name!r} needs dtype, shape and data_offsets")
    except (OSError, ValueError) as exc:
        raise StageError(f"{path}: unreadable safetensors header ({exc}); re-export the weights") from None
    end = max((v["data_offsets"][1] for v in header.values()), default=0)
    if 8 + n + end > path.stat().st_size:
        raise StageError(f"{path}: truncated safetensors file (tensor data ends past the file); copy it again")
    return header


_CONFIG_FIX = "restore the model's own config.json (as its hub repo or `save_pretrained` writes it)"
_INDEX_FIX = "restore the index `save_pretrained` wrote, or delete it when the weights are one model.safetensors"


def _read_json_object(path: Path, fix: str) -> dict[str, Any]:
    """A JSON file that must hold an object; StageError (naming the file and `fix`) otherwise."""
    try:
        data = bounded_json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StageError(f"{path}: cannot parse ({exc}); {fix}") from None
    if not isinstance(data, dict):
        raise StageError(f"{path}: expected a JSON object {{...}}, found {_json_kind(data)}; {fix}")
    return data


def _read_config(path: Path) -> dict[str, Any]:
    """Reads a model's config.json and checks the shape of the fields staging reads.

    Raises:
        StageError: Not JSON, not an object, `architectures` not a list of class names,
            `text_config` not an object. The message names the file, the field and the fix.
    """
    config = _read_json_object(path, _CONFIG_FIX)
    archs = config.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise StageError(
            f"{path}: field 'architectures' must be a list of class names such as "
            f'["Qwen3VLForConditionalGeneration"], found {_short(archs)}; {_CONFIG_FIX}'
        )
    text = config.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise StageError(f"{path}: field 'text_config' must be an object, found {_json_kind(text)}; {_CONFIG_FIX}")
    return config


def _read_weight_map(path: Path) -> dict[str, str]:
    """Reads model.safetensors.index.json's `weight_map` ({tensor name: shard file name}).

    Raises:
        StageError: Not JSON, not an object, no `weight_map`, a `weight_map` that is not an
            object of file names. The message names the file, the field and the fix.
    """
    index = _read_json_object(path, _INDEX_FIX)
    weight_map = index.get("weight_map")
    if "weight_map" not in index:
        raise StageError(f"{path}: cannot parse: no field 'weight_map' {{tensor name: shard file}}; {_INDEX_FIX}")
    if not isinstance(weight_map, dict):
        raise StageError(
            f"{path}: field 'weight_map' must be an object {{tensor name: shard file}}, found "
            f"{_json_kind(weight_map)}; {_INDEX_FIX}"
        )
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard:
            raise StageError(
                f"{path}: field 'weight_map' maps {name!r} to {_short(shard)}, not a shard file name such as "
                f'"model-00001-of-00002.safetensors"; {_INDEX_FIX}'
            )
    return weight_map


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return f"{kinds.get(type(value), 'null')} ({_short(value)})"


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_model(folder: Path, files: list[str]) -> dict[str, Any]:
    """Checks that a folder holds a model this pipeline can train.

    Args:
        folder: The model folder.
        files: Its relative file list.

    Returns:
        Metadata: architecture, model_type, num_parameters, dtype, torch_dtype.

    Raises:
        StageError: config.json missing or unparsable, unsupported architecture, tokenizer
            or processor files missing, no safetensors, an indexed shard missing, or an
            unreadable safetensors header. The message names the file and the fix.
    """
    config_path = folder / "config.json"
    if "config.json" not in files:
        raise StageError(f"{folder}: no config.json; this does not look like a Hugging Face model folder")
    config = _read_config(config_path)
    archs = config.get("architectures") or []
    arch = archs[0] if archs else ""
    if arch not in SUPPORTED_ARCHITECTURES:
        raise StageError(
            f"{config_path}: architecture {arch or '(none)'!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    if "tokenizer_config.json" not in files or not (
        "tokenizer.json" in files or {"vocab.json", "merges.txt"} <= set(files)
    ):
        raise StageError(f"{folder}: tokenizer files missing (need tokenizer_config.json and tokenizer.json)")
    if "preprocessor_config.json" not in files and "processor_config.json" not in files:
        raise StageError(f"{folder}: image processor missing (need preprocessor_config.json)")
    shards = [f for f in files if f.endswith(".safetensors")]
    if not shards:
        raise StageError(f"{folder}: no *.safetensors weights; convert the model to safetensors first")
    if "model.safetensors.index.json" in files:
        index_path = folder / "model.safetensors.index.json"
        missing = sorted(set(_read_weight_map(index_path).values()) - set(shards))
        if missing:
            raise StageError(f"{index_path}: shard(s) listed but not present: {', '.join(missing)}")
    n_params, dtypes = 0, {}
    for shard in shards:
        for info in _safetensors_header(folder / shard).values():
            count = 1
            for dim in info["shape"]:
                count *= dim
            n_params += count
            dtypes[info["dtype"]] = dtypes.get(info["dtype"], 0) + count
    text = config.get("text_config") or {}
    return {
        "architecture": arch,
        "model_type": SUPPORTED_ARCHITECTURES[arch],
        "num_parameters": n_params,
        "dtype": max(dtypes, key=dtypes.get) if dtypes else "",
        "torch_dtype": str(config.get("torch_dtype") or config.get("dtype") or text.get("dtype") or ""),
    }
