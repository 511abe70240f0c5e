"""Load-time refusals (issue 50): values that loaded and then meant something else, or failed hours later.

YAML 1.1 number and boolean forms, `pipeline.name` beyond what Vertex accepts, ms-swift enum values
checked against ms-swift's and transformers' own choices, gate thresholds outside the metric's range,
generation budgets, range-checked command-line numbers, `--dry-run` checking what the run checks,
and Vertex-only flags with `--local`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

import pytest

from components.common import cli_numbers
from components.common.swift import installed_sft_choices, pinned_sft_choices
from components.evaluate.metrics import GATE_METRIC_RANGES, GATE_METRICS
from pipelines._load_checks import MAX_NEW_TOKENS, MAX_PIPELINE_NAME
from pipelines.cli import main
from pipelines.config import ConfigError, load_config, parse_overrides
from tests.test_config import MINIMAL, error_of, line_of, write

REPO = Path(__file__).resolve().parent.parent
SEED = REPO / "configs" / "qwen3_vl_4b" / "lora_seed.yaml"

# --- YAML 1.1 forms: refused by name, with file:line ---------------------------------------


@pytest.mark.parametrize(
    "written, words",
    [
        ("017", "leading zero"),
        ("0o17", "octal"),
        ("0x1F", "hexadecimal"),
        ("0b101", "binary"),
        ("1:30", "base-60"),
        ("1_000", "'_' separators"),
        ("1_000.5", "'_' separators"),
    ],
)
def test_ambiguous_yaml_numbers_are_refused_with_file_line_and_key(tmp_path, written, words):
    text = MINIMAL + f"swift:\n  lora_rank: {written}\n"
    path = write(tmp_path, text)
    msg = error_of(path)
    assert msg.startswith(f"{path}:{line_of(text, 'lora_rank')}: 'swift.lora_rank: {written}' is "), msg
    assert words in msg and "\n" not in msg
    with pytest.raises(ConfigError, match=words):  # the override form too
        parse_overrides([f"swift.lora_rank={written}"])


@pytest.mark.parametrize("written", ["yes", "No", "ON", "off"])
def test_yaml_11_booleans_are_refused(tmp_path, written):
    text = MINIMAL.replace("  name: tiny-run\n", f"  name: tiny-run\n  enable_caching: {written}\n")
    msg = error_of(write(tmp_path, text))
    assert f"'pipeline.enable_caching: {written}' is a YAML 1.1 boolean" in msg and "true or false" in msg
    with pytest.raises(ConfigError, match="YAML 1.1 boolean"):
        parse_overrides([f"pipeline.enable_caching={written}"])


def test_unambiguous_forms_still_load(tmp_path):
    text = MINIMAL + "swift:\n  lora_rank: 17\n  learning_rate: 1.0e-4\n  seed: 0\n  system: '017'\n"
    text = text.replace("  name: tiny-run\n", "  name: tiny-run\n  enable_caching: false\n")
    cfg = load_config(write(tmp_path, text))
    assert cfg.swift["lora_rank"] == 17 and cfg.swift["system"] == "017" and cfg.pipeline.enable_caching is False
    assert parse_overrides(["swift.lora_rank='017'", "eval.min_margin=0.05"]) == {
        "swift.lora_rank": "017",
        "eval.min_margin": 0.05,
    }


# --- pipeline.name: what Vertex accepts -------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["рun", "run-é", "tiny-run-", "a" * (MAX_PIPELINE_NAME + 1), "Tiny", "1run", "tiny_run", ""]
)
def test_pipeline_names_vertex_refuses_are_refused(tmp_path, name):
    text = MINIMAL.replace("name: tiny-run", f"name: '{name}'")
    path = write(tmp_path, text)
    msg = error_of(path)
    assert msg.startswith(f"{path}:2:") and "'pipeline.name' must be lowercase letters, digits and '-'" in msg
    assert "ASCII" in msg and str(MAX_PIPELINE_NAME) in msg


def test_the_longest_name_makes_a_valid_vertex_job_id(tmp_path):
    from google.cloud.aiplatform.constants.pipeline import _VALID_NAME_PATTERN

    name = "a" + "-b" * ((MAX_PIPELINE_NAME - 1) // 2)
    assert len(name) <= MAX_PIPELINE_NAME
    cfg = load_config(write(tmp_path, MINIMAL.replace("name: tiny-run", f"name: {name}")))
    assert _VALID_NAME_PATTERN.match(f"{cfg.pipeline.name}-20261201235959")  # aiplatform's own job-ID rule
    assert not _VALID_NAME_PATTERN.match(f"{'a' * (MAX_PIPELINE_NAME + 1)}-20261201235959")


# --- swift enums: ms-swift's and transformers' own choices -------------------------------------


@pytest.mark.parametrize(
    "key, value, close",
    [
        ("optim", "bogus", None),
        ("lr_scheduler_type", "cosin", "cosine"),
        ("attn_impl", "flash", "flash_attn"),
        ("save_strategy", "step", "steps"),
        ("truncation_strategy", "middle", None),
        ("padding_side", "up", None),
    ],
)
def test_swift_enum_values_are_checked_at_load(key, value, close):
    with pytest.raises(ConfigError) as info:
        load_config(SEED, parse_overrides([f"swift.{key}={value}"]))
    msg = str(info.value)
    assert f"(override swift.{key}=" in msg and f"'swift.{key}' must be one of" in msg and repr(value) in msg
    if close:
        assert f"did you mean {close!r}" in msg


@pytest.mark.parametrize(
    "key, value",
    [
        ("optim", "adamw_torch_fused"),
        ("lr_scheduler_type", "cosine"),
        ("attn_impl", "sdpa"),
        ("attn_impl", "kernels-community/flash-attn"),
        ("save_strategy", "epoch"),
    ],
)
def test_swift_enum_values_ms_swift_takes_load(key, value):
    assert load_config(SEED, parse_overrides([f"swift.{key}={value}"])).swift[key] == value


def test_the_pinned_choices_are_the_installed_ms_swift_and_transformers():
    import json
    from importlib.metadata import version

    from components.common.swift import SFT_CHOICES_FILE

    pinned = json.loads(SFT_CHOICES_FILE.read_text())
    assert (pinned["ms_swift"], pinned["transformers"]) == (version("ms-swift"), version("transformers"))
    assert pinned_sft_choices() == installed_sft_choices()


# --- gate thresholds against the metric's range; generation budgets -----------------------------


@pytest.mark.parametrize("metric", GATE_METRICS)
@pytest.mark.parametrize("override, key", [("eval.min_value=2", "min_value"), ("eval.min_margin=1.5", "min_margin")])
def test_gate_thresholds_outside_the_metrics_range_are_refused(metric, override, key):
    low, high = GATE_METRIC_RANGES[metric]
    with pytest.raises(ConfigError) as info:
        load_config(SEED, parse_overrides([f"eval.metric={metric}", override]))
    msg = str(info.value)
    assert f"'eval.{key}'" in msg and repr(metric) in msg and f"{low:g}" in msg and "\n" not in msg


def test_gate_thresholds_inside_the_range_load():
    cfg = load_config(SEED, parse_overrides(["eval.min_value=1", "eval.min_margin=-0.02"]))
    assert (cfg.eval.min_value, cfg.eval.min_margin) == (1.0, -0.02)


def test_generation_budgets_are_bounded_and_checked_against_max_length():
    with pytest.raises(ConfigError, match=rf"'eval.max_new_tokens' is {MAX_NEW_TOKENS + 1}, above"):
        load_config(SEED, parse_overrides([f"eval.max_new_tokens={MAX_NEW_TOKENS + 1}", "swift.max_length=65536"]))
    with pytest.raises(ConfigError, match=r"more than swift.max_length 3000"):
        load_config(SEED, parse_overrides(["eval.max_new_tokens=3001"]))
    assert load_config(SEED, parse_overrides(["eval.max_new_tokens=3000"])).eval.max_new_tokens == 3000


# --- command-line numbers ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "factory, text",
    [
        (lambda: cli_numbers.positive(float), "nan"),
        (lambda: cli_numbers.positive(float), "inf"),
        (lambda: cli_numbers.positive(float), "0"),
        (lambda: cli_numbers.non_negative(int), "-1"),
        (lambda: cli_numbers.ranged(float, 0, 1), "1.5"),
        (lambda: cli_numbers.positive(int), "2.5"),
    ],
)
def test_number_types_refuse_out_of_range(factory, text):
    with pytest.raises(argparse.ArgumentTypeError):
        factory()(text)


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["validate", "x.jsonl", "--fetch-timeout", "nan"], "--fetch-timeout"),
        (["validate", "x.jsonl", "--max-length", "-1"], "--max-length"),
        (["validate", "x.jsonl", "--max-pixels", "-5"], "--max-pixels"),
        (["stage", "hf://a/b", "--cache", "c", "--workers", "0"], "--workers"),
        (["serve", "--port", "70000"], "--port"),
        (["serve", "--start-timeout", "-1"], "--start-timeout"),
        (["jobs", "ls", "--config", "lora_seed", "--limit", "-3"], "--limit"),
    ],
)
def test_cli_numbers_are_range_checked(argv, flag, capsys):
    with pytest.raises(SystemExit) as info:
        from importlib import import_module

        from pipelines.cli import COMMANDS

        import_module(COMMANDS[argv[0]][0]).main(argv[1:])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}:" in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["inf", "nan", "-1"])
def test_validate_fractions_are_refused_with_the_configs_rule(value, capsys):
    """--eval-fraction / --max-invalid-fraction: the rule of data.* in a config, in its words (one line, exit 2)."""
    from components.validate_data.__main__ import main as validate

    assert validate(["x.jsonl", "--eval-fraction", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("validate-data: --eval-fraction must be") and "data.eval_fraction" in err
    assert err.count("\n") == 1 and "Traceback" not in err


# --- --dry-run checks what the run checks; Vertex-only flags with --local -----------------------


def test_dry_run_refuses_a_root_the_real_run_refuses(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    root = blocker / "runs"  # under a file: the real run refuses it before any task
    assert main(["run", "--local", "--dry-run", "--root", str(root)]) == 2
    dry = capsys.readouterr().err
    assert "--root" in dry and "which is a file" in dry
    from pipelines.config import DEFAULT_LOCAL_CONFIG
    from pipelines.local_run import RunError, run_local

    with pytest.raises(ConfigError, match="which is a file"):  # the same refusal, from the real run
        try:
            run_local(load_config(DEFAULT_LOCAL_CONFIG), str(root), None)
        except RunError:
            pytest.fail("refused later than the root check")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write any folder")
def test_dry_run_refuses_an_unwritable_root(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert main(["run", "--local", "--dry-run", "--root", str(locked / "runs")]) == 2
    assert "not writable" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--wait"], ["--project", "p"], ["--wait", "--project", "p"]])
def test_vertex_only_flags_with_local_are_refused(flags, capsys):
    assert main(["run", "--local", *flags]) == 2
    err = capsys.readouterr().err
    assert "for a Vertex run" in err and all(f in err for f in flags if f.startswith("--"))
    assert err.count("\n") == 1


def test_cli_dry_run_vertex_flags_are_refused_in_a_subprocess(tmp_path):
    import subprocess

    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "run", "--local", "--dry-run", "--wait"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr and "--wait" in result.stderr


def test_nothing_refused_before_is_accepted_now():
    """The checks only add refusals: the shipped configs load, and every earlier refusal still stands."""
    for bad in ("pipeline.name=Tiny", "eval.max_new_tokens=0", "swift.tuner_type=full", "eval.metric=bleu"):
        with pytest.raises(ConfigError):
            load_config(SEED, parse_overrides([bad]))
    assert dataclasses.is_dataclass(load_config(SEED))
