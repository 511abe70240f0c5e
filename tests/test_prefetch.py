"""The next batch copied to the GPU while the current step computes (components/train_lora/prefetch.py)."""

from __future__ import annotations

import pytest
import torch

from components.train_lora import prefetch


def test_lookahead_starts_the_next_item_before_handing_out_the_current_one():
    events = []

    def start(item):
        events.append(f"start {item}")
        return item

    def finish(item):
        events.append(f"hand out {item}")
        return item * 10

    got = []
    for out in prefetch.lookahead(range(3), start, finish):
        events.append(f"use {out}")
        got.append(out)
    assert got == [0, 10, 20]
    assert events == [
        "start 0", "start 1", "hand out 0", "use 0", "start 2", "hand out 1", "use 10", "hand out 2", "use 20",
    ]  # fmt: skip
    assert list(prefetch.lookahead([], start, finish)) == []
    assert list(prefetch.lookahead([7], start, finish)) == [70]


def test_the_tensors_of_a_batch_are_found_in_mappings_and_sequences():
    a, b, c = torch.zeros(1), torch.ones(2), torch.full((3,), 2.0)
    batch = {"input_ids": a, "extra": [b, {"nested": (c, "text")}], "n": 3}
    assert [t.shape[0] for t in prefetch.tensors(batch)] == [1, 2, 3]


def test_only_a_cuda_device_with_pinned_batches_prefetches():
    assert not prefetch.applies(None, True)
    assert not prefetch.applies("cpu", True)
    assert not prefetch.applies("cuda:0", False)
    assert prefetch.applies("cuda:0", True) == torch.cuda.is_available()


def _loader(device, pin_memory: bool):
    from swift.dataloader.shard import DataLoaderShard

    rows = [{"input_ids": torch.arange(i, i + 4), "pixel_values": torch.full((2, 3), float(i))} for i in range(5)]
    return DataLoaderShard(rows, device=device, batch_size=2, pin_memory=pin_memory, collate_fn=_collate)


def _collate(rows):
    return {key: torch.stack([row[key] for row in rows]) for key in rows[0]}


def test_the_plugins_loader_hands_out_the_same_batches_on_the_cpu():
    pytest.importorskip("swift")
    from components.train_lora import swift_plugin

    assert swift_plugin.PREFETCH_BATCH
    batches = list(_loader("cpu", pin_memory=False))
    assert [b["input_ids"][:, 0].tolist() for b in batches] == [[0, 1], [2, 3], [4]]
    assert batches[2]["pixel_values"].eq(4).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_the_batches_arrive_the_same_through_a_side_stream_gpu():
    pytest.importorskip("swift")
    from components.train_lora import swift_plugin  # noqa: F401 - installs the wrapper

    want = list(_loader(None, pin_memory=False))
    got = []
    for batch in _loader("cuda", pin_memory=True):
        assert all(t.is_cuda for t in batch.values())
        torch.cuda._sleep(10_000_000)  # a busy step: the next batch's copy runs beside it
        got.append({k: v.cpu() for k, v in batch.items()})
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        assert all(torch.equal(g[k], w[k]) for k in w)
