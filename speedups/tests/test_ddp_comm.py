"""DDP's communication for LoRA (speedups/ddp_comm.py, plugin item 14).

The bucket size is checked where it matters: two real processes (gloo on the CPU) run DDP with the
settings and DDP's own logging data says how many buckets it reduced, and where the gradients lie; the plugin
is checked to set the values on the DDP arguments transformers' Trainer builds for accelerate.
"""

from __future__ import annotations

import math
import socket
import types

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from speedups import ddp_comm


class Adapted(torch.nn.Module):
    """A frozen base with float32 "adapters" of about 30 MiB, a non-persistent buffer like a rotary table."""

    def __init__(self, bn: bool = False) -> None:
        super().__init__()
        self.base = torch.nn.Linear(64, 64)
        self.base.requires_grad_(False)
        self.a = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(1024, 1024) * 0.01) for _ in range(8)])
        self.register_buffer("inv_freq", torch.arange(4.0), persistent=False)
        self.norm = torch.nn.BatchNorm1d(64) if bn else None

    def forward(self, x):
        h = self.base(x[:, :64])
        if self.norm is not None:
            h = self.norm(h)
        y = x
        for p in self.a:
            y = y @ p
        return y.sum() + h.sum() * self.inv_freq.sum()


def test_trainable_grad_bytes_counts_trainable_parameters_in_their_dtype():
    model = Adapted()
    assert ddp_comm.trainable_grad_bytes(model) == 8 * 1024 * 1024 * 4
    model.a[0].data = model.a[0].data.to(torch.bfloat16)
    assert ddp_comm.trainable_grad_bytes(model) == 7 * 1024 * 1024 * 4 + 1024 * 1024 * 2


def test_persistent_buffers_names_state_dict_buffers_only():
    assert ddp_comm.persistent_buffers(Adapted()) == []
    kept = ddp_comm.persistent_buffers(Adapted(bn=True))
    assert kept == ["norm.running_mean", "norm.running_var", "norm.num_batches_tracked"]


def test_settings_one_bucket_and_no_broadcast_for_derived_buffers():
    settings, lines = ddp_comm.ddp_settings(
        Adapted(), world_size=2, deepspeed=None, bucket_cap_mb=None, broadcast_buffers=None
    )
    assert settings == {"bucket_cap_mb": 33, "broadcast_buffers": False, "gradient_as_bucket_view": True}
    assert "32.0 MiB of trainable gradients in one bucket" in lines[0] and "ddp_bucket_cap_mb 33" in lines[0]
    assert "ddp_broadcast_buffers false" in lines[1]
    assert "views of its all-reduce bucket" in lines[2]


def test_settings_keep_config_values_and_broadcast_real_statistics():
    settings, lines = ddp_comm.ddp_settings(
        Adapted(bn=True), world_size=2, deepspeed=None, bucket_cap_mb=25, broadcast_buffers=None
    )
    # the config's bucket; BatchNorm's statistics keep the broadcast
    assert settings == {"gradient_as_bucket_view": True} and len(lines) == 1
    settings, _ = ddp_comm.ddp_settings(
        Adapted(), world_size=2, deepspeed=None, bucket_cap_mb=None, broadcast_buffers=True, bucket_view=False
    )
    assert settings == {"bucket_cap_mb": 33}


@pytest.mark.parametrize("world_size, deepspeed", [(1, None), (2, "zero2"), (2, "/x/zero3.json")])
def test_settings_only_for_ddp(world_size, deepspeed):
    assert ddp_comm.ddp_settings(
        Adapted(), world_size=world_size, deepspeed=deepspeed, bucket_cap_mb=None, broadcast_buffers=None
    ) == ({}, [])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, port: int, kwargs: dict, out) -> None:
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model = Adapted()
        ddp = torch.nn.parallel.DistributedDataParallel(model, **kwargs)
        torch.manual_seed(1 + rank)  # each rank its own rows
        for _ in range(3):  # DDP rebuilds its buckets by gradient order after the first iteration
            ddp.zero_grad()
            ddp(torch.randn(2, 1024)).backward()
        data = ddp._get_ddp_logging_data()
        # with the bucket view every gradient lies in one flat buffer (the bucket): one storage for all of them
        storages = {p.grad.untyped_storage().data_ptr() for p in model.a}
        out.put((rank, data.get("num_buckets_reduced"), float(model.a[0].grad.double().sum()), len(storages)))
    finally:
        dist.destroy_process_group()


def _run(kwargs: dict) -> list[tuple]:
    """Each rank's (rank, buckets reduced, reduced gradient sum, gradient storages) of a real two-process DDP run."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_ddp_worker, args=(r, port, kwargs, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


def _buckets(kwargs: dict) -> tuple[set, set]:
    results = _run(kwargs)
    return {r[1] for r in results}, {r[2] for r in results}


def _storages(kwargs: dict) -> tuple[set, set]:
    """(gradient storages per rank, reduced gradient sums) of a real two-process DDP run with `kwargs`."""
    results = _run(kwargs)
    return {r[3] for r in results}, {r[2] for r in results}


def test_real_ddp_reduces_the_adapters_in_one_bucket():
    settings, _ = ddp_comm.ddp_settings(
        Adapted(), world_size=2, deepspeed=None, bucket_cap_mb=None, broadcast_buffers=None
    )
    kwargs = {"bucket_cap_mb": settings["bucket_cap_mb"], "broadcast_buffers": settings["broadcast_buffers"]}
    buckets, grads = _buckets(kwargs)
    assert buckets == {1}
    assert len(grads) == 1  # both ranks hold the same reduced gradient
    default_buckets, default_grads = _buckets({})  # transformers' default, 25 MB: more than one
    assert min(default_buckets) > 1
    assert math.isclose(next(iter(grads)), next(iter(default_grads)), rel_tol=1e-9)


def test_apply_sets_the_settings_on_ddp_handlers_only():
    from accelerate.utils import DistributedDataParallelKwargs, GradScalerKwargs

    ddp, scaler = DistributedDataParallelKwargs(static_graph=True), GradScalerKwargs()
    settings = {"bucket_cap_mb": 33, "broadcast_buffers": False, "gradient_as_bucket_view": True}
    assert ddp_comm.apply([scaler, ddp], settings) == 1
    assert ddp.to_kwargs() == {**settings, "static_graph": True}  # what transformers set stays
    assert ddp_comm.apply([DistributedDataParallelKwargs()], {}) == 0


def test_real_ddp_with_bucket_view_keeps_gradients_in_the_bucket_and_equal():
    kwargs = {"bucket_cap_mb": 40, "broadcast_buffers": False}
    viewed, grads = _storages({**kwargs, "gradient_as_bucket_view": True})
    copied, copied_grads = _storages(kwargs)
    assert viewed == {1}  # all 8 adapters' gradients in the one bucket, on both ranks
    assert copied == {8}  # without it each gradient has its own memory
    assert len(grads) == 1 and math.isclose(next(iter(grads)), next(iter(copied_grads)), rel_tol=1e-9)


def _built(tmp_path, environ: dict, **training_args):
    """accelerate's DDP arguments that transformers' Trainer builds, through the plugin's wrapper, and the log."""
    from transformers import Trainer, TrainingArguments

    from speedups import swift_plugin  # noqa: F401 (installs its wrappers)

    assert getattr(Trainer._build_accelerator_args, "_vlm_lora_ddp_comm", False)  # installed on import
    plain = Trainer._build_accelerator_args.__wrapped__
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", **training_args)
    build = ddp_comm.with_ddp_comm(plain, environ=environ)
    handler = build(types.SimpleNamespace(args=args, model=Adapted()))["kwargs_handlers"][0]
    return {k: getattr(handler, k) for k in ("bucket_cap_mb", "broadcast_buffers", "gradient_as_bucket_view")}


def test_plugin_sets_the_ddp_arguments_transformers_builds(tmp_path, capsys):
    built = _built(tmp_path, {"WORLD_SIZE": "2"})
    assert built["bucket_cap_mb"] == 33 and built["broadcast_buffers"] is False
    assert built["gradient_as_bucket_view"] is True
    out = capsys.readouterr().out
    assert "in one bucket" in out and "does not broadcast buffers" in out and "views of its all-reduce bucket" in out


@pytest.mark.parametrize(
    "environ", [{"WORLD_SIZE": "2", "VLM_LORA_DDP_COMM": "0"}, {"WORLD_SIZE": "1"}, {}], ids=["off", "one", "unset"]
)
def test_plugin_switch_off_and_single_process_leave_the_arguments(tmp_path, capsys, environ):
    built = _built(tmp_path, environ)  # accelerate's defaults
    assert built == {"bucket_cap_mb": 25, "broadcast_buffers": True, "gradient_as_bucket_view": False}
    assert "train-lora plugin" not in capsys.readouterr().out


def test_plugin_keeps_the_configs_values_and_the_view_switch(tmp_path):
    built = _built(tmp_path, {"WORLD_SIZE": "2"}, ddp_bucket_cap_mb=10, ddp_broadcast_buffers=True)
    assert built["bucket_cap_mb"] == 10 and built["broadcast_buffers"] is True and built["gradient_as_bucket_view"]
    built = _built(tmp_path, {"WORLD_SIZE": "2", "VLM_LORA_DDP_BUCKET_VIEW": "0"})
    assert built["bucket_cap_mb"] == 33 and built["gradient_as_bucket_view"] is False


class _WithLoss(Adapted):
    """`Adapted` as a Trainer model: a dict with the loss."""

    def forward(self, x, labels=None):
        return {"loss": super().forward(x) / 1e3}


def _trainer_worker(rank: int, port: int, out_dir: str, environ: dict, out) -> None:
    import os

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", **environ
    )
    from transformers import Trainer, TrainingArguments

    from speedups import swift_plugin as plugin  # installs its wrappers, as `swift sft` loads it

    assert plugin.CONTEXT.loaded[14].state == ("skipped" if environ.get("VLM_LORA_DDP_COMM") == "0" else "pending")
    torch.manual_seed(0)
    rows = [{"x": torch.randn(1024)} for _ in range(8)]
    args = TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=2, max_steps=2, report_to="none", use_cpu=True,
        ddp_backend="gloo", save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    trainer = Trainer(
        model=_WithLoss(),
        args=args,
        train_dataset=rows,
        data_collator=lambda b: {"x": torch.stack([r["x"] for r in b])},
    )
    trainer.train()
    ddp = trainer.model_wrapped
    data = ddp._get_ddp_logging_data()
    table = trainer.__dict__["_vlm_lora_speedups"]  # the start-up table of this trainer
    out.put(
        (rank, type(ddp).__name__, ddp.gradient_as_bucket_view, data.get("num_buckets_reduced"), ddp.broadcast_buffers,
         table.outcomes[14].line())
    )  # fmt: skip


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (
            {},
            (
                "DistributedDataParallel",
                True,
                1,
                False,
                "applied: broadcast_buffers, bucket_cap_mb, gradient_as_bucket_view",
            ),
        ),
        (
            {"VLM_LORA_DDP_COMM": "0"},
            ("DistributedDataParallel", False, 2, True, "skipped: switch off (VLM_LORA_DDP_COMM=0)"),
        ),
    ],
    ids=["on", "off"],
)
def test_a_real_two_process_trainer_gets_the_plugins_ddp_arguments(tmp_path, environ, expected):
    """transformers' Trainer builds DDP through accelerate in two processes (gloo): the plugin's values reach it."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_trainer_worker, args=(r, port, str(tmp_path), environ, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=240) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert [r[1:] for r in results] == [expected, expected]
