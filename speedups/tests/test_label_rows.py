"""The LM head and its loss on labelled positions only (speedups/label_rows.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from speedups.label_rows import (
    host_rows_for_loss,
    label_rows,
    label_rows_only,
    selected_target,
    shifted_label_rows,
)


@dataclasses.dataclass
class Output:  # the shape of Liger's CrossEntropyOutput
    loss: torch.Tensor
    z_loss: torch.Tensor | None = None
    token_accuracy: torch.Tensor | None = None
    predicted_tokens: torch.Tensor | None = None


def reference_flce(
    hidden,
    weight,
    target,
    num_items_in_batch=None,
    ignore_index=-100,
    final_logit_softcapping=None,
    return_token_accuracy=False,
    return_predicted_tokens=False,
    seen=None,
):
    """What Liger's fixed_fused_linear_cross_entropy computes, in plain torch (every row's logits)."""
    if seen is not None:
        seen.append(hidden.shape[0])
    logits = hidden @ weight.t()
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = F.cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction)
    if num_items_in_batch is not None:
        loss = loss / num_items_in_batch
    if not (return_token_accuracy or return_predicted_tokens):
        return loss
    valid = target != ignore_index
    predicted = logits.argmax(-1)
    accuracy = (predicted[valid] == target[valid]).double().mean()
    return Output(loss=loss, token_accuracy=accuracy, predicted_tokens=torch.where(valid, predicted, -1))


def _batch(rows=60, hidden=16, vocab=50, labelled=(5, 9, 10, 33, 59), seed=0):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, hidden, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(vocab, hidden, generator=gen, dtype=torch.float64)
    t = torch.full((rows,), -100, dtype=torch.long)
    t[list(labelled)] = torch.randint(0, vocab, (len(labelled),), generator=gen)
    return h, w, t


@pytest.mark.parametrize("num_items", [None, 7])
def test_same_loss_and_gradient_from_the_labelled_rows_only(num_items):
    h, w, t = _batch()
    full = reference_flce(h, w, t, num_items)
    (grad_full,) = torch.autograd.grad(full, h)

    seen: list[int] = []
    wrapped = label_rows_only(lambda *a, **k: reference_flce(*a, **k, seen=seen))
    kept = wrapped(h, w, t, num_items)
    (grad_kept,) = torch.autograd.grad(kept, h)

    assert seen == [5]  # the head saw the 5 labelled rows of 60
    assert kept.item() == pytest.approx(full.item(), rel=1e-12)
    assert torch.allclose(grad_kept, grad_full, rtol=1e-12, atol=1e-15)
    assert grad_kept[t == -100].abs().max().item() == 0.0
    assert grad_kept[t != -100].abs().min().item() > 0.0


def test_per_token_outputs_are_put_back_at_their_positions():
    h, w, t = _batch()
    full = reference_flce(h, w, t, return_token_accuracy=True, return_predicted_tokens=True)
    kept = label_rows_only(reference_flce)(h, w, t, return_token_accuracy=True, return_predicted_tokens=True)
    assert kept.predicted_tokens.shape == (60,)
    assert torch.equal(kept.predicted_tokens, full.predicted_tokens)
    assert (kept.predicted_tokens[t == -100] == -1).all()
    assert kept.token_accuracy.item() == pytest.approx(full.token_accuracy.item())


@pytest.mark.parametrize("labelled", [(), tuple(range(60))])
def test_no_or_every_row_labelled_goes_through_unchanged(labelled):
    h, w, t = _batch(labelled=labelled)
    seen: list[int] = []
    label_rows_only(lambda *a, **k: reference_flce(*a, **k, seen=seen))(h, w, t)
    assert seen == [60]
    assert label_rows(t, -100) is None


def test_another_ignore_index_and_positional_arguments_are_honoured():
    h, w, t = _batch()
    t = torch.where(t == -100, torch.tensor(-1), t)
    seen: list[int] = []
    wrapped = label_rows_only(lambda *a, **k: reference_flce(*a, **k, seen=seen))
    loss = wrapped(h, w, t, None, -1, None)
    assert seen == [5]
    assert loss.item() == pytest.approx(reference_flce(h, w, t, None, -1).item(), rel=1e-12)


def test_unexpected_shapes_go_through_unchanged():
    h, w, t = _batch()
    seen: list[int] = []
    wrapped = label_rows_only(lambda *a, **k: seen.append(a[0].shape) or 0)
    wrapped(h.view(3, 20, 16), w, t)
    assert seen == [(3, 20, 16)]


def _labels(rows=3, length=9, seed=1):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.full((rows, length), -100)
    labels[0, 5:] = torch.randint(0, 50, (4,), generator=gen)
    labels[1, 2:6] = torch.randint(0, 50, (4,), generator=gen)
    labels[2, 0] = 3  # the first position: no row predicts it (dropped by the shift)
    labels[2, 8] = 7
    return labels


def copy_of(device, host):
    """host_of for one device tensor: its host copy."""
    return lambda t: host if t is device else None


def liger_like_loss(
    hidden_states, lm_head_weight, labels, hidden_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None
):
    """LigerForCausalLMLoss's own steps (liger_kernel/transformers/model/loss_utils.py, 0.8.5) around `FLCE`."""
    if shift_labels is None:
        labels = F.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:].contiguous()
    return FLCE(
        hidden_states.view(-1, hidden_size), lm_head_weight, shift_labels.view(-1), num_items_in_batch, ignore_index
    )


FLCE = None  # set by each test: the wrapped fixed_fused_linear_cross_entropy


def test_the_host_rows_are_those_of_liger_s_shifted_target():
    labels = _labels()
    shifted = F.pad(labels, (0, 1), value=-100)[:, 1:].reshape(-1)
    assert torch.equal(shifted_label_rows(labels), label_rows(shifted, -100))
    assert shifted_label_rows(labels).tolist() == [4, 5, 6, 7, 10, 11, 12, 13, 25]  # position i predicts label i + 1
    assert shifted_label_rows(torch.where(labels == -100, -1, labels), -1).tolist() == [4, 5, 6, 7, 10, 11, 12, 13, 25]


def test_the_loss_takes_its_rows_from_the_labels_host_copy_without_reading_the_device():
    global FLCE
    labels = _labels()
    device = labels.to("meta")  # no values: a read of it (nonzero) would fail
    seen = []

    def head(hidden, weight, target, *rest):
        seen.append((hidden.shape, target.shape, target is selected_target()))
        return hidden.sum()

    FLCE = label_rows_only(head)
    loss = host_rows_for_loss(liger_like_loss, copy_of(device, labels))
    hidden = torch.empty(3, 9, 16, device="meta")
    loss(hidden, torch.empty(50, 16, device="meta"), device, 16, 8)
    assert seen == [((9, 16), (9,), True)]  # the 9 labelled rows; the target handed on is the one selected
    assert selected_target() is None  # only during the call
    with pytest.raises(Exception):  # noqa: B017 - without the host copy the rows come from the device: meta fails
        host_rows_for_loss(liger_like_loss, lambda t: None)(hidden, torch.empty(50, 16, device="meta"), device, 16, 8)


@pytest.mark.parametrize("num_items", [None, 8])
def test_the_loss_and_gradient_from_the_host_rows_are_the_full_call_s(num_items):
    global FLCE
    labels = _labels()
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(3, 9, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, generator=gen, dtype=torch.float64)
    FLCE = reference_flce
    full = liger_like_loss(hidden, weight, labels, 16, num_items)
    (grad_full,) = torch.autograd.grad(full, hidden)
    seen: list[int] = []
    FLCE = label_rows_only(lambda *a, **k: reference_flce(*a, **k, seen=seen))
    kept = host_rows_for_loss(liger_like_loss, copy_of(labels, labels.clone()))(hidden, weight, labels, 16, num_items)
    (grad_kept,) = torch.autograd.grad(kept, hidden)
    assert seen == [9]
    assert kept.item() == pytest.approx(full.item(), rel=1e-12)
    assert torch.allclose(grad_kept, grad_full, rtol=1e-12, atol=1e-15)


def test_given_shift_labels_the_host_copy_is_not_used():
    global FLCE
    labels = _labels()
    wrong = torch.full_like(labels, -100)  # a host "copy" that, if used, would pick no row at all
    seen: list[int] = []
    FLCE = label_rows_only(lambda *a, **k: reference_flce(*a, **k, seen=seen))
    hidden = torch.randn(3, 9, 16, dtype=torch.float64)
    weight = torch.randn(50, 16, dtype=torch.float64)
    shift = F.pad(labels, (0, 1), value=-100)[:, 1:].contiguous()
    host_rows_for_loss(liger_like_loss, copy_of(labels, wrong))(hidden, weight, labels, 16, shift_labels=shift)
    assert seen == [9]  # Liger uses shift_labels: the rows come from it, on the device path
    host_rows_for_loss(liger_like_loss, copy_of(labels, wrong))(hidden, weight, labels, 16)
    assert seen == [9, 27]  # without shift_labels the copy is used: this wrong one picks no row, so all 27 go


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_liger_loss_and_gradient_are_the_same_on_the_labelled_rows_gpu():
    pytest.importorskip("liger_kernel")
    from liger_kernel.transformers.model import loss_utils

    torch.manual_seed(0)
    hidden = torch.randn(4, 1200, 2560, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(151936, 2560, device="cuda", dtype=torch.bfloat16) * 0.02
    labels = torch.full((4, 1200), -100, device="cuda")
    labels[:, 1080:1194] = torch.randint(0, 151936, (4, 114), device="cuda")
    original = loss_utils.fixed_fused_linear_cross_entropy
    original = getattr(original, "__wrapped__", original)
    results = []
    for fn in (original, label_rows_only(original)):
        loss_utils.fixed_fused_linear_cross_entropy = fn
        try:
            loss = loss_utils.LigerForCausalLMLoss(hidden, weight, labels, hidden_size=2560)
            (grad,) = torch.autograd.grad(loss, hidden)
        finally:
            loss_utils.fixed_fused_linear_cross_entropy = original
        results.append((loss.float().item(), grad.float()))
    (loss_full, grad_full), (loss_kept, grad_kept) = results
    # float32 reference: every row's logits, torch's cross-entropy
    h32 = hidden.detach().float().requires_grad_(True)
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:].reshape(-1)
    ref = torch.nn.functional.cross_entropy((h32.view(-1, 2560) @ weight.float().t()), shifted)
    (grad_ref,) = torch.autograd.grad(ref, h32)
    assert loss_kept == pytest.approx(loss_full, rel=1e-5)
    assert loss_kept == pytest.approx(ref.item(), rel=1e-3)
    ignored = (shifted == -100).view(4, 1200)
    assert grad_kept[ignored].abs().max().item() == 0.0 and grad_full[ignored].abs().max().item() == 0.0
    # both bf16 gradients are within bf16 rounding of the float32 one, the labelled-rows one no further
    scale = grad_ref.abs().max().item()
    err_full = (grad_full - grad_ref).abs().max().item()
    err_kept = (grad_kept - grad_ref).abs().max().item()
    assert err_full <= 2e-2 * scale and err_kept <= 2e-2 * scale
    assert err_kept <= 1.5 * err_full + 1e-3 * scale
