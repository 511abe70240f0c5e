"""Garbage collection at step ends (components/train_lora/speedups/gc_align.py, swift_plugin.gc_callback, item 15).

The collector is the real one: cyclic garbage is watched through weak references, and the plugin's callback
runs inside a real transformers Trainer on the CPU.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from components.train_lora.speedups import gc_align
from components.train_lora.speedups.registry import SWITCHES
from tests.speedups_isolation import restored_speedups  # noqa: F401 (autouse: no plugin left behind)


class Node:
    def __init__(self) -> None:
        self.other = self


def _cycle() -> weakref.ref:
    """A reference cycle nobody holds, watched by a weak reference (alive until a collection frees it)."""
    return weakref.ref(Node())


@pytest.fixture(autouse=True)
def _collector_restored():
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()


def test_aligned_collection_is_off_between_steps_and_frees_cycles_at_step_end():
    aligner = gc_align.AlignedGc(full_every=3)
    aligner.start()
    assert not gc.isenabled()
    assert gc.get_freeze_count() > 0  # what existed at the start is frozen
    ref = _cycle()
    for _ in range(20_000):  # far past the automatic threshold (700 allocations): nothing collects
        Node()
    assert ref() is not None
    assert aligner.step_end(1) == 1
    assert ref() is None
    assert [aligner.step_end(s) for s in (2, 3, 4, 6)] == [1, 2, 1, 2]
    assert aligner.collections == 5
    ref = _cycle()
    aligner.young()  # after an evaluation batch
    assert ref() is None and aligner.collections == 6
    aligner.stop()
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def _child_collector_state(conn) -> None:
    conn.send((gc.isenabled(), gc.get_freeze_count() > 0))
    conn.close()


def test_forked_children_get_the_automatic_collector_back():
    import multiprocessing

    ctx = multiprocessing.get_context("fork")  # as the data loader's workers on Linux

    def child_state() -> tuple[bool, bool]:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_child_collector_state, args=(child,))
        proc.start()
        state = parent.recv()
        proc.join(timeout=30)
        assert proc.exitcode == 0
        return state

    aligner = gc_align.AlignedGc()
    aligner.start()
    try:
        assert child_state() == (True, True)  # collector on, the parent's objects still frozen
        assert not gc.isenabled()  # the parent's stays off
    finally:
        aligner.stop()
    gc.disable()  # a collector that was off before start stays off in children too
    aligner = gc_align.AlignedGc()
    aligner.start()
    try:
        assert child_state()[0] is False
    finally:
        aligner.stop()


def test_stop_keeps_a_collector_that_was_off_off():
    gc.disable()
    aligner = gc_align.AlignedGc()
    aligner.start()
    aligner.stop()
    assert not gc.isenabled()
    assert aligner.step_end(1) == -1  # inactive: does nothing


def test_full_every_must_be_positive():
    with pytest.raises(ValueError, match="full_every must be a positive number of steps, not 0"):
        gc_align.AlignedGc(full_every=0)


def test_census_counts_collections_and_pauses():
    ticks = iter([1.0, 1.004, 2.0, 2.030])
    census = gc_align.GcCensus(clock=lambda: next(ticks))
    census.attach()
    census.attach()  # once only
    try:
        gc.collect(0)
        gc.collect(2)
    finally:
        census.detach()
    assert census.counts == {0: 1, 1: 0, 2: 1}
    assert census.seconds == pytest.approx(0.034)
    assert (round(census.longest, 3), census.longest_generation) == (0.03, 2)
    assert census.summary() == (
        "2 garbage collections (1 of generation 0, 1 of generation 2) paused the host 34.0 ms in all, "
        "the longest 30.0 ms (generation 2)"
    )
    gc.collect()
    assert sum(census.counts.values()) == 2  # detached
    assert gc_align.GcCensus().summary() == "no garbage collection ran"


@pytest.mark.parametrize(
    ("environ", "world_size", "expected"),
    [
        ({}, 2, True),
        ({}, 1, False),
        ({"VLM_LORA_ALIGNED_GC": "0"}, 8, False),
        ({"VLM_LORA_ALIGNED_GC": "1"}, 1, True),
    ],
)
def test_on_with_several_processes_unless_switched(environ, world_size, expected):
    assert SWITCHES["VLM_LORA_ALIGNED_GC"].on(environ, world_size) is expected


class Regression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Linear(4, 1)

    def forward(self, x, labels):
        return {"loss": torch.nn.functional.mse_loss(self.w(x).squeeze(-1), labels)}


def _train(tmp_path, steps: int = 4, evaluate: bool = False, accumulate: int = 1) -> tuple[list[bool], list]:
    """A real Trainer on the CPU (the plugin's __init__ wrapper adds its callback); whether the automatic collector
    was on at each step's start, and the callbacks. `evaluate`: 3 batches of evaluation after step 2."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from components.train_lora.speedups import swift_plugin  # noqa: F401 (installs the plugin, as swift sft does)

    seen: list[bool] = []

    class Watch(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            seen.append(gc.isenabled())

    rows = [{"x": torch.randn(4), "labels": torch.randn(())} for _ in range(16)]
    extra = {"eval_strategy": "steps", "eval_steps": 2, "per_device_eval_batch_size": 2} if evaluate else {}
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=steps, per_device_train_batch_size=2, report_to=[], use_cpu=True,
        save_strategy="no", logging_steps=1, dataloader_num_workers=0, gradient_accumulation_steps=accumulate,
        **extra,
    )  # fmt: skip
    # ms-swift, once another test in this process has imported its trainers, replaces transformers' flow callback
    # with one that reads its own `max_epochs` argument (None: no limit, as in ms-swift's arguments)
    args.max_epochs = None
    trainer = Trainer(
        model=Regression(),
        args=args,
        train_dataset=rows,
        eval_dataset=rows[:6] if evaluate else None,
        callbacks=[Watch()],
    )
    trainer.train()
    return seen, trainer.callback_handler.callbacks


def test_trainer_collects_at_step_ends_with_several_processes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VLM_LORA_ALIGNED_GC", "1")  # as with WORLD_SIZE > 1, in one process
    seen, callbacks = _train(tmp_path)
    assert seen == [False] * 4
    assert gc.isenabled()  # back on after training
    ours = [c for c in callbacks if type(c).__name__ == "GcCallback"]
    assert len(ours) == 1 and ours[0].aligner.collections == 4
    assert ours[0].census.counts[1] >= 4  # its own step-end collections are counted
    out = capsys.readouterr().out
    assert "garbage collection at step ends on every rank (automatic collection off; all generations every 50" in out
    assert "train-lora plugin: rank 0, collection at step ends: " in out
    assert "train-lora plugin: 15 aligned_gc      applied: collections at step ends" in out  # the start-up table


def test_trainer_collects_after_each_evaluation_batch(tmp_path, monkeypatch):
    monkeypatch.setenv("VLM_LORA_ALIGNED_GC", "1")
    seen, callbacks = _train(tmp_path, steps=2, evaluate=True)
    assert seen == [False, False]
    ours = [c for c in callbacks if type(c).__name__ == "GcCallback"]
    assert ours[0].aligner.collections == 2 + 3  # two step ends, three evaluation batches


def test_trainer_collects_after_each_accumulating_micro_step(tmp_path, monkeypatch):
    monkeypatch.setenv("VLM_LORA_ALIGNED_GC", "1")
    seen, callbacks = _train(tmp_path, steps=2, accumulate=3)
    assert seen == [False, False]  # at each optimizer step's start
    ours = [c for c in callbacks if type(c).__name__ == "GcCallback"]
    assert ours[0].aligner.collections == 2 + 2 * 2  # two step ends, two accumulating micro-steps in each step


def test_trainer_keeps_automatic_collection_with_one_process(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("VLM_LORA_ALIGNED_GC", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    seen, callbacks = _train(tmp_path, steps=2)
    assert seen == [True, True]
    ours = [c for c in callbacks if type(c).__name__ == "GcCallback"]
    assert len(ours) == 1 and ours[0].aligner is None
    out = capsys.readouterr().out
    assert "train-lora plugin: rank 0, collection automatic: " in out
    assert "15 aligned_gc      skipped: switch off (VLM_LORA_ALIGNED_GC unset: default 0 with one process)" in out


def test_plugin_switch_is_allowed_in_the_job_environment():
    from components.train_lora.job_env import check_job_env

    check_job_env({"VLM_LORA_ALIGNED_GC": "0"})


def test_plugin_switch_takes_zero_or_one_only():
    from components.train_lora.job_env import JobEnvError, check_job_env

    with pytest.raises(JobEnvError, match="VLM_LORA_ALIGNED_GC: 'maybe' is not a value it takes: use 0"):
        check_job_env({"VLM_LORA_ALIGNED_GC": "maybe"})
