"""Liger's fused linear cross-entropy without its two reads of the GPU (plugin item 18).

Liger 0.8.5's `fused_linear_cross_entropy_forward` counts the labelled rows with
`target_mask.sum().item()` (the count is a scalar argument of its Triton kernel), and its
backward asks `torch.equal(grad_output, torch.tensor(1.0, device=...))` to skip a
multiplication by one. Each makes the host wait for everything queued before it: the whole
forward, then the loss, so the GPU ran dry at the loss while the host caught up (the sync
census of 2 × H200 counted them at lines 132 and 420 at every micro-step).

- `count_without_wait(module, selected)` recompiles Liger's forward from its own source with
  that one line replaced by a call that returns the target's length where `selected()` is
  that very target (label_rows_only passes labelled rows only, so the count is its length)
  and reads the GPU as before otherwise. Any other source (another Liger) leaves Liger as it is.
- `scaled_without_wait(backward)` always multiplies the input gradient by `grad_output`
  (out of place; in float32, stored in the input gradient's dtype, as Liger's kernel does:
  a bf16 product on the GPU would round the factor to bf16 first); by one the product is
  the same number; where Liger also computes the LM head's gradient (a trained
  head), its own backward runs.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

FORWARD = "fused_linear_cross_entropy_forward"
BACKWARD = "fused_linear_cross_entropy_backward"
COUNT_LINE = "total_n_non_ignore = target_mask.sum().item()"
HOOK = "_vlm_lora_labelled_count"


def labelled_count(selected: Callable[[], torch.Tensor | None]) -> Callable[[torch.Tensor, torch.Tensor], int]:
    """Liger's `target_mask.sum().item()`: the target's length, no wait, where `selected()` is that target."""

    def count(target: torch.Tensor, target_mask: torch.Tensor) -> int:
        if target is selected() and target_mask.shape == target.shape and target.dim() == 1:
            return target.shape[0]
        return target_mask.sum().item()

    return count


def count_without_wait(module: ModuleType, selected: Callable[[], torch.Tensor | None]) -> bool:
    """Replaces `module.fused_linear_cross_entropy_forward` by its own source with COUNT_LINE counting through
    `labelled_count(selected)`; False (nothing changed) unless that line is in it exactly once."""
    original = getattr(module, FORWARD, None)
    if original is None:
        return False
    if getattr(original, "_vlm_lora_count", False):
        return True
    try:
        lines, first = inspect.getsourcelines(original)
        filename = inspect.getsourcefile(original) or "<liger>"
    except (OSError, TypeError):
        return False
    source = textwrap.dedent("".join(lines))
    if source.count(COUNT_LINE) != 1:
        return False
    tree = ast.parse(source.replace(COUNT_LINE, f"total_n_non_ignore = {HOOK}(target, target_mask)"))
    ast.increment_lineno(tree, first - 1)  # tracebacks name Liger's own lines
    made: dict[str, Any] = {}
    exec(compile(tree, filename, "exec"), module.__dict__, made)  # noqa: S102 - Liger's own source, one line changed
    replaced = made.get(FORWARD)
    if not callable(replaced):
        return False
    replaced._vlm_lora_count = True
    replaced._vlm_lora_original = original
    setattr(module, HOOK, labelled_count(selected))
    setattr(module, FORWARD, replaced)
    return True


def scaled_without_wait(backward: Callable[..., Any]) -> Callable[..., Any]:
    """Liger's `fused_linear_cross_entropy_backward(grad_output, grad_input, grad_weight, grad_bias)` without
    `torch.equal(grad_output, 1.0)`: the input gradient times `grad_output`, queued. With a weight or bias
    gradient (a trained LM head): Liger's own."""

    @functools.wraps(backward)
    def fused_linear_cross_entropy_backward(grad_output, grad_input, grad_weight, grad_bias):
        if grad_weight is not None or grad_bias is not None or grad_input is None or grad_output.numel() != 1:
            return backward(grad_output, grad_input, grad_weight, grad_bias)
        product = grad_input.float() * grad_output.reshape(()).float()  # as Liger's kernel: in float32, then stored
        return product.to(grad_input.dtype), None, None

    fused_linear_cross_entropy_backward._vlm_lora_scaled = True
    return fused_linear_cross_entropy_backward


# ---- item 18 of the plugin (items.py) ---------------------------------------------------------------------------------

LIGER_MODELS = "liger_kernel.transformers.model."
OPS = "liger_kernel.ops.fused_linear_cross_entropy"


def install(ctx):
    """Liger's forward counts and its backward scales without reading the GPU, and its `LigerForCausalLMLoss` hands
    item 5 the labelled rows from the labels' host copy (item 16's)."""
    import importlib
    import sys

    from speedups import label_rows, registry
    from speedups.patching import wrap_once

    try:
        ops = importlib.import_module(OPS)
    except ImportError:  # a Liger laid out otherwise: its count and check read the GPU
        ops = None
    parts = []
    if ops is not None and wrap_once(ops, BACKWARD, scaled_without_wait, "_vlm_lora_scaled"):
        parts.append("backward scaled without asking")
    if ops is not None and count_without_wait(ops, label_rows.selected_target):
        parts.append("count by length")
    else:
        print("train-lora plugin: Liger's forward is not the one item 18 knows; its count reads the GPU", flush=True)
    if ctx.on(16):  # host copies kept: the labelled rows come from the labels' host copy
        from speedups.batch_facts import COPIES

        def wrap(loss_fn):
            return label_rows.host_rows_for_loss(loss_fn, COPIES.host_of)

        # loss_utils first: the model modules Liger loads later bind its wrapped function
        modules = [sys.modules.get(LIGER_MODELS + "loss_utils")]
        modules += [m for name, m in list(sys.modules.items()) if name.startswith(LIGER_MODELS) and m not in modules]
        if sum(wrap_once(m, "LigerForCausalLMLoss", wrap, "_vlm_lora_host_rows") for m in modules if m):
            parts.append("labelled rows from the host")
    if not parts:
        return registry.target_missing(f"{OPS}.{FORWARD}", f"{OPS}.{BACKWARD}", version_of="liger-kernel")
    return registry.pending(", ".join(parts))


def check(ctx, trainer):
    from speedups import registry

    if not getattr(getattr(trainer, "args", None), "use_liger_kernel", False):
        return registry.not_applicable("use_liger_kernel off")
    return registry.applied(ctx.loaded[18].detail)
