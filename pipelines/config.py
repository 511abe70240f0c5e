"""The one schema every file under `configs/` loads into.

A config is value-only YAML with four sections:

* `pipeline`: name and pipeline root (where every task writes its artifacts).
* `model`: the base model source and the model cache it is staged into.
* `data`: training / held-out JSONL files and the validation policy.
* `swift`: arguments for `swift sft`, in ms-swift's own names, passed through unchanged
  (checked against the installed ms-swift by `components.train_lora.core.check_swift_args`).
* `eval`: generation settings, the IoU threshold and the promotion gate.

Unknown keys and wrong types are errors that name the file, the line, the key and what
is expected: `ConfigError`, raised before any work starts.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
DEFAULT_LOCAL_CONFIG = CONFIG_DIR / "local" / "tiny_cpu.yaml"

# Sources that `pipelines.run --local` builds on the fly instead of reading from disk.
DEMO_MODEL = "demo://tiny-qwen3-vl"
DEMO_DATA_TRAIN = "demo://drawings/train"
DEMO_DATA_EVAL = "demo://drawings/eval"


class ConfigError(ValueError):
    """A config file is invalid; the message names file, line, key and the fix."""


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
    """

    source: str
    cache: str
    revision: str = ""
    token_from: str = ""
    allow: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DataSection:
    """Training data and the validation policy.

    Attributes:
        train: ms-swift JSONL file (`messages` + `images`, image paths relative to the file).
        eval: Held-out JSONL file; empty = split `eval_fraction` off `train`. Default "".
        eval_fraction: Fraction of `train` held out when `eval` is empty, 0 < f < 1. Default 0.1.
        max_invalid_fraction: Largest fraction of invalid lines tolerated (they are
            quarantined and reported); above it validation fails. Default 0.0.
        split_seed: Salt of the deterministic hash split. Default "split-v1".
        task: Check of the assistant answers: "" (none), "json" (fenced JSON) or
            "detection" (fenced JSON list of {label, bbox}). Default "".
    """

    train: str
    eval: str = ""
    eval_fraction: float = 0.1
    max_invalid_fraction: float = 0.0
    split_seed: str = "split-v1"
    task: str = ""


@dataclass(frozen=True)
class EvalSection:
    """Held-out evaluation and the promotion gate.

    Attributes:
        max_new_tokens: Greedy generation budget per sample, tokens. Default 512.
        batch_size: Samples generated together. Default 8.
        max_samples: Evaluate at most this many held-out samples; 0 = all. Default 0.
        iou_threshold: A predicted box matches a gold box of the same label at IoU >= this.
            Default 0.5.
        metric: Gate metric: one of f1, precision, recall, json_valid_rate,
            exact_match_rate. Default f1.
        min_value: The tuned model's metric must be at least this. Default 0.0.
        min_margin: ... and beat the reference (base) model by at least this. Default 0.0.
    """

    max_new_tokens: int = 512
    batch_size: int = 8
    max_samples: int = 0
    iou_threshold: float = 0.5
    metric: str = "f1"
    min_value: float = 0.0
    min_margin: float = 0.0


@dataclass(frozen=True)
class Config:
    """A whole validated config file."""

    pipeline: PipelineSection
    model: ModelSection
    data: DataSection
    swift: dict[str, Any] = field(default_factory=dict)
    eval: EvalSection = field(default_factory=EvalSection)
    path: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Returns the config as plain data (what gets logged and recorded)."""
        out = dataclasses.asdict(self)
        out.pop("path")
        return out


_GATE_METRICS = ("f1", "precision", "recall", "json_valid_rate", "exact_match_rate")


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is dict:
        return "a mapping"
    if typing.get_origin(tp) is list:
        return "a list of strings"
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _line_map(node: yaml.Node, prefix: str = "") -> dict[str, int]:
    """Maps dotted key paths to 1-based line numbers in the YAML source."""
    lines: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = f"{prefix}{key_node.value}"
            lines[key] = key_node.start_mark.line + 1
            lines.update(_line_map(value_node, key + "."))
    return lines


def _check_value(value: Any, tp: Any) -> Any:
    """Returns `value` converted to `tp`, or raises TypeError."""
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif typing.get_origin(tp) is dict:
        if isinstance(value, dict):
            return value
    elif typing.get_origin(tp) is list:
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
    raise TypeError


def _build_section(cls: type, raw: Any, name: str, where: typing.Callable[[str], str]) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where(name)}: section '{name}' must be a mapping of keys to values")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields), key=str)  # YAML keys may be non-strings (1, on, yes)
    if unknown:
        key = f"{name}.{unknown[0]}"
        raise ConfigError(
            f"{where(key)}: unknown key '{key}'; allowed keys in '{name}': {', '.join(fields)}"
        )
    values = {}
    for fname, f in fields.items():
        key = f"{name}.{fname}"
        if fname not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{where(name)}: missing required key '{key}' ({_type_name(hints[fname])})")
            continue
        try:
            values[fname] = _check_value(raw[fname], hints[fname])
        except TypeError:
            raise ConfigError(
                f"{where(key)}: '{key}' must be {_type_name(hints[fname])}, "
                f"got {json.dumps(raw[fname], default=str)}"
            ) from None
    return cls(**values)


def load_config(path: str | Path) -> Config:
    """Loads and validates one config file.

    Args:
        path: The YAML file.

    Returns:
        The validated `Config`.

    Raises:
        ConfigError: The file is missing or unreadable, not YAML, has an unknown key, a
            missing required key, or a value of the wrong type or range. The message names
            the file, the line and the key.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from None
    try:
        node = yaml.compose(text)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a config must be a mapping with sections pipeline, model, data, swift, eval")
    lines = _line_map(node) if node is not None else {}

    def where(key: str) -> str:
        line = lines.get(key) or lines.get(key.split(".")[0])
        return f"{path}:{line}" if line else str(path)

    sections = {"pipeline": PipelineSection, "model": ModelSection, "data": DataSection, "eval": EvalSection}
    unknown = sorted(map(str, set(raw) - set(sections) - {"swift"}))  # YAML keys may be non-strings
    if unknown:
        raise ConfigError(
            f"{where(unknown[0])}: unknown section '{unknown[0]}'; allowed: pipeline, model, data, swift, eval"
        )
    for required in ("pipeline", "model", "data"):
        if required not in raw:
            raise ConfigError(f"{path}: missing required section '{required}'")
    built = {name: _build_section(cls, raw[name], name, where) for name, cls in sections.items() if name in raw}
    swift = raw.get("swift") or {}
    if not isinstance(swift, dict):
        raise ConfigError(f"{where('swift')}: section 'swift' must be a mapping of ms-swift argument names to values")
    for key, value in swift.items():
        if not isinstance(value, (str, int, float, bool, list)) or value is None:
            raise ConfigError(
                f"{where('swift.' + str(key))}: 'swift.{key}' must be a string, number, boolean or list, got {value!r}"
            )
    cfg = Config(path=str(path), swift=dict(swift), **built)
    _check_ranges(cfg, where)
    return cfg


def _check_ranges(cfg: Config, where: typing.Callable[[str], str]) -> None:
    d, e = cfg.data, cfg.eval
    checks = [
        ("data.eval_fraction", 0.0 < d.eval_fraction < 1.0, "a number between 0 and 1 (exclusive)"),
        ("data.max_invalid_fraction", 0.0 <= d.max_invalid_fraction <= 1.0, "a number between 0 and 1"),
        ("data.task", d.task in ("", "json", "detection"), "'', 'json' or 'detection'"),
        ("eval.max_new_tokens", e.max_new_tokens > 0, "a positive integer"),
        ("eval.batch_size", e.batch_size > 0, "a positive integer"),
        ("eval.max_samples", e.max_samples >= 0, "0 (all) or a positive integer"),
        ("eval.iou_threshold", 0.0 < e.iou_threshold <= 1.0, "a number in (0, 1]"),
        ("eval.metric", e.metric in _GATE_METRICS, "one of " + ", ".join(_GATE_METRICS)),
        ("pipeline.name", _valid_name(cfg.pipeline.name), "lowercase letters, digits and '-', starting with a letter"),
        ("model.source", bool(cfg.model.source.strip()), "a model folder or URI"),
        ("model.cache", bool(cfg.model.cache.strip()), "a folder or gs:// URI"),
        ("model.token_from", _valid_token_ref(cfg.model.token_from),
         "'' or 'env:VAR' or 'projects/P/secrets/S[/versions/V]' (a reference, never the token itself)"),
        ("data.train", bool(cfg.data.train.strip()), "a JSONL path or URI"),
    ]
    for key, ok, expected in checks:
        if not ok:
            section, name = key.split(".")
            value = getattr(getattr(cfg, section), name)
            shown = "a value that is not a reference (not echoed)" if key == "model.token_from" else repr(value)
            raise ConfigError(f"{where(key)}: '{key}' must be {expected}, got {shown}")
    if "tuner_type" in cfg.swift and cfg.swift["tuner_type"] != "lora":
        raise ConfigError(f"{where('swift.tuner_type')}: 'swift.tuner_type' must be 'lora' (this pipeline trains LoRA adapters)")


def _valid_token_ref(ref: str) -> bool:
    return ref == "" or ref.startswith("env:") or ref.startswith("projects/")


def _valid_name(name: str) -> bool:
    return bool(name) and name[0].isalpha() and all(c.islower() or c.isdigit() or c == "-" for c in name)

