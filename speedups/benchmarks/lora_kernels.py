"""LoRA's backward with dropout on one GPU: PyTorch's kernels against the plugin's Triton kernels.

    python3 -m speedups.benchmarks.lora_kernels [--rows 9656] [--rank 8] [--tiles 64x128,128x64,...]

For each input width of a Qwen3-VL-4B decoder layer's adapted projections (2,560: q / k / v / gate / up;
4,096: o; 9,728: down) at the tuned micro-batch (8 rows × 1,207 tokens = 9,656 rows), bf16:

- the input gradient `dx += keep * mask * (gh @ A)`: PyTorch's `addcmul_` (what `_LoraLinear` runs
  without Triton), a masked-scale kernel then an in-place add, and `lora_triton.add_dropped_product`
  at each tile shape;
- A's gradient `gh^T @ (keep * mask * x)`: PyTorch's masked-scale kernel and a matmul, and
  `lora_triton.dropped_weight_grad` at each tile shape and programs count.

- with masks given by a seed (`lora_triton.Seeded`, the default since 2026-11-26, benchmarks/ARCHIVE.md, "16 rows
  per micro-step on an H100": no mask kept), at the default tiles: the forward's rank-r product
  `keep * (mask * x) @ A^T` against PyTorch's dropout kernel and a matmul (and a plain matmul without dropout), and
  both backward kernels computing the mask again;
- `--forward-tiles` / `--seeded-tiles`: the seeded forward, and the seeded input gradient and A's gradient,
  at each tile shape (`--seeded-programs`: programs wanted for the latter's row splits).

Each result is first checked against float32 arithmetic (relative error printed), then timed with
`triton.testing.do_bench` (median; inputs rotated over three sets so that the L2 cache holds none).
The bandwidth column counts the bytes a kernel must move at least (dx: read dx and mask, write dx;
A's gradient: read x and mask). Prints one line per measurement and `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

WIDTHS = (2560, 4096, 9728)
P = 0.05


def _sets(rows: int, width: int, rank: int, count: int = 3) -> list[dict[str, Any]]:
    import torch

    out = []
    for _ in range(count):
        out.append(
            {
                "dx": torch.randn(rows, width, device="cuda", dtype=torch.bfloat16),
                "x": torch.randn(rows, width, device="cuda", dtype=torch.bfloat16),
                "mask": torch.rand(rows, width, device="cuda") > P,
                "gh": torch.randn(rows, rank, device="cuda", dtype=torch.bfloat16),
                "a": torch.randn(rank, width, device="cuda", dtype=torch.bfloat16) / width**0.5,
            }
        )
    return out


def _rotating(sets, fn):
    state = {"i": 0}

    def call():
        state["i"] = (state["i"] + 1) % len(sets)
        fn(sets[state["i"]])

    return call


def _error(out, ref) -> float:
    return float((out.float() - ref).norm() / ref.norm())


def _check(lt, s, keep: float) -> dict[str, float]:
    import torch

    ref_dx = s["dx"].float() + keep * s["mask"].float() * (s["gh"].float() @ s["a"].float())
    dx = lt.add_dropped_product(s["dx"].clone(), s["gh"], s["a"], s["mask"], keep)
    ref_da = s["gh"].float().t() @ (keep * s["mask"].float() * s["x"].float())
    torch_da = s["gh"].t() @ torch.ops.aten.native_dropout_backward(s["x"], s["mask"], keep)
    return {
        "dx_error": _error(dx, ref_dx),
        "dx_torch_error": _error(s["dx"].clone().addcmul_(s["gh"] @ s["a"], s["mask"], value=keep), ref_dx),
        "da_error": _error(lt.dropped_weight_grad(s["gh"], s["x"], s["mask"], keep), ref_da),
        "da_torch_error": _error(torch_da, ref_da),
    }


def _time(fn) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=200, return_mode="median")) * 1e3  # µs


def measure_width(lt, rows: int, width: int, rank: int, tiles: list[tuple[int, int]], programs: list[int]):
    import torch

    keep = 1.0 / (1.0 - P)
    sets = _sets(rows, width, rank)
    row: dict[str, Any] = {"width": width, "rows": rows, **_check(lt, sets[0], keep)}
    dx_bytes, da_bytes = rows * width * 5, rows * width * 3
    timings = {
        "dx_torch_addcmul": _rotating(sets, lambda s: s["dx"].addcmul_(s["gh"] @ s["a"], s["mask"], value=keep)),
        "dx_torch_scale_add": _rotating(
            sets, lambda s: s["dx"].add_(torch.ops.aten.native_dropout_backward(s["gh"] @ s["a"], s["mask"], keep))
        ),
        "da_torch": _rotating(
            sets,
            lambda s: (s["gh"].t() @ torch.ops.aten.native_dropout_backward(s["x"], s["mask"], keep)).float(),
        ),
    }
    for name, fn in timings.items():
        row[name] = _time(fn)
    dx_fn = _rotating(sets, lambda s: lt.add_dropped_product(s["dx"], s["gh"], s["a"], s["mask"], keep))
    da_fn = _rotating(sets, lambda s: lt.dropped_weight_grad(s["gh"], s["x"], s["mask"], keep))
    for bm, bk in tiles:
        row[f"dx_triton_{bm}x{bk}"] = _timed_at(lt, {"_DX_BLOCK_M": bm, "_DX_BLOCK_K": bk}, dx_fn)
        for n in programs:
            row[f"da_triton_{bm}x{bk}_p{n}"] = _timed_at(
                lt, {"_DA_BLOCK_M": bm, "_DA_BLOCK_K": bk, "_DA_PROGRAMS": n}, da_fn
            )
    row["dx_min_bytes"], row["da_min_bytes"] = dx_bytes, da_bytes
    row.update(measure_seeded(lt, sets))
    return row, sets


def measure_seeded(lt, sets) -> dict[str, float]:
    """The three seeded kernels (each set its own seed) and PyTorch's forward, with their errors against float32."""
    import torch

    for s in sets:
        s["seed"] = lt.seeded(P)
    s = sets[0]
    kept = lt.kept_mask(tuple(s["x"].shape), s["seed"], "cuda").float()
    keep = s["seed"].keep
    ref_h = (keep * kept * s["x"].float()) @ s["a"].float().t()
    ref_dx = s["dx"].float() + keep * kept * (s["gh"].float() @ s["a"].float())
    ref_da = s["gh"].float().t() @ (keep * kept * s["x"].float())
    out = {
        "seeded_drop_rate": float(1 - kept.mean()),
        "h_seeded_error": _error(lt.dropped_rank_product(s["x"], s["a"], s["seed"]), ref_h),
        "dx_seeded_error": _error(lt.add_dropped_product(s["dx"].clone(), s["gh"], s["a"], s["seed"], keep), ref_dx),
        "da_seeded_error": _error(lt.dropped_weight_grad(s["gh"], s["x"], s["seed"], keep), ref_da),
    }
    timings = {
        "h_torch_plain": lambda s: s["x"] @ s["a"].t(),
        "h_torch_dropout": lambda s: torch.native_dropout(s["x"], P, True)[0] @ s["a"].t(),
        "h_seeded": lambda s: lt.dropped_rank_product(s["x"], s["a"], s["seed"]),
        "dx_seeded": lambda s: lt.add_dropped_product(s["dx"], s["gh"], s["a"], s["seed"], keep),
        "da_seeded": lambda s: lt.dropped_weight_grad(s["gh"], s["x"], s["seed"], keep),
    }
    for name, fn in timings.items():
        out[name] = _time(_rotating(sets, fn))
    return out


def _timed_at(lt, settings: dict[str, int], fn) -> float:
    """`fn` timed with `lora_triton`'s tile settings `settings` (names -> values), restored afterwards."""
    saved = {name: getattr(lt, name) for name in settings}
    try:
        for name, value in settings.items():
            setattr(lt, name, value)
        return _time(fn)
    finally:
        for name, value in saved.items():
            setattr(lt, name, value)


def measure_tiles(lt, sets, forward: list[tuple[int, int]], seeded: list[tuple[int, int]], programs: list[int]):
    """At each tile: the seeded forward (`h_seeded_MxK`), the seeded input gradient (`dx_seeded_MxK`) and A's
    gradient (`da_seeded_MxK_pN`, for each programs count)."""
    keep = sets[0]["seed"].keep
    h_fn = _rotating(sets, lambda s: lt.dropped_rank_product(s["x"], s["a"], s["seed"]))
    dx_fn = _rotating(sets, lambda s: lt.add_dropped_product(s["dx"], s["gh"], s["a"], s["seed"], keep))
    da_fn = _rotating(sets, lambda s: lt.dropped_weight_grad(s["gh"], s["x"], s["seed"], keep))
    out: dict[str, float] = {}
    for bm, bk in forward:
        out[f"h_seeded_{bm}x{bk}"] = _timed_at(lt, {"_H_BLOCK_M": bm, "_H_BLOCK_K": bk}, h_fn)
    for bm, bk in seeded:
        out[f"dx_seeded_{bm}x{bk}"] = _timed_at(lt, {"_DXS_BLOCK_M": bm, "_DXS_BLOCK_K": bk}, dx_fn)
        for n in programs:
            out[f"da_seeded_{bm}x{bk}_p{n}"] = _timed_at(
                lt, {"_DAS_BLOCK_M": bm, "_DAS_BLOCK_K": bk, "_DAS_PROGRAMS": n}, da_fn
            )
    return out


def _tiles(text: str) -> list[tuple[int, int]]:
    """`64x128,32x256` -> [(64, 128), (32, 256)]; ValueError naming the part that is not two powers of two."""
    out = []
    for part in text.split(","):
        m, _, k = part.partition("x")
        if not (m.isdigit() and k.isdigit() and _power_of_two(int(m)) and _power_of_two(int(k))):
            raise ValueError(f"{part!r} is not ROWSxCOLS with two powers of two (e.g. 64x128)")
        out.append((int(m), int(k)))
    return out


def _power_of_two(n: int) -> bool:
    return n >= 16 and n & (n - 1) == 0


def _programs(text: str) -> list[int]:
    """`264,528` -> [264, 528]; ValueError naming the part that is not a positive whole number."""
    out = []
    for part in text.split(","):
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"{part!r} is not a positive whole number")
        out.append(int(part))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=9656)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--tiles", default="64x128,128x64,64x64,128x128,32x256")
    parser.add_argument("--programs", default="264,528,1056")
    parser.add_argument("--forward-tiles", default="", help="e.g. 32x128,64x64 (none by default)")
    parser.add_argument("--seeded-tiles", default="", help="e.g. 32x128,64x64 (none by default)")
    parser.add_argument("--seeded-programs", default="1056")
    args = parser.parse_args(argv)
    try:
        tiles, programs = _tiles(args.tiles), _programs(args.programs)
        forward = _tiles(args.forward_tiles) if args.forward_tiles else []
        seeded = _tiles(args.seeded_tiles) if args.seeded_tiles else []
        seeded_programs = _programs(args.seeded_programs)
    except ValueError as err:
        parser.error(f"--tiles / --programs / --forward-tiles / --seeded-tiles / --seeded-programs: {err}")
    if args.rows < 1 or args.rank < 1:
        parser.error(f"--rows {args.rows} / --rank {args.rank}: both must be at least 1")
    import torch

    from speedups import lora_triton as lt

    if not torch.cuda.is_available():
        raise SystemExit("lora_kernels: needs a CUDA GPU")
    rows = []
    for width in WIDTHS:
        row, sets = measure_width(lt, args.rows, width, args.rank, tiles, programs)
        row.update(measure_tiles(lt, sets, forward, seeded, seeded_programs))
        del sets
        rows.append(row)
        for name, value in row.items():
            if name.startswith(("dx_t", "da_t", "dx_s", "da_s", "h_")) and not name.endswith("error"):
                moved = row["dx_min_bytes"] if name.startswith("dx") else row["da_min_bytes"]
                if name.startswith(("h_", "dx_s", "da_s")):  # no mask read: x (h, A's gradient) or dx twice
                    moved = moved * 4 // 5 if name.startswith("dx") else moved * 2 // 3
                print(f"width {width:5d}  {name:28s} {value:8.1f} us  {moved / value / 1e3:7.0f} GB/s", flush=True)
        errors = {k: f"{v:.2e}" for k, v in row.items() if k.endswith("error")}
        print(f"width {width:5d}  errors against float32: {errors}", flush=True)
    result = {"device": torch.cuda.get_device_name(), "rank": args.rank, "rows": rows}
    print("RESULT " + json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
