"""Tests of pipelines.config.load_config on hand-written YAML files."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from components.evaluate.settings import EvalSettings
from pipelines.config import (
    CONFIG_DIR,
    Config,
    ConfigError,
    DataSection,
    load_config,
)

MINIMAL = """\
pipeline:
  name: tiny-run
model:
  source: /models/qwen3-vl-4b
  cache: /cache/models
data:
  train: data/train.jsonl
"""


def write(tmp_path: Path, text: str, name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def error_of(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return str(info.value)


def line_of(text: str, needle: str) -> int:
    """1-based number of the first line of `text` that contains `needle`."""
    for number, line in enumerate(textwrap.dedent(text).splitlines(), start=1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in text")


# --- valid configs -----------------------------------------------------------------


def test_minimal_config_loads_with_defaults(tmp_path):
    path = write(tmp_path, MINIMAL)
    cfg = load_config(path)
    assert isinstance(cfg, Config)
    assert cfg.path == str(path)
    assert cfg.pipeline.name == "tiny-run"
    assert cfg.pipeline.root == "runs"
    assert cfg.pipeline.enable_caching is True
    assert cfg.model.source == "/models/qwen3-vl-4b"
    assert cfg.model.cache == "/cache/models"
    assert cfg.data == DataSection(train="data/train.jsonl")
    assert cfg.data.eval == ""
    assert cfg.data.eval_fraction == 0.1
    assert cfg.data.max_invalid_fraction == 0.0
    assert cfg.data.split_seed == "split-v1"
    assert cfg.eval == EvalSettings()
    assert cfg.eval.metric == "f1"
    assert cfg.eval.batch_size == 8
    assert cfg.swift == {}


def test_full_config_values_are_kept_and_ints_become_floats(tmp_path):
    text = MINIMAL + textwrap.dedent(
        """\
        swift:
          lora_rank: 16
          learning_rate: 1.0e-4
          target_modules: [all-linear]
          gradient_checkpointing: true
          tuner_type: lora
        eval:
          batch_size: 2
          max_samples: 0
          iou_threshold: 1
          metric: recall
          min_value: 0
          min_margin: 0.05
        """
    )
    cfg = load_config(write(tmp_path, text))
    assert cfg.swift == {
        "lora_rank": 16,
        "learning_rate": 1.0e-4,
        "target_modules": ["all-linear"],
        "gradient_checkpointing": True,
        "tuner_type": "lora",
    }
    assert cfg.eval.batch_size == 2
    assert cfg.eval.metric == "recall"
    # an integer given for a float field is accepted and converted
    assert cfg.eval.iou_threshold == 1.0 and isinstance(cfg.eval.iou_threshold, float)
    assert isinstance(cfg.eval.min_value, float)
    d = cfg.to_dict()
    assert "path" not in d
    assert d["eval"]["min_margin"] == 0.05
    assert d["swift"]["lora_rank"] == 16
    assert d["pipeline"] == {"name": "tiny-run", "root": "runs", "enable_caching": True}


def test_empty_swift_section_is_an_empty_mapping(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL + "swift:\n"))
    assert cfg.swift == {}


# --- unknown sections and keys -----------------------------------------------------


def test_unknown_section_names_file_line_and_allowed_sections(tmp_path):
    text = MINIMAL + "trainer:\n  lr: 1\n"
    path = write(tmp_path, text)
    msg = error_of(path)
    assert f"{path}:{line_of(text, 'trainer:')}:" in msg
    assert "unknown section 'trainer'" in msg
    for section in ("pipeline", "model", "data", "swift", "eval"):
        assert section in msg


def test_unknown_key_names_file_line_key_and_allowed_keys(tmp_path):
    text = """\
    pipeline:
      name: tiny-run
    model:
      source: /models/x
      cache: /cache
    data:
      train: train.jsonl
      eval_fracton: 0.2
    """
    path = write(tmp_path, text)
    msg = error_of(path)
    assert msg.startswith(f"{path}:8:")
    assert line_of(text, "eval_fracton") == 8
    assert "unknown key 'data.eval_fracton'" in msg
    allowed = msg.split("allowed keys in 'data':", 1)[1]
    for key in ("train", "eval", "eval_fraction", "max_invalid_fraction", "split_seed"):
        assert re.search(rf"\b{key}\b", allowed)


def test_unknown_key_in_eval_section_line(tmp_path):
    text = MINIMAL + "eval:\n  batch_size: 4\n  metrik: f1\n"
    path = write(tmp_path, text)
    msg = error_of(path)
    assert f"{path}:{line_of(text, 'metrik')}:" in msg
    assert "'eval.metrik'" in msg
    assert "metric" in msg.split("allowed keys", 1)[1]


def test_non_string_top_level_key_is_a_config_error(tmp_path):
    # regression: an integer key used to crash with AttributeError instead of ConfigError
    text = MINIMAL + "1: foo\n"
    path = write(tmp_path, text)
    msg = error_of(path)
    assert msg.startswith(f"{path}:{line_of(text, '1: foo')}:")
    assert "unknown section '1'" in msg


def test_yaml_boolean_key_next_to_unknown_key_is_a_config_error(tmp_path):
    # regression: `on:` loads as the boolean True; sorting it with a string key used to
    # raise TypeError instead of ConfigError
    text = MINIMAL.replace("  name: tiny-run\n", "  name: tiny-run\n  on: true\n  zz: 1\n")
    msg = error_of(write(tmp_path, text))
    assert "unknown key 'pipeline." in msg
    assert "allowed keys in 'pipeline': name, root, enable_caching" in msg


# --- missing sections / keys -------------------------------------------------------


@pytest.mark.parametrize("section", ["pipeline", "model", "data"])
def test_missing_required_section(tmp_path, section):
    sections = {
        "pipeline": "pipeline:\n  name: tiny-run\n",
        "model": "model:\n  source: /m\n  cache: /c\n",
        "data": "data:\n  train: t.jsonl\n",
    }
    text = "".join(v for k, v in sections.items() if k != section)
    msg = error_of(write(tmp_path, text))
    assert f"missing required section '{section}'" in msg


@pytest.mark.parametrize(
    "drop_line, key",
    [
        ("  name: tiny-run\n", "pipeline.name"),
        ("  cache: /cache/models\n", "model.cache"),
        ("  train: data/train.jsonl\n", "data.train"),
    ],
)
def test_missing_required_key_names_key_and_section_line(tmp_path, drop_line, key):
    assert drop_line in MINIMAL
    text = MINIMAL.replace(drop_line, "")
    # keep every section a non-empty mapping, so only the one key is missing
    text = text.replace("pipeline:\n", "pipeline:\n  root: runs\n")
    text = text.replace("data:\n", "data:\n  split_seed: s\n")
    path = write(tmp_path, text)
    msg = error_of(path)
    section = key.split(".")[0]
    assert f"missing required key '{key}'" in msg
    assert f"{path}:{line_of(text, section + ':')}:" in msg
    assert "a string" in msg


def test_section_that_is_not_a_mapping(tmp_path):
    text = MINIMAL.replace("data:\n  train: data/train.jsonl\n", "data: train.jsonl\n")
    path = write(tmp_path, text)
    msg = error_of(path)
    assert "section 'data' must be a mapping" in msg
    assert f"{path}:{line_of(text, 'data:')}" in msg


# --- wrong types -------------------------------------------------------------------


def test_string_for_int_names_key_line_and_value(tmp_path):
    text = MINIMAL + 'eval:\n  batch_size: "eight"\n'
    path = write(tmp_path, text)
    msg = error_of(path)
    assert msg.startswith(f"{path}:{line_of(text, 'batch_size')}:")
    assert "'eval.batch_size' must be an integer" in msg
    assert '"eight"' in msg


@pytest.mark.parametrize(
    "snippet, key, expected",
    [
        ("eval:\n  batch_size: true\n", "eval.batch_size", "an integer"),
        ("eval:\n  max_new_tokens: 8.5\n", "eval.max_new_tokens", "an integer"),
        ("eval:\n  min_value: false\n", "eval.min_value", "a number"),
        ("eval:\n  iou_threshold: high\n", "eval.iou_threshold", "a number"),
        ("eval:\n  metric: 1\n", "eval.metric", "a string"),
    ],
)
def test_wrong_types_are_rejected(tmp_path, snippet, key, expected):
    text = MINIMAL + snippet
    path = write(tmp_path, text)
    msg = error_of(path)
    assert f"'{key}' must be {expected}" in msg
    assert msg.startswith(f"{path}:{line_of(text, key.split('.')[1])}:")


def test_string_for_bool_is_rejected(tmp_path):
    text = MINIMAL.replace("  name: tiny-run\n", "  name: tiny-run\n  enable_caching: 'no'\n")
    msg = error_of(write(tmp_path, text))
    assert "'pipeline.enable_caching' must be true or false" in msg


def test_number_for_string_is_rejected(tmp_path):
    text = MINIMAL.replace("  train: data/train.jsonl\n", "  train: 42\n")
    msg = error_of(write(tmp_path, text))
    assert "'data.train' must be a string" in msg


# --- ranges ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "snippet, key",
    [
        ("data:\n  train: t.jsonl\n  eval_fraction: 0\n", "data.eval_fraction"),
        ("data:\n  train: t.jsonl\n  eval_fraction: 1\n", "data.eval_fraction"),
        ("data:\n  train: t.jsonl\n  eval_fraction: -0.1\n", "data.eval_fraction"),
        ("data:\n  train: t.jsonl\n  max_invalid_fraction: 1.5\n", "data.max_invalid_fraction"),
        ("data:\n  train: '  '\n", "data.train"),
    ],
)
def test_out_of_range_data_values(tmp_path, snippet, key):
    text = MINIMAL.replace("data:\n  train: data/train.jsonl\n", snippet)
    path = write(tmp_path, text)
    msg = error_of(path)
    assert f"'{key}' must be" in msg
    assert msg.startswith(f"{path}:{line_of(text, key.split('.')[1] + ':')}:")


@pytest.mark.parametrize("value", [0.5, 0.01, 0.99])
def test_eval_fraction_inside_range_is_accepted(tmp_path, value):
    text = MINIMAL.replace("  train: data/train.jsonl\n", f"  train: data/train.jsonl\n  eval_fraction: {value}\n")
    assert load_config(write(tmp_path, text)).data.eval_fraction == value


@pytest.mark.parametrize("name", ["Tiny-Run", "1run", "tiny_run", "tiny run", "-run", ""])
def test_bad_pipeline_name(tmp_path, name):
    text = MINIMAL.replace("name: tiny-run", f"name: '{name}'")
    path = write(tmp_path, text)
    msg = error_of(path)
    assert "'pipeline.name' must be lowercase letters, digits and '-'" in msg
    assert msg.startswith(f"{path}:2:")
    assert repr(name) in msg


@pytest.mark.parametrize("name", ["a", "run-2", "qwen3-vl-4b-lora"])
def test_good_pipeline_names(tmp_path, name):
    text = MINIMAL.replace("name: tiny-run", f"name: {name}")
    assert load_config(write(tmp_path, text)).pipeline.name == name


@pytest.mark.parametrize(
    "snippet, key",
    [
        ("eval:\n  metric: accuracy\n", "eval.metric"),
        ("eval:\n  metric: F1\n", "eval.metric"),
        ("eval:\n  batch_size: 0\n", "eval.batch_size"),
        ("eval:\n  max_new_tokens: -1\n", "eval.max_new_tokens"),
        ("eval:\n  max_samples: -1\n", "eval.max_samples"),
        ("eval:\n  iou_threshold: 0\n", "eval.iou_threshold"),
        ("eval:\n  iou_threshold: 1.01\n", "eval.iou_threshold"),
    ],
)
def test_out_of_range_eval_values(tmp_path, snippet, key):
    text = MINIMAL + snippet
    path = write(tmp_path, text)
    msg = error_of(path)
    assert f"'{key}' must be" in msg
    assert msg.startswith(f"{path}:{line_of(text, key.split('.')[1] + ':')}:")


def test_bad_metric_lists_allowed_metrics(tmp_path):
    msg = error_of(write(tmp_path, MINIMAL + "eval:\n  metric: accuracy\n"))
    for metric in ("f1", "precision", "recall", "json_valid_rate", "exact_match_rate"):
        assert metric in msg
    assert "'accuracy'" in msg


@pytest.mark.parametrize("metric", ["f1", "precision", "recall", "json_valid_rate", "exact_match_rate"])
def test_every_gate_metric_is_accepted(tmp_path, metric):
    assert load_config(write(tmp_path, MINIMAL + f"eval:\n  metric: {metric}\n")).eval.metric == metric


# --- eval.reference and the registry names it depends on ---------------------------


def test_reference_defaults_to_auto(tmp_path):
    assert load_config(write(tmp_path, MINIMAL)).eval.reference == "auto"


@pytest.mark.parametrize("value", ["auto", "base", "champion", "gs://bucket/models/merged", "/gcs/bucket/merged"])
def test_reference_keywords_and_uris_are_accepted(tmp_path, value):
    assert load_config(write(tmp_path, MINIMAL + f"eval:\n  reference: {value}\n")).eval.reference == value


def test_reference_local_model_folder_is_accepted(tmp_path):
    model = tmp_path / "golden"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert load_config(write(tmp_path, MINIMAL + f"eval:\n  reference: {model}\n")).eval.reference == str(model)


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("champ", "not found (expected auto, base, champion"),
        ("gs://bucket", "must name a folder"),
        ("hf://Qwen/Qwen3-VL-4B-Instruct", "no other URI schemes"),
        ("'  '", "must be auto, base, champion"),
    ],
)
def test_bad_reference_names_file_line_and_choices(tmp_path, value, fragment):
    text = MINIMAL + f"eval:\n  metric: f1\n  reference: {value}\n"
    path = write(tmp_path, text)
    msg = error_of(path)
    assert msg.startswith(f"{path}:{line_of(text, 'reference:')}: 'eval.reference'"), msg
    assert fragment in msg


def test_reference_folder_without_config_json_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    msg = error_of(write(tmp_path, MINIMAL + f"eval:\n  reference: {tmp_path / 'empty'}\n"))
    assert "has no config.json" in msg


def test_reference_must_be_a_string(tmp_path):
    msg = error_of(write(tmp_path, MINIMAL + "eval:\n  reference: 3\n"))
    assert "'eval.reference' must be a string, got 3" in msg


def test_champion_reference_needs_an_alias(tmp_path):
    text = MINIMAL + "eval:\n  reference: champion\nregister:\n  alias: ''\n"
    path = write(tmp_path, text)
    msg = error_of(path)
    assert msg.startswith(f"{path}:{line_of(text, 'reference:')}:") and "'register.alias' is empty" in msg


@pytest.mark.parametrize(
    "key, value",
    [
        ("model_id", "9-drawings"),
        ("model_id", "Qwen-Drawings"),
        ("model_id", "a" * 64),
        ("model_id", "-x"),
        ("alias", "Champion"),
        ("alias", "42"),
        ("alias", "best-"),
        ("alias", "c"),
    ],
)
def test_bad_register_ids_name_file_and_line(tmp_path, key, value):
    text = MINIMAL + f"register:\n  {key}: '{value}'\n"
    path = write(tmp_path, text)
    msg = error_of(path)
    assert msg.startswith(f"{path}:{line_of(text, key + ':')}: 'register.{key}' must be"), msg


@pytest.mark.parametrize(
    "key, value",
    [("model_id", "qwen3_vl-drawings"), ("alias", "champion"), ("alias", "prod-v2"), ("alias", "bestModel1")],
)
def test_good_register_ids(tmp_path, key, value):
    cfg = load_config(write(tmp_path, MINIMAL + f"register:\n  {key}: {value}\n"))
    assert getattr(cfg.register, key) == value


# --- swift section -----------------------------------------------------------------


def test_swift_value_that_is_a_mapping_is_rejected(tmp_path):
    text = MINIMAL + "swift:\n  lora_rank: 8\n  deepspeed:\n    stage: 2\n"
    path = write(tmp_path, text)
    msg = error_of(path)
    assert msg.startswith(f"{path}:{line_of(text, 'deepspeed:')}:")
    assert "'swift.deepspeed' must be a string, number, boolean or list" in msg


def test_swift_null_value_is_rejected(tmp_path):
    text = MINIMAL + "swift:\n  lora_rank:\n"
    msg = error_of(write(tmp_path, text))
    assert "'swift.lora_rank'" in msg


def test_swift_section_that_is_a_list_is_rejected(tmp_path):
    text = MINIMAL + "swift:\n  - lora_rank\n"
    msg = error_of(write(tmp_path, text))
    assert "section 'swift' must be a mapping" in msg


def test_swift_tuner_type_must_be_lora(tmp_path):
    msg = error_of(write(tmp_path, MINIMAL + "swift:\n  tuner_type: full\n"))
    assert "'swift.tuner_type' must be 'lora'" in msg


# --- unreadable files --------------------------------------------------------------


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    msg = error_of(path)
    assert str(path) in msg
    assert "not found" in msg


def test_invalid_yaml(tmp_path):
    path = write(tmp_path, "pipeline:\n  name: [unclosed\nmodel: {\n")
    msg = error_of(path)
    assert str(path) in msg
    assert "not valid YAML" in msg


def test_yaml_that_is_not_a_mapping(tmp_path):
    for i, text in enumerate(["- a\n- b\n", "just a sentence\n", ""]):
        path = write(tmp_path, text, f"c{i}.yaml")
        msg = error_of(path)
        assert str(path) in msg
        assert "must be a mapping" in msg


def test_binary_file(tmp_path):
    path = tmp_path / "weights.yaml"
    path.write_bytes(b"\xff\xfe\x00\x81binary\x00")
    msg = error_of(path)
    assert str(path) in msg
    assert "cannot read config" in msg


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


# --- the repository's own configs --------------------------------------------------

REPO_CONFIGS = sorted(CONFIG_DIR.glob("**/*.yaml"))


@pytest.mark.parametrize("path", REPO_CONFIGS, ids=[str(p.relative_to(CONFIG_DIR)) for p in REPO_CONFIGS])
def test_repository_config_loads(path):
    cfg = load_config(path)
    assert cfg.path == str(path)
    assert cfg.pipeline.name


def test_expected_repository_configs_exist():
    for rel in ("local/tiny_cpu.yaml", "qwen3_vl_4b/lora_seed.yaml"):
        assert (CONFIG_DIR / rel).is_file(), f"configs/{rel} is missing"


@pytest.mark.parametrize("value", ["quarantine", "error", "warn"])
def test_data_leakage_modes_load(tmp_path, value):
    text = MINIMAL.replace("  train: data/train.jsonl\n", f"  train: data/train.jsonl\n  leakage: {value}\n")
    assert load_config(write(tmp_path, text)).data.leakage == value


def test_data_leakage_defaults_to_quarantine_and_bad_values_are_named(tmp_path):
    assert load_config(write(tmp_path, MINIMAL)).data.leakage == "quarantine"
    text = MINIMAL.replace("  train: data/train.jsonl\n", "  train: data/train.jsonl\n  leakage: ignore\n")
    message = error_of(write(tmp_path, text, "bad.yaml"))
    assert "'data.leakage' must be one of quarantine, error, warn, got 'ignore'" in message


def test_nan_eval_fraction_is_refused(tmp_path):
    text = MINIMAL.replace("  train: data/train.jsonl\n", "  train: data/train.jsonl\n  eval_fraction: .nan\n")
    assert "data.eval_fraction" in error_of(write(tmp_path, text))
