"""The frozen vision tower's forward of one micro-step, by way of running it (speedups/vision_tower.py).

The 4B's vision tower (random bf16 weights, sdpa, bf16 autocast as in training, the train-lora plugin's host
sequence boundaries) over `--images` drawings of `--size`² pixels (16 × 1024² = the planner's H100 micro-step):

- `stock`: transformers' forward (the patch embedding's Conv3d, one sdpa call per image in every block);
- `liger`: stock with Liger's vision rotary (`liger_rotary_pos_emb_vision`), which transformers puts in place when
  training starts with `use_liger_kernel` (float32 copies of q and k, Liger's rope kernel, copies back);
- `linear`: the patch embedding as one matmul (`linear_patch_embed`);
- `rotary`: the rotary embedding as one Triton kernel (`fused_rotary`);
- `lnorm`: the LayerNorms in bf16 with autocast off (`bf16_layer_norms`);
- `fast`: all three (what the plugin installs);
- `compiled` (with `--compile`): stock with each block under `torch.compile`, for reference.

Prints per variant the forward's GPU time (CUDA events, median of `--iters`), TFLOP/s of the tower's FLOPs,
the peak memory, the largest difference of the tower's outputs (merged tokens and deepstack features) from
`stock` relative to their scale (and whether they are bit-equal), and with `--kernels` the GPU kernels by name (torch.profiler).

    python3 -m speedups.benchmarks.vision_forward [--images 16 --size 1024 --iters 20 --kernels --compile]
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from benchmarks.qwen3_vl_4b import QWEN3_VL_4B_CONFIG
from benchmarks.throughput import ArchShape

DEVICE = "cuda"
TRANSFORMERS_ROTARY = None  # transformers' own apply_rotary_pos_emb_vision, put back before each variant
VARIANTS = ("stock", "liger", "linear", "rotary", "lnorm", "fast", "compiled")


def build_tower():
    import torch
    from transformers import Qwen3VLVisionConfig
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    config = Qwen3VLVisionConfig(**QWEN3_VL_4B_CONFIG["vision_config"])
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    tower = modeling_qwen3_vl.Qwen3VLVisionModel(config).to(DEVICE, torch.bfloat16)
    tower.requires_grad_(False)
    tower.train()  # as in training (the tower has no dropout)
    return tower, config


def install_host_seqlens() -> None:
    from transformers import vision_utils
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    from speedups import vision_seqlens

    vision_seqlens.install([vision_utils, modeling_qwen3_vl])


def inputs(config, images: int, size: int):
    import torch

    side = size // config.patch_size
    grid = torch.tensor([[1, side, side]] * images, device=DEVICE)
    patch = config.in_channels * config.temporal_patch_size * config.patch_size**2
    pixels = torch.randn(images * side * side, patch, device=DEVICE, dtype=torch.bfloat16)
    return pixels, grid


def forward(tower, pixels, grid):
    import torch

    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        out = tower(pixels, grid_thw=grid)
    return [out.pooler_output, *out.deepstack_features]


def vision_flops(images: int, size: int) -> float:
    arch = ArchShape.from_config(QWEN3_VL_4B_CONFIG)
    patches = (size // 16) ** 2
    per_image = (
        2.0 * arch.vit_depth * arch.vit_block_params() * patches
        + 4.0 * arch.vit_depth * arch.vit_hidden * patches**2
        + 2.0 * arch.vit_patch_in * arch.vit_hidden * patches
        + 2.0 * (1 + arch.deepstack) * arch.merger_params() * patches / arch.merge**2
    )
    return per_image * images


def time_forward(tower, pixels, grid, iters: int) -> list[float]:
    import torch

    for _ in range(3):
        forward(tower, pixels, grid)
    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        forward(tower, pixels, grid)
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return times


def kernels(tower, pixels, grid, top: int = 15) -> list[dict[str, Any]]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    forward(tower, pixels, grid)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        forward(tower, pixels, grid)
        torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        us = getattr(event, "self_device_time_total", 0.0) or 0.0
        if us and "CUDA" in str(getattr(event, "device_type", "")):
            rows.append({"kernel": event.key[:110], "ms": round(us / 1e3, 3), "launches": event.count})
    rows.sort(key=lambda r: -r["ms"])
    return rows[:top]


def relative_difference(outs, reference) -> float:
    return max(float((o.float() - r.float()).abs().max() / r.float().abs().max()) for o, r in zip(outs, reference))


def _transformers_rotary():
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    return modeling_qwen3_vl.apply_rotary_pos_emb_vision


def apply_variant(tower, name: str) -> dict[str, int]:
    """The variant's changes on a fresh tower (`fast`: all of them, as the train-lora plugin installs them)."""
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    from speedups import vision_tower, vision_triton

    modeling_qwen3_vl.apply_rotary_pos_emb_vision = TRANSFORMERS_ROTARY  # not an earlier variant's
    if name == "liger":
        from liger_kernel.transformers.rope import liger_rotary_pos_emb_vision

        modeling_qwen3_vl.apply_rotary_pos_emb_vision = liger_rotary_pos_emb_vision
        return {"liger_rotary": 1}
    if name == "fast":
        return vision_tower.install(tower, [modeling_qwen3_vl], vision_triton)
    counts = {}
    if name == "linear":
        counts["patch_embed"] = vision_tower.linear_patch_embed(tower)
    if name == "rotary":
        counts["rotary"] = vision_tower.install_fused_rotary([modeling_qwen3_vl], vision_triton)
    if name == "lnorm":
        counts["layer_norm"] = vision_tower.bf16_layer_norms(tower)
    if name == "compiled":
        for block in tower.blocks:
            block.compile()
        counts["compiled"] = len(tower.blocks)
    return counts


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--variants", default="stock,liger,linear,rotary,lnorm,fast")
    parser.add_argument("--kernels", action="store_true")
    parser.add_argument("--compile", action="store_true", help="add the compiled-blocks reference")
    args = parser.parse_args(argv)
    import torch

    variants = args.variants.split(",") + (["compiled"] if args.compile else [])
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    if args.images < 1 or args.size < 32 or args.size % 32 or args.iters < 1:
        parser.error("--images and --iters at least 1, --size a multiple of 32 (two merged 16-pixel patches)")
    if not torch.cuda.is_available():
        raise SystemExit("vision_forward: needs a CUDA GPU")
    install_host_seqlens()
    global TRANSFORMERS_ROTARY
    TRANSFORMERS_ROTARY = _transformers_rotary()
    flops = vision_flops(args.images, args.size)
    results: dict[str, Any] = {"images": args.images, "size": args.size, "tflop": flops / 1e12, "variants": {}}
    reference = None
    for name in variants:
        tower, config = build_tower()  # the same seed: the same weights for every variant
        counts = apply_variant(tower, name)
        pixels, grid = inputs(config, args.images, args.size)
        torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            outs = forward(tower, pixels, grid)
        if reference is None:
            reference = [o.clone() for o in outs]
        times = time_forward(tower, pixels, grid, args.iters)
        ms = statistics.median(times)
        row = {
            "counts": counts,
            "median_ms": round(ms, 3),
            "min_ms": round(min(times), 3),
            "tflops": round(flops / ms / 1e9, 1),
            "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
            "rel_diff_vs_stock": relative_difference(outs, reference),
            "equal_to_stock": all(bool(o.equal(r)) for o, r in zip(outs, reference)),
        }
        if args.kernels:
            row["kernels"] = kernels(tower, pixels, grid)
        results["variants"][name] = row
        print(f"{name}: {json.dumps({k: v for k, v in row.items() if k != 'kernels'})}", flush=True)
        for k in row.get("kernels", []):
            print(f"    {k['ms']:8.3f} ms {k['launches']:5d}x  {k['kernel']}", flush=True)
        del tower, outs
        torch.cuda.empty_cache()
    print("RESULT " + json.dumps({k: v for k, v in results.items() if k != "variants"}), flush=True)
    return results


if __name__ == "__main__":
    main()
