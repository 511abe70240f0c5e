"""The `swift` section: ms-swift's own `swift sft` arguments, passed through unchanged, and their checks.

Loading refuses a name the pinned ms-swift's `swift sft` does not know (with the closest
names) or one the pipeline sets itself, values of the wrong type or range for the arguments
whose meaning is well known (`SWIFT_ARG_RULES`), a choice ms-swift does not offer, a tuner
other than LoRA, and combinations ms-swift refuses only once the GPU job has started.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

from components.common.model_fit import LIGER_WITH_PARAMETERS
from components.common.swift import pinned_sft_args, swift_arg_problem
from pipelines._load_checks import swift_choice_problem
from pipelines.config._errors import ConfigError, Where
from pipelines.config._values import is_int, is_number


def _steps(v: Any) -> bool:  # transformers: a step count, or below 1 a fraction of all steps
    return (is_int(v) and v > 0) or (isinstance(v, float) and 0 < v < 1)


_POSITIVE_INT = (lambda v: is_int(v) and v > 0, "a positive integer")
_BOOL = (lambda v: isinstance(v, bool), "true or false")
_FRACTION = (lambda v: is_number(v) and 0 <= v <= 1, "a number from 0 to 1")

# The `swift sft` arguments whose type and range are well known (ms-swift 4.x / transformers),
# checked when a config loads so a bad value stops before a GPU is booked, not minutes into
# train-lora. {name: (check, what it must be)}. Other keys pass through unchanged (their
# names are checked against the installed ms-swift by `components.train_lora.core`).
SWIFT_ARG_RULES: dict[str, tuple[typing.Callable[[Any], bool], str]] = {
    "learning_rate": (lambda v: is_number(v) and v > 0, "a number > 0, e.g. 1.0e-4"),
    "num_train_epochs": (lambda v: is_number(v) and v > 0, "a number > 0, e.g. 2"),
    "max_steps": (lambda v: is_int(v) and (v == -1 or v > 0), "-1 (use num_train_epochs) or a positive integer"),
    # `auto`: train-lora sizes the micro-batch from the data, the model and the GPU (components/train_lora/_plan.py)
    "per_device_train_batch_size": (lambda v: v == "auto" or (is_int(v) and v > 0), "a positive integer or auto"),
    "per_device_eval_batch_size": _POSITIVE_INT,
    "gradient_accumulation_steps": _POSITIVE_INT,
    "lora_rank": _POSITIVE_INT,
    "lora_alpha": (lambda v: is_number(v) and v > 0, "a number > 0, e.g. 32"),
    "lora_dropout": (lambda v: is_number(v) and 0 <= v < 1, "a number from 0 to 1 (1 excluded), e.g. 0.05"),
    "max_length": _POSITIVE_INT,
    "max_pixels": _POSITIVE_INT,
    "warmup_ratio": _FRACTION,
    "warmup_steps": (lambda v: is_number(v) and v >= 0, "a number >= 0"),
    "weight_decay": (lambda v: is_number(v) and v >= 0, "a number >= 0, e.g. 0.1"),
    "max_grad_norm": (lambda v: is_number(v) and v >= 0, "a number >= 0, e.g. 1.0"),
    "adam_beta1": (lambda v: is_number(v) and 0 <= v < 1, "a number from 0 to 1 (1 excluded), e.g. 0.9"),
    "adam_beta2": (lambda v: is_number(v) and 0 <= v < 1, "a number from 0 to 1 (1 excluded), e.g. 0.95"),
    "save_steps": (_steps, "a positive integer (or a fraction of all steps below 1)"),
    "eval_steps": (_steps, "a positive integer (or a fraction of all steps below 1)"),
    "logging_steps": _POSITIVE_INT,
    "save_total_limit": _POSITIVE_INT,
    "seed": (lambda v: is_int(v) and 0 <= v < 1 << 32, "an integer from 0 to 4294967295"),
    "data_seed": (lambda v: is_int(v) and 0 <= v < 1 << 32, "an integer from 0 to 4294967295"),
    "dataloader_num_workers": (lambda v: is_int(v) and v >= 0, "0 or a positive integer"),
    "split_dataset_ratio": (lambda v: is_number(v) and 0 <= v < 1, "a number from 0 to 1 (1 excluded)"),
    "torch_dtype": (lambda v: v in ("bfloat16", "float16", "float32"), "bfloat16, float16 or float32"),
    "bf16": _BOOL,
    "fp16": _BOOL,
    "gradient_checkpointing": (lambda v: isinstance(v, bool) or v == "auto", "true, false or auto"),
    "freeze_vit": _BOOL,
    "freeze_llm": _BOOL,
    "freeze_aligner": _BOOL,
    "use_liger_kernel": _BOOL,
    "save_only_model": _BOOL,
    "use_rslora": _BOOL,
    "use_dora": _BOOL,
    "packing": _BOOL,
    "padding_free": _BOOL,
    # train-lora sets these unless the config does (components/train_lora/_swift_args.py, _launch.py, speedups/ddp_comm.py)
    "logging_nan_inf_filter": _BOOL,
    "ddp_find_unused_parameters": _BOOL,
    "ddp_broadcast_buffers": _BOOL,
    "ddp_bucket_cap_mb": _POSITIVE_INT,
    "target_modules": (
        lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)),
        "a string or a list of strings, e.g. all-linear",
    ),
}


def check_swift_section(swift: Any, where: Where) -> dict[str, Any]:
    """The `swift` section as read: a mapping of names to plain values (an empty section is {}).

    Raises:
        ConfigError: Not a mapping, or a value that is not a string, number, boolean or list.
    """
    swift = swift or {}
    if not isinstance(swift, dict):
        raise ConfigError(f"{where('swift')}: section 'swift' must be a mapping of ms-swift argument names to values")
    for key, value in swift.items():
        if not isinstance(value, (str, int, float, bool, list)) or value is None:
            raise ConfigError(
                f"{where('swift.' + str(key))}: 'swift.{key}' must be a string, number, boolean or list, got {value!r}"
            )
    return dict(swift)


def check_swift(swift: dict[str, Any], where: Where) -> None:
    """Checks the `swift` values in `SWIFT_ARG_RULES` and refuses a token in `swift.hub_token`.

    Raises:
        ConfigError: A value of the wrong type or range, named with file, line and key.
    """
    if "hub_token" in swift:
        raise ConfigError(
            f"{where('swift.hub_token')}: 'swift.hub_token' puts a token in the config (not echoed); remove it, "
            "put the token in an environment variable or Secret Manager and name it in model.token_from "
            "(env:HF_TOKEN)"
        )
    version, known = pinned_sft_args()
    for name in swift:
        problem = swift_arg_problem(name, known, version)
        if problem:
            raise ConfigError(f"{where('swift.' + name)}: {problem}")
    for name, value in swift.items():
        if name not in SWIFT_ARG_RULES:
            continue
        ok, expected = SWIFT_ARG_RULES[name]
        if ok(value):
            continue
        key = f"swift.{name}"
        hint = ""
        if isinstance(value, str):
            try:
                float(value)
                hint = f" (YAML reads {value} as text, not a number: write it with a dot, e.g. 1.0e-4 for 1e-4)"
            except ValueError:
                hint = " (text, not a number)" if "number" in expected or "integer" in expected else ""
        raise ConfigError(f"{where(key)}: '{key}' must be {expected}, got {value!r}{hint}")


def check_swift_choices(swift: Mapping[str, Any], where: Where) -> None:
    """Refuses a value outside the choices the pinned ms-swift offers (`swift_choice_problem`)."""
    if found := swift_choice_problem(swift):
        raise ConfigError(f"{where(found[0])}: {found[1]}")


def check_tuner_type(swift: Mapping[str, Any], where: Where) -> None:
    """Refuses a `swift.tuner_type` other than lora."""
    if "tuner_type" in swift and swift["tuner_type"] != "lora":
        raise ConfigError(
            f"{where('swift.tuner_type')}: 'swift.tuner_type' must be 'lora' (this pipeline trains LoRA adapters)"
        )


_FLASH_ATTN = ("flash_attn", "flash_attention_2", "flash_attention_3", "flash_attention_4")


def check_packing(swift: Mapping[str, Any], where: Where) -> None:
    """padding_free / packing need a flash-attention kernel: ms-swift 4.6 refuses them otherwise, inside the GPU job."""
    for key in ("padding_free", "packing"):
        if swift.get(key) is True and swift.get("attn_impl") not in _FLASH_ATTN:
            raise ConfigError(
                f"{where('swift.' + key)}: 'swift.{key}: true' needs a flash-attention kernel (ms-swift refuses it "
                f"with attn_impl {swift.get('attn_impl', 'unset (sdpa)')!r}, after the job has started): set "
                "swift.attn_impl: flash_attn (the training image builds flash-attn; the lent GPU machines have none, "
                f"so it is not measured here) or drop swift.{key}"
            )


def check_parameter_targets(swift: Mapping[str, Any], where: Where) -> None:
    """LoRA on parameters (`swift.target_parameters`, e.g. a MoE model's experts) needs lora_dropout 0."""
    if not swift.get("target_parameters"):
        return
    if swift.get("use_liger_kernel") is True:
        raise ConfigError(f"{where('swift.target_parameters')}: {LIGER_WITH_PARAMETERS}")
    dropout = swift.get("lora_dropout", 0.05)
    if dropout != 0:
        raise ConfigError(
            f"{where('swift.target_parameters')}: 'swift.target_parameters' is set, and peft's LoRA on parameters "
            f"(ParamWrapper) does not work with dropout, but swift.lora_dropout is {dropout!r} "
            "(ms-swift's default is 0.05): set swift.lora_dropout: 0"
        )
