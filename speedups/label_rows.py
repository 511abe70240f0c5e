"""The language-model head and its loss on the label positions only.

With `use_liger_kernel` transformers replaces the model's forward by Liger's, which hands
the last hidden states of every position (batch × sequence, flattened) and the shifted
labels to Liger's fused linear cross-entropy. That function multiplies every row by the
151,936-wide output matrix and back (logits chunk by chunk, then the input gradient),
including the rows whose label is ignored (-100): the prompt and the image tokens. In the
seed's rows about 114 of 1,207 positions carry a label, so nine tenths of that work — two
matmuls against the vocabulary per ignored row, about 8 % of a tuned step's FLOPs — is
thrown away (their loss and gradient are zero).

`label_rows_only(fn)` wraps that function so that it receives only the rows with a label
(`index_select`; the backward scatters the gradient into zeros for the others, as Liger
writes zeros for them). Every kept row's loss is computed as before and the reduction is
the same — the mean over the labelled rows, or the sum divided by `num_items_in_batch`
— so the loss and the gradients are those of the full call up to the order of a float32
sum. Per-token outputs (`return_predicted_tokens`) are put back at their positions, -1
elsewhere, as Liger reports ignored rows. When no row or every row has a label, the call
goes through unchanged.

Finding the labelled rows on the GPU (`nonzero`) makes the host wait there for the whole
forward. Where the labels' host copy is known (`host_rows_for_loss`, around Liger's
`LigerForCausalLMLoss`, which shifts the labels it is given), the rows are computed from
that copy and queued to the GPU without waiting; `selected_target()` tells, during the call,
which target holds labelled rows only (Liger's count of them needs no read of the GPU then).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

# During a LigerForCausalLMLoss call whose labels' host copy is known: (rows of its flat shifted target that carry a
# label, on the host; that target's length; its ignore_index).
_HOST_ROWS: contextvars.ContextVar = contextvars.ContextVar("vlm_lora_host_rows", default=None)
# During the call label_rows_only makes: the target it passes (every row labelled).
_SELECTED: contextvars.ContextVar = contextvars.ContextVar("vlm_lora_selected_target", default=None)


def label_rows(target: torch.Tensor, ignore_index: int) -> torch.Tensor | None:
    """Indices of the rows of a flat target that carry a label; None if none or all of them do."""
    keep = (target != ignore_index).nonzero().squeeze(1)
    if keep.numel() in (0, target.numel()):
        return None
    return keep


def shifted_label_rows(labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """On the host: the rows of Liger's flat target for `labels` that carry a label.

    Liger's `LigerForCausalLMLoss` pads each row on the right with `ignore_index`, drops the
    first position (`pad(labels, (0, 1))[..., 1:]`, so position i predicts label i + 1) and
    flattens. The result is pinned where a GPU is, so that its copy needs no wait.
    """
    flat = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:].reshape(-1)
    rows = (flat != ignore_index).nonzero().squeeze(1)
    return rows.pin_memory() if torch.cuda.is_available() else rows


def _rows_for(target: torch.Tensor, ignore_index: int) -> torch.Tensor | None:
    """label_rows(target), from the labels' host copy where `host_rows_for_loss` knows it (no wait)."""
    known = _HOST_ROWS.get()
    if known is None or known[1] != target.numel() or known[2] != ignore_index:
        return label_rows(target, ignore_index)
    rows = known[0]
    if rows.numel() in (0, target.numel()):
        return None
    return rows.to(target.device, non_blocking=True)


def selected_target() -> torch.Tensor | None:
    """The target label_rows_only is passing on right now (all its rows carry a label), else None."""
    return _SELECTED.get()


def host_rows_for_loss(
    loss_fn: Callable[..., Any], host_of: Callable[[Any], torch.Tensor | None]
) -> Callable[..., Any]:
    """Liger's `LigerForCausalLMLoss(hidden_states, lm_head_weight, labels, ..., shift_labels=None)`, with the
    labelled rows of the target it builds computed from the labels' host copy (`host_of(labels)`) for the
    label_rows_only call inside it. Given shift_labels, or labels without a known host copy: unchanged."""
    signature = inspect.signature(loss_fn)

    @functools.wraps(loss_fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return loss_fn(*args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        labels = given.get("labels")
        host = host_of(labels) if given.get("shift_labels") is None and isinstance(labels, torch.Tensor) else None
        ignore_index = given.get("ignore_index", -100)
        if host is None or not isinstance(ignore_index, int):
            return loss_fn(*args, **kwargs)
        token = _HOST_ROWS.set((shifted_label_rows(host, ignore_index), host.numel(), ignore_index))
        try:
            return loss_fn(*args, **kwargs)
        finally:
            _HOST_ROWS.reset(token)

    wrapper._vlm_lora_host_rows = True
    return wrapper


def _restore_per_token(result: Any, rows: torch.Tensor, total: int) -> Any:
    """Liger's predicted tokens for the kept rows, put back at their positions (-1 elsewhere)."""
    predicted = getattr(result, "predicted_tokens", None)
    if predicted is None or predicted.dim() != 1 or predicted.numel() != rows.numel():
        return result
    full = torch.full((total,), -1, dtype=predicted.dtype, device=predicted.device)
    full[rows] = predicted
    result.predicted_tokens = full
    return result


def label_rows_only(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn(hidden_states, lm_head_weight, target, num_items_in_batch, ignore_index, ...)` on labelled rows only.

    `fn` is Liger's `fixed_fused_linear_cross_entropy` (flat `hidden_states` BT × H, flat
    `target` BT); anything it takes besides those is passed through.
    """

    @functools.wraps(fn)
    def wrapper(
        hidden_states: torch.Tensor,
        lm_head_weight: torch.Tensor,
        target: torch.Tensor,
        num_items_in_batch: Any = None,
        ignore_index: int = -100,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        if hidden_states.dim() != 2 or target.dim() != 1 or target.shape[0] != hidden_states.shape[0]:
            return fn(hidden_states, lm_head_weight, target, num_items_in_batch, ignore_index, *args, **kwargs)
        rows = _rows_for(target, ignore_index)
        if rows is None:
            return fn(hidden_states, lm_head_weight, target, num_items_in_batch, ignore_index, *args, **kwargs)
        selected = target.index_select(0, rows)
        token = _SELECTED.set(selected)
        try:
            result = fn(
                hidden_states.index_select(0, rows),
                lm_head_weight,
                selected,
                num_items_in_batch,
                ignore_index,
                *args,
                **kwargs,
            )
        finally:
            _SELECTED.reset(token)
        return _restore_per_token(result, rows, target.shape[0])

    wrapper._vlm_lora_label_rows = True
    return wrapper


# ---- item 5 of the plugin (items.py) ----------------------------------------------------------------------------------

LOSS = "liger_kernel.transformers.model.loss_utils.fixed_fused_linear_cross_entropy"


def install(ctx):
    """Wraps Liger's `fixed_fused_linear_cross_entropy` in `label_rows_only`."""
    from liger_kernel.transformers.model import loss_utils

    from speedups import patching, registry

    if not patching.wrap_once(loss_utils, "fixed_fused_linear_cross_entropy", label_rows_only, "_vlm_lora_label_rows"):
        return registry.target_missing(LOSS, version_of="liger-kernel")
    return registry.pending()


def check(ctx, trainer):
    from speedups import patching, registry

    changed = patching.not_ours(registry.item(5))
    if changed:
        return registry.target_missing(*changed, version_of="liger-kernel")
    if not getattr(getattr(trainer, "args", None), "use_liger_kernel", False):
        return registry.not_applicable("use_liger_kernel off")
    return registry.applied()
