"""The Triton kernels of LoRA's backward with dropout (components/train_lora/lora_triton.py).

On the CPU they run under Triton's interpreter, in a process of their own (tests/triton_interpret_checks.py);
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

from components.train_lora import fused_lora, job_env

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def interpreted() -> dict:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-m", "tests.triton_interpret_checks"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if "unsupported" in result:  # an older Triton (the GPU machine's 3.6): the GPU test below checks the kernels
        assert not triton_3_8_or_later(), result["unsupported"]  # the locked 3.8 must run them
        pytest.skip(result["unsupported"])
    return result


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


def test_the_kernels_are_not_used_off_the_gpu():
    tensors = [torch.randn(4, 8), torch.randn(4, 2), torch.rand(4, 8) > 0.5]
    assert fused_lora._load_kernels()  # Triton is installed with torch (requirements.lock)
    assert fused_lora._masked_kernels(*tensors) is None  # CPU tensors, not interpreting


def test_with_the_switch_off_the_kernels_are_not_called(interpreted):
    # the same function with tensors the kernels take (interpreting), the switch off: PyTorch's kernels only
    assert interpreted["layer"]["calls_with_switch_off"] == {"add_dropped_product": 0, "dropped_weight_grad": 0}


def test_the_switch_is_allowed_with_its_values():
    job_env.check_job_env({"VLM_LORA_TRITON_LORA": "0"})
    job_env.check_job_env({"VLM_LORA_TRITON_LORA": 1})
    with pytest.raises(job_env.JobEnvError, match="VLM_LORA_TRITON_LORA"):
        job_env.check_job_env({"VLM_LORA_TRITON_LORA": "yes"})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_the_compiled_kernels_equal_float64():
    from components.train_lora import lora_triton
    from tests.triton_interpret_checks import kernel_cases

    torch.manual_seed(7)
    _assert_kernel_cases(kernel_cases(lora_triton, device="cuda"))


def test_the_kernel_benchmark_says_it_needs_a_gpu(monkeypatch):
    import benchmarks.lora_kernels as bench

    assert bench._tiles("64x128,32x256") == [(64, 128), (32, 256)]
    for bad in (["--tiles", "64x100"], ["--tiles", "64"], ["--programs", "0"], ["--rows", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            bench.main(bad)
        assert exit_info.value.code == 2, bad
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        bench.main([])
