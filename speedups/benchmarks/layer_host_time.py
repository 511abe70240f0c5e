"""Host time against GPU time of one Qwen3-VL-4B decoder layer with LoRA, per way of running LoRA.

A tuned training step leaves the GPU idle for part of its time (benchmarks/README.md): where the
host launches kernels more slowly than the GPU runs them, the step's time is the host's. This
measures one language-model decoder layer of the 4B architecture (random weights, bf16, LoRA r8 on
its seven projections with float32 adapters, Liger's RMSNorm / rotary / SiLU-multiply where Liger is
installed, sdpa, bf16 autocast as in training), forward and backward, three ways:

- `host_us`: a few tokens, so the GPU never waits for work: the wall time per iteration is what the
  host spends launching one layer's forward and backward;
- `wall_ms`: the tuned plan's micro-batch (8 rows x 1,207 tokens by default), iterations back to back
  with one synchronisation at the end: what a layer costs in training;
- `gpu_ms`: the same iterations' kernel time (CUDA events around each iteration's work, queued
  after a synchronisation so no host time is inside).

Variants: peft's own LoRA forward; the train-lora plugin's LoRA function (`lora_delta`); without
dropout its lean path (`lean_delta`: autograd's own nodes); with the seed's dropout 0.05; the frozen
layer without LoRA (`nolora`); `...norm`: with torch's fused RMSNorm in place of Liger's
(speedups/rms_norm.py); `group`: the lean path with q/k/v's and gate/up's rank-r products in one
matmul each; `functionapart`: the LoRA function after the frozen layer (not with it in one node,
`_LoraLinear`); `...copy`: that, with the LoRA product added out of place (a copy of the layer's output first);
`functiontorch`: the LoRA function with PyTorch's kernels for its dropout backward (not the plugin's Triton ones);
`functionnormold`: `functionnorm` with the adapters cast in every forward and LoRA's scaling as kernels of its own
(speedups/lora_switches.py: `CAST_CACHE`, `FOLD` off). `--cprofile` adds where the host time goes (cProfile, own time
per function and iteration); `--kernels` the GPU kernels of the full-size iteration by name (torch.profiler).

    python3 -m speedups.benchmarks.layer_host_time [--rows 8 --tokens 1207 --iters 30]

Prints one line per variant and a JSON summary (RESULT ...).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from benchmarks.qwen3_vl_4b import QWEN3_VL_4B_CONFIG

DEVICE = "cuda"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_layer(dropout: float, liger: bool, lora: bool = True, torch_norm: bool = False, group: bool = False):
    """One decoder layer of the 4B's language model with LoRA; returns (peft model, layer, rotary)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3VLTextConfig
    from transformers.models.qwen3_vl import modeling_qwen3_vl as mq

    if liger:
        from liger_kernel.transformers import apply_liger_kernel_to_qwen3_vl

        apply_liger_kernel_to_qwen3_vl(rope=True, rms_norm=True, fused_linear_cross_entropy=False)
    config = Qwen3VLTextConfig(**QWEN3_VL_4B_CONFIG["text_config"])
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    holder = torch.nn.Module()
    holder.layer = mq.Qwen3VLTextDecoderLayer(config, layer_idx=0)
    holder.rotary = mq.Qwen3VLTextRotaryEmbedding(config=config)
    holder = holder.to(DEVICE, torch.bfloat16)
    if liger:
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction

        from speedups.swiglu import fuse_silu_mul

        fuse_silu_mul(holder, LigerSiLUMulFunction.apply)
    if torch_norm:
        from speedups.rms_norm import use_torch_rms_norm

        use_torch_rms_norm(holder)
    if not lora:  # the frozen layer alone: its input still gets gradients
        holder.requires_grad_(False)
        return holder, holder.layer, holder.rotary
    model = get_peft_model(holder, LoraConfig(r=8, lora_alpha=32, lora_dropout=dropout, target_modules=TARGETS))
    for name, param in model.named_parameters():
        if "lora_" in name:
            param.data = param.data.float()
    if group:
        from speedups.lora_lean import group_shared_inputs

        group_shared_inputs(model)
    model.train()
    return model, holder.layer, holder.rotary


def _inputs(layer, rotary, rows: int, tokens: int):
    import torch

    hidden = layer.self_attn.config.hidden_size
    x = torch.randn(rows, tokens, hidden, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    position_ids = torch.arange(tokens, device=DEVICE).expand(3, rows, tokens)
    cos_sin = rotary(x, position_ids)
    return x, cos_sin


def _step(layer, x, cos_sin) -> None:
    import torch

    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        out = layer(x, attention_mask=None, position_embeddings=cos_sin)
    out = out[0] if isinstance(out, tuple) else out
    out.float().square().mean().backward()


def measure(layer, rotary, rows: int, tokens: int, iters: int) -> dict[str, float]:
    import torch

    small_x, small_cs = _inputs(layer, rotary, 1, 16)
    x, cos_sin = _inputs(layer, rotary, rows, tokens)
    for _ in range(3):
        _step(layer, small_x, small_cs)
        _step(layer, x, cos_sin)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters * 4):
        _step(layer, small_x, small_cs)
    torch.cuda.synchronize()
    host_us = (time.perf_counter() - t0) / (iters * 4) * 1e6
    t0 = time.perf_counter()
    for _ in range(iters):
        _step(layer, x, cos_sin)
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) / iters * 1e3
    gpu = 0.0
    for _ in range(iters):
        torch.cuda.synchronize()
        torch.cuda._sleep(50_000_000)  # the GPU busy until the host has queued the whole iteration
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        _step(layer, x, cos_sin)
        end.record()
        end.synchronize()
        gpu += begin.elapsed_time(end)
    layer.zero_grad(set_to_none=True)
    return {"host_us": host_us, "wall_ms": wall_ms, "gpu_ms": gpu / iters}


def host_profile(layer, rotary, iters: int, top: int = 30) -> list[dict[str, Any]]:
    """cProfile of the few-token loop (host only): the functions with the most own time per iteration."""
    import cProfile
    import pstats

    import torch

    small_x, small_cs = _inputs(layer, rotary, 1, 16)
    _step(layer, small_x, small_cs)
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(iters):
        _step(layer, small_x, small_cs)
    torch.cuda.synchronize()
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = []
    for (path, line, func), (_cc, calls, tottime, cumtime, _callers) in stats.stats.items():
        rows.append(
            {
                "where": f"{path.split('site-packages/')[-1]}:{line}({func})",
                "calls_per_iter": calls / iters,
                "own_us_per_iter": tottime / iters * 1e6,
                "cum_us_per_iter": cumtime / iters * 1e6,
            }
        )
    rows.sort(key=lambda r: -r["own_us_per_iter"])
    return rows[:top]


def kernel_profile(layer, rotary, rows: int, tokens: int, iters: int = 5, top: int = 25) -> dict[str, Any]:
    """GPU kernels of the full-size forward + backward (torch.profiler): time and launches per iteration, by name."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    x, cos_sin = _inputs(layer, rotary, rows, tokens)
    _step(layer, x, cos_sin)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            _step(layer, x, cos_sin)
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = {}
    for event in prof.key_averages():
        us = getattr(event, "self_device_time_total", None)
        if us is None:
            us = getattr(event, "self_cuda_time_total", 0.0)
        if "CUDA" in str(getattr(event, "device_type", "")) and us:
            total = kernels.setdefault(event.key, [0.0, 0.0])
            total[0] += us
            total[1] += event.count
    rows_out = [
        {"kernel": name, "us_per_iter": us / iters, "launches_per_iter": n / iters} for name, (us, n) in kernels.items()
    ]
    rows_out.sort(key=lambda r: -r["us_per_iter"])
    gemm = [r for r in rows_out if _is_gemm(r["kernel"])]
    layer.zero_grad(set_to_none=True)
    return {
        "kernel_us_per_iter": sum(r["us_per_iter"] for r in rows_out),
        "launches_per_iter": sum(r["launches_per_iter"] for r in rows_out),
        "gemm_us_per_iter": sum(r["us_per_iter"] for r in gemm),
        "gemm_launches_per_iter": sum(r["launches_per_iter"] for r in gemm),
        "top": rows_out[:top],
    }


def _is_gemm(name: str) -> bool:
    lowered = name.lower()
    return any(k in lowered for k in ("gemm", "cutlass", "sm90_xmma", "nvjet", "ampere_", "sm80_xmma"))


def _set_variant(variant: str) -> None:
    from peft.tuners.lora.layer import Linear

    from speedups import fused_lora, lora_switches

    original = getattr(Linear.forward, "_vlm_lora_original", Linear.forward)
    if variant == "peft":
        Linear.forward = original
        return

    def forward(self, x, *args, **kwargs):
        out = fused_lora.fused_forward(self, x, *args, **kwargs)
        return original(self, x, *args, **kwargs) if out is None else out

    forward._vlm_lora_original = original
    Linear.forward = forward
    lora_switches.LEAN = variant.startswith(("lean", "group"))
    lora_switches.GROUP = variant.startswith("group")
    lora_switches.INPLACE = not variant.endswith("copy")
    lora_switches.FUSED_BASE = not variant.endswith(("apart", "copy"))
    lora_switches.TRITON = not variant.endswith("torch")  # with dropout on a GPU: LoRA's backward by PyTorch's kernels
    # `...old`: the adapters cast in every forward and LoRA's scaling in kernels of its own (before the 2026-11-26
    # changes of benchmarks/ARCHIVE.md, "Fewer launches per LoRA layer")
    lora_switches.CAST_CACHE = lora_switches.FOLD = not variant.endswith("old")


VARIANTS = (
    ("peft", 0.0),
    ("function", 0.0),
    ("lean", 0.0),
    ("leannorm", 0.0),
    ("leancopy", 0.0),
    ("group", 0.0),
    ("peft", 0.05),
    ("function", 0.05),
    ("functionnorm", 0.05),
    ("functionapart", 0.05),
    ("functioncopy", 0.05),
    ("functiontorch", 0.05),
    ("functionnormold", 0.05),
    ("nolora", 0.0),
)


def _variant(parser: argparse.ArgumentParser, text: str) -> tuple[str, float]:
    """`name:dropout` from --variants, or a usage error naming what it takes."""
    name, _, dropout = text.partition(":")
    known = sorted({v for v, _ in VARIANTS})
    try:
        value = float(dropout)
    except ValueError:
        value = -1.0
    if name not in known or not 0.0 <= value < 1.0:
        parser.error(f"--variants: {text!r} is not name:dropout with a name in {known} and 0 <= dropout < 1")
    return name, value


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=1207)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--no-liger", action="store_true")
    parser.add_argument("--variants", default="", help="comma-separated variant:dropout pairs (default: all)")
    parser.add_argument("--cprofile", action="store_true", help="also print each variant's host-side cProfile")
    parser.add_argument("--kernels", action="store_true", help="also print each variant's GPU kernels (torch.profiler)")
    args = parser.parse_args(argv)
    import torch

    liger = not args.no_liger
    if liger:
        try:
            import liger_kernel  # noqa: F401
        except ImportError:
            liger = False
    results = []
    chosen = [_variant(parser, v) for v in args.variants.split(",") if v] or VARIANTS
    for variant, dropout in chosen:
        _set_variant(variant)
        model, layer, rotary = build_layer(
            dropout,
            liger,
            lora=variant != "nolora",
            torch_norm="norm" in variant,
            group=variant.startswith("group"),
        )
        row = {"variant": variant, "lora_dropout": dropout, "liger": liger}
        row.update(measure(layer, rotary, args.rows, args.tokens, args.iters))
        row["host_share_of_gpu"] = row["host_us"] / 1e3 / row["gpu_ms"]
        if args.cprofile:
            row["host_profile"] = host_profile(layer, rotary, args.iters)
            for r in row["host_profile"]:
                print(
                    f"    {r['own_us_per_iter']:8.0f} us own {r['cum_us_per_iter']:8.0f} cum "
                    f"{r['calls_per_iter']:6.0f} calls  {r['where'][:110]}"
                )
        if args.kernels:
            row["kernels"] = kernel_profile(layer, rotary, args.rows, args.tokens)
            k = row["kernels"]
            print(
                f"    kernels {k['kernel_us_per_iter']:8.0f} us in {k['launches_per_iter']:.0f} launches; "
                f"matmuls {k['gemm_us_per_iter']:8.0f} us in {k['gemm_launches_per_iter']:.0f}"
            )
            for r in k["top"]:
                print(f"    {r['us_per_iter']:8.0f} us {r['launches_per_iter']:5.0f} x  {r['kernel'][:120]}")
        results.append(row)
        print(
            f"{variant:9s} dropout {dropout:4.2f}  host {row['host_us']:7.0f} us  wall {row['wall_ms']:7.2f} ms  "
            f"gpu {row['gpu_ms']:7.2f} ms  host/gpu {row['host_share_of_gpu']:.2f}",
            flush=True,
        )
        del model, layer, rotary
        torch.cuda.empty_cache()
    from speedups.rms_norm import fused_op_on

    summary = {
        "device": torch.cuda.get_device_name(),
        "torch_rms_norm_fused": fused_op_on("cuda"),
        "rows": args.rows,
        "tokens": args.tokens,
        "results": results,
    }
    print("RESULT " + json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
