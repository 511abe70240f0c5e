"""Qwen3-VL's deepstack additions by position (speedups/deepstack.py)."""

from __future__ import annotations

import pytest
import torch

from speedups import deepstack
from speedups.tests.tiny_text import qwen3_vl_text_model


def _reference(hidden_states, visual_pos_masks, visual_embeds):
    """transformers' Qwen3VLTextModel._deepstack_process."""
    hidden_states = hidden_states.clone()
    local_this = hidden_states[visual_pos_masks, :] + visual_embeds
    hidden_states[visual_pos_masks, :] = local_this
    return hidden_states


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_values_and_gradients_as_the_boolean_mask(dtype):
    torch.manual_seed(0)
    mask = torch.zeros(3, 9, dtype=torch.bool)
    mask[0, 2:6] = True
    mask[2, 1:4] = True
    results = []
    for fn in (_reference, deepstack.deepstack_add):
        hidden = torch.randn(3, 9, 16, dtype=dtype, generator=torch.Generator().manual_seed(1)).requires_grad_()
        embeds = torch.randn(7, 16, dtype=dtype, generator=torch.Generator().manual_seed(2)).requires_grad_()
        out = fn(hidden * 1, mask, embeds)
        (out.float() * torch.arange(16.0)).sum().backward()
        results.append((out.detach(), hidden.grad, embeds.grad))
    for got, want in zip(results[1], results[0]):
        assert torch.equal(got, want)  # each position gets hidden + visual, rounded once, either way


def test_positions_are_found_once_per_mask():
    mask = torch.tensor([[False, True, True], [True, False, False]])
    first = deepstack._positions(mask)
    assert first.tolist() == [1, 2, 3]
    assert deepstack._positions(mask) is first  # cached: the three layers share one `nonzero`
    mask[1, 2] = True  # changed in place: found again
    assert deepstack._positions(mask).tolist() == [1, 2, 3, 5]


def test_shapes_it_does_not_cover_are_left_to_the_model():
    hidden = torch.randn(2, 4, 8)
    assert deepstack.deepstack_add(hidden, torch.ones(2, 5, dtype=torch.bool), torch.randn(10, 8)) is None
    assert deepstack.deepstack_add(hidden, torch.ones(2, 4, dtype=torch.long), torch.randn(8, 8)) is None
    assert deepstack.deepstack_add(hidden, torch.ones(2, 4, dtype=torch.bool), torch.randn(7, 8)) is None


def test_installed_in_the_text_model_gives_the_same_outputs_and_gradients():
    reference, patched = qwen3_vl_text_model(4), qwen3_vl_text_model(4)
    patched.load_state_dict(reference.state_dict())
    assert deepstack.install(patched) == 1
    assert deepstack.install(patched) == 0  # once
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.zeros(2, 7, dtype=torch.bool)
    mask[0, 1:4] = True
    mask[1, 2:4] = True
    outs = []
    for model in (reference, patched):
        embeds = [torch.randn(5, 32, generator=torch.Generator().manual_seed(4 + i)).requires_grad_() for i in range(3)]
        out = model(input_ids=ids, visual_pos_masks=mask, deepstack_visual_embeds=embeds).last_hidden_state
        out.square().sum().backward()
        outs.append((out.detach(), [e.grad for e in embeds], model.layers[0].mlp.up_proj.weight.grad))
        # the patched model found the positions (once, cached on the mask); the reference did not
        assert hasattr(mask, "_vlm_lora_positions") == (model is patched)
    torch.testing.assert_close(outs[1][0], outs[0][0])
    for got, want in zip(outs[1][1], outs[0][1]):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(outs[1][2], outs[0][2])
    # no images in the batch: the model's own path
    out = patched(input_ids=ids).last_hidden_state
    torch.testing.assert_close(out, reference(input_ids=ids).last_hidden_state)


def test_the_plugin_patches_the_trainers_model_unless_switched_off(monkeypatch):
    from speedups import plugin

    model = qwen3_vl_text_model(2)
    monkeypatch.setenv("VLM_LORA_INDEX_DEEPSTACK", "0")
    off = plugin.check_model(model)[10]
    assert off.line() == "skipped: switch off (VLM_LORA_INDEX_DEEPSTACK=0)"
    assert not getattr(model._deepstack_process, "_vlm_lora_deepstack", False)
    monkeypatch.delenv("VLM_LORA_INDEX_DEEPSTACK")
    assert plugin.check_model(model)[10].line() == "applied: 1 text model(s)"
    assert getattr(model._deepstack_process, "_vlm_lora_deepstack", False)


def test_a_model_without_deepstack_is_said_to_have_none(monkeypatch):
    """Item 10 finds nothing in a model without Qwen3-VL's text model: it says so (it used to log nothing)."""
    from speedups import plugin

    outcome = plugin.check_model(torch.nn.Sequential(torch.nn.Linear(2, 2)))[10]
    assert outcome.skipped and outcome.kind == "found nothing in the model" and "deepstack count 0" in outcome.detail
