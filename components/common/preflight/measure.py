"""The measurements (torch, imported by the caller): matmul TFLOP/s, all-reduce bus bandwidth, one DDP step.

Part of the preflight (`components.common.preflight`, its docstring says what it checks and why).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from components.common.preflight.checks import busbw_gbps
from components.common.preflight.options import Options
from components.common.preflight.rendezvous import _Identity

# --- measurements (torch) ---------------------------------------------------------------------


def _sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _matmul_tflops(torch: Any, device: Any, n: int, budget_s: float) -> float:
    """TFLOP/s of an n×n×n matmul (bf16 on GPU, fp32 on CPU), timed for about `budget_s` seconds."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    a @ b
    _sync(torch, device)
    t0 = time.perf_counter()
    a @ b
    _sync(torch, device)
    one = max(time.perf_counter() - t0, 1e-7)
    for _ in range(min(50, int(0.2 / one))):  # warm up: clocks ramp, cuBLAS picks its kernel
        a @ b
    _sync(torch, device)
    iters = max(3, min(500, int(budget_s / one)))
    t0 = time.perf_counter()
    for _ in range(iters):
        a @ b
    _sync(torch, device)
    return 2 * n**3 * iters / (time.perf_counter() - t0) / 1e12


def _gpu_entry(torch: Any, me: _Identity, index: int, opts: Options) -> dict[str, Any]:
    """Free memory and matmul TFLOP/s of one GPU (or of the CPU)."""
    entry: dict[str, Any] = {
        "rank": me.rank,
        "node_rank": me.node_rank,
        "local_rank": me.local_rank,
        "hostname": me.hostname,
        "gpu_index": index,
        "device": opts.device,
    }
    if opts.device == "cpu":
        device = torch.device("cpu")
        entry.update(gpu_name="cpu", gpus_visible=0, free_bytes=0, total_bytes=0)
    else:
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
        props = torch.cuda.get_device_properties(device)
        free, total = torch.cuda.mem_get_info(device)
        entry.update(
            gpu_name=torch.cuda.get_device_name(device),
            uuid=str(getattr(props, "uuid", "")),
            gpus_visible=torch.cuda.device_count(),
            free_bytes=int(free),
            total_bytes=int(total),
        )
    n = opts.matmul_n or (8192 if opts.device == "cuda" else 256)
    entry.update(matmul_n=n, tflops=round(_matmul_tflops(torch, device, n, opts.budget_s), 4))
    return entry


def _allreduce_figures(torch: Any, dist: Any, device: Any, sizes_mb: Sequence[float], group: Any, budget_s: float):
    """Times all-reduces of float32 tensors of each size in `group`; returns (sizes, correct)."""
    n = dist.get_world_size(group)
    out, correct = [], True

    def group_max(value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64 if device.type == "cpu" else torch.float32, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return float(t.item())

    for mb in sizes_mb:
        numel = max(1, int(mb * 2**20) // 4)
        x = torch.ones(numel, dtype=torch.float32, device=device)
        dist.all_reduce(x, group=group)
        _sync(torch, device)
        correct = correct and float(x[0].item()) == n and float(x[-1].item()) == n
        t0 = time.perf_counter()
        dist.all_reduce(x, group=group)
        _sync(torch, device)
        iters = max(1, min(20, int(budget_s / max(group_max(time.perf_counter() - t0), 1e-7))))
        group_max(0.0)  # line the ranks up
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x, group=group)
        _sync(torch, device)
        per = group_max(time.perf_counter() - t0) / iters
        algbw = numel * 4 / per / 1e9
        out.append({"mb": mb, "seconds": per, "algbw_gbps": algbw, "busbw_gbps": busbw_gbps(algbw, n)})
        del x
    return out, correct


def _link_figures(torch: Any, dist: Any, device: Any, me: _Identity, gpus: list[dict], opts: Options) -> list[dict]:
    """The all-reduce figures of each link: each node's GPUs (several nodes) and all ranks."""
    nodes = sorted({int(g["node_rank"]) for g in gpus})
    kind = "inter-node" if len(nodes) > 1 else "intra-node"
    links = []
    if len(nodes) > 1:
        groups = {k: sorted(int(g["rank"]) for g in gpus if int(g["node_rank"]) == k) for k in nodes}
        handles = {k: dist.new_group(ranks) for k, ranks in groups.items()}  # every rank creates every group
        mine = None
        if len(groups[me.node_rank]) > 1:
            sizes, ok = _allreduce_figures(
                torch, dist, device, opts.sizes_mb[-1:], handles[me.node_rank], opts.budget_s
            )
            mine = {"kind": "intra-node", "node_rank": me.node_rank, "ranks": len(groups[me.node_rank])}
            mine.update(device=opts.device, correct=ok, sizes=sizes)
        per_node: list[Any] = [None] * me.world
        dist.all_gather_object(per_node, mine if me.local_rank == 0 else None)
        links += [link for link in per_node if link]
    sizes, ok = _allreduce_figures(torch, dist, device, opts.sizes_mb, None, opts.budget_s)
    links.append(
        {"kind": kind, "node_rank": nodes[0], "ranks": me.world, "device": opts.device, "correct": ok, "sizes": sizes}
    )
    return links


def _ddp_figures(torch: Any, dist: Any, device: Any, me: _Identity) -> dict[str, Any]:
    """One DDP step of a tiny model: its gradients against rank 0's and the mean of the local ones."""
    from torch.nn.parallel import DistributedDataParallel

    t0 = time.perf_counter()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)).to(device)
    gen = torch.Generator().manual_seed(1000 + me.rank)  # different data on each rank
    x, y = torch.randn(16, 64, generator=gen).to(device), torch.randn(16, 1, generator=gen).to(device)
    torch.nn.functional.mse_loss(model(x), y).backward()
    local = torch.cat([p.grad.flatten() for p in model.parameters()])
    mean = local.clone()
    dist.all_reduce(mean)
    mean /= me.world
    model.zero_grad(set_to_none=True)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    loss.backward()
    synced = torch.cat([p.grad.flatten() for p in model.parameters()])
    ref = synced.clone()
    dist.broadcast(ref, 0)
    largest = float(mean.abs().max().item())
    scale = largest or 1.0
    diff = torch.stack([(synced - ref).abs().max(), (synced - mean).abs().max()]).max().reshape(1) / scale
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    _sync(torch, device)
    return {
        "max_grad_diff": float(diff.item()),
        "grads_nonzero": largest > 0 and bool(synced.abs().sum().item() > 0),
        "loss": float(loss.item()),
        "seconds": time.perf_counter() - t0,
    }
