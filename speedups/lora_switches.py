"""Item 3's options (items.py, `VLM_LORA_*`): the fused LoRA branch's switches, read once at import.

The branch's modules (`fused_lora.py` and the `lora_*.py` beside it) look each one up here when they run
(`lora_switches.SEEDED`), so a test or a benchmark sets one on this module and every module sees it.
"""

from __future__ import annotations

import os

# without dropout under autocast: autograd's own nodes instead of the Python function (`lean_delta`);
# VLM_LORA_LEAN_LORA=0 keeps `lora_delta` there too
LEAN = os.environ.get("VLM_LORA_LEAN_LORA", "1") != "0"
# the LoRA product added into the frozen layer's fresh output in place (`addmm_`): an out-of-place `addmm`
# first copies that output (a device-to-device copy of the whole activation per adapted layer);
# VLM_LORA_INPLACE_ADD=0 keeps the out-of-place `addmm` where the layer runs outside the LoRA function
# (`lean_delta`, `lora_delta`; `_LoraLinear` adds into its own output)
INPLACE = os.environ.get("VLM_LORA_INPLACE_ADD", "1") != "0"
# with dropout (or off the lean path), the frozen layer's own matmuls inside the LoRA function (`_LoraLinear`):
# its input gradient and LoRA's are summed in one buffer (a matmul epilogue, or one multiply-add with the
# dropout mask) instead of autograd adding two; VLM_LORA_FUSED_BASE=0 keeps the frozen layer outside
FUSED_BASE = os.environ.get("VLM_LORA_FUSED_BASE", "1") != "0"
# on the lean path, sibling LoRA layers that read one input compute their A projections in one matmul
# (`SharedInput`); VLM_LORA_GROUP_LORA=0 keeps one matmul per layer
GROUP = os.environ.get("VLM_LORA_GROUP_LORA", "1") != "0"
# with dropout on a GPU, the backward's two masked passes as Triton kernels (`lora_triton.py`: the mask applied
# while reading, no full-size product or dropped-out copy written); VLM_LORA_TRITON_LORA=0 keeps PyTorch's kernels
TRITON = os.environ.get("VLM_LORA_TRITON_LORA", "1") != "0"
# an MLP's down projection with LoRA reads silu(gate) * up without keeping it (`_SiluMulLoraLinear`: computed
# again in the backward from gate and up); VLM_LORA_SILU_MUL_DOWN=0 keeps the product for the backward
SILU_MUL_DOWN = os.environ.get("VLM_LORA_SILU_MUL_DOWN", "1") != "0"
# with dropout on a GPU, VLM_LORA_SEEDED_DROPOUT=1: the masks given by a seed and computed in the Triton kernels
# wherever needed (`lora_triton`: `Seeded`) instead of a boolean mask per adapted layer kept until the backward
# (less memory: −18 GiB at 16 x 1; −2.7 to +3.4 % time per step at the same plan, 2 x H200, 2026-11-26,
# benchmarks/train_throughput.py: the train-lora planner sets it where it lets a faster plan fit); unset or 0:
# PyTorch's dropout kernel and its masks
SEEDED = os.environ.get("VLM_LORA_SEEDED_DROPOUT", "0") == "1"
# the adapter weights' compute-dtype copies kept between forwards of the LoRA functions (`CastCache`) instead of
# two cast kernels per adapted layer per forward (504 for the 4B); VLM_LORA_CAST_CACHE=0 casts in every forward
CAST_CACHE = os.environ.get("VLM_LORA_CAST_CACHE", "1") != "0"
# in the backward with dropout on a GPU, LoRA's scaling applied by the Triton kernels (with the dropout scale) and
# B's gradient by one float32-output matmul and its multiply, instead of a multiply of the rank-r gradient, and a
# bfloat16 matmul, multiply and cast; VLM_LORA_FOLD_SCALING=0 keeps the separate kernels
FOLD = os.environ.get("VLM_LORA_FOLD_SCALING", "1") != "0"
