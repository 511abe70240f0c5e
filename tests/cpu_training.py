"""The `swift sft` arguments of the tests that train the tiny Qwen3-VL on the CPU through train-lora's core."""

from __future__ import annotations

from typing import Any


def cpu_swift_args(steps: int, **overrides: Any) -> dict[str, Any]:
    """LoRA rank 8 on every linear layer, one row per micro-step, float32 (transformers refuses bf16 training on a
    CPU), a checkpoint at the last step, no evaluation, a loss point per step, no reporting; `overrides` on top."""
    return {
        "lora_rank": 8,
        "lora_alpha": 16,
        "target_modules": "all-linear",
        "freeze_vit": True,
        "learning_rate": 1e-3,
        "max_steps": steps,
        "per_device_train_batch_size": 1,
        "max_length": 512,
        "torch_dtype": "float32",
        "save_steps": steps,
        "eval_steps": 1000,
        "save_only_model": True,
        "logging_steps": 1,
        "dataloader_num_workers": 0,
        "report_to": "none",
        "seed": 42,
        **overrides,
    }
