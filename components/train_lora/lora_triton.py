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

The rank-r operands are padded to 16 (the smallest dot Triton takes) by masked loads. Under
`TRITON_INTERPRET=1` (the CPU tests) the dots run in float32, since the interpreter's bf16 dot is
wrong; on a GPU they take the compute dtype (bf16 products are exact in float32 either way), float32
operands in full float32 (Triton's default would be TF32).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
# tiles measured on an H100 with benchmarks/lora_kernels.py (bf16, K = 2,560 / 4,096 / 9,728, M = 9,656; session 10
# in benchmarks/README.md): the best of five tile shapes for each kernel at every width
_DX_BLOCK_M, _DX_BLOCK_K = 64, 64
_DA_BLOCK_M, _DA_BLOCK_K = 64, 128
# programs wanted for the weight gradient's reduction (264, 528, 1,056 measured: 264 = two per multiprocessor)
_DA_PROGRAMS = 264


@triton.jit
def _add_dropped_product_kernel(
    dx_ptr, gh_ptr, a_ptr, mask_ptr, M, K, R, keep,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, RP: tl.constexpr, F32_DOT: tl.constexpr, PRECISION: tl.constexpr,
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
    kept = tl.load(mask_ptr + at, mask=inside, other=0) != 0
    dx = tl.load(dx_ptr + at, mask=inside, other=0.0).to(tl.float32)
    dx += tl.where(kept, product * keep, 0.0)
    tl.store(dx_ptr + at, dx.to(dx_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _dropped_weight_grad_kernel(
    part_ptr, gh_ptr, x_ptr, mask_ptr, M, K, R, keep, rows_per_split,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, RP: tl.constexpr, F32_DOT: tl.constexpr, PRECISION: tl.constexpr,
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


def usable(*tensors: torch.Tensor) -> bool:
    """The kernels take these operands: contiguous, on a CUDA device (any device when interpreting)."""
    return all(t.is_contiguous() and (t.is_cuda or INTERPRETING) for t in tensors)


def add_dropped_product(dx: torch.Tensor, gh: torch.Tensor, a: torch.Tensor, mask: torch.Tensor, keep: float):
    """`dx += keep * mask * (gh @ a)` in place (dx, mask: M × K; gh: M × r; a: r × K); returns dx."""
    (m, k), r = dx.shape, gh.shape[1]
    grid = (triton.cdiv(m, _DX_BLOCK_M), triton.cdiv(k, _DX_BLOCK_K))
    _add_dropped_product_kernel[grid](
        dx, gh, a, mask, m, k, r, float(keep),
        BLOCK_M=_DX_BLOCK_M, BLOCK_K=_DX_BLOCK_K, RP=_rank_pad(r), F32_DOT=INTERPRETING, PRECISION=_precision(gh.dtype),
    )  # fmt: skip
    return dx


def dropped_weight_grad(gh: torch.Tensor, x: torch.Tensor, mask: torch.Tensor, keep: float) -> torch.Tensor:
    """`gh^T @ (keep * mask * x)` in float32 (gh: M × r; x, mask: M × K): A's gradient, r × K."""
    (m, k), r = x.shape, gh.shape[1]
    rp = _rank_pad(r)
    col_blocks = triton.cdiv(k, _DA_BLOCK_K)
    row_blocks = max(1, triton.cdiv(m, _DA_BLOCK_M))
    splits = max(1, min(row_blocks, triton.cdiv(_DA_PROGRAMS, col_blocks)))
    rows_per_split = triton.cdiv(row_blocks, splits) * _DA_BLOCK_M
    splits = triton.cdiv(m, rows_per_split) if m else 1
    part = torch.empty((splits, rp, k), dtype=torch.float32, device=x.device)
    _dropped_weight_grad_kernel[(col_blocks, splits)](
        part, gh, x, mask, m, k, r, float(keep), rows_per_split,
        BLOCK_M=_DA_BLOCK_M, BLOCK_K=_DA_BLOCK_K, RP=rp, F32_DOT=INTERPRETING, PRECISION=_precision(x.dtype),
    )  # fmt: skip
    return part.sum(0)[:r] if splits > 1 else part[0, :r]
