"""Checks of speedups/lora_triton.py under Triton's interpreter, printed as one JSON line.

Triton's interpreter replaces `triton.language` when Triton is imported, so these run in a process of
their own with `TRITON_INTERPRET=1` (speedups/tests/test_lora_triton.py starts it):

    TRITON_INTERPRET=1 python -m speedups.tests.triton_interpret_checks

- "kernels": each kernel against a float64 reference on fresh random inputs (shapes that are and are
  not multiples of the tiles, ranks 4 / 8 / 16, no rows), the relative error per case;
- "layer": `_LoraLinear` with dropout through the kernels against the same function through PyTorch's
  kernels (the same masks: the same seed), the largest relative difference of each gradient, and how
  often each kernel ran with the switch on and off;
- "seeded": masks given by a seed — the forward's rank-r product and both backward kernels against float64
  with the mask written out (`kept_mask`), the drop rate and neighbouring columns' joint drops on a large
  mask, and `_LoraLinear` / `_SiluMulLoraLinear` with seeded masks against autograd on the written-out masks;
- "vision_rotary": the vision tower's rotary kernel (speedups/vision_triton.py) against
  transformers' `apply_rotary_pos_emb_vision` on strided q / k (speedups/tests/test_vision_tower.py reads it).
"""

from __future__ import annotations

import copy
import json
import os
import sys

import torch

SHAPES = ((100, 200, 8), (64, 128, 16), (3, 130, 4), (0, 64, 8), (700, 96, 8), (257, 300, 8))


def _relative(out: torch.Tensor, ref: torch.Tensor) -> float:
    if ref.numel() == 0:
        return 0.0 if out.numel() == 0 else float("inf")
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-300))


def _beyond_rounding(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> float:
    """The largest error beyond one rounding to `dtype` (one unit in the last place, at most 2^-7 of the value
    for bf16: the interpreter's float32 -> bf16 conversion truncates), over the largest reference value; 0 up
    to float32 accumulation for a result rounded once."""
    if ref.numel() == 0:
        return 0.0
    ulp = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-23
    excess = ((out.double() - ref).abs() - ulp * ref.abs()).clamp_min(0)
    return float(excess.max() / ref.abs().max().clamp_min(1e-300))


def kernel_cases(kernels, device: str = "cpu") -> list[dict]:
    """Each kernel against float64 on fresh inputs (also on a GPU: speedups/tests/test_lora_triton.py)."""
    cases = []
    for dtype in (torch.float32, torch.bfloat16):
        for m, k, r in SHAPES:
            p = 0.1 + 0.3 * torch.rand(()).item()
            keep = 1.0 / (1.0 - p)
            x, gh, a = (torch.randn(*shape, device=device).to(dtype) for shape in ((m, k), (m, r), (r, k)))
            mask = torch.rand(m, k, device=device) > p
            dx = torch.randn(m, k, device=device).to(dtype)
            dx_ref = dx.double() + keep * mask.double() * (gh.double() @ a.double())
            dx_out = kernels.add_dropped_product(dx.clone(), gh, a, mask, keep)
            da_ref = gh.double().t() @ (keep * mask.double() * x.double())
            da_out = kernels.dropped_weight_grad(gh, x, mask, keep)
            cases.append(
                {
                    "dtype": str(dtype),
                    "shape": [m, k, r],
                    "dx_error": _relative(dx_out, dx_ref),
                    "dx_beyond_rounding": _beyond_rounding(dx_out, dx_ref, dtype),
                    "dx_dtype": str(dx_out.dtype),
                    "da_error": _relative(da_out, da_ref),
                    "da_shape": list(da_out.shape),
                    "da_dtype": str(da_out.dtype),
                }
            )
    return cases


class _Counted:
    """The kernels module with a count of each kernel's calls."""

    def __init__(self, kernels) -> None:
        self.kernels, self.calls = kernels, {"add_dropped_product": 0, "dropped_weight_grad": 0}

    def usable(self, *tensors):
        return self.kernels.usable(*tensors)

    def add_dropped_product(self, *args):
        self.calls["add_dropped_product"] += 1
        return self.kernels.add_dropped_product(*args)

    def dropped_weight_grad(self, *args):
        self.calls["dropped_weight_grad"] += 1
        return self.kernels.dropped_weight_grad(*args)


def _lora_linear_grads(lora_functions, layer, x, seed: int):
    weight_a, weight_b = layer["a"], layer["b"]
    x = x.clone().requires_grad_(True)
    torch.manual_seed(seed)
    out = lora_functions._LoraLinear.apply(x, layer["w"], layer["bias"], weight_a, weight_b, 2.0, 0.2, x.dtype)
    out.square().sum().backward()
    grads = {"x": x.grad, "a": weight_a.grad, "b": weight_b.grad, "out": out.detach()}
    weight_a.grad = weight_b.grad = None
    return grads


def layer_case(lora_functions, lora_switches, kernels) -> dict:
    torch.manual_seed(0)
    d_in, d_out, r = 96, 80, 8
    layer = {
        "w": torch.randn(d_out, d_in) / d_in**0.5,
        "bias": torch.randn(d_out),
        "a": (torch.randn(r, d_in) / d_in**0.5).requires_grad_(True),
        "b": (torch.randn(d_out, r) * 0.2).requires_grad_(True),
    }
    x = torch.randn(3, 45, d_in)
    counted = _Counted(kernels)
    # PyTorch's masks either way
    lora_functions._kernels, lora_switches.TRITON, lora_switches.SEEDED = counted, True, False
    on = _lora_linear_grads(lora_functions, copy.deepcopy(layer), x, seed=5)
    calls = dict(counted.calls)
    counted.calls = dict.fromkeys(calls, 0)
    lora_switches.TRITON = False
    off = _lora_linear_grads(lora_functions, copy.deepcopy(layer), x, seed=5)
    return {
        "calls": calls,
        "calls_with_switch_off": counted.calls,
        "difference": {name: _relative(on[name], off[name].double()) for name in on},
    }


def seeded_kernel_cases(kernels, device: str = "cpu") -> list[dict]:
    """The three kernels with a seed against float64 with the same mask written out."""
    cases = []
    for dtype in (torch.float32, torch.bfloat16):
        for m, k, r in SHAPES:
            mask = kernels.seeded(0.1 + 0.3 * torch.rand(()).item())
            kept = kernels.kept_mask((m, k), mask, device).double()
            x, gh, a = (torch.randn(*shape, device=device).to(dtype) for shape in ((m, k), (m, r), (r, k)))
            dx = torch.randn(m, k, device=device).to(dtype)
            h_ref = (mask.keep * kept * x.double()) @ a.double().t()
            dx_ref = dx.double() + mask.keep * kept * (gh.double() @ a.double())
            da_ref = gh.double().t() @ (mask.keep * kept * x.double())
            h_out = kernels.dropped_rank_product(x, a, mask)
            dx_out = kernels.add_dropped_product(dx.clone(), gh, a, mask, mask.keep)
            cases.append(
                {
                    "dtype": str(dtype),
                    "shape": [m, k, r],
                    "h_error": _relative(h_out, h_ref),
                    "h_dtype": str(h_out.dtype),
                    "dx_error": _relative(dx_out, dx_ref),
                    "da_error": _relative(kernels.dropped_weight_grad(gh, x, mask, mask.keep), da_ref),
                }
            )
    return cases


def seeded_mask_stats(kernels, device: str = "cpu") -> dict:
    """A 512 x 1,000 mask at p = 0.05: drop rate, neighbouring columns dropped together, the same seed again."""
    mask = kernels.seeded(0.05)
    kept = kernels.kept_mask((512, 1000), mask, device)
    dropped = ~kept
    other = kernels.kept_mask((512, 1000), kernels.seeded(0.05), device)
    return {
        "p": mask.threshold / 65536,
        "keep": mask.keep,
        "drop_rate": float(dropped.double().mean()),
        "adjacent_both_dropped": float((dropped[:, 1:] & dropped[:, :-1]).double().mean()),
        "rows_both_dropped": float((dropped[1:] & dropped[:-1]).double().mean()),
        "same_seed_same_mask": bool(torch.equal(kept, kernels.kept_mask((512, 1000), mask, device))),
        "other_seed_differs": float((kept != other).double().mean()),
    }


class _Recorded:
    """The kernels module recording each seed the forward draws."""

    def __init__(self, kernels) -> None:
        self.kernels, self.seeds = kernels, []

    def __getattr__(self, name):
        return getattr(self.kernels, name)

    def seeded(self, p):
        self.seeds.append(self.kernels.seeded(p))
        return self.seeds[-1]


def seeded_layer_case(lora_functions, lora_switches, kernels, device: str = "cpu") -> dict:
    """`_LoraLinear` and `_SiluMulLoraLinear` with seeded masks against autograd over the written-out masks."""
    torch.manual_seed(0)
    d_in, d_out, r, p, scaling = 96, 80, 8, 0.2, 2.0
    w, bias = torch.randn(d_out, d_in, device=device) / d_in**0.5, torch.randn(d_out, device=device)
    a0 = torch.randn(r, d_in, device=device) / d_in**0.5
    b0 = torch.randn(d_out, r, device=device) * 0.2
    recorded = _Recorded(kernels)
    lora_functions._kernels, lora_switches.TRITON, lora_switches.SEEDED = recorded, True, True
    differences = {}
    for name in ("linear", "silu_mul"):
        inputs = [
            torch.randn(3, 45, d_in, device=device).requires_grad_(True) for _ in range(2 if name == "silu_mul" else 1)
        ]
        a, b = a0.clone().requires_grad_(True), b0.clone().requires_grad_(True)
        if name == "linear":
            out = lora_functions._LoraLinear.apply(inputs[0], w, bias, a, b, scaling, p, inputs[0].dtype)
        else:
            out = lora_functions._SiluMulLoraLinear.apply(
                *inputs, w, bias, a, b, scaling, p, inputs[0].dtype, lora_functions.TorchSiluMul
            )
        out.square().sum().backward()
        got = {"out": out.detach(), "a": a.grad, "b": b.grad, **{f"x{i}": t.grad for i, t in enumerate(inputs)}}
        mask = recorded.seeds[-1]
        ref_inputs = [t.detach().double().requires_grad_(True) for t in inputs]
        ra, rb = a0.double().requires_grad_(True), b0.double().requires_grad_(True)
        x = ref_inputs[0] if name == "linear" else torch.nn.functional.silu(ref_inputs[0]) * ref_inputs[1]
        x2 = x.reshape(-1, d_in)
        kept = kernels.kept_mask(tuple(x2.shape), mask, device).double()
        ref = x2 @ w.double().t() + bias.double() + scaling * ((x2 * kept * mask.keep) @ ra.t()) @ rb.t()
        ref.square().sum().backward()
        want = {"out": ref.detach().view(out.shape), "a": ra.grad, "b": rb.grad}
        want.update({f"x{i}": t.grad for i, t in enumerate(ref_inputs)})
        differences[name] = {key: _relative(got[key], want[key]) for key in want}
    return {"differences": differences, "seeds_drawn": len(recorded.seeds)}


def _strided_qk(seq: int, heads: int, dim: int, dtype: torch.dtype, device: str):
    """q, k as the vision attention has them: views of one (seq, 3, heads, dim) projection output."""
    q, k, _v = torch.randn(seq, 3, heads, dim, device=device).to(dtype).permute(1, 0, 2, 3).unbind(0)
    angles = torch.randn(seq, dim // 2, device=device) * 3
    cos, sin = torch.cat([angles.cos(), angles.cos()], -1), torch.cat([angles.sin(), angles.sin()], -1)
    return q, k, cos, sin


def vision_rotary_cases(kernels, device: str = "cpu") -> list[dict]:
    """`vision_triton.rotary` against transformers' `apply_rotary_pos_emb_vision`: bit-equal outputs where the
    rounding to the dtype is the GPU's (float32 here; every dtype on a GPU), else the largest difference in
    units of the last place (the interpreter truncates to 16 bits)."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb_vision as reference

    cases = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for seq, heads, dim in ((37, 16, 64), (5, 3, 10), (130, 2, 128), (0, 4, 8)):
            q, k, cos, sin = _strided_qk(seq, heads, dim, dtype, device)
            got, want = kernels.rotary(q, k, cos, sin), reference(q, k, cos, sin)
            ulp = torch.finfo(dtype).eps
            worst = max(
                (
                    float(((g.double() - w.double()).abs() / (w.double().abs() * ulp).clamp_min(1e-30)).max())
                    if w.numel()
                    else 0.0
                )
                for g, w in zip(got, want)
            )
            cases.append(
                {
                    "dtype": str(dtype), "shape": [seq, heads, dim], "usable": kernels.usable(q, k, cos, sin),
                    "equal": all(bool(g.equal(w)) for g, w in zip(got, want)), "ulps": worst,
                    "contiguous": all(g.is_contiguous() for g in got),
                }
            )  # fmt: skip
    return cases


def interpreter_gap() -> str:
    """Why this Triton's interpreter cannot run the kernels ("" if it can): Triton 3.6's (the GPU machine's)
    fails on a loop whose bound is a kernel argument (`int()` of a one-element array), which 3.8's runs."""
    import triton
    import triton.language as tl

    @triton.jit
    def _loop(out_ptr, n):
        total = 0
        for i in range(0, n, 1):
            total += i
        tl.store(out_ptr, total)

    out = torch.zeros(1, dtype=torch.int32)
    try:
        _loop[(1,)](out, 4)
    except Exception as error:  # noqa: BLE001 - any failure of the probe is the interpreter's gap
        return f"Triton {triton.__version__}'s interpreter cannot run a loop over a kernel argument: {error!r}"
    return "" if int(out[0]) == 6 else f"Triton {triton.__version__}'s interpreter summed 0..3 to {int(out[0])}"


def main(argv: list[str] | None = None) -> dict:
    """All checks, or with the argument `vision` the vision rotary kernel's only."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run with TRITON_INTERPRET=1 (Triton's interpreter; the kernels run on the CPU)")
    from speedups import lora_functions, lora_switches, lora_triton, vision_triton

    gap = interpreter_gap()
    if gap:
        print(json.dumps({"unsupported": gap}))
        return {"unsupported": gap}
    torch.manual_seed(1234)
    if (sys.argv[1:] if argv is None else argv) == ["vision"]:
        result = {"vision_rotary": vision_rotary_cases(vision_triton)}
        print(json.dumps(result))
        return result
    result = {"interpreting": lora_triton.INTERPRETING, "kernels": kernel_cases(lora_triton)}
    result["layer"] = layer_case(lora_functions, lora_switches, lora_triton)
    result["seeded"] = {
        "kernels": seeded_kernel_cases(lora_triton),
        "stats": seeded_mask_stats(lora_triton),
        "layer": seeded_layer_case(lora_functions, lora_switches, lora_triton),
    }
    result["vision_rotary"] = vision_rotary_cases(vision_triton)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
