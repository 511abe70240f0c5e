"""A LoRA checkpoint under DeepSpeed ZeRO-1/2 copies only the adapter's tensors to host memory
(speedups/adapter_save.py through the train-lora plugin), and the adapter file is the
same as with the whole model copied.

The last test runs the real `swift sft` with DeepSpeed ZeRO-2 on the CPU (DeepSpeed's CPU
accelerator, one process) twice, with the plugin's switch on and off (about 45 s on 2 cores).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from speedups import adapter_save

ROOT = Path(__file__).resolve().parents[2]


def _peft_model(**lora):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    from pipelines.demo.tiny_model import ensure_tiny_model

    base = AutoModelForImageTextToText.from_pretrained(ensure_tiny_model(), dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=r".*language_model.*\.(q_proj|v_proj|up_proj)", **lora)
    return get_peft_model(base, config)


def _saved(model, folder: Path, state_dict) -> bytes:
    model.save_pretrained(folder, state_dict=state_dict, selected_adapters=["default"])
    return (folder / "adapter_model.safetensors").read_bytes()


@pytest.mark.parametrize("lora", [{}, {"modules_to_save": ["lm_head"]}], ids=["lora", "modules_to_save"])
def test_the_kept_entries_save_the_same_adapter_file(tmp_path, lora):
    model = _peft_model(**lora)
    kept = adapter_save.adapter_entries(model)
    full = model.state_dict()
    assert kept and set(kept) < set(full)
    assert set(kept) == {name for name, p in model.named_parameters() if p.requires_grad}  # the adapter
    assert any("modules_to_save" in k for k in kept) == bool(lora)
    from deepspeed.checkpoint.utils import clone_tensors_for_torch_save

    small = _saved(model, tmp_path / "small", clone_tensors_for_torch_save(kept))
    whole = _saved(model, tmp_path / "whole", clone_tensors_for_torch_save(full))
    assert small == whole


def test_no_peft_model_or_tensors_peft_made_itself_mean_the_full_copy(monkeypatch):
    assert adapter_save.adapter_entries(torch.nn.Linear(2, 2)) is None
    model = _peft_model()
    import peft.utils

    original = peft.utils.get_peft_model_state_dict

    def cloning(*args, **kwargs):  # a peft that builds new tensors: the entries cannot be matched
        return {k: v.clone() for k, v in original(*args, **kwargs).items()}

    monkeypatch.setattr(peft.utils, "get_peft_model_state_dict", cloning)
    assert adapter_save.adapter_entries(model) is None


def test_only_zero_below_3_without_tensor_parallelism():
    from accelerate.utils import DistributedType

    def accel(stage, tp=0, kind=DistributedType.DEEPSPEED):
        config = {"zero_optimization": {"stage": stage}, "tensor_parallel": {"autotp_size": tp}}
        return SimpleNamespace(distributed_type=kind, deepspeed_config=config)

    assert adapter_save.zero_below_3(accel(2)) and adapter_save.zero_below_3(accel(1))
    assert adapter_save.zero_below_3(accel(0))
    assert not adapter_save.zero_below_3(accel(3))
    assert not adapter_save.zero_below_3(accel(2, tp=2))
    assert not adapter_save.zero_below_3(accel(2, kind=DistributedType.MULTI_GPU))


def test_only_a_plain_lora_trainer_saving_a_peft_model():
    model = _peft_model()
    assert adapter_save.saves_lora_only(SimpleNamespace(args=SimpleNamespace(tuner_type="lora"), model=model))
    assert not adapter_save.saves_lora_only(SimpleNamespace(args=SimpleNamespace(tuner_type="ia3"), model=model))
    assert not adapter_save.saves_lora_only(SimpleNamespace(args=SimpleNamespace(tuner_type="full"), model=model))
    with_callback = SimpleNamespace(args=SimpleNamespace(), model=model, template=SimpleNamespace(save_callback=1))
    assert not adapter_save.saves_lora_only(with_callback)
    assert not adapter_save.saves_lora_only(SimpleNamespace(args=SimpleNamespace(), model=torch.nn.Linear(2, 2)))


def _zero2_run(tmp_path: Path, train_jsonl: Path, name: str, switch: str) -> tuple[Path, str]:
    config = tmp_path / "zero2.json"
    config.write_text(
        '{"zero_optimization": {"stage": 2}, "fp16": {"enabled": false}, "bf16": {"enabled": false},'
        ' "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",'
        ' "gradient_accumulation_steps": "auto", "gradient_clipping": "auto"}'
    )
    from pipelines.demo.tiny_model import ensure_tiny_model

    out = tmp_path / name
    swift = Path(sys.executable).with_name("swift")
    args = {
        "model": ensure_tiny_model(), "model_type": "qwen3_vl", "dataset": train_jsonl, "output_dir": out,
        "add_version": "false", "check_model": "false", "tuner_type": "lora",
        "external_plugins": ROOT / "speedups/swift_plugin.py", "lora_rank": 4, "lora_alpha": 8,
        "target_modules": "all-linear", "freeze_vit": "true", "max_steps": 2, "save_steps": 1,
        "per_device_train_batch_size": 1, "max_length": 512, "torch_dtype": "float32", "fp16": "false",
        "bf16": "false", "logging_steps": 1, "dataloader_num_workers": 0, "report_to": "none", "seed": 42,
        "deepspeed": config,
    }  # fmt: skip
    cmd = [str(swift), "sft"] + [x for k, v in args.items() for x in (f"--{k}", str(v))]
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29400 + os.getpid() % 500),
        "VLM_LORA_ADAPTER_ONLY_SAVE": switch, "PYTHONPATH": str(ROOT),
    }  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, done.stdout + done.stderr


def test_swift_sft_with_zero2_saves_the_same_adapter_without_copying_the_base(tmp_path):
    from components.train_lora._data import materialize_dataset
    from components.validate_data.core import validate_data
    from pipelines.demo.drawings import generate_dataset

    raw = generate_dataset(tmp_path / "raw", n_train=4, n_eval=1, image_size=128)
    validate_data([raw["train"]], str(tmp_path / "train"), str(tmp_path / "eval"), str(tmp_path / "q.jsonl"))
    train_jsonl = tmp_path / "train.jsonl"
    materialize_dataset(tmp_path / "train", train_jsonl)
    on, on_log = _zero2_run(tmp_path, train_jsonl, "on", "1")
    off, off_log = _zero2_run(tmp_path, train_jsonl, "off", "0")
    counts = re.findall(r"save under ZeRO-1/2: (\d+) of (\d+) tensors copied \(adapter\)", on_log)
    assert len(counts) == 2, on_log[-3000:]  # checkpoints 1 and 2
    assert all(0 < int(copied) < int(total) for copied, total in counts)
    assert "save under ZeRO-1/2" not in off_log
    for step in (1, 2):
        ours = (on / f"checkpoint-{step}" / "adapter_model.safetensors").read_bytes()
        assert ours == (off / f"checkpoint-{step}" / "adapter_model.safetensors").read_bytes()
        assert (on / f"checkpoint-{step}" / f"global_step{step}").is_dir()  # DeepSpeed's own states still saved
