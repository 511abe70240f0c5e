"""The merged weights are the base weights plus the adapter's update (`compare_weights`).

Every adapted weight equals ``W + scale * B @ A`` to within one rounding step of the
stored dtype (bf16 keeps 8 mantissa bits), and every other tensor is bit-identical to the
base model's. This is exact and cheap, and catches what breaks merges in practice (adapter
keys that match nothing, a wrong scale, tensors renamed or dropped).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.merge_export._json import read_json
from components.merge_export.errors import MergeError, MergeVerificationError


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

    config = read_json(adapter_dir / "adapter_config.json")
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
    targeted = [str(p) for p in read_json(adapter_dir / "adapter_config.json").get("target_parameters") or []]
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
