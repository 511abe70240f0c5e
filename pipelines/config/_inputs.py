"""What a run reads: the `pipeline`, `model` and `data` sections, each with its checks."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from components.common import data_policy
from components.common.boxes import AUTO as AUTO_CONVENTION
from components.common.boxes import CONVENTIONS
from components.common.quantization import QUANTIZATIONS, swift_conflict, swift_quant_args
from components.common.tasks import TASK_NAMES
from pipelines._load_checks import pipeline_name_problem
from pipelines.config._errors import Check, ConfigError, Where
from pipelines.config._values import looks_like_token

_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SECRET_RE = re.compile(r"projects/[^/\s]+/secrets/[A-Za-z0-9_-]{1,255}(/versions/[A-Za-z0-9_-]+)?")


@dataclass(frozen=True)
class PipelineSection:
    """Where and under which name the pipeline runs.

    Attributes:
        name: Pipeline name (lowercase letters, digits and '-'), shown in the console.
        root: Pipeline root: a local folder (kfp.local) or `gs://bucket/prefix` (Vertex).
            Relative local paths are taken from the current directory. Default `runs`.
        enable_caching: Reuse results of tasks whose inputs did not change. Default true.
    """

    name: str
    root: str = "runs"
    enable_caching: bool = True


@dataclass(frozen=True)
class ModelSection:
    """The base model and its cache.

    Attributes:
        source: `hf://org/name[@rev]`, `ms://org/name[@rev]`, `gs://bucket/prefix`, a local
            model folder, or `demo://tiny-qwen3-vl` (the tiny offline model).
        cache: Model cache root: a local folder or `gs://bucket/models`.
        revision: Branch, tag or commit for hf:// and ms:// sources; "" = default branch.
        token_from: Where a gated model's hub token is read: `env:VAR` or a Secret Manager
            name `projects/P/secrets/S[/versions/V]`; never the token itself. Default "".
        allow: Only stage files matching these globs. Default [] (all).
        ignore: Skip files matching these globs (e.g. `*.bin`, `original/*`). Default [].
        quantization: Train LoRA on a bitsandbytes-quantised base (QLoRA): `none`, `nf4` or
            `int8`; train-lora gets ms-swift's quant arguments, merge-export still merges into
            the staged bf16 base (docs/training.md). Default `none`.
    """

    source: str
    cache: str
    revision: str = ""
    token_from: str = ""
    allow: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    quantization: str = "none"


@dataclass(frozen=True)
class DataSection:
    """Training data and the validation policy.

    Attributes:
        train: ms-swift JSONL data (`messages` + `images`, image paths relative to the
            file): files, folders / prefixes (every `*.jsonl` below) and globs, local or
            gs://, comma-separated; snapshot-data resolves them to exact files each run.
        eval: Held-out JSONL data, the same forms; empty = split `eval_fraction` off
            `train`. Default "".
        eval_fraction: Fraction of `train` held out when `eval` is empty, 0 < f < 1. Default 0.1.
        max_invalid_fraction: Largest fraction of invalid lines tolerated (they are
            quarantined and reported); above it validation fails. Default 0.0.
        split_seed: Salt of the deterministic hash split. Default "split-v1".
        box_convention: What the detection boxes' numbers mean (components.common.boxes):
            "pixel" (pixels of the original image), "norm1000" (relative, [0, 1000]:
            Qwen2-VL / Qwen3-VL), "resized_pixel" (pixels after the processor's smart resize:
            Qwen2.5-VL), or "auto" (the staged model family's own). evaluate maps boxes to
            pixels of the original image before IoU. Default "pixel".
        task: Check of the assistant answers: "" (none), "json" (fenced JSON) or
            "detection" (fenced JSON list of {label, bbox}). Default "".
        leakage: What validation does with an eval row whose image (by content hash), or
            images and prompt, a train row has too: "quarantine" (the eval copy, code
            E_LEAK), "error" (validation fails, naming both rows' file:line) or "warn"
            (kept; counted and listed in the report). The hash split keeps rows that share
            an image on one side (unless every row shares one). Default "quarantine".
    """

    train: str
    eval: str = ""
    eval_fraction: float = 0.1
    max_invalid_fraction: float = 0.0
    split_seed: str = "split-v1"
    task: str = ""
    box_convention: str = "pixel"
    leakage: str = data_policy.DEFAULT_LEAKAGE


_BOX_CONVENTIONS = (AUTO_CONVENTION, *CONVENTIONS)


def data_checks(d: DataSection) -> list[Check]:
    """The `data` fields' own checks (the validation policy, the task and the box convention)."""
    return [
        *(  # the rules validate-data's core and CLI check with too (components.common.data_policy)
            (f"data.{name}", not data_policy.setting_problem(name, getattr(d, name)), data_policy.expected(name))
            for name in data_policy.RULES
        ),
        ("data.task", d.task in TASK_NAMES, "one of " + ", ".join(repr(name) for name in TASK_NAMES)),
        ("data.box_convention", d.box_convention in _BOX_CONVENTIONS, "one of " + ", ".join(_BOX_CONVENTIONS)),
    ]


def source_checks(m: ModelSection, d: DataSection) -> list[Check]:
    """Where the run reads from is named: the model, its cache and the training data."""
    return [
        ("model.source", bool(m.source.strip()), "a model folder or URI"),
        ("model.cache", bool(m.cache.strip()), "a folder or gs:// URI"),
        ("data.train", bool(d.train.strip()), "a JSONL file, folder / prefix or glob (local or gs://)"),
    ]


def check_pipeline_name(p: PipelineSection, where: Where) -> None:
    """Refuses a `pipeline.name` that cannot name a Vertex pipeline job (`pipeline_name_problem`)."""
    if problem := pipeline_name_problem(p.name):
        raise ConfigError(f"{where('pipeline.name')}: {problem}")


def quantized_swift(m: ModelSection, swift: dict[str, Any], where: Where) -> dict[str, Any]:
    """Checks `model.quantization`; returns the `swift` section with its ms-swift arguments added.

    A `swift.quant_*` / `swift.bnb_*` argument that contradicts the setting (or any such
    argument without one) is refused with one line naming both keys.
    """
    q = m.quantization
    if q not in QUANTIZATIONS:
        raise ConfigError(
            f"{where('model.quantization')}: 'model.quantization' must be one of {', '.join(QUANTIZATIONS)}, got {q!r}"
        )
    clash = swift_conflict(swift, q)
    if clash:
        name, value, need = clash
        fix = f"set swift.{name}: {need} or drop it" if need is not None else f"drop swift.{name}"
        raise ConfigError(
            f"{where('swift.' + name)}: 'swift.{name}: {value}' contradicts 'model.quantization: {q}' "
            f"({where('model.quantization')}); the setting passes ms-swift's quant arguments itself: {fix}, "
            "or choose another model.quantization (none, nf4, int8)"
        )
    if q == "none":
        return swift
    return {**swift, **swift_quant_args(q)}


def check_token_ref(ref: str, where: Where) -> None:
    """Checks `model.token_from` is a reference to a token, never the token; never echoes it.

    Raises:
        ConfigError: The value looks like a token itself, or is not `env:NAME` or a Secret
            Manager name.
    """
    key = "model.token_from"
    if ref == "":
        return
    name = ref[len("env:") :] if ref.startswith("env:") else ref
    env_name_ok = _ENV_NAME_RE.fullmatch(name) and not name.startswith("hf_") and not looks_like_token(name)
    if ref.startswith("env:") and env_name_ok:
        return
    if _SECRET_RE.fullmatch(ref) and not looks_like_token(ref.split("/")[3]):
        return
    if looks_like_token(name) or ref.startswith("env:"):
        raise ConfigError(
            f"{where(key)}: {key} looks like a token itself (not echoed); put the token in an environment "
            "variable or Secret Manager and name it: env:HF_TOKEN or projects/P/secrets/S"
        )
    raise ConfigError(
        f"{where(key)}: '{key}' must be '' or 'env:VAR' (an environment variable name such as HF_TOKEN) or "
        "'projects/P/secrets/S[/versions/V]' (a reference, never the token itself); got a value that is "
        "neither (not echoed)"
    )
