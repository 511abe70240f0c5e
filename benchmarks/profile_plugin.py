"""ms-swift plugin (`--external_plugins`) that profiles a window of training micro-steps.

Used by benchmarks/train_throughput.py's *_prof profiles; inert unless
VLM_LORA_PROFILE_OUT is set. Wraps transformers' Trainer.training_step: from micro-step
VLM_LORA_PROFILE_START for VLM_LORA_PROFILE_STEPS micro-steps it runs torch.profiler
(CPU + CUDA), then writes VLM_LORA_PROFILE_OUT (JSON): the window's wall time (data loading
and optimizer steps between micro-steps included), GPU kernel time by category (GEMM,
attention, Triton/Liger, elementwise/reduction, copies, NCCL, other), the GPU-idle share,
and the 30 kernels that take the most time.
"""

from __future__ import annotations

import json
import os
import time

OUT = os.environ.get("VLM_LORA_PROFILE_OUT", "")
START = int(os.environ.get("VLM_LORA_PROFILE_START", "4"))
STEPS = int(os.environ.get("VLM_LORA_PROFILE_STEPS", "4"))

CATEGORIES = (
    ("nccl", ("nccl",)),
    ("attention", ("sdpa", "fmha", "flash", "attention")),
    ("gemm", ("nvjet", "gemm", "cutlass", "xmma", "cublas", "wgmma", "convolve")),
    ("dtype_copy", ("copy_kernel", "bfloat16_copy", "memcpy")),
    ("dropout", ("dropout", "masked_scale")),
    ("elementwise_reduce", ("at::native",)),
)


def category(name: str) -> str:
    """GEMM, attention, dtype copies, dropout, other PyTorch elementwise, or Triton (Liger) kernels."""
    low = name.lower()
    for cat, needles in CATEGORIES:
        if any(n in low for n in needles):
            return cat
    return "triton_other"


def summarize(prof, wall_s: float) -> dict:
    kernels: dict[str, float] = {}
    for evt in prof.key_averages():
        device_type = str(getattr(evt, "device_type", ""))
        t = getattr(evt, "self_device_time_total", None)
        if t is None:
            t = getattr(evt, "self_cuda_time_total", 0)
        if "CUDA" not in device_type or not t:
            continue
        kernels[evt.key] = kernels.get(evt.key, 0.0) + t / 1e6
    busy = sum(kernels.values())
    cats: dict[str, float] = {}
    for name, t in kernels.items():
        cats[category(name)] = cats.get(category(name), 0.0) + t
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:30]
    return {
        "wall_s": wall_s,
        "gpu_kernel_s": busy,
        "gpu_idle_fraction": max(0.0, 1 - busy / wall_s) if wall_s else 0.0,
        "by_category_s": dict(sorted(cats.items(), key=lambda kv: -kv[1])),
        "by_category_fraction_of_wall": {k: v / wall_s for k, v in cats.items()} if wall_s else {},
        "top_kernels": [{"name": n[:160], "s": t, "category": category(n)} for n, t in top],
        "micro_steps": STEPS,
    }


def _install() -> None:
    import torch
    from transformers import Trainer

    original = Trainer.training_step
    state: dict = {"n": 0}
    cuda = torch.cuda.is_available()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def training_step(self, *args, **kwargs):
        n = state["n"]
        state["n"] += 1
        if n == START:
            sync()
            prof = torch.profiler.profile(activities=activities)
            prof.__enter__()
            state.update(prof=prof, t0=time.perf_counter())
        out = original(self, *args, **kwargs)
        if n == START + STEPS - 1 and "prof" in state:
            sync()
            wall = time.perf_counter() - state["t0"]
            state["prof"].__exit__(None, None, None)
            if self.is_world_process_zero():
                with open(OUT, "w", encoding="utf-8") as f:
                    json.dump(summarize(state["prof"], wall), f, indent=1)
        return out

    Trainer.training_step = training_step


if OUT:
    _install()
