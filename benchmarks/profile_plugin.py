"""ms-swift plugin (`--external_plugins`) that profiles a window of training micro-steps.

Used by benchmarks/train_throughput.py's *_prof profiles; inert unless
VLM_LORA_PROFILE_OUT is set. Wraps transformers' Trainer.training_step: from micro-step
VLM_LORA_PROFILE_START for VLM_LORA_PROFILE_STEPS micro-steps it runs torch.profiler
(CPU + CUDA), then writes VLM_LORA_PROFILE_OUT (JSON): the window's wall time (data loading
and optimizer steps between micro-steps included), GPU kernel time by category (GEMM,
attention, Triton/Liger, elementwise/reduction, copies, NCCL, other), the GPU-idle share,
and the 30 kernels that take the most time; and the window's time by region, from CUDA events
on the training stream: the vision tower's forward, the model's forward with its loss, the LM
head + loss (Liger's fused loss, which computes its gradient in the forward), the backward pass
(a micro-step less its forward) and what runs between micro-steps (optimizer, data, host);
`vision_output_requires_grad` says whether autograd would run the backward through the frozen
vision tower. The micro-step before the window, and what runs between it and the micro-step before
it (the optimizer step, the next batch and its copy to the GPU), run with torch's sync debug mode:
`host_syncs` lists the source lines that made the host wait for the GPU (`.item()`, `.tolist()`,
`nonzero`, blocking copies) and how often, each a point where the GPU may run dry; a line inside
torch (`torch.cuda.synchronize`, a tensor's copy) is followed by ` <- ` and its two innermost callers outside
torch (this profiler's own frames included: it may be the one waiting).

`idle` (from the profiler's trace) says where the GPU waited: per region (the regions are also
profiler ranges, so each has a span on the GPU's timeline) the span, the kernel time inside it and
the rest; the gaps between consecutive kernels by size; and the operators that launched the kernel
after each gap of 20 µs or more (the host work the GPU waited for ends with that launch).

Every rank writes its own summary (rank 0 to VLM_LORA_PROFILE_OUT, rank R to `<that>.rank<R>`, `rank_path`): under DDP
each rank's NCCL time says how long it waited for the others at the collectives, so the ranks' files together say
which one the step waits for.
`unprofiled` times the same regions over as many later micro-steps without the profiler (which slows
the host) and subtracts the profiled kernel times: the GPU's idle time per region as training runs.
"""

from __future__ import annotations

import json
import os
import time
import traceback
import warnings
from bisect import bisect_right
from collections import Counter, defaultdict

OUT = os.environ.get("VLM_LORA_PROFILE_OUT", "")
START = int(os.environ.get("VLM_LORA_PROFILE_START", "4"))
STEPS = int(os.environ.get("VLM_LORA_PROFILE_STEPS", "4"))
# Python stacks in the trace (VLM_LORA_PROFILE_STACK=1): `long_gaps` then names the code before each
# long GPU wait; recording them slows the host, so the window's times are not the run's
WITH_STACK = os.environ.get("VLM_LORA_PROFILE_STACK", "0") == "1"
# after the profiled window, the same number of micro-steps timed by region without the profiler
UNPROFILED_START = START + STEPS + 2

CATEGORIES = (
    ("nccl", ("nccl",)),
    ("attention", ("sdpa", "fmha", "flash", "attention")),
    ("gemm", ("nvjet", "gemm", "cutlass", "xmma", "cublas", "wgmma", "convolve")),
    ("dtype_copy", ("copy_kernel", "bfloat16_copy", "memcpy")),
    ("dropout", ("dropout", "masked_scale")),
    ("elementwise_reduce", ("at::native",)),
)


def rank_path(out: str, rank: int) -> str:
    """Where rank `rank` writes its summary: `out` for rank 0, `out.rank<R>` for the others."""
    return out if rank == 0 else f"{out}.rank{rank}"


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
        if "CUDA" not in device_type or not t or evt.key.startswith("region:"):
            continue  # region:* are the regions' ranges on the GPU timeline, not kernels
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


GAP_BUCKETS_US = (10, 100, 1000)
LATE_GAP_US = 20.0


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def _covered(busy: list[tuple[float, float]], starts: list[float], lo: float, hi: float) -> float:
    """Length of [lo, hi] covered by the merged, sorted intervals `busy` (`starts` = their starts)."""
    total = 0.0
    i = max(0, bisect_right(starts, lo) - 1)
    while i < len(busy) and busy[i][0] < hi:
        a, b = busy[i]
        total += max(0.0, min(b, hi) - max(a, lo))
        i += 1
    return total


LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")  # Triton and some libraries launch through the driver
HOST_CATEGORIES = ("cpu_op", "user_annotation", "python_function")
LONG_GAP_US = 1000.0
# frames that say nothing about which model or trainer code did the host work
_PLUMBING = (
    "torch/nn/modules/module.py",
    "torch/autograd/function.py",
    "torch/utils/_contextlib.py",
    "<built-in",
    "torch/_tensor.py",
    "torch/amp/",
    "torch/autograd/profiler",
)


def _useful_frame(name: str) -> bool:
    return not any(p in name for p in _PLUMBING)


def _launch_contexts(events: list[dict]) -> dict[int, tuple[str, tuple[str, ...]]]:
    """Correlation id of each kernel launch -> (innermost CPU operator, innermost Python frames).

    One sweep in time order per thread, keeping the stack of the host ranges (operators, and
    Python frames when the profile recorded stacks) open at each launch.
    """
    items = []
    for e in events:
        cat = e.get("cat")
        if cat in HOST_CATEGORIES and "dur" in e:
            items.append((e["ts"], 0, e.get("tid"), e["ts"] + e["dur"], cat, e.get("name", "?")))
        elif cat in LAUNCH_CATEGORIES and "correlation" in e.get("args", {}):
            items.append((e["ts"], 1, e.get("tid"), e["args"]["correlation"], cat, ""))
    items.sort(key=lambda it: (it[0], it[1], -it[3] if it[1] == 0 else 0))
    stacks: dict = defaultdict(list)
    out: dict[int, tuple[str, tuple[str, ...]]] = {}
    for ts, kind, tid, value, cat, name in items:
        stack = stacks[tid]
        while stack and stack[-1][0] < ts:
            stack.pop()
        if kind == 0:
            stack.append((value, cat, name))
            continue
        op = next((n for _, c, n in reversed(stack) if c != "python_function"), "(no operator)")
        frames = tuple(n for _, c, n in reversed(stack) if c == "python_function" and _useful_frame(n))[:6]
        out[value] = (op, frames)
    return out


def idle_summary(events: list[dict]) -> dict:
    """Where the GPU waited, from a chrome trace's events (torch.profiler `export_chrome_trace`)."""
    kernels = sorted(
        (e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e),
        key=lambda e: e["ts"],
    )
    if not kernels:
        return {}
    busy = _merged([(k["ts"], k["ts"] + k["dur"]) for k in kernels])
    starts = [a for a, _ in busy]
    regions: dict[str, dict[str, float]] = {}
    for e in events:
        if e.get("cat") == "gpu_user_annotation" and str(e.get("name", "")).startswith("region:"):
            name = e["name"][len("region:") :]
            r = regions.setdefault(name, {"span_s": 0.0, "kernel_s": 0.0})
            r["span_s"] += e["dur"] / 1e6
            r["kernel_s"] += _covered(busy, starts, e["ts"], e["ts"] + e["dur"]) / 1e6
    for r in regions.values():
        r["idle_s"] = r["span_s"] - r["kernel_s"]
    launched_by = _launch_contexts(events)
    buckets = Counter()
    bucket_s: dict[str, float] = defaultdict(float)
    late: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    long_gaps: dict[tuple[str, ...], list[float]] = defaultdict(lambda: [0, 0.0])
    end = kernels[0]["ts"] + kernels[0]["dur"]
    for k in kernels[1:]:
        gap = k["ts"] - end
        if gap > 0:
            label = next((f"<{b}us" for b in GAP_BUCKETS_US if gap < b), f">={GAP_BUCKETS_US[-1]}us")
            buckets[label] += 1
            bucket_s[label] += gap / 1e6
            if gap >= LATE_GAP_US:
                op, frames = launched_by.get(k.get("args", {}).get("correlation"), ("(no operator)", ()))
                late[op][0] += 1
                late[op][1] += gap / 1e6
                if gap >= LONG_GAP_US:
                    where = (op, *frames) if frames else (op, k.get("name", "?")[:80])
                    long_gaps[where][0] += 1
                    long_gaps[where][1] += gap / 1e6
        end = max(end, k["ts"] + k["dur"])
    top_late = sorted(late.items(), key=lambda kv: -kv[1][1])[:25]
    return {
        "regions": regions,
        "gaps": {label: {"count": buckets[label], "s": bucket_s[label]} for label in buckets},
        "late_launches": [{"launched_by": op[:160], "gaps": n, "s": t} for op, (n, t) in top_late],
        # gaps of 1 ms or more: the operator and (with stacks) the code whose launch ended each
        "long_gaps": [
            {"launched_at": [w[:160] for w in where], "gaps": n, "s": t}
            for where, (n, t) in sorted(long_gaps.items(), key=lambda kv: -kv[1][1])[:25]
        ],
    }


class Regions:
    """Elapsed GPU time of named code regions, from CUDA events recorded around them while active."""

    def __init__(self, torch_module):
        self.torch = torch_module
        self.active = False
        self.pairs: dict[str, list] = {}
        self.notes: dict[str, object] = {}

    def start(self, name: str):
        if not self.active or not self.torch.cuda.is_available():
            return None
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        scope = self.torch.autograd.profiler.record_function(f"region:{name}")
        scope.__enter__()
        return name, event, scope

    def stop(self, token) -> None:
        if token is None:
            return
        name, begin, scope = token
        scope.__exit__(None, None, None)
        end = self.torch.cuda.Event(enable_timing=True)
        end.record()
        self.pairs.setdefault(name, []).append((begin, end))

    def wrap(self, fn, name: str):
        def wrapped(*args, **kwargs):
            token = self.start(name)
            try:
                return fn(*args, **kwargs)
            finally:
                self.stop(token)

        wrapped.__wrapped__ = fn
        return wrapped

    def seconds(self) -> dict[str, float]:
        return {name: sum(b.elapsed_time(e) for b, e in pairs) / 1e3 for name, pairs in self.pairs.items()}


def region_summary(regions: dict[str, float], wall_s: float) -> dict:
    """Region times and the derived backward / between-step shares."""
    out = dict(regions)
    if "training_step" in regions and "forward_and_loss" in regions:
        out["backward"] = regions["training_step"] - regions["forward_and_loss"]
    if "training_step" in regions:
        out["between_micro_steps"] = max(0.0, wall_s - regions["training_step"])
    return {"seconds": out, "fraction_of_wall": {k: v / wall_s for k, v in out.items()} if wall_s else {}}


def unprofiled_summary(regions: dict[str, float], wall_s: float, profiled: dict) -> dict:
    """The same regions timed without the profiler, and the GPU's idle time in each.

    The profiler slows the host, so where the GPU waits for the host its idle time is overstated;
    kernel times hardly change. Idle here = a region's unprofiled time less the kernel time the
    profiled window measured in it (the backward's kernels = all kernels less the forward's and the
    optimizer's, which run between micro-steps).
    """
    out = region_summary(regions, wall_s)
    seconds = out["seconds"]
    kernels = {name: r["kernel_s"] for name, r in profiled.get("idle", {}).get("regions", {}).items()}
    total = profiled.get("gpu_kernel_s", 0.0)
    if "forward_and_loss" in kernels:
        kernels["backward_and_between"] = total - kernels["forward_and_loss"]
        seconds = {
            **seconds,
            "backward_and_between": seconds.get("backward", 0.0) + seconds.get("between_micro_steps", 0.0),
        }
    idle = {name: seconds[name] - k for name, k in kernels.items() if name in seconds and name != "training_step"}
    return {
        "wall_s": wall_s,
        "seconds": seconds,
        "gpu_idle_s": idle,
        "gpu_idle_fraction": max(0.0, 1 - total / wall_s) if wall_s else 0.0,
    }


def _inside_torch(filename: str) -> bool:
    """A file of the torch package itself (not merely under a folder named torch, as a virtualenv may be)."""
    path = filename.replace("\\", "/")
    return any(f"{root}/torch/" in path for root in ("site-packages", "dist-packages"))


def sync_site(filename: str, lineno: int, stack: list, callers: int = 2) -> str:
    """Where a wait was asked for: `file:line`, and where that is inside torch (`torch.cuda.synchronize`, ...),
    ` <- file:line` for each of the `callers` innermost callers outside torch (`stack`: traceback frames, outermost
    first; the warnings machinery left out, this file's own frames kept: the profiler may be the one waiting)."""
    site = f"{filename}:{lineno}"
    if not _inside_torch(filename):
        return site
    found = []
    for frame in reversed(stack):
        name = frame.filename
        if not _inside_torch(name) and not name.endswith("warnings.py"):
            found.append(f"{name}:{frame.lineno}")
            if len(found) == callers:
                break
    return " <- ".join([site, *found])


class SyncSites:
    """torch's sync-debug warnings by `sync_site`, recorded as they are raised (`showwarning`)."""

    def __init__(self) -> None:
        self.sites: Counter = Counter()

    def showwarning(self, message, category, filename, lineno, file=None, line=None) -> None:
        if "synchroniz" in str(message).lower():
            self.sites[sync_site(filename, lineno, traceback.extract_stack()[:-1])] += 1


class SyncCensus:
    """torch's CUDA sync debug mode on between `start()` and `stop()`, which returns {site: count}, most frequent
    first (a warnings context held open across calls: the census spans a step boundary)."""

    def __init__(self, torch_module) -> None:
        self.torch = torch_module
        self.sites = SyncSites()
        self._context = None

    def start(self) -> SyncCensus:
        self._context = warnings.catch_warnings()
        self._context.__enter__()
        warnings.simplefilter("always")
        warnings.showwarning = self.sites.showwarning
        self.torch.cuda.set_sync_debug_mode(1)
        return self

    def stop(self) -> dict[str, int]:
        self.torch.cuda.set_sync_debug_mode(0)
        if self._context is not None:
            self._context.__exit__(None, None, None)
            self._context = None
        return dict(self.sites.sites.most_common(40))


def _hook_vision(model, regions: Regions) -> None:
    vision = next((m for m in model.modules() if type(m).__name__.endswith("VisionModel")), None)
    if vision is None:
        return
    tokens: list = []

    def pre(_module, _args):
        tokens.append(regions.start("vision_forward"))

    def post(_module, _args, output):
        regions.stop(tokens.pop() if tokens else None)
        first = output[0] if isinstance(output, (tuple, list)) else getattr(output, "last_hidden_state", output)
        if hasattr(first, "requires_grad"):
            regions.notes["vision_output_requires_grad"] = bool(first.requires_grad)

    vision.register_forward_pre_hook(pre)
    vision.register_forward_hook(post)


def _install() -> None:
    import torch
    from transformers import Trainer

    original = Trainer.training_step
    regions = Regions(torch)
    try:
        from liger_kernel.transformers.model import loss_utils
    except ImportError:
        pass
    else:  # the train-lora plugin may wrap it too: it is looked up at call time, so this is outermost
        loss_utils.fixed_fused_linear_cross_entropy = regions.wrap(
            loss_utils.fixed_fused_linear_cross_entropy, "lm_head_and_loss"
        )
    state: dict = {"n": 0}
    out_path = rank_path(OUT, int(os.environ.get("RANK", "0") or 0))
    cuda = torch.cuda.is_available()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def training_step(self, *args, **kwargs):
        n = state["n"]
        state["n"] += 1
        if n == 0:  # ms-swift's trainer overrides compute_loss: wrap the instance's
            _hook_vision(self.model, regions)
            self.compute_loss = regions.wrap(self.compute_loss, "forward_and_loss")
        if n == UNPROFILED_START and "summary" in state:
            sync()
            regions.pairs.clear()
            regions.active = True
            state["t0"] = time.perf_counter()
        if n == START:
            sync()
            prof = torch.profiler.profile(activities=activities, with_stack=WITH_STACK)
            prof.__enter__()
            regions.active = True
            state.update(prof=prof, t0=time.perf_counter())
        if n == START - 1 and cuda and "census" not in state:  # no micro-step before it: this one alone
            state["census"] = SyncCensus(torch).start()
        token = regions.start("training_step")
        out = original(self, *args, **kwargs)
        regions.stop(token)
        if n == START - 2 and cuda:  # the census: the step boundary before micro-step START - 1, then that one
            state["census"] = SyncCensus(torch).start()
        elif n == START - 1 and "census" in state:
            regions.notes["host_syncs"] = state.pop("census").stop()
        if n == START + STEPS - 1 and "prof" in state:
            sync()
            wall = time.perf_counter() - state["t0"]
            regions.active = False
            state["prof"].__exit__(None, None, None)
            summary = summarize(state["prof"], wall)
            summary["regions"] = region_summary(regions.seconds(), wall)
            summary.update(regions.notes)
            trace = f"{out_path}.trace.json"
            state["prof"].export_chrome_trace(trace)
            with open(trace, encoding="utf-8") as f:
                summary["idle"] = idle_summary(json.load(f).get("traceEvents", []))
            os.remove(trace)
            with open(out_path, "w", encoding="utf-8") as f:
                json.dump(summary, f, indent=1)
            state["summary"] = summary
        if n == UNPROFILED_START + STEPS - 1 and "summary" in state:
            sync()
            wall = time.perf_counter() - state["t0"]
            regions.active = False
            summary = state.pop("summary")
            summary["unprofiled"] = unprofiled_summary(regions.seconds(), wall, summary)
            with open(out_path, "w", encoding="utf-8") as f:
                json.dump(summary, f, indent=1)
        return out

    Trainer.training_step = training_step


if OUT:
    _install()
