"""The batch's host copies (speedups/batch_facts.py, plugin item 16): kept for the very device tensor
made from each, read by ms-swift's logits_to_keep and by the model forward's facts instead of the GPU.

"Device" tensors here are on PyTorch's meta device where the code must not read them: a meta tensor has no values,
so any read of one fails, and a result that comes out right can only come from the host copies."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest
import torch

from speedups import batch_facts, vision_seqlens


def _batch():
    labels = torch.full((3, 7), -100)
    labels[0, 4:] = 5
    labels[1, 2:6] = 6  # the earliest label: column 2
    labels[2, 5:] = 7
    return {
        "input_ids": torch.tensor([[1, 9, 9, 2, 3, 4, 0], [1, 9, 9, 9, 9, 2, 3], [1, 2, 3, 4, 5, 0, 0]]),
        "attention_mask": torch.tensor([[1] * 6 + [0], [1] * 7, [1] * 5 + [0] * 2]),
        "labels": labels,
        "image_grid_thw": torch.tensor([[1, 2, 4], [1, 4, 4]]),
        "pixel_values": torch.randn(24, 6),
    }


def _to_meta(batch):
    return {k: v.to("meta") for k, v in batch.items()}


def test_a_host_copy_is_found_for_the_very_device_tensor_unchanged():
    copies = batch_facts.HostCopies()
    host = _batch()
    device = _to_meta(host)
    assert copies.remember(host, device) == 4  # input_ids, attention_mask, labels, grid: not the pixel values
    assert copies.host_of(device["labels"]) is host["labels"]
    assert copies.host_of(device["pixel_values"]) is None
    assert copies.host_of(host["labels"]) is None  # a host tensor is not a device tensor made from one
    assert copies.host_of(device["labels"].clone()) is None  # another tensor, the same values
    device["attention_mask"].add_(0)  # changed in place (its version moves): the copy is stale
    assert copies.host_of(device["attention_mask"]) is None
    assert copies.host_of(device["input_ids"]) is host["input_ids"]
    before = len(copies)
    del device["input_ids"]
    gc.collect()
    assert len(copies) == before - 1  # gone with its device tensor


def test_only_host_to_device_copies_of_the_same_shape_and_dtype_are_kept():
    copies = batch_facts.HostCopies()
    host = _batch()
    assert copies.remember(host, dict(host)) == 0  # host to host
    odd = {"input_ids": host["input_ids"].to("meta", torch.int32), "labels": host["labels"][:, 1:].to("meta")}
    assert copies.remember(host, odd) == 0
    assert copies.remember(host, None) == 0 and copies.remember([1], [2]) == 0


def test_the_wrapped_to_device_queues_the_copy_without_waiting_and_keeps_the_host_copies():
    copies = batch_facts.HostCopies()
    calls = []

    def to_device(data, device, non_blocking=False):
        calls.append((device, non_blocking))
        return {k: v.to(device) for k, v in data.items()}

    wrapped = batch_facts.remembering(to_device, copies)
    host = _batch()
    out = wrapped(host, "meta")  # as ms-swift's loaders call it
    assert calls == [("meta", True)] and out["labels"].device.type == "meta"
    assert copies.host_of(out["image_grid_thw"]) is host["image_grid_thw"]
    assert wrapped.__wrapped__ is to_device and wrapped._vlm_lora_batch_facts


def test_ms_swift_s_own_data_loader_keeps_the_host_copies_through_the_wrapper(monkeypatch):
    """ms-swift's `DataLoaderShard` (the loader its trainer builds) with its `to_device` wrapped as the plugin does:
    each batch reaches the device and its host copies are kept."""
    from swift.dataloader import shard

    copies = batch_facts.HostCopies()
    monkeypatch.setattr(shard, "to_device", batch_facts.remembering(shard.to_device, copies))
    host = _batch()
    (device,) = list(shard.DataLoaderShard([host], device="meta", collate_fn=lambda rows: rows[0]))
    assert device["input_ids"].device.type == "meta"
    assert copies.host_of(device["input_ids"]) is host["input_ids"] and len(copies) == 4


def _ms_swift_prepare(self, inputs):
    """ms-swift's own `SwiftMixin.prepare_logits_to_keep` (the installed 4.6.0) on a trainer stand-in."""
    from swift.trainers.mixin import SwiftMixin

    prepare = SwiftMixin.prepare_logits_to_keep
    prepare = getattr(prepare, "__wrapped__", prepare)  # the plugin's wrapper, where a test loaded it
    trainer = SimpleNamespace(
        template=SimpleNamespace(sequence_parallel_size=1), args=SimpleNamespace(tuner_backend="peft")
    )
    return prepare(trainer, inputs)


def test_logits_to_keep_from_the_host_copy_equals_ms_swift_on_the_labels():
    copies = batch_facts.HostCopies()
    host = _batch()
    scale = torch.rand(3, 7)
    want = {"labels": host["labels"].clone(), "loss_scale": scale.clone()}
    _ms_swift_prepare(None, want)  # on the host: ms-swift's own result
    assert want["logits_to_keep"] == 6  # 7 - 2 + 1
    device = _to_meta(host)
    device["loss_scale"] = scale.to("meta")
    copies.remember(host, device)
    prepare = batch_facts.logits_to_keep_from_host(_ms_swift_prepare, copies)
    prepare(None, device)  # on the meta labels ms-swift's .item() would fail: the host copy was read
    assert device["logits_to_keep"] == 6
    assert device["labels"].device.type == "meta" and device["labels"].shape == want["labels"].shape
    assert device["loss_scale"].device.type == "meta" and device["loss_scale"].shape == (3, 6)
    assert set(device) == {*host, "loss_scale", "logits_to_keep"}
    # the suffix's host copy is kept for the loss (item 18)
    assert torch.equal(copies.host_of(device["labels"]), want["labels"])


def test_logits_to_keep_without_a_host_copy_or_for_one_row_is_ms_swift_s(monkeypatch):
    from swift.trainers import mixin

    # one process per GPU, as train-lora runs: with several GPUs visible to one process ms-swift takes the model to be
    # split over them (`is_mp`) and computes an int for one row too (this failed on a 2-GPU machine, either order)
    monkeypatch.setattr(mixin, "is_mp", lambda: False)
    prepare = batch_facts.logits_to_keep_from_host(_ms_swift_prepare, batch_facts.HostCopies())
    host = _batch()
    inputs = {"labels": host["labels"].clone()}
    prepare(None, inputs)  # no copy kept: ms-swift on the labels themselves
    assert inputs["logits_to_keep"] == 6 and torch.equal(inputs["labels"], host["labels"][:, 1:])
    copies = batch_facts.HostCopies()
    one = {"labels": host["labels"][1:2].clone()}
    device = {"labels": one["labels"].to("meta")}
    copies.remember(one, device)
    seen = []
    batch_facts.logits_to_keep_from_host(lambda self, i: seen.append(i["labels"].device.type), copies)(None, device)
    assert seen == ["meta"]  # one row: ms-swift's mask, on the device labels (no wait there)
    _ms_swift_prepare(None, one)  # and ms-swift's one-row result: a mask, not an int
    assert isinstance(one["logits_to_keep"], torch.Tensor)


def test_the_forward_facts_come_from_the_host_copies_without_reading_the_device(monkeypatch):
    config = SimpleNamespace(image_token_id=9, video_token_id=8)
    host = _batch()
    device = _to_meta(host)
    copies = batch_facts.HostCopies()
    copies.remember(host, device)
    facts = vision_seqlens.gather_facts(
        config, device["input_ids"], device["attention_mask"], [device["image_grid_thw"]], copies.host_of
    )
    # the same facts the device path finds (the CPU taken for a GPU)
    monkeypatch.setattr(vision_seqlens, "on_device", lambda t: isinstance(t, torch.Tensor))
    want = vision_seqlens.gather_facts(config, host["input_ids"], host["attention_mask"], [host["image_grid_thw"]])
    assert facts.tokens == want.tokens == {9: 6, 8: 0}
    assert facts.right_aligned is want.right_aligned is True and facts.mask_shape == (3, 7)
    assert facts.input_ids is device["input_ids"] and facts.grids[0][0] is device["image_grid_thw"]
    assert torch.equal(facts.grids[0][1], want.grids[0][1])
    left = dict(host, attention_mask=torch.tensor([[0] + [1] * 6] * 3))
    assert vision_seqlens.gather_facts(config, host["input_ids"], left["attention_mask"], []).right_aligned is False


def test_a_missing_host_copy_sends_the_facts_to_the_device_path(monkeypatch):
    config = SimpleNamespace(image_token_id=9, video_token_id=8)
    host = _batch()
    monkeypatch.setattr(vision_seqlens, "on_device", lambda t: isinstance(t, torch.Tensor))
    stand_ins = {k: v.clone() for k, v in host.items()}  # "device" tensors (the CPU taken for a GPU)
    copies = batch_facts.HostCopies()
    seen = []
    real = vision_seqlens._fact_values

    def values(token_ids, input_ids, mask, grids):
        seen.append(input_ids is stand_ins["input_ids"])
        return real(token_ids, input_ids, mask, grids)

    monkeypatch.setattr(vision_seqlens, "_fact_values", values)
    known = {id(stand_ins[k]): host[k] for k in ("input_ids", "attention_mask")}  # no copy of the grid
    monkeypatch.setattr(copies, "host_of", lambda t: known.get(id(t)))
    facts = vision_seqlens.gather_facts(
        config, stand_ins["input_ids"], stand_ins["attention_mask"], [stand_ins["image_grid_thw"]], copies.host_of
    )
    assert seen == [True] and facts.tokens == {9: 6, 8: 0}  # computed from the device tensors


GPU_CODE = """
import torch
from speedups import batch_facts, deepstack, swift_plugin
from swift.dataloader.shard import DataLoaderShard
from speedups.tests.gpu_waits import gpu_waits
from speedups.tests.test_vision_seqlens import _batch, _qwen3_vl_model

model = _qwen3_vl_model().cuda()
deepstack.install(model)
batch = {k: v.contiguous() for k, v in _batch(model.config).items()}
pinned = lambda rows: {k: v.pin_memory() for k, v in rows[0].items()}
batch_facts.install_readers()  # as at a trainer's creation, ms-swift's modules loaded
(device,) = list(DataLoaderShard([batch], device=torch.device("cuda"), collate_fn=pinned))

def run(inputs):
    out, waits = gpu_waits(lambda: model(**inputs).last_hidden_state)
    return out.detach(), len(waits)

kept = batch_facts.COPIES.host_of(device["input_ids"]) is not None
run(device)  # the tower's per-size parts computed
mine, waits = run(device)
stock, stock_waits = run({k: v.clone() for k, v in device.items()})  # no host copies for these
print(not swift_plugin.CONTEXT.loaded[16].skipped, kept, waits, stock_waits, bool(torch.allclose(mine, stock)))
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_data_loader_batch_reaches_the_forward_without_a_wait_gpu():
    """On a GPU (a fresh interpreter: the plugin patches libraries): ms-swift's data loader copies a batch without
    waiting and keeps its host copies; the tiny Qwen3-VL model's training forward then waits for the GPU not once
    (once, for the facts' copy, on tensors without host copies), with the same output."""
    import os

    from speedups.tests.plugin_run import ROOT, last_line

    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    assert last_line(GPU_CODE, PYTHONPATH=path) == "True True 0 1 True"


def test_the_switch_is_allowed_in_the_job_environment_with_its_values():
    from components.train_lora import job_env

    job_env.check_job_env({"VLM_LORA_BATCH_FACTS": "0"})
    job_env.check_job_env({"VLM_LORA_BATCH_FACTS": 1})
    with pytest.raises(job_env.JobEnvError, match="VLM_LORA_BATCH_FACTS"):
        job_env.check_job_env({"VLM_LORA_BATCH_FACTS": "off"})


def test_the_plugin_wraps_ms_swift_s_readers_once_they_are_loaded():
    """The plugin does not load ms-swift's modules (its trainers replace transformers' default callbacks); where they
    are loaded, the loaders' `to_device` and `prepare_logits_to_keep` are wrapped, at the plugin's load or at a
    trainer's creation; not with the switch off."""
    import os

    from speedups.tests.plugin_run import ROOT, last_line

    code = """
import sys
import torch
from speedups import plugin
ctx = plugin.install()
loaded_before = "swift.trainers.mixin" in sys.modules
from swift.trainers.mixin import SwiftMixin
from swift.dataloader import shard
outcome = plugin.check_model(torch.nn.Linear(2, 2))[16]  # as the plugin's Trainer.__init__ does
flag = lambda f: getattr(f, "_vlm_lora_batch_facts", False)
print(loaded_before, outcome.applied, flag(shard.to_device), flag(SwiftMixin.prepare_logits_to_keep))
"""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    assert last_line(code, PYTHONPATH=path) == "False True True True"
    assert last_line(code, PYTHONPATH=path, VLM_LORA_BATCH_FACTS="0") == "False False False False"


def test_the_lookups_are_counted_for_the_log():
    copies = batch_facts.HostCopies()
    host = _batch()
    device = _to_meta(host)
    copies.remember(host, device)
    copies.host_of(device["labels"])
    copies.host_of(device["labels"].clone())
    device["input_ids"].add_(0)
    copies.host_of(device["input_ids"])
    copies.host_of(host["labels"])  # a host tensor: not a lookup of a device tensor
    assert copies.summary() == "4 host copies kept; device tensors looked up: found 1, unknown 1, changed 1"
