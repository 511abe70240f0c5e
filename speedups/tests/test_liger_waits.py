"""Liger's fused linear cross-entropy without its reads of the GPU (speedups/liger_waits.py, plugin
item 18).

On the CPU the recompilation runs on a module shaped like Liger's (its count line verbatim); targets on PyTorch's
meta device have no values, so where the count comes out right without an error, nothing read them. On a GPU the
real Liger runs: the same loss and gradient as Liger's own, and no wait."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
import traceback

import pytest
import torch

from speedups import liger_waits
from speedups.label_rows import host_rows_for_loss, label_rows_only, selected_target

LIGER_LIKE = '''
import torch


def helper():
    return "module global"


def fused_linear_cross_entropy_forward(_input, weight, target, ignore_index=-100, fail=False):
    """Liger's forward, its count line verbatim."""
    target_mask = target != ignore_index
    total_n_non_ignore = target_mask.sum().item()
    if fail:
        raise RuntimeError("the line this names")
    return total_n_non_ignore, helper()
'''


def _module(tmp_path, source=LIGER_LIKE, name="liger_like"):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_the_count_of_the_selected_target_is_its_length_without_reading_it(tmp_path):
    module = _module(tmp_path)
    original = module.fused_linear_cross_entropy_forward
    chosen = torch.empty(9, dtype=torch.long, device="meta")  # .item() of it would fail
    assert liger_waits.count_without_wait(module, lambda: chosen)
    replaced = module.fused_linear_cross_entropy_forward
    assert replaced is not original and replaced._vlm_lora_original is original
    assert replaced(None, None, chosen) == (9, "module global")  # the module's own globals
    other = torch.tensor([3, -100, 4, -100])
    assert replaced(None, None, other) == (2, "module global")  # any other target: Liger's own count
    with pytest.raises(RuntimeError, match="meta"):
        replaced(None, None, chosen.view(3, 3))  # not the one selected: read (and meta fails)
    assert liger_waits.count_without_wait(module, lambda: None)  # once only
    assert module.fused_linear_cross_entropy_forward is replaced


def test_errors_in_the_recompiled_forward_name_liger_s_own_file_and_line(tmp_path):
    module = _module(tmp_path)
    liger_waits.count_without_wait(module, lambda: None)
    with pytest.raises(RuntimeError) as caught:
        module.fused_linear_cross_entropy_forward(None, None, torch.tensor([1]), fail=True)
    frame = traceback.extract_tb(caught.value.__traceback__)[-1]
    source = (tmp_path / "liger_like.py").read_text().splitlines()
    assert frame.filename == str(tmp_path / "liger_like.py")
    assert 'raise RuntimeError("the line this names")' in source[frame.lineno - 1]


@pytest.mark.parametrize(
    "source",
    [
        LIGER_LIKE.replace("target_mask.sum().item()", "int(target_mask.sum())"),  # another Liger: left as it is
        LIGER_LIKE.replace(
            "    return total_n_non_ignore",
            "    total_n_non_ignore = target_mask.sum().item()\n    return total_n_non_ignore",
        ),  # twice: which one is meant is unknown
    ],
)
def test_a_forward_without_the_count_line_once_is_left_as_it_is(tmp_path, source):
    module = _module(tmp_path, source, name="liger_other")
    original = module.fused_linear_cross_entropy_forward
    assert not liger_waits.count_without_wait(module, lambda: None)
    assert module.fused_linear_cross_entropy_forward is original
    assert not hasattr(module, liger_waits.HOOK)


def test_the_backward_scales_the_input_gradient_without_asking():
    calls = []

    def liger_backward(grad_output, grad_input, grad_weight, grad_bias):
        calls.append(grad_weight is not None)
        return grad_input, grad_weight, grad_bias

    backward = liger_waits.scaled_without_wait(liger_backward)
    grad_input = torch.randn(5, 8, dtype=torch.bfloat16)
    one, weight, bias = backward(torch.tensor(1.0), grad_input, None, None)
    assert torch.equal(one, grad_input) and one.dtype == torch.bfloat16 and weight is None and bias is None
    half, _, _ = backward(torch.tensor(0.37), grad_input, None, None)
    assert torch.equal(half, (grad_input.float() * 0.37).to(torch.bfloat16))  # in float32, stored in bf16
    assert torch.equal(grad_input, one)  # out of place: the saved gradient is left as it was
    assert calls == []
    backward(torch.tensor(0.5), grad_input, torch.ones(3, 8), None)  # a trained LM head: Liger's own
    assert calls == [True]


def _liger_s_own(fn):
    """`fn` without the plugin's wrappers or replacement, where the plugin ran in this process before the test."""
    while True:
        mine = {k for k, v in vars(fn).items() if k.startswith("_vlm_lora") and v}
        if "_vlm_lora_original" in mine:
            fn = fn._vlm_lora_original
        elif mine and hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        else:
            return fn


def test_liger_s_own_functions_are_found_under_the_plugin_s_wrappers(tmp_path):
    module = _module(tmp_path, name="liger_wrapped")
    forward = module.fused_linear_cross_entropy_forward
    liger_waits.count_without_wait(module, lambda: None)
    backward = liger_waits.scaled_without_wait(forward)
    assert _liger_s_own(module.fused_linear_cross_entropy_forward) is forward and _liger_s_own(backward) is forward
    assert _liger_s_own(forward) is forward


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_liger_s_loss_from_the_host_rows_is_liger_s_own_and_waits_for_nothing_gpu(monkeypatch):
    """Liger's own loss (waits) against the same with items 5 and 18 (no wait). The test starts from Liger's own
    functions whatever ran before it in this process: where the plugin had replaced Liger's forward, its count hook
    (set to None below) was never set again, `TypeError: 'NoneType' object is not callable` (GPU files together)."""
    pytest.importorskip("liger_kernel")
    from liger_kernel.ops import fused_linear_cross_entropy as ops
    from liger_kernel.transformers.model import loss_utils

    from speedups.tests.gpu_waits import gpu_waits

    torch.manual_seed(0)
    hidden = torch.randn(4, 1200, 2560, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(151936, 2560, device="cuda", dtype=torch.bfloat16) * 0.02
    host = torch.full((4, 1200), -100)
    host[:, 1080:1194] = torch.randint(0, 151936, (4, 114))
    labels = host.to("cuda")
    scale = torch.tensor(2.0, device="cuda")  # as with two processes (the loss times the world size)
    original = _liger_s_own(loss_utils.fixed_fused_linear_cross_entropy)
    loss_fn = _liger_s_own(loss_utils.LigerForCausalLMLoss)
    monkeypatch.setattr(loss_utils, "fixed_fused_linear_cross_entropy", label_rows_only(original))
    monkeypatch.setattr(ops, liger_waits.FORWARD, _liger_s_own(ops.fused_linear_cross_entropy_forward))
    monkeypatch.setattr(ops, liger_waits.BACKWARD, _liger_s_own(ops.fused_linear_cross_entropy_backward))

    def step(fn):
        loss = fn(hidden, weight, labels, hidden_size=2560, num_items_in_batch=456)
        (grad,) = torch.autograd.grad(loss * scale, hidden)
        return loss, grad

    step(loss_fn)  # warm-up: Triton compiles Liger's kernels
    (loss_before, grad_before), before = gpu_waits(lambda: step(loss_fn))
    monkeypatch.setattr(ops, liger_waits.HOOK, None, raising=False)  # forward and backward: restored after
    assert liger_waits.count_without_wait(ops, selected_target)
    ops.fused_linear_cross_entropy_backward = liger_waits.scaled_without_wait(ops.fused_linear_cross_entropy_backward)
    no_wait = host_rows_for_loss(loss_fn, lambda t: host if t is labels else None)
    step(no_wait)
    (loss_after, grad_after), after = gpu_waits(lambda: step(no_wait))
    assert len(before) >= 3 and after == [], (before, after)  # label rows' nonzero, Liger's count and check
    assert torch.equal(loss_after, loss_before) and torch.equal(grad_after, grad_before)


def test_the_switch_is_allowed_in_the_job_environment_with_its_values():
    from components.train_lora import job_env

    job_env.check_job_env({"VLM_LORA_LOSS_NO_WAIT": "0"})
    job_env.check_job_env({"VLM_LORA_LOSS_NO_WAIT": 1})
    with pytest.raises(job_env.JobEnvError, match="VLM_LORA_LOSS_NO_WAIT"):
        job_env.check_job_env({"VLM_LORA_LOSS_NO_WAIT": "yes"})
