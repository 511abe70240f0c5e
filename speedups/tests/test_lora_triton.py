"""The Triton kernels of LoRA's backward with dropout (speedups/lora_triton.py).

On the CPU they run under Triton's interpreter, in a process of their own (speedups/tests/triton_interpret_checks.py);
on a GPU (skipped without one) the compiled kernels are checked the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from components.train_lora import job_env
from speedups import lora_functions, lora_switches

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]


def run_interpreted(*args: str) -> dict:
    """speedups/tests/triton_interpret_checks.py's JSON (with `args`) under Triton's interpreter; skips where this Triton's
    interpreter cannot run the kernels (the GPU machine's 3.6: the GPU tests check the kernels there)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-m", "speedups.tests.triton_interpret_checks", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if "unsupported" in result:  # an older Triton (the GPU machine's 3.6): the GPU test below checks the kernels
        assert not triton_3_8_or_later(), result["unsupported"]  # the locked 3.8 must run them
        pytest.skip(result["unsupported"])
    return result


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted()


def triton_3_8_or_later() -> bool:
    import triton

    return tuple(int(part) for part in triton.__version__.split(".")[:2]) >= (3, 8)


def _assert_kernel_cases(cases: list[dict]) -> None:
    shapes = {tuple(case["shape"]) for case in cases}
    assert (0, 64, 8) in shapes and (257, 300, 8) in shapes and len(cases) == 12
    for case in cases:
        m, k, r = case["shape"]
        assert case["da_shape"] == [r, k] and case["da_dtype"] == "torch.float32", case
        assert case["da_error"] < 1e-6, case  # accumulated in float32: no rounding to bf16 of the product
        assert case["dx_dtype"] == case["dtype"], case
        if case["dtype"] == "torch.float32":
            assert case["dx_error"] < 1e-6, case
        else:  # the sum rounded once to bf16, nothing more
            assert case["dx_beyond_rounding"] < 1e-5 and case["dx_error"] < 6e-3, case


def test_the_kernels_equal_float64_under_the_interpreter(interpreted):
    assert interpreted["interpreting"] is True
    _assert_kernel_cases(interpreted["kernels"])


def test_the_lora_function_through_the_kernels_equals_it_through_pytorchs(interpreted):
    layer = interpreted["layer"]
    assert layer["calls"] == {"add_dropped_product": 1, "dropped_weight_grad": 1}
    difference = layer["difference"]
    assert difference["out"] == 0.0 and difference["b"] == 0.0  # the forward and B's gradient: untouched
    assert difference["x"] < 1e-6 and difference["a"] < 1e-6, difference


def _assert_seeded_cases(cases: list[dict]) -> None:
    assert len(cases) == 12 and {tuple(c["shape"]) for c in cases} >= {(0, 64, 8), (257, 300, 8), (3, 130, 4)}
    for case in cases:
        assert case["da_error"] < 1e-6, case  # float32 accumulation
        assert case["h_dtype"] == case["dtype"], case
        bound = 1e-6 if case["dtype"] == "torch.float32" else 6e-3  # bf16: the result rounded once
        assert case["h_error"] < bound and case["dx_error"] < bound, case


def _assert_seeded_stats(stats: dict) -> None:
    p = stats["p"]
    assert p == pytest.approx(0.05, abs=1 / 65536) and stats["keep"] == pytest.approx(1 / (1 - p))
    sigma = (p * (1 - p) / 512_000) ** 0.5
    assert abs(stats["drop_rate"] - p) < 5 * sigma, stats  # 512,000 draws
    for key in ("adjacent_both_dropped", "rows_both_dropped"):  # independent neighbours: p^2
        assert stats[key] == pytest.approx(p * p, rel=0.15), (key, stats)
    assert stats["same_seed_same_mask"] is True
    assert stats["other_seed_differs"] == pytest.approx(2 * p * (1 - p), rel=0.05)


def test_seeded_masks_under_the_interpreter(interpreted):
    """The forward's product and both backward kernels agree on the mask a seed gives (tiles of 64 and 128
    columns), it drops at the rate asked, neighbours independently, and the layers train as autograd says."""
    seeded = interpreted["seeded"]
    _assert_seeded_cases(seeded["kernels"])
    _assert_seeded_stats(seeded["stats"])
    assert seeded["layer"]["seeds_drawn"] == 2
    for name, difference in seeded["layer"]["differences"].items():
        assert max(difference.values()) < 1e-6, (name, difference)


class _FakeSeed:
    """A seed's mask from a CPU generator of our own: the seeded path's bookkeeping without Triton."""

    def __init__(self, p):
        self.p, self.keep, self.seed = p, 1 / (1 - p), int(torch.randint(1 << 30, ()))

    def kept(self, shape):
        return (torch.rand(shape, generator=torch.Generator().manual_seed(self.seed)) >= self.p).float()


def _kept(mask, shape):
    return mask.float() if isinstance(mask, torch.Tensor) else mask.kept(shape)


class _FakeKernels:
    def usable(self, *tensors):
        return True

    def seeded(self, p):
        return _FakeSeed(p)

    def dropped_rank_product(self, x, a, mask):
        return (x * mask.kept(x.shape) * mask.keep) @ a.t()

    def dropped_weight_grad(self, gh, x, mask, keep):
        return gh.t() @ (x * _kept(mask, x.shape) * keep)

    def add_dropped_product(self, dx, gh, a, mask, keep):
        return dx.add_((gh @ a) * _kept(mask, dx.shape) * keep)


def _seeded_layer(monkeypatch, seeded: bool = True):
    from speedups.tests.triton_interpret_checks import _Recorded

    recorded = _Recorded(_FakeKernels())
    monkeypatch.setattr(lora_functions, "_kernels", recorded)
    monkeypatch.setattr(lora_switches, "TRITON", True)
    monkeypatch.setattr(lora_switches, "SEEDED", seeded)
    return recorded


def test_seeded_masks_keep_no_mask_for_the_backward(monkeypatch):
    """With a seed the LoRA function saves no mask tensor: 1 byte per input element less than PyTorch's dropout."""
    recorded = _seeded_layer(monkeypatch)
    sizes = {}
    for seeded in (False, True):
        monkeypatch.setattr(lora_switches, "SEEDED", seeded)
        saved: list[int] = []

        def pack(t, saved=saved):
            saved.append(t.numel() * t.element_size())
            return t

        x = torch.randn(4, 32, requires_grad=True)
        w, a, b = torch.randn(16, 32), torch.randn(8, 32, requires_grad=True), torch.randn(16, 8, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = lora_functions._LoraLinear.apply(x, w, None, a, b, 2.0, 0.2, x.dtype)
        out.sum().backward()
        sizes[seeded] = sum(saved)
        assert x.grad is not None and a.grad is not None and b.grad is not None
    assert len(recorded.seeds) == 1
    assert sizes[False] - sizes[True] == 4 * 32  # the boolean mask of the 4 x 32 input


@pytest.mark.parametrize("reentrant", [False, True])
def test_seeded_masks_under_gradient_checkpointing_draw_the_same_seed_again(monkeypatch, reentrant):
    """Checkpointing runs the forward again in the backward: it restores PyTorch's CPU generator, so the seed drawn
    again is the first one and the gradients equal the run without checkpointing."""
    from torch.utils.checkpoint import checkpoint

    recorded = _seeded_layer(monkeypatch)
    w = torch.randn(16, 32)
    a0, b0 = torch.randn(8, 32), torch.randn(16, 8)
    x0 = torch.randn(4, 32)
    grads = []
    for use_checkpoint in (False, True):
        x, a, b = x0.clone().requires_grad_(True), a0.clone().requires_grad_(True), b0.clone().requires_grad_(True)

        def layer(x, a=a, b=b):
            return lora_functions._LoraLinear.apply(x, w, None, a, b, 2.0, 0.2, x.dtype).tanh()

        torch.manual_seed(11)
        out = checkpoint(layer, x, use_reentrant=reentrant) if use_checkpoint else layer(x)
        torch.rand(5)  # the generator moves on between the forward and the backward
        out.square().sum().backward()
        grads.append((x.grad, a.grad, b.grad))
    assert [s.seed for s in recorded.seeds][0] == recorded.seeds[1].seed == recorded.seeds[2].seed  # 1 + 2 draws
    for got, want in zip(grads[1], grads[0]):
        assert torch.equal(got, want)


def test_the_kernels_are_not_used_off_the_gpu():
    tensors = [torch.randn(4, 8), torch.randn(4, 2), torch.rand(4, 8) > 0.5]
    assert lora_functions._load_kernels()  # Triton is installed with torch (requirements.lock)
    assert lora_functions._masked_kernels(*tensors) is None  # CPU tensors, not interpreting


def test_with_the_switch_off_the_kernels_are_not_called(interpreted):
    # the same function with tensors the kernels take (interpreting), the switch off: PyTorch's kernels only
    assert interpreted["layer"]["calls_with_switch_off"] == {"add_dropped_product": 0, "dropped_weight_grad": 0}


@pytest.mark.parametrize(
    "name", ["VLM_LORA_TRITON_LORA", "VLM_LORA_SEEDED_DROPOUT", "VLM_LORA_CAST_CACHE", "VLM_LORA_FOLD_SCALING"]
)
def test_the_switch_is_allowed_with_its_values(name):
    job_env.check_job_env({name: "0"})
    job_env.check_job_env({name: 1})
    with pytest.raises(job_env.JobEnvError, match=name):
        job_env.check_job_env({name: "yes"})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_the_compiled_kernels_equal_float64():
    from speedups import lora_triton
    from speedups.tests.triton_interpret_checks import kernel_cases

    torch.manual_seed(7)
    _assert_kernel_cases(kernel_cases(lora_triton, device="cuda"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_the_seeded_kernels_agree_and_drop_at_the_rate_asked():
    from speedups import lora_triton
    from speedups.tests.triton_interpret_checks import seeded_kernel_cases, seeded_layer_case, seeded_mask_stats

    torch.manual_seed(7)
    _assert_seeded_cases(seeded_kernel_cases(lora_triton, device="cuda"))
    _assert_seeded_stats(seeded_mask_stats(lora_triton, device="cuda"))
    saved = lora_functions._kernels, lora_switches.TRITON, lora_switches.SEEDED
    try:
        layer = seeded_layer_case(lora_functions, lora_switches, lora_triton, device="cuda")
    finally:
        lora_functions._kernels, lora_switches.TRITON, lora_switches.SEEDED = saved
    for name, difference in layer["differences"].items():
        assert max(difference.values()) < 1e-5, (name, difference)  # float32 on the GPU (no TF32)


def test_the_kernel_benchmark_says_it_needs_a_gpu(monkeypatch):
    import speedups.benchmarks.lora_kernels as bench
    from speedups.tests.benchmark_cli import assert_refuses_then_needs_a_gpu

    assert bench._tiles("64x128,32x256") == [(64, 128), (32, 256)]
    bad = [["--tiles", "64x100"], ["--tiles", "64"], ["--programs", "0"], ["--rows", "0"], ["--forward-tiles", "8x64"]]
    bad += [["--seeded-tiles", "64x"], ["--seeded-programs", "-1"]]
    assert_refuses_then_needs_a_gpu(bench.main, bad, monkeypatch)


def test_the_kernel_benchmark_times_each_tile_and_puts_the_defaults_back(monkeypatch):
    import types

    import speedups.benchmarks.lora_kernels as bench

    lt = types.SimpleNamespace(_H_BLOCK_M=32, _H_BLOCK_K=128)
    seen = []
    monkeypatch.setattr(bench, "_time", lambda fn: fn() or 1.5)
    assert bench._timed_at(lt, {"_H_BLOCK_M": 16}, lambda: seen.append((lt._H_BLOCK_M, lt._H_BLOCK_K))) == 1.5
    assert seen == [(16, 128)] and (lt._H_BLOCK_M, lt._H_BLOCK_K) == (32, 128)

    def fails():
        raise RuntimeError("out of resources")

    with pytest.raises(RuntimeError, match="out of resources"):
        bench._timed_at(lt, {"_H_BLOCK_M": 128, "_H_BLOCK_K": 256}, fails)
    assert (lt._H_BLOCK_M, lt._H_BLOCK_K) == (32, 128)  # a tile that fails leaves the defaults in place
