"""One Triton kernel for the vision tower's rotary embedding: q and k in one pass, float32 arithmetic.

transformers' `apply_rotary_pos_emb_vision(q, k, cos, sin)` casts q and k to float32, builds
`rotate_half` by concatenation and computes `q * cos + rotate_half(q) * sin` in float32 before
rounding back: eleven elementwise kernels over float32 copies of q and k in each of the 4B's 24
vision blocks (about 70 ms of a 250 ms vision forward for 16 drawings on an H100,
2026-11-26, speedups/benchmarks/vision_forward.py). `rotary` reads q and k once (any strides: they are views of the qkv
projection's output) and writes both results, with the same float32 operations in the same order
(`x1 * cos1 + (-x2) * sin1`, `x2 * cos2 + x1 * sin2`, no fused multiply-add) and one rounding to the
input's dtype, so the results are the same numbers transformers computes.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
_BLOCK_S = 4  # rows per program: 4 x 16 heads x 32 pairs
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _rotate(src, s_s, s_h, s_d, dst, r3, h3, d3, mask, cos1, cos2, sin1, sin2, heads, HALF: tl.constexpr):
    """One of q / k: `x1 * cos1 + (-x2) * sin1` and `x2 * cos2 + x1 * sin2` into contiguous (seq, heads, 2 HALF)."""
    x1 = tl.load(src + r3 * s_s + h3 * s_h + d3 * s_d, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + r3 * s_s + h3 * s_h + (d3 + HALF) * s_d, mask=mask, other=0.0).to(tl.float32)
    out1 = x1 * cos1 + (-x2) * sin1
    out2 = x2 * cos2 + x1 * sin2
    out = dst + r3 * (heads * 2 * HALF) + h3 * (2 * HALF) + d3
    tl.store(out, out1.to(dst.dtype.element_ty), mask=mask)
    tl.store(out + HALF, out2.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr,
    seq, heads,
    q_s, q_h, q_d, k_s, k_h, k_d, c_s, c_d, n_s, n_d,
    HALF: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    rows = (tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)).to(tl.int64)  # row * stride may pass 2^31
    hs = tl.arange(0, BLOCK_H)
    ds = tl.arange(0, BLOCK_D)
    r3 = rows[:, None, None]
    h3 = hs[None, :, None]
    d3 = ds[None, None, :]
    mask = (r3 < seq) & (h3 < heads) & (d3 < HALF)
    r2 = rows[:, None]
    d2 = ds[None, :]
    cmask = (r2 < seq) & (d2 < HALF)
    cos1 = tl.load(cos_ptr + r2 * c_s + d2 * c_d, mask=cmask, other=0.0).to(tl.float32)[:, None, :]
    cos2 = tl.load(cos_ptr + r2 * c_s + (d2 + HALF) * c_d, mask=cmask, other=0.0).to(tl.float32)[:, None, :]
    sin1 = tl.load(sin_ptr + r2 * n_s + d2 * n_d, mask=cmask, other=0.0).to(tl.float32)[:, None, :]
    sin2 = tl.load(sin_ptr + r2 * n_s + (d2 + HALF) * n_d, mask=cmask, other=0.0).to(tl.float32)[:, None, :]
    _rotate(q_ptr, q_s, q_h, q_d, qo_ptr, r3, h3, d3, mask, cos1, cos2, sin1, sin2, heads, HALF)
    _rotate(k_ptr, k_s, k_h, k_d, ko_ptr, r3, h3, d3, mask, cos1, cos2, sin1, sin2, heads, HALF)


def usable(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """q, k: (seq, heads, dim) of one dtype, cos / sin: (seq, dim), dim even, on a GPU (or interpreting), no
    gradient wanted (the kernel has no backward: a frozen tower's q and k need none)."""
    tensors = (q, k, cos, sin)
    return (
        q.dim() == 3
        and k.shape == q.shape
        and q.dtype == k.dtype
        and q.dtype in _DTYPES
        and cos.dtype in _DTYPES
        and sin.dtype in _DTYPES
        and cos.shape == sin.shape == (q.shape[0], q.shape[2])
        and q.shape[2] % 2 == 0
        and all(t.device == q.device for t in tensors)
        and (q.is_cuda or (INTERPRETING and q.device.type == "cpu"))
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
    )


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q * cos + rotate_half(q) * sin, the same for k) in float32, each rounded once to q's dtype (contiguous)."""
    seq, heads, dim = q.shape
    q_out = torch.empty((seq, heads, dim), dtype=q.dtype, device=q.device)
    k_out = torch.empty_like(q_out)
    if seq == 0:
        return q_out, k_out
    half = dim // 2
    grid = (triton.cdiv(seq, _BLOCK_S),)
    _rotary_kernel[grid](
        q, k, cos, sin, q_out, k_out,
        seq, heads,
        *q.stride(), *k.stride(), *cos.stride(), *sin.stride(),
        HALF=half, BLOCK_S=_BLOCK_S,
        BLOCK_H=triton.next_power_of_2(heads), BLOCK_D=triton.next_power_of_2(half),
        **({} if INTERPRETING else {"enable_fp_fusion": False}),
    )  # fmt: skip
    return q_out, k_out
