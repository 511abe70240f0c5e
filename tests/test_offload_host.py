"""Offloaded checkpoints (`VLM_LORA_CHECKPOINT_OFFLOAD=1`) and the host's memory: the pinned bytes one micro-step
needs, refused before training where the host has too little available (issue 53's bad input)."""

from __future__ import annotations

import json

import pytest

from components.common import cluster
from components.train_lora import _facts, _fit, _launch, _offload, _plan

GIB = 1024**3
CONFIG = {"text_config": {"num_hidden_layers": 36, "hidden_size": 2560, "vocab_size": 151936}}


def meminfo(tmp_path, available_kb: int):
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       131072000 kB\nMemFree:        1000 kB\nMemAvailable:   {available_kb} kB\n")
    return path


def test_the_bytes_are_the_checkpointed_layers_inputs_in_bf16():
    # the 4B at 16 rows of 1,221 tokens with all 36 layers checkpointed
    assert _offload.offload_bytes(16, 1221, 2560, 36) == 16 * 1221 * 2560 * 2 * 36
    assert _offload.offload_bytes(16, 1221, 2560, 36) / GIB == pytest.approx(3.35, abs=0.01)


def test_mem_available_is_read_from_meminfo(tmp_path):
    assert _offload.available_host_bytes(meminfo(tmp_path, 2048)) == 2048 * 1024
    (tmp_path / "other").write_text("MemTotal: 1 kB\n")
    assert _offload.available_host_bytes(tmp_path / "other") is None
    assert _offload.available_host_bytes(tmp_path / "missing") is None
    assert _offload.available_host_bytes() is None or _offload.available_host_bytes() > 0  # this machine's


def test_too_little_host_memory_is_refused_with_both_figures():
    on = {_offload.OFFLOAD: "1"}
    kw = {"micro_batch": 16, "tokens": 1221, "hidden": 2560, "layers": 36}
    with pytest.raises(_offload.OffloadHostMemoryError) as err:
        _offload.check_host_memory(on, available=6 * GIB, **kw)
    message = str(err.value)
    assert "3.4 GiB for micro-batch 16 x 1221 tokens x 36 layers" in message
    assert "this host has 6.0 GiB available" in message
    assert "environment.VLM_LORA_CHECKPOINT_OFFLOAD: '0'" in message
    # enough: the bytes; the switch off, no layer checkpointed or an unknown host: nothing refused
    assert _offload.check_host_memory(on, available=8 * GIB, **kw) == _offload.offload_bytes(16, 1221, 2560, 36)
    assert _offload.check_host_memory({}, available=1, **kw) == 0
    assert _offload.check_host_memory(on, available=1, **{**kw, "layers": 0}) == 0
    assert _offload.check_host_memory(on, available=None, **kw) > 0


def test_train_lora_checks_the_plan_it_will_run(tmp_path, monkeypatch):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG))
    train = tmp_path / "train"
    train.mkdir()
    (train / "token_stats.json").write_text(json.dumps({"max_tokens": 1221, "rows": 168}))
    launch = _launch.Launch(cluster.LaunchPlan(), 1, 24 * GIB)
    plan = _plan.Plan(16, 1, True, 0, 0, (), checkpoint_layers=20)  # 20 of 36 layers checkpointed
    monkeypatch.setattr(_offload, "MEMINFO", meminfo(tmp_path, 5 * 1024 * 1024))  # 5 GiB available
    env = {_offload.OFFLOAD: "1"}
    facts = _facts.RunFacts.gather(str(model), {}, launch, str(train))
    with pytest.raises(_offload.OffloadHostMemoryError, match="x 20 layers"):
        _fit.check_offload({}, plan, facts, env)
    # fixed settings without a plan: every layer of micro-batch 1 (0.2 GiB)
    fixed = {"per_device_train_batch_size": 1, "gradient_checkpointing": True}
    assert _fit.check_offload(fixed, None, facts, env) == 1221 * 2560 * 2 * 36
    # no GPU, or the switch off: not checked
    cpu = _facts.RunFacts.gather(str(model), {}, _launch.Launch(cluster.LaunchPlan(), 0, 0), str(train))
    assert _fit.check_offload({}, plan, cpu, env) == 0
    assert _fit.check_offload({}, plan, facts, {}) == 0


def test_the_check_runs_where_train_lora_settles_its_plan(tmp_path, monkeypatch):
    """`_fit.micro_batch_plan` (what train-lora's core calls before `swift sft`) checks fixed settings too."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG))
    monkeypatch.setattr(_offload, "MEMINFO", meminfo(tmp_path, 5 * 1024 * 1024))
    launch = _launch.Launch(cluster.LaunchPlan(), 1, 24 * GIB)
    fixed = {"per_device_train_batch_size": 16, "gradient_checkpointing": True, "max_length": 3000}
    facts = _facts.RunFacts.gather(str(model), fixed, launch, str(tmp_path))
    with pytest.raises(_offload.OffloadHostMemoryError, match="micro-batch 16 x 3000 tokens x 36 layers"):
        _fit.micro_batch_plan(fixed, facts, {_offload.OFFLOAD: "1"})
    assert _fit.micro_batch_plan(fixed, facts, {}) is None
