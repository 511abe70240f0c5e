"""Two Triton kernels for the backward of a LoRA branch with dropout: the mask applied while reading.

With dropout, LoRA's backward over an input `x` (M rows of K features, its boolean dropout mask,
`keep = 1 / (1 - p)`, the rank-r gradient `gh = scaling * g B`) needs

- the input gradient `dx += keep * mask * (gh A)`: PyTorch writes `gh A` (a full-size product) and
  then runs a multiply-add with the mask, whose mixed-dtype (bf16 × bool) CUDA kernel is not
  vectorised (measured on an H100: 166 µs where a masked-scale kernel and an add take 60 + 59);
- A's gradient `dA = gh^T (keep * mask * x)`: PyTorch writes the dropped-out input again (a
  masked-scale kernel) for the matmul to read back.

`add_dropped_product` computes the rank-r product tile by tile in registers and adds it, masked
and scaled, into `dx` in place: one pass that reads `dx` and the mask and writes `dx`.
`dropped_weight_grad` reads `x` and the mask once and reduces over the rows in a fixed number of
row splits (each program one split and one column block; the splits are summed afterwards, so the
result does not depend on scheduling). Both accumulate in float32: they round once where PyTorch
rounds the full-size product to the compute dtype first.

Seeded masks (`Seeded`, `dropped_rank_product`): instead of a boolean mask kept per adapted layer
until the backward (1 byte per input element: 10.4 bytes per token × layer × hidden for the 4B's
seven layers), the forward draws a seed on the host and the kernels compute the mask from it
wherever they need it: `dropped_rank_product` computes `h = keep * (mask * x) A^T` in one pass over
`x`, and the two backward kernels compute the same mask again. Philox (4 × 32 bits per draw, the
generator PyTorch's CUDA dropout uses) with the counter `row * ceil(K / 8) + column // 8`: each
draw gives eight 16-bit numbers, one for each of 8 neighbouring columns, and an element is dropped
when its number is below `threshold = round(p * 65536)` (p rounded to 1 / 65536: 0.05 becomes
0.0500031; `keep` is computed from the rounded p, so the expectation stays exact). The mask depends on
the seed, the row and the column only, not on a kernel's tiles (every tile starts at a multiple of 8
columns), so the three kernels agree.

The rank-r operands are padded to 16 (the smallest dot Triton takes) by masked loads. Under
`TRITON_INTERPRET=1` (the CPU tests) the dots run in float32, since the interpreter's bf16 dot is
wrong; on a GPU they take the compute dtype (bf16 products are exact in float32 either way), float32
operands in full float32 (Triton's default would be TF32).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
# tiles measured on an H100 with speedups/benchmarks/lora_kernels.py (bf16, K = 2,560 / 4,096 / 9,728, M = 9,656;
# 2026-11-25, re-checked within 1 % on 2026-11-26; dx 54.7 µs against PyTorch's 140.3 at K 2,560): the best of five tile
# shapes for each kernel at every width
_DX_BLOCK_M, _DX_BLOCK_K = 64, 64
_DA_BLOCK_M, _DA_BLOCK_K = 64, 128
# programs wanted for the weight gradient's reduction (264, 528, 1,056 measured: 264 = two per multiprocessor)
_DA_PROGRAMS = 264


# with a seed the kernels compute the mask (Philox: integer work) instead of reading it, and want other tiles:
# measured on an H100 with speedups/benchmarks/lora_kernels.py at 19,312 rows (16 × 1,207 tokens: the planner's 16 × 1;
# 2026-11-26: the three seeded passes of a layer 2,619 -> 2,018 µs), the best summed over a decoder layer's
# widths (5 × 2,560, 4,096, 9,728)
# - the forward's `dropped_rank_product` (one program per BLOCK_M rows, a loop over the input's width)
_H_BLOCK_M, _H_BLOCK_K = 32, 128
# - the input gradient and A's gradient (its programs: more than with a stored mask, to hide Philox's latency)
_DXS_BLOCK_M, _DXS_BLOCK_K = 32, 128
_DAS_BLOCK_M, _DAS_BLOCK_K, _DAS_PROGRAMS = 32, 128, 1056
_SEED_BITS = 16  # each element's random number: 16 bits of a Philox draw, eight elements per draw


@triton.jit
def _kept(seed, rows, first_col, groups, threshold, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """Which elements of the tile (its `rows`, columns `first_col` + 0..BLOCK_K-1, `first_col` a multiple of 8)
    dropout keeps: 16 bits of the Philox draw `(seed, row * groups + column // 8)` per element."""
    draws = rows[:, None] * groups + (first_col // 8 + tl.arange(0, BLOCK_K // 8))[None, :]
    u0, u1, u2, u3 = tl.randint4x(seed, draws)
    v0 = tl.join(tl.join(u0 & 0xFFFF, u0 >> 16), tl.join(u1 & 0xFFFF, u1 >> 16))
    v1 = tl.join(tl.join(u2 & 0xFFFF, u2 >> 16), tl.join(u3 & 0xFFFF, u3 >> 16))
    numbers = tl.reshape(tl.join(v0, v1), (BLOCK_M, BLOCK_K))
    return numbers >= threshold


@triton.jit(do_not_specialize=["seed"])
def _dropped_rank_product_kernel(
    h_ptr, x_ptr, a_ptr, seed, M, K, R, groups, threshold, keep,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, RP: tl.constexpr, F32_DOT: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    ranks = tl.arange(0, RP)
    row_in, rank_in = rows < M, ranks < R
    acc = tl.zeros((BLOCK_M, RP), dtype=tl.float32)
    for first in range(0, K, BLOCK_K):
        cols = first + tl.arange(0, BLOCK_K)
        col_in = cols < K
        inside = row_in[:, None] & col_in[None, :]
        x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=inside, other=0.0)
        x = tl.where(_kept(seed, rows, first, groups, threshold, BLOCK_M, BLOCK_K), x, tl.zeros_like(x))
        a = tl.load(a_ptr + ranks[None, :] * K + cols[:, None], mask=col_in[:, None] & rank_in[None, :], other=0.0)
        if F32_DOT:
            x, a = x.to(tl.float32), a.to(tl.float32)
        acc += tl.dot(x, a, input_precision=PRECISION, out_dtype=tl.float32)
    out = h_ptr + rows[:, None] * R + ranks[None, :]
    tl.store(out, (acc * keep).to(h_ptr.dtype.element_ty), mask=row_in[:, None] & rank_in[None, :])


@triton.jit(do_not_specialize=["seed"])
def _kept_mask_kernel(mask_ptr, seed, M, K, groups, threshold, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    first = tl.program_id(1) * BLOCK_K
    cols = first + tl.arange(0, BLOCK_K)
    kept = _kept(seed, rows, first, groups, threshold, BLOCK_M, BLOCK_K)
    inside = (rows < M)[:, None] & (cols < K)[None, :]
    tl.store(mask_ptr + rows[:, None] * K + cols[None, :], kept.to(tl.int8), mask=inside)


@triton.jit(do_not_specialize=["seed"])
def _add_dropped_product_kernel(
    dx_ptr, gh_ptr, a_ptr, mask_ptr, M, K, R, keep, seed, groups, threshold,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, RP: tl.constexpr, F32_DOT: tl.constexpr, PRECISION: tl.constexpr,
    SEEDED: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    ranks = tl.arange(0, RP)
    row_in, col_in, rank_in = rows < M, cols < K, ranks < R
    gh = tl.load(gh_ptr + rows[:, None] * R + ranks[None, :], mask=row_in[:, None] & rank_in[None, :], other=0.0)
    a = tl.load(a_ptr + ranks[:, None] * K + cols[None, :], mask=rank_in[:, None] & col_in[None, :], other=0.0)
    if F32_DOT:
        gh, a = gh.to(tl.float32), a.to(tl.float32)
    product = tl.dot(gh, a, input_precision=PRECISION, out_dtype=tl.float32)
    at = rows[:, None] * K + cols[None, :]
    inside = row_in[:, None] & col_in[None, :]
    if SEEDED:
        kept = _kept(seed, rows, tl.program_id(1) * BLOCK_K, groups, threshold, BLOCK_M, BLOCK_K)
    else:
        kept = tl.load(mask_ptr + at, mask=inside, other=0) != 0
    dx = tl.load(dx_ptr + at, mask=inside, other=0.0).to(tl.float32)
    dx += tl.where(kept, product * keep, 0.0)
    tl.store(dx_ptr + at, dx.to(dx_ptr.dtype.element_ty), mask=inside)


@triton.jit(do_not_specialize=["seed"])
def _dropped_weight_grad_kernel(
    part_ptr, gh_ptr, x_ptr, mask_ptr, M, K, R, keep, rows_per_split, seed, groups, threshold,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, RP: tl.constexpr, F32_DOT: tl.constexpr, PRECISION: tl.constexpr,
    SEEDED: tl.constexpr,
):  # fmt: skip
    cols = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    split = tl.program_id(1)
    ranks = tl.arange(0, RP)
    col_in, rank_in = cols < K, ranks < R
    start = split.to(tl.int64) * rows_per_split
    stop = tl.minimum(start + rows_per_split, M)
    acc = tl.zeros((RP, BLOCK_K), dtype=tl.float32)
    for first in range(start, stop, BLOCK_M):
        rows = first + tl.arange(0, BLOCK_M)
        row_in = rows < stop
        gh = tl.load(gh_ptr + rows[:, None] * R + ranks[None, :], mask=row_in[:, None] & rank_in[None, :], other=0.0)
        at = rows[:, None] * K + cols[None, :]
        inside = row_in[:, None] & col_in[None, :]
        if SEEDED:
            kept = _kept(seed, rows, tl.program_id(0) * BLOCK_K, groups, threshold, BLOCK_M, BLOCK_K)
        else:
            kept = tl.load(mask_ptr + at, mask=inside, other=0) != 0
        x = tl.load(x_ptr + at, mask=inside, other=0.0)
        x = tl.where(kept, x, tl.zeros_like(x))
        if F32_DOT:
            gh, x = gh.to(tl.float32), x.to(tl.float32)
        acc += tl.dot(tl.trans(gh), x, input_precision=PRECISION, out_dtype=tl.float32)
    out = part_ptr + split.to(tl.int64) * RP * K + ranks[:, None] * K + cols[None, :]
    tl.store(out, acc * keep, mask=(ranks[:, None] < RP) & col_in[None, :])


def _precision(dtype: torch.dtype) -> str:
    """float32 operands multiply in full float32 ("ieee"), as torch's matmul does by default, not TF32."""
    return "ieee" if dtype == torch.float32 or INTERPRETING else "tf32"


def _rank_pad(r: int) -> int:
    return max(16, triton.next_power_of_2(r))


@dataclass(frozen=True)
class Seeded:
    """A dropout mask given by its Philox seed (see the module docstring): nothing kept per element."""

    seed: int
    threshold: int  # an element is dropped when its 16-bit number is below this

    @property
    def keep(self) -> float:
        """The scale of a kept element: 1 / (1 - p) for the p the threshold gives."""
        return float(1 << _SEED_BITS) / ((1 << _SEED_BITS) - self.threshold)


def seeded(p: float) -> Seeded:
    """A fresh mask for dropout probability `p`: its seed drawn from PyTorch's CPU generator (no wait for the GPU;
    `torch.manual_seed` reproduces it and gradient checkpointing's recomputation, which restores that generator,
    draws the same seed again)."""
    if not 0 < p < 1:
        raise ValueError(f"dropout probability {p} is not in (0, 1)")
    threshold = min(max(round(p * (1 << _SEED_BITS)), 1), (1 << _SEED_BITS) - 1)
    # at least 2**32: always a 64-bit kernel argument (one compiled kernel)
    return Seeded(int(torch.randint(1 << 32, 1 << 62, ()).item()), threshold)


def _groups(k: int) -> int:
    return triton.cdiv(k, 8)


def usable(*tensors: torch.Tensor) -> bool:
    """The kernels take these operands: contiguous, on a CUDA device (any device when interpreting)."""
    return all(t.is_contiguous() and (t.is_cuda or INTERPRETING) for t in tensors)


def _mask_args(mask: torch.Tensor | Seeded, k: int, dummy: torch.Tensor) -> tuple:
    """(mask tensor, seed, groups, threshold, SEEDED) for a kernel call."""
    if isinstance(mask, Seeded):
        return dummy, mask.seed, _groups(k), mask.threshold, True
    return mask, 1 << 32, _groups(k), 0, False


def dropped_rank_product(x: torch.Tensor, a: torch.Tensor, mask: Seeded) -> torch.Tensor:
    """`keep * (mask * x) @ a^T` (x: M × K; a: r × K; the mask given by its seed), in x's dtype: M × r."""
    (m, k), r = x.shape, a.shape[0]
    h = torch.empty((m, r), dtype=x.dtype, device=x.device)
    _dropped_rank_product_kernel[(triton.cdiv(m, _H_BLOCK_M),)](
        h, x, a, mask.seed, m, k, r, _groups(k), mask.threshold, mask.keep,
        BLOCK_M=_H_BLOCK_M, BLOCK_K=_H_BLOCK_K, RP=_rank_pad(r), F32_DOT=INTERPRETING, PRECISION=_precision(x.dtype),
    )  # fmt: skip
    return h


def kept_mask(shape: tuple[int, int], mask: Seeded, device: torch.device | str) -> torch.Tensor:
    """The boolean M × K mask a seed gives (the elements kept), written out: for checks and PyTorch's kernels."""
    m, k = shape
    out = torch.empty((m, k), dtype=torch.int8, device=device)
    grid = (triton.cdiv(m, _DX_BLOCK_M), triton.cdiv(k, _DX_BLOCK_K))
    _kept_mask_kernel[grid](out, mask.seed, m, k, _groups(k), mask.threshold, BLOCK_M=_DX_BLOCK_M, BLOCK_K=_DX_BLOCK_K)
    return out.bool()


def add_dropped_product(
    dx: torch.Tensor, gh: torch.Tensor, a: torch.Tensor, mask: torch.Tensor | Seeded, keep: float
) -> torch.Tensor:
    """`dx += keep * mask * (gh @ a)` in place (dx, mask: M × K; gh: M × r; a: r × K); returns dx."""
    (m, k), r = dx.shape, gh.shape[1]
    mask_t, seed, groups, threshold, is_seeded = _mask_args(mask, k, dx)
    block_m, block_k = (_DXS_BLOCK_M, _DXS_BLOCK_K) if is_seeded else (_DX_BLOCK_M, _DX_BLOCK_K)
    grid = (triton.cdiv(m, block_m), triton.cdiv(k, block_k))
    _add_dropped_product_kernel[grid](
        dx, gh, a, mask_t, m, k, r, float(keep), seed, groups, threshold,
        BLOCK_M=block_m, BLOCK_K=block_k, RP=_rank_pad(r), F32_DOT=INTERPRETING, PRECISION=_precision(gh.dtype),
        SEEDED=is_seeded,
    )  # fmt: skip
    return dx


def dropped_weight_grad(gh: torch.Tensor, x: torch.Tensor, mask: torch.Tensor | Seeded, keep: float) -> torch.Tensor:
    """`gh^T @ (keep * mask * x)` in float32 (gh: M × r; x, mask: M × K): A's gradient, r × K."""
    (m, k), r = x.shape, gh.shape[1]
    rp = _rank_pad(r)
    mask_t, seed, groups, threshold, is_seeded = _mask_args(mask, k, x)
    block_m, block_k, programs = (
        (_DAS_BLOCK_M, _DAS_BLOCK_K, _DAS_PROGRAMS) if is_seeded else (_DA_BLOCK_M, _DA_BLOCK_K, _DA_PROGRAMS)
    )
    col_blocks = triton.cdiv(k, block_k)
    row_blocks = max(1, triton.cdiv(m, block_m))
    splits = max(1, min(row_blocks, triton.cdiv(programs, col_blocks)))
    rows_per_split = triton.cdiv(row_blocks, splits) * block_m
    splits = triton.cdiv(m, rows_per_split) if m else 1
    part = torch.empty((splits, rp, k), dtype=torch.float32, device=x.device)
    _dropped_weight_grad_kernel[(col_blocks, splits)](
        part, gh, x, mask_t, m, k, r, float(keep), rows_per_split, seed, groups, threshold,
        BLOCK_M=block_m, BLOCK_K=block_k, RP=rp, F32_DOT=INTERPRETING, PRECISION=_precision(x.dtype),
        SEEDED=is_seeded,
    )  # fmt: skip
    return part.sum(0)[:r] if splits > 1 else part[0, :r]
