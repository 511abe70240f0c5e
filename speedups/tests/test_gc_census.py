"""The garbage-collection census every rank logs at the end of training (speedups/gc_census.py).

Item 15 (collections at step ends on every rank) was deleted on 2026-11-28: it gained nothing beyond the spread on
two H200s (benchmarks/README.md). The collector is the real one, and the plugin's callback runs inside a real
transformers Trainer on the CPU.
"""

from __future__ import annotations

import gc

import pytest
import torch

from speedups import gc_census
from speedups.registry import ITEMS


def test_census_counts_collections_and_pauses():
    ticks = iter([1.0, 1.004, 2.0, 2.030])
    census = gc_census.GcCensus(clock=lambda: next(ticks))
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
    assert gc_census.GcCensus().summary() == "no garbage collection ran"


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

    from speedups import swift_plugin  # noqa: F401 (installs the plugin, as swift sft does)

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


def test_every_trainer_gets_the_census_and_collection_stays_automatic(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VLM_LORA_ALIGNED_GC", "1")  # turned automatic collection off while item 15 existed
    seen, callbacks = _train(tmp_path, steps=2)
    assert seen == [True, True]  # automatic collection at every step's start
    ours = [c for c in callbacks if type(c).__name__ == "GcCallback"]
    assert len(ours) == 1
    out = capsys.readouterr().out
    assert "train-lora plugin: rank 0, garbage collection: " in out
    assert "aligned_gc" not in out


def test_item_15_is_gone_and_its_switch_is_refused():
    from components.train_lora.job_env import JobEnvError, check_job_env

    assert 15 not in {it.number for it in ITEMS} and "aligned_gc" not in {it.name for it in ITEMS}
    with pytest.raises(
        JobEnvError,
        match=r"'VLM_LORA_ALIGNED_GC': the train-lora plugin's item 15 .* was deleted on "
        r"2026-11-28: .*; remove it from the environment section",
    ):
        check_job_env({"VLM_LORA_ALIGNED_GC": "0"})
