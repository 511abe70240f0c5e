"""What nf4 / int8 make of the published Qwen3-VL architectures: sizes by arithmetic, no weights, no GPU.

Each architecture (config fields of `benchmarks.qwen3_vl_large` and `benchmarks.qwen3_vl_4b`) is built on
the `meta` device; its state-dict names (the names save_pretrained stores; a tied head is stored once) and
shapes go through `components.common.quantization.quantized_weight_bytes`, the rule train-lora sizes a
staged model by. The rule itself is checked against a real nf4 load of the tiny MoE in
tests/test_quantization_moe.py.

    python -m benchmarks.quantized_sizes            # 4b, 8b, 30b-a3b
    python -m benchmarks.quantized_sizes 30b-a3b
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from components.common.quantization import is_quantized_tensor, quantized_weight_bytes

GB = 1e9
GIB = 1024**3


def _architectures() -> dict[str, tuple[str, dict[str, Any]]]:
    from benchmarks.qwen3_vl_4b import QWEN3_VL_4B_CONFIG
    from benchmarks.qwen3_vl_large import ARCHITECTURES

    return {"4b": ("qwen3_vl", QWEN3_VL_4B_CONFIG), **ARCHITECTURES}


def stored_tensors(name: str) -> dict[str, tuple[int, int]]:
    """{stored name: (elements, ndim)} of an architecture, built on the meta device (no memory, < 5 s).

    Args:
        name: "4b", "8b" or "30b-a3b".

    Returns:
        Every tensor save_pretrained would store (a tied head's duplicate left out).
    """
    import torch

    model_type, fields = _architectures()[name]
    if model_type == "qwen3_vl_moe":
        from transformers import Qwen3VLMoeConfig as Config
        from transformers import Qwen3VLMoeForConditionalGeneration as Model
    else:
        from transformers import Qwen3VLConfig as Config
        from transformers import Qwen3VLForConditionalGeneration as Model
    config = Config(**{k: v for k, v in fields.items() if k != "model_type"})
    with torch.device("meta"):
        model = Model(config)
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})
    return {k: (v.numel(), v.ndim) for k, v in model.state_dict().items() if k not in tied}


@dataclass(frozen=True)
class Sizes:
    """One architecture's frozen-base sizes; bytes unless named otherwise."""

    name: str
    params: int
    expert_params: int  # the fused 3-D expert tensors (`.experts.`)
    quantized_params: int  # those `is_quantized_tensor` counts as quantised
    bf16: int
    nf4: int
    int8: int

    @property
    def expert_share(self) -> float:
        return self.expert_params / self.params

    @property
    def kept_fraction(self) -> float:
        """Share of the parameters left in bf16 when quantised (`known_quantized_bytes`' kept_fraction)."""
        return 1 - self.quantized_params / self.params


def sizes(name: str) -> Sizes:
    """The bf16 / nf4 / int8 sizes of an architecture (see `stored_tensors`)."""
    tensors = stored_tensors(name)
    return Sizes(
        name=name,
        params=sum(n for n, _ in tensors.values()),
        expert_params=sum(n for k, (n, _) in tensors.items() if ".experts." in k),
        quantized_params=sum(n for k, (n, d) in tensors.items() if is_quantized_tensor(k, d)),
        bf16=quantized_weight_bytes(tensors, "none"),
        nf4=quantized_weight_bytes(tensors, "nf4"),
        int8=quantized_weight_bytes(tensors, "int8"),
    )


def table(names: list[str]) -> str:
    """A markdown table of `sizes` for each architecture."""
    lines = [
        "| model | params | expert share | quantised share | bf16 | nf4 | int8 |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in map(sizes, names):
        gb = " | ".join(f"{b / GB:.2f} GB ({b / GIB:.1f} GiB)" for b in (s.bf16, s.nf4, s.int8))
        quantized = 1 - s.kept_fraction
        lines.append(f"| {s.name} | {s.params / 1e9:.3f} B | {s.expert_share:.1%} | {quantized:.1%} | {gb} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(sys.argv[1:] or list(_architectures())))
