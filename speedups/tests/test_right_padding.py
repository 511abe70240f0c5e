"""Causal attention without a mask for right-padded training batches (speedups/right_padding.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import masking_utils

from speedups.right_padding import right_aligned, right_padded_causal_skip

ORIGINAL = getattr(masking_utils._ignore_causal_mask_sdpa, "__wrapped__", masking_utils._ignore_causal_mask_sdpa)


def test_right_aligned_masks():
    assert right_aligned(torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]]))
    assert not right_aligned(torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]))  # left padding
    assert not right_aligned(torch.tensor([[1, 0, 1, 0]]))  # a hole
    assert right_aligned(torch.ones(2, 1))
    assert not right_aligned(torch.ones(2, 3, 3))


def _model():
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query heads, as in Qwen3-VL
        head_dim=16,
        attn_implementation="sdpa",
    )
    model = get_peft_model(Qwen3ForCausalLM(config), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.2)
    return model


def _batch(lengths=(11, 7, 9), total=12, left=False):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 97, (len(lengths), total), generator=gen)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for row, n in enumerate(lengths):
        if left:
            mask[row, total - n :] = 1
        else:
            mask[row, :n] = 1
    labels = torch.where(mask.bool(), ids, -100)
    labels[:, :3] = -100  # a prompt
    return ids, mask, labels


def _loss_and_grads(model, ids, mask, labels, calls):
    original_sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording_sdpa(*args, **kwargs):
        calls.append(kwargs.get("attn_mask") is None and kwargs.get("is_causal", False))
        return original_sdpa(*args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = recording_sdpa
    try:
        model.zero_grad()
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
    finally:
        torch.nn.functional.scaled_dot_product_attention = original_sdpa
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads


@pytest.mark.parametrize("left", [False, True])
def test_same_loss_and_gradients_as_the_padding_mask(monkeypatch, left):
    model = _model()
    twin = copy.deepcopy(model)
    ids, mask, labels = _batch(left=left)

    monkeypatch.setattr(masking_utils, "_ignore_causal_mask_sdpa", ORIGINAL)
    masked_calls: list[bool] = []
    loss_masked, grads_masked = _loss_and_grads(model, ids, mask, labels, masked_calls)

    monkeypatch.setattr(masking_utils, "_ignore_causal_mask_sdpa", right_padded_causal_skip(ORIGINAL))
    causal_calls: list[bool] = []
    loss_causal, grads_causal = _loss_and_grads(twin, ids, mask, labels, causal_calls)

    assert masked_calls == [False, False]  # transformers' path: a padding mask in both layers
    assert causal_calls == ([False, False] if left else [True, True])  # right padding: the causal flag, no mask
    assert loss_causal == pytest.approx(loss_masked, rel=1e-6)
    assert len(grads_causal) == len(grads_masked) == 28  # A and B of 7 LoRA layers x 2 decoder layers
    for name, grad in grads_masked.items():
        assert torch.allclose(grads_causal[name], grad, rtol=1e-4, atol=1e-7), name


def _mask(padding, q_length=None):
    padding = torch.tensor(padding, dtype=torch.bool)
    q_length = padding.shape[-1] if q_length is None else q_length
    return masking_utils.sdpa_mask(
        batch_size=padding.shape[0],
        q_length=q_length,
        kv_length=padding.shape[-1],
        cache_position=torch.arange(padding.shape[-1] - q_length, padding.shape[-1]),
        attention_mask=padding,
        q_offset=padding.shape[-1] - q_length,
        kv_offset=0,
    )


def test_only_right_padded_training_batches_skip_the_mask(monkeypatch):
    monkeypatch.setattr(masking_utils, "_ignore_causal_mask_sdpa", right_padded_causal_skip(ORIGINAL))
    right = [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert _mask(right) is None
    assert _mask([[1, 1, 1, 1]]) is None  # no padding: transformers skips it too
    assert _mask([[0, 1, 1, 1], [1, 1, 1, 1]]) is not None  # left padding
    assert _mask(right, q_length=1) is not None  # decoding one token against padded keys
    with torch.no_grad():
        assert _mask(right) is not None  # inference keeps transformers' own mask
