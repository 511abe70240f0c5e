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
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch


def label_rows(target: torch.Tensor, ignore_index: int) -> torch.Tensor | None:
    """Indices of the rows of a flat target that carry a label; None if none or all of them do."""
    keep = (target != ignore_index).nonzero().squeeze(1)
    if keep.numel() in (0, target.numel()):
        return None
    return keep


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
        rows = label_rows(target, ignore_index)
        if rows is None:
            return fn(hidden_states, lm_head_weight, target, num_items_in_batch, ignore_index, *args, **kwargs)
        result = fn(
            hidden_states.index_select(0, rows),
            lm_head_weight,
            target.index_select(0, rows),
            num_items_in_batch,
            ignore_index,
            *args,
            **kwargs,
        )
        return _restore_per_token(result, rows, target.shape[0])

    wrapper._vlm_lora_label_rows = True
    return wrapper
