"""ms-swift's NaN-gradient skip decided on the GPU (speedups/grad_nan.py, plugin item 17): the fused
optimizer's `found_inf` leaves everything as ms-swift's skip (every gradient None) does, with no `.item()`."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from speedups import grad_nan


def _model_and_optimizer(fused: bool = True, cls=torch.optim.AdamW):
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 4)
    optimizer = cls(model.parameters(), lr=0.1, weight_decay=0.1, fused=fused)
    return model, optimizer


def _step(model, optimizer, x):
    model(x).square().sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def _state(model, optimizer):
    return [p.detach().clone() for p in model.parameters()], copy.deepcopy(optimizer.state_dict()["state"])


def _assert_same(a, b):
    for got, want in zip(a[0], b[0], strict=True):
        assert torch.equal(got, want)
    assert a[1].keys() == b[1].keys()
    for key in a[1]:
        for name in a[1][key]:
            assert torch.equal(a[1][key][name], b[1][key][name]), (key, name)


@pytest.mark.parametrize("nan", [False, True])
def test_found_inf_leaves_the_same_state_as_ms_swift_s_skip(nan):
    x = torch.randn(3, 6)
    bad = torch.full((3, 6), float("nan")) if nan else torch.randn(3, 6)
    mine, swift = _model_and_optimizer(), _model_and_optimizer()
    for model, optimizer in (mine, swift):
        _step(model, optimizer, x)  # one ordinary step first: moments and a step count to keep
    # ms-swift: clip, then every gradient None where the norm is NaN
    model, optimizer = swift
    model(bad).square().sum().backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if norm.isnan().item():
        for p in model.parameters():
            p.grad = None
    optimizer.step()
    optimizer.zero_grad()
    # the plugin: clip, then found_inf for the next step
    model, optimizer = mine
    model(bad).square().sum().backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    grad_nan.skip_if_nan([optimizer], norm)
    optimizer.step()
    optimizer.zero_grad()
    assert "found_inf" not in optimizer.__dict__  # taken away after the step
    _assert_same(_state(*mine), _state(*swift))
    _step(*mine, x), _step(*swift, x)  # and the step after it runs as ms-swift's does
    _assert_same(_state(*mine), _state(*swift))


def test_only_fused_adam_without_a_scaler_decides_on_the_device():
    _, fused = _model_and_optimizer()
    _, plain = _model_and_optimizer(fused=False)
    _, adam = _model_and_optimizer(cls=torch.optim.Adam)
    accelerator = SimpleNamespace(scaler=None, _optimizers=[SimpleNamespace(optimizer=fused), adam])
    assert grad_nan.fused_optimizers(accelerator) == [fused, adam]
    assert grad_nan.fused_optimizers(SimpleNamespace(scaler=None, _optimizers=[fused, plain])) is None
    assert grad_nan.fused_optimizers(SimpleNamespace(scaler=object(), _optimizers=[fused])) is None
    assert grad_nan.fused_optimizers(SimpleNamespace(scaler=None, _optimizers=[])) is None


def test_the_context_clips_with_accelerate_and_hands_the_flag_to_the_optimizer(monkeypatch, capsys):
    """ms-swift's context manager stands in as ms-swift writes it: its clip wrapper reads `.item()`; inside the
    plugin's context accelerate's clip runs instead, and the optimizer gets the NaN flag."""
    import contextlib

    from accelerate import Accelerator

    calls = []

    def accelerate_clip(self, parameters, max_norm, norm_type=2):
        calls.append("accelerate")
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type)

    @contextlib.contextmanager
    def swift_context():
        original = Accelerator.clip_grad_norm_

        def clip_grad_norm_(self, parameters, *args, **kwargs):
            calls.append("swift")
            parameters = list(parameters)
            norm = original(self, parameters, *args, **kwargs)
            if norm.isnan().item():
                for p in parameters:
                    p.grad = None
            return norm

        Accelerator.clip_grad_norm_ = clip_grad_norm_
        try:
            yield
        finally:
            Accelerator.clip_grad_norm_ = original

    monkeypatch.setattr(Accelerator, "clip_grad_norm_", accelerate_clip)
    model, optimizer = _model_and_optimizer()
    context = grad_nan.device_nan_skip(swift_context)
    accelerator = SimpleNamespace(scaler=None, _optimizers=[SimpleNamespace(optimizer=optimizer)])
    model(torch.full((2, 6), float("nan"))).sum().backward()
    with context():
        norm = Accelerator.clip_grad_norm_(accelerator, model.parameters(), 1.0)
    assert calls == ["accelerate"] and norm.isnan() and bool(optimizer.found_inf) is True
    assert "decided on the device (fused optimizer's found_inf)" in capsys.readouterr().out
    assert all(p.grad is not None for p in model.parameters())  # left for the step, which skips
    assert Accelerator.clip_grad_norm_ is accelerate_clip  # both contexts undone
    _, plain = _model_and_optimizer(fused=False)
    with context():
        Accelerator.clip_grad_norm_(SimpleNamespace(scaler=None, _optimizers=[plain]), model.parameters(), 1.0)
    assert calls[-2:] == ["swift", "accelerate"]  # not fused: ms-swift's own wrapper
    assert all(p.grad is None for p in model.parameters())


def test_the_plugin_wraps_ms_swift_s_context_once_its_trainers_are_loaded():
    import os

    from speedups.tests.plugin_run import ROOT, last_line

    code = """
import torch
from speedups import plugin
before = plugin.check_model(torch.nn.Linear(2, 2))[17]  # as at a trainer's creation
from swift.trainers.mixin import SwiftMixin
after, again = (plugin.check_model(torch.nn.Linear(2, 2))[17] for _ in range(2))
print(before.line() == "skipped: not applicable (ms-swift's trainers not loaded)", after.applied, again.applied,
      getattr(SwiftMixin._fix_grad_norm_nan, "_vlm_lora_grad_nan", False),
      type(SwiftMixin.__dict__["_fix_grad_norm_nan"]).__name__)
"""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    assert last_line(code, PYTHONPATH=path) == "True True True True staticmethod"
    assert last_line(code, PYTHONPATH=path, VLM_LORA_GRAD_NAN_ON_GPU="0") == "False False False False staticmethod"


def test_where_fused_adam_stops_taking_found_inf_ms_swift_s_own_check_stays_with_a_line():
    """Item 17 relies on torch's fused Adam / AdamW reading `found_inf`: where they stop, the skip would silently
    stop skipping, so the item checks their signature and source first and leaves ms-swift's check in place."""
    import os

    from speedups.tests.plugin_run import ROOT, last_line

    assert grad_nan.found_inf_problem() == ""  # this torch takes it
    code = """
import torch
from speedups import grad_nan, plugin
from swift.trainers.mixin import SwiftMixin
grad_nan.found_inf_problem = lambda: "torch.optim.adam._fused_adam(found_inf=)"  # as a torch without it
outcome = plugin.check_model(torch.nn.Linear(2, 2))[17]
print(outcome.kind, "|", outcome.detail.split(";")[0], "|",
      getattr(SwiftMixin._fix_grad_norm_nan, "_vlm_lora_grad_nan", False))
"""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    out = last_line(code, PYTHONPATH=path)
    assert out == "target missing or changed | torch.optim.adam._fused_adam(found_inf=) | False"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_the_skip_adds_no_wait_where_ms_swift_s_check_adds_one_gpu():
    """Clip and step on a GPU with a NaN gradient, counted with torch's sync debug mode: the plugin's skip waits no
    more than clip and step alone, ms-swift's `.item()` once more; the plugin's skip leaves the parameters."""
    from speedups.tests.gpu_waits import gpu_waits

    def clip_and_step(how):
        torch.manual_seed(0)
        model = torch.nn.Linear(6, 4).cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
        _step(model, optimizer, torch.randn(3, 6, device="cuda"))
        before = [p.detach().clone() for p in model.parameters()]
        model(torch.full((3, 6), float("nan"), device="cuda")).sum().backward()

        def clip_skip_step():
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if how == "plugin":
                grad_nan.skip_if_nan([optimizer], norm)
            elif how == "ms-swift" and norm.isnan().item():
                for p in model.parameters():
                    p.grad = None
            optimizer.step()

        _, sites = gpu_waits(clip_skip_step)
        kept = all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
        return sites, kept

    clip_and_step("neither")  # warm-up: a first clip and step on the device waits once (one-time set-up)
    alone, _ = clip_and_step("neither")
    plugin, plugin_kept = clip_and_step("plugin")
    swift, swift_kept = clip_and_step("ms-swift")
    assert len(plugin) == len(alone) and len(swift) == len(alone) + 1, (alone, plugin, swift)
    assert plugin_kept and swift_kept
