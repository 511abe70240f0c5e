"""ms-swift's skip of an optimizer step whose gradient norm is NaN, decided on the GPU instead of the host.

During training ms-swift (4.6, `SwiftMixin._fix_grad_norm_nan`) wraps accelerate's `clip_grad_norm_`: after
clipping it reads `grad_norm.isnan().item()` and, when true, sets every gradient to None, so that the optimizer
step changes nothing. That `.item()` makes the host wait at every optimizer step for the whole backward (under DDP
also for the gradients' all-reduce, that is for the other ranks) before it may queue the optimizer step and prepare
the next step: the GPU then runs dry while the host does that work, once per optimizer step.

torch's fused Adam and AdamW take the same decision on the GPU: given a `found_inf` tensor (the mechanism of
torch's GradScaler), their kernel leaves parameters, moments and step counts as they were where it is 1. So where
every optimizer accelerate holds is a fused torch Adam / AdamW and no gradient scaler runs, `device_nan_skip` clips
as accelerate does and hands the optimizers `grad_norm.isnan()` as `found_inf` for their next step (taken away
after it): the same parameters and optimizer state as ms-swift's skip, without the wait. Anything else (another
optimizer, a scaler, FSDP) gets ms-swift's own check.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

FUSED_TYPES = (torch.optim.Adam, torch.optim.AdamW)
_HOOKED = "_vlm_lora_found_inf_hook"


def fused_optimizers(accelerator: Any) -> list[torch.optim.Optimizer] | None:
    """The torch optimizers behind `accelerator` if each is a fused Adam / AdamW and no gradient scaler runs."""
    if getattr(accelerator, "scaler", None) is not None:
        return None
    found = []
    for wrapped in getattr(accelerator, "_optimizers", None) or []:
        optimizer = getattr(wrapped, "optimizer", wrapped)
        if not isinstance(optimizer, FUSED_TYPES) or not all(g.get("fused") for g in optimizer.param_groups):
            return None
        found.append(optimizer)
    return found or None


def _drop_found_inf(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    optimizer.__dict__.pop("found_inf", None)


def skip_if_nan(optimizers: list[torch.optim.Optimizer], grad_norm: torch.Tensor) -> None:
    """Makes each optimizer's next step change nothing where `grad_norm` is NaN (decided on its device)."""
    found = grad_norm.detach().isnan().to(torch.float32).reshape(())
    for optimizer in optimizers:
        if not getattr(optimizer, _HOOKED, False):
            optimizer.register_step_post_hook(_drop_found_inf)  # one step only
            setattr(optimizer, _HOOKED, True)
        optimizer.found_inf = found


def device_nan_skip(swift_context: Callable[[], Any]) -> Callable[[], Any]:
    """ms-swift's `_fix_grad_norm_nan` context manager, with accelerate's `clip_grad_norm_` inside it deciding on
    the GPU where `fused_optimizers` allows (ms-swift's own wrapper otherwise)."""

    @functools.wraps(swift_context)
    @contextlib.contextmanager
    def _fix_grad_norm_nan() -> Iterator[None]:
        from accelerate import Accelerator
        from accelerate.utils import DistributedType

        accelerate_clip = Accelerator.clip_grad_norm_
        with swift_context():
            swift_clip = Accelerator.clip_grad_norm_

            said: list[bool] = []

            def clip_grad_norm_(self: Any, parameters: Any, *args: Any, **kwargs: Any) -> Any:
                parameters = list(parameters)
                optimizers = fused_optimizers(self)
                on_gpu = optimizers is not None and getattr(self, "distributed_type", None) != DistributedType.FSDP
                if not said:  # once per training: which way the NaN check goes
                    said.append(True)
                    how = "on the device (fused optimizer's found_inf)" if on_gpu else "by ms-swift on the host"
                    print(f"train-lora plugin: a NaN gradient norm skips the optimizer step, decided {how}", flush=True)
                if not on_gpu:
                    return swift_clip(self, parameters, *args, **kwargs)  # (ms-swift handles FSDP2 offload itself)
                grad_norm = accelerate_clip(self, parameters, *args, **kwargs)
                if isinstance(grad_norm, torch.Tensor):  # ms-swift checks tensors only
                    skip_if_nan(optimizers, grad_norm)
                return grad_norm

            clip_grad_norm_._vlm_lora_grad_nan = True
            Accelerator.clip_grad_norm_ = clip_grad_norm_
            try:
                yield
            finally:
                Accelerator.clip_grad_norm_ = swift_clip

    _fix_grad_norm_nan._vlm_lora_grad_nan = True
    return _fix_grad_norm_nan


# ---- item 17 of the plugin (items.py) ---------------------------------------------------------------------------------


def found_inf_problem() -> str:
    """What stops torch's fused Adam / AdamW from taking `found_inf` as this module hands it ("" where nothing does):
    the optimizers' `step` must pass their `found_inf` attribute on, and the fused kernels must take it."""
    import inspect

    try:
        from torch.optim import adam
    except ImportError:
        return "torch.optim.adam"
    problems = []
    for cls in FUSED_TYPES:
        try:
            source = inspect.getsource(cls.step)
        except (OSError, TypeError):
            source = ""
        if '"found_inf"' not in source and "'found_inf'" not in source:
            problems.append(f"torch.optim.{cls.__name__}.step (does not pass its found_inf on)")
    for name in ("adam", "_fused_adam"):
        fn = getattr(adam, name, None)
        try:
            takes = fn is not None and "found_inf" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            takes = False
        if not takes:
            problems.append(f"torch.optim.adam.{name}(found_inf=)")
    return ", ".join(problems)


def check(ctx, trainer):
    """Wraps ms-swift's `SwiftMixin._fix_grad_norm_nan` once ms-swift's trainers are loaded, where torch's fused
    Adam / AdamW still take `found_inf`; otherwise ms-swift's own check stays (and says so)."""
    import sys

    from speedups import registry

    cls = getattr(sys.modules.get("swift.trainers.mixin"), "SwiftMixin", None)
    if cls is None:
        return registry.not_applicable("ms-swift's trainers not loaded")
    original = cls.__dict__.get("_fix_grad_norm_nan")
    if not isinstance(original, staticmethod):
        return registry.target_missing("swift.trainers.mixin.SwiftMixin._fix_grad_norm_nan", version_of="ms-swift")
    problem = found_inf_problem()
    if problem:
        if getattr(original.__func__, "_vlm_lora_grad_nan", False):
            cls._fix_grad_norm_nan = staticmethod(original.__func__.__wrapped__)
        ctx.say(
            f"a NaN gradient norm is checked by ms-swift on the host: torch's fused Adam no longer takes found_inf ({problem})"
        )
        return registry.target_missing(problem, version_of="torch")
    if not getattr(original.__func__, "_vlm_lora_grad_nan", False):
        cls._fix_grad_norm_nan = staticmethod(device_nan_skip(original.__func__))
    return registry.applied("fused Adam / AdamW skip on the device; other optimizers: ms-swift's check")
