"""Careless and hostile config files (issue #21): named errors, never last-wins, hangs or tracebacks.

Each case is a small generated YAML; the CLI cases run `python -m pipelines.compile` (and
one `python -m pipelines.run --local`) in a subprocess and check the exit code, the one-line
message, that no traceback is printed, and that nothing was written.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import pipelines.config as config
from pipelines.config import ConfigError, load_config
from tests.test_config import MINIMAL, error_of, write  # the shared config-test helpers

REPO = Path(__file__).resolve().parent.parent

HF_TOKEN = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWx" + "0123456789"  # token-shaped, not a real token


def line_of(text: str, needle: str, start: int = 1) -> int:
    """1-based number of the first line at or after `start` that contains `needle`."""
    for number, line in enumerate(textwrap.dedent(text).splitlines(), start=1):
        if number >= start and needle in line:
            return number
    raise AssertionError(f"{needle!r} not in text")


def bomb(kind: str, levels: int = 9) -> str:
    """A "billion laughs" section: 9 aliases per level, 9**levels values once expanded."""
    if kind == "list":
        lines = ["swift:", '  a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
        lines += [f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels + 1)]
    else:
        lines = ["vertex:", "  labels:", "    x0: &x0 {a: lol, b: lol, c: lol, d: lol, e: lol, f: lol, g: lol, h: lol}"]
        lines += [
            f"    x{i}: &x{i} {{" + ", ".join(f"k{j}: *x{i - 1}" for j in range(9)) + "}" for i in range(1, levels + 1)
        ]
    return MINIMAL + "\n".join(lines) + "\n"


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )


# --- duplicate keys: never "last one wins" ------------------------------------------


def test_duplicate_section_is_named_with_both_lines(tmp_path):
    text = MINIMAL + "eval:\n  min_margin: 0.1\nswift:\n  lora_rank: 8\neval:\n  min_margin: 0.0\n"
    path = write(tmp_path, text)
    msg = error_of(path)
    first, second = line_of(text, "eval:"), line_of(text, "eval:", line_of(text, "eval:") + 1)
    assert msg == f"{path}:{second}: duplicate key 'eval' (first at line {first}); keep one"


def test_duplicate_key_inside_a_section(tmp_path):
    text = MINIMAL + "eval:\n  min_margin: 0.1\n  metric: f1\n  min_margin: 0.0\n"
    path = write(tmp_path, text)
    msg = error_of(path)
    first = line_of(text, "min_margin")
    assert msg == (
        f"{path}:{line_of(text, 'min_margin', first + 1)}: duplicate key 'eval.min_margin' "
        f"(first at line {first}); keep one"
    )


def test_duplicate_key_in_a_mapping_inside_a_list(tmp_path):
    text = MINIMAL + "swift:\n  x:\n    - {a: 1, a: 2}\n"
    msg = error_of(write(tmp_path, text))
    assert "duplicate key 'swift.x[0].a'" in msg


def test_keys_that_load_the_same_are_duplicates(tmp_path):
    # `on` and `true` are both the boolean True in YAML 1.1: the second would replace the first
    text = MINIMAL.replace("  name: tiny-run\n", "  name: tiny-run\n  on: 1\n  true: 2\n")
    msg = error_of(write(tmp_path, text))
    assert "duplicate key 'pipeline.True' (first at line 3 as 'on')" in msg


def test_a_merge_key_may_be_overridden(tmp_path):
    text = MINIMAL + "vertex:\n  labels:\n    <<: {app: a, team: b}\n    app: c\n"
    assert load_config(write(tmp_path, text)).vertex.labels == {"app": "c", "team": "b"}


# --- alias bombs, size, depth ------------------------------------------------------


@pytest.mark.parametrize("kind", ["list", "mapping"])
def test_alias_bomb_is_refused_fast(tmp_path, kind):
    text = bomb(kind)
    path = write(tmp_path, text)
    start = time.monotonic()
    msg = error_of(path)
    assert time.monotonic() - start < 30  # a hang guard (unbounded before #21): the refusal takes well under 1 s
    assert f"more than {config.MAX_YAML_NODES} values once its aliases (*name) are expanded" in msg
    assert "a config needs no anchors (&name) or aliases (*name)" in msg
    assert msg.startswith(f"{path}:")


def test_too_many_aliases_are_refused(tmp_path):
    text = MINIMAL + "swift:\n  a: &a 1\n  l: [" + ", ".join(["*a"] * 101) + "]\n"
    msg = error_of(write(tmp_path, text))
    assert "uses more than 100 aliases" in msg


def test_a_recursive_alias_is_refused(tmp_path):
    msg = error_of(write(tmp_path, MINIMAL + "swift:\n  x: &a [1, *a]\n"))
    assert "alias *a is inside its own anchor" in msg


def test_a_few_anchors_still_load(tmp_path):
    text = MINIMAL + "swift:\n  target_modules: &m [q_proj, v_proj]\nvertex:\n  labels: {a: &v x, b: *v}\n"
    cfg = load_config(write(tmp_path, text))
    assert cfg.swift["target_modules"] == ["q_proj", "v_proj"] and cfg.vertex.labels == {"a": "x", "b": "x"}


def test_too_many_values_without_aliases(tmp_path):
    text = MINIMAL + "vertex:\n  labels:\n" + "".join(f"    k{i}: v\n" for i in range(12_000))
    msg = error_of(write(tmp_path, text))
    assert f"more than {config.MAX_YAML_NODES} values;" in msg


@pytest.mark.parametrize("nested", ["[" * 2000 + "]" * 2000, "{a: " * 300 + "1" + "}" * 300])
def test_deep_nesting_is_refused_not_a_recursion_error(tmp_path, nested):
    msg = error_of(write(tmp_path, MINIMAL + f"swift:\n  x: {nested}\n"))
    assert f"nests more than {config.MAX_YAML_DEPTH} levels deep" in msg


def test_file_over_1_mib_is_refused_before_parsing(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(MINIMAL + "swift: [unclosed\n" + "#" * (1 << 20), encoding="utf-8")  # invalid YAML too
    msg = error_of(path)
    assert msg.startswith(f"{path}: config is larger than 1 MiB")


def test_a_folder_is_not_a_config(tmp_path):
    assert "is a folder, not a config file" in error_of(tmp_path)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_a_device_is_not_read_forever():
    assert "not a regular file" in error_of(Path("/dev/zero"))


def test_a_number_of_thousands_of_digits_is_a_config_error(tmp_path):
    msg = error_of(write(tmp_path, MINIMAL + "eval:\n  max_samples: " + "9" * 5000 + "\n"))
    assert "not valid YAML: a number is too long" in msg


def test_an_integer_past_64_bits_is_refused(tmp_path):
    text = MINIMAL + "eval:\n  max_samples: " + "9" * 400 + "\n"
    path = write(tmp_path, text)
    assert error_of(path).startswith(f"{path}:{line_of(text, 'max_samples')}: 'eval.max_samples' must be an integer")


# --- non-finite numbers ------------------------------------------------------------


@pytest.mark.parametrize(
    "snippet, key",
    [
        ("eval:\n  min_margin: .inf\n", "eval.min_margin"),
        ("eval:\n  min_value: .nan\n", "eval.min_value"),
        ("eval:\n  iou_threshold: -.inf\n", "eval.iou_threshold"),
        ("data:\n  train: t.jsonl\n  max_invalid_fraction: .NaN\n", "data.max_invalid_fraction"),
        ("swift:\n  learning_rate: .inf\n", "swift.learning_rate"),
        ("swift:\n  lora_dropout: .nan\n", "swift.lora_dropout"),
        ("swift:\n  some_future_arg: [1.0, .inf]\n", "swift.some_future_arg"),
        ("vertex:\n  labels: {app: .inf}\n", "vertex.labels.app"),
    ],
)
def test_non_finite_numbers_are_refused(tmp_path, snippet, key):
    base = MINIMAL.replace("data:\n  train: data/train.jsonl\n", "") if snippet.startswith("data:") else MINIMAL
    text = base + snippet
    path = write(tmp_path, text)
    msg = error_of(path)
    assert msg.startswith(f"{path}:{line_of(text, key.split('.')[1] + ':')}: '{key}' must be a finite number"), msg


# --- a token where its name belongs ------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        f"env:{HF_TOKEN}",
        HF_TOKEN,
        "env:hf_token",
        "env:my-token",
        "env:" + "Zx9Qp2Lm7Rt4Wv8Ks3Nb",  # high entropy, mixed case and digits
        "env:" + "a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8",  # 36 hex characters
        "ms-12345678-abcd-ef01-2345-6789abcdef01",
        f"projects/p/secrets/{HF_TOKEN}",
    ],
)
def test_token_from_that_looks_like_a_token_is_refused_unechoed(tmp_path, value):
    text = MINIMAL.replace("  cache: /cache/models\n", f"  cache: /cache/models\n  token_from: '{value}'\n")
    path = write(tmp_path, text)
    msg = error_of(path)
    assert msg.startswith(f"{path}:{line_of(text, 'token_from')}: model.token_from looks like a token itself")
    assert "env:HF_TOKEN" in msg
    assert value not in msg and value.removeprefix("env:") not in msg


def test_token_from_that_is_no_reference_is_refused_unechoed(tmp_path):
    text = MINIMAL.replace("  cache: /cache/models\n", "  cache: /cache/models\n  token_from: my token\n")
    msg = error_of(write(tmp_path, text))
    assert "'model.token_from' must be '' or 'env:VAR'" in msg and "my token" not in msg


@pytest.mark.parametrize(
    "value",
    ["env:HF_TOKEN", "env:my_hub_token", "projects/p/secrets/hf-token", "projects/p/secrets/hf_token/versions/3"],
)
def test_token_references_are_accepted(tmp_path, value):
    text = MINIMAL.replace("  cache: /cache/models\n", f"  cache: /cache/models\n  token_from: {value}\n")
    assert load_config(write(tmp_path, text)).model.token_from == value


def test_a_token_under_any_other_key_is_refused_unechoed(tmp_path):
    text = MINIMAL + f"swift:\n  report_to: [tensorboard, {HF_TOKEN}]\n"
    msg = error_of(write(tmp_path, text))
    assert "'swift.report_to' holds what looks like a hub token" in msg and HF_TOKEN not in msg


def test_swift_hub_token_is_refused(tmp_path):
    msg = error_of(write(tmp_path, MINIMAL + "swift:\n  hub_token: secret123\n"))
    assert "'swift.hub_token' puts a token in the config" in msg and "secret123" not in msg


def test_a_yaml_error_does_not_echo_the_line(tmp_path):
    text = MINIMAL.replace("  cache: /cache/models\n", f"  cache: /cache/models\n  token_from: env:{HF_TOKEN}: x\n")
    path = write(tmp_path, text)
    msg = error_of(path)
    assert msg.startswith(f"{path}:{line_of(text, 'token_from')}:") and "not valid YAML" in msg
    assert HF_TOKEN not in msg


# --- local pipeline root and model cache -------------------------------------------


@pytest.mark.parametrize("key", ["pipeline.root", "model.cache"])
def test_local_folder_under_a_file_is_refused_at_load(tmp_path, key):
    (tmp_path / "notes.txt").write_text("x")
    inside = tmp_path / "notes.txt" / "sub"
    if key == "pipeline.root":
        text = MINIMAL.replace("  name: tiny-run\n", f"  name: tiny-run\n  root: {inside}\n")
    else:
        text = MINIMAL.replace("cache: /cache/models", f"cache: {inside}")
    path = write(tmp_path, text)
    msg = error_of(path)
    name = key.split(".")[1]
    assert msg.startswith(
        f"{path}:{line_of(text, name + ':')}: '{key}' '{inside}' is inside '{tmp_path / 'notes.txt'}'"
    )
    assert "which is a file, not a folder" in msg


def test_gs_root_and_cache_are_not_checked_locally(tmp_path):
    text = MINIMAL.replace("  name: tiny-run\n", "  name: tiny-run\n  root: gs://b/root\n").replace(
        "/cache/models", "gs://b/models"
    )
    cfg = load_config(write(tmp_path, text))
    config.check_local_dirs(cfg)
    assert config.local_dir_problem("gs://b/x") is None


def test_local_dir_problem_unwritable_folder(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == ro else real_access(p, mode))
    problem = config.local_dir_problem(str(ro / "runs"))
    assert f"{str(ro)!r} is not writable by this user" in problem
    assert config.local_dir_problem(str(ro / "runs"), writable=False) is None
    assert config.local_dir_problem(str(tmp_path / "new" / "runs")) is None


def test_check_local_dirs_names_the_key_its_line_or_the_option(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    text = MINIMAL.replace("  name: tiny-run\n", f"  name: tiny-run\n  root: {ro / 'runs'}\n").replace(
        "/cache/models", str(tmp_path / "cache")
    )
    path = write(tmp_path, text)
    cfg = load_config(path)  # loading does not check writability: the run may happen elsewhere
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == ro else real_access(p, mode))
    with pytest.raises(ConfigError, match=rf"^{path}:{line_of(text, 'root:')}: 'pipeline.root' .* is not writable"):
        config.check_local_dirs(cfg)
    with pytest.raises(ConfigError, match=r"^--root .* is not writable"):
        config.check_local_dirs(cfg, root_from="--root")


# --- swift values checked when the config loads ------------------------------------


@pytest.mark.parametrize(
    "name, value, expected",
    [
        ("num_train_epochs", "-1", "a number > 0"),
        ("num_train_epochs", "0", "a number > 0"),
        ("learning_rate", "fast", "a number > 0"),
        ("learning_rate", "0", "a number > 0"),
        ("learning_rate", "1e-4", "write it with a dot"),
        ("max_steps", "0", "-1 (use num_train_epochs) or a positive integer"),
        ("max_steps", "2.5", "-1 (use num_train_epochs) or a positive integer"),
        ("per_device_train_batch_size", "0", "a positive integer"),
        ("per_device_eval_batch_size", "two", "a positive integer"),
        ("gradient_accumulation_steps", "2.0", "a positive integer"),
        ("lora_rank", "-8", "a positive integer"),
        ("lora_rank", "true", "a positive integer"),
        ("lora_alpha", "0", "a number > 0"),
        ("lora_dropout", "1", "a number from 0 to 1 (1 excluded)"),
        ("max_length", "0", "a positive integer"),
        ("warmup_ratio", "1.5", "a number from 0 to 1"),
        ("weight_decay", "-0.1", "a number >= 0"),
        ("save_steps", "0", "a positive integer"),
        ("eval_steps", "-5", "a positive integer"),
        ("logging_steps", "0.5", "a positive integer"),
        ("save_total_limit", "0", "a positive integer"),
        ("seed", "-1", "an integer from 0 to 4294967295"),
        ("seed", "'42'", "an integer from 0 to 4294967295"),
        ("bf16", "'true'", "true or false"),
        ("gradient_checkpointing", "1", "true, false or auto"),
        ("gradient_checkpointing", "automatic", "true, false or auto"),
        ("per_device_train_batch_size", "0", "a positive integer or auto"),
        ("per_device_train_batch_size", "AUTO", "a positive integer or auto"),
        ("torch_dtype", "fp32", "bfloat16, float16 or float32"),
        ("logging_nan_inf_filter", "yes please", "true or false"),
        ("ddp_find_unused_parameters", "1", "true or false"),
        ("ddp_broadcast_buffers", "'no'", "true or false"),
        ("ddp_bucket_cap_mb", "0", "a positive integer"),
        ("ddp_bucket_cap_mb", "25.5", "a positive integer"),
        ("target_modules", "[1, 2]", "a string or a list of strings"),
    ],
)
def test_bad_swift_values_stop_at_load(tmp_path, name, value, expected):
    text = MINIMAL + f"swift:\n  tuner_type: lora\n  {name}: {value}\n"
    path = write(tmp_path, text)
    msg = error_of(path)
    assert msg.startswith(f"{path}:{line_of(text, name + ':')}: 'swift.{name}' must be "), msg
    assert expected in msg


@pytest.mark.parametrize(
    "name, value",
    [("max_steps", -1), ("max_steps", 500), ("save_steps", 0.25), ("lora_alpha", 16.5), ("num_train_epochs", 0.5)],
)
def test_good_swift_edge_values_load(tmp_path, name, value):
    assert load_config(write(tmp_path, MINIMAL + f"swift:\n  {name}: {value}\n")).swift[name] == value


def test_swift_rules_agree_with_the_installed_ms_swift():
    """Every rule names a `swift sft` argument and accepts ms-swift's own default for it."""
    pytest.importorskip("swift.arguments")
    import dataclasses

    from swift.arguments import SftArguments

    fields = {f.name: f for f in dataclasses.fields(SftArguments)}
    for name, (ok, expected) in config.SWIFT_ARG_RULES.items():
        assert name in fields, f"swift.{name} is not an argument of the installed ms-swift"
        default = fields[name].default
        if default is not None and default is not dataclasses.MISSING:
            assert ok(default), f"swift.{name}: ms-swift's default {default!r} is not {expected}"


# --- the command lines: exit 2, one line, no traceback, nothing written ------------


def _compile(tmp_path: Path, text: str, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    path = write(tmp_path, text, "bad.yaml")
    out = tmp_path / "out" / "p.yaml"
    return cli("pipelines.compile", "--config", str(path), "--output", str(out), *extra), path


def _assert_refused(result: subprocess.CompletedProcess, tmp_path: Path) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.startswith("error: ")
    assert not (tmp_path / "out").exists()


def test_cli_duplicate_key(tmp_path):
    result, path = _compile(tmp_path, MINIMAL + "eval:\n  min_margin: 0.1\neval:\n  min_margin: 0.0\n")
    _assert_refused(result, tmp_path)
    assert f"{path}:10: duplicate key 'eval' (first at line 8); keep one" in result.stderr


@pytest.mark.parametrize("kind", ["list", "mapping"])
def test_cli_alias_bomb_finishes_in_seconds(tmp_path, kind):
    start = time.monotonic()
    result, _ = _compile(tmp_path, bomb(kind))  # a subprocess with a 60 s timeout; before #21 it never ended
    assert time.monotonic() - start < 60  # a hang guard: the compile CLI starts and refuses in ~3-8 s
    _assert_refused(result, tmp_path)
    assert "aliases (*name) are expanded" in result.stderr


@pytest.mark.parametrize("value", [f"env:{HF_TOKEN}", HF_TOKEN])
def test_cli_token_is_never_printed_or_written(tmp_path, value):
    text = MINIMAL.replace("  cache: /cache/models\n", f"  cache: /cache/models\n  token_from: {value}\n")
    result, _ = _compile(tmp_path, text)
    _assert_refused(result, tmp_path)
    assert HF_TOKEN not in result.stdout + result.stderr
    assert "model.token_from looks like a token itself" in result.stderr


@pytest.mark.parametrize(
    "snippet, fragment",
    [
        ("eval:\n  min_margin: .inf\n", "'eval.min_margin' must be a finite number"),
        ("swift:\n  num_train_epochs: -1\n", "'swift.num_train_epochs' must be a number > 0"),
        ("swift:\n  learning_rate: fast\n", "'swift.learning_rate' must be a number > 0"),
    ],
)
def test_cli_bad_values(tmp_path, snippet, fragment):
    result, path = _compile(tmp_path, MINIMAL + snippet)
    _assert_refused(result, tmp_path)
    assert f"{path}:9: {fragment}" in result.stderr


def test_cli_root_under_a_file(tmp_path):
    (tmp_path / "f.txt").write_text("x")
    text = MINIMAL.replace("  name: tiny-run\n", f"  name: tiny-run\n  root: {tmp_path / 'f.txt' / 'runs'}\n")
    result, path = _compile(tmp_path, text, "--target", "local")
    _assert_refused(result, tmp_path)
    assert f"{path}:3: 'pipeline.root'" in result.stderr and "which is a file, not a folder" in result.stderr


@pytest.mark.skipif(
    os.access("/proc/sys", os.W_OK) or not Path("/proc/sys").is_dir(), reason="needs a read-only folder"
)
def test_cli_local_target_with_a_read_only_root(tmp_path):
    text = MINIMAL.replace("  name: tiny-run\n", "  name: tiny-run\n  root: /proc/sys/vlm-runs\n").replace(
        "/cache/models", str(tmp_path / "cache")
    )
    result, path = _compile(tmp_path, text, "--target", "local")
    _assert_refused(result, tmp_path)
    assert f"{path}:3: 'pipeline.root' '/proc/sys/vlm-runs' cannot be created or written" in result.stderr


def test_cli_output_under_a_file(tmp_path):
    (tmp_path / "f.txt").write_text("x")
    path = write(tmp_path, MINIMAL.replace("/cache/models", str(tmp_path / "cache")), "ok.yaml")
    gs_roots = ("pipeline.root=gs://test-bucket/root", "model.cache=gs://test-bucket/models")  # Vertex needs gs://
    result = cli("pipelines.compile", "--config", str(path), "--output", str(tmp_path / "f.txt" / "p.yaml"), *gs_roots)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "part of its path is a file, not a folder" in result.stderr


def test_cli_run_local_refuses_a_duplicate_key(tmp_path):
    path = write(tmp_path, MINIMAL + "eval:\n  min_margin: 0.1\neval:\n  min_margin: 0.0\n")
    result = cli("pipelines.run", "--local", "--config", str(path))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and f"{path}:10: duplicate key 'eval'" in result.stderr


def test_cli_run_local_refuses_a_root_under_a_file(tmp_path):
    (tmp_path / "f.txt").write_text("x")
    result = cli("pipelines.run", "--local", "--root", str(tmp_path / "f.txt" / "runs"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"--root '{tmp_path / 'f.txt' / 'runs'}' is inside '{tmp_path / 'f.txt'}', which is a file" in result.stderr


# --- swift argument names, before anything runs (issue #14) -----------------------------


def test_an_unknown_swift_argument_is_refused_at_load_with_the_closest_names(tmp_path):
    path = write(tmp_path, MINIMAL + "swift:\n  lora_rnak: 8\n")
    msg = error_of(path)
    assert f"{path}:" in msg and "'swift.lora_rnak' is not an argument of ms-swift 4.6.0 `swift sft`" in msg
    assert "did you mean lora_rank" in msg


def test_a_swift_argument_the_pipeline_sets_is_refused(tmp_path):
    msg = error_of(write(tmp_path, MINIMAL + "swift:\n  output_dir: /tmp/x\n"))
    assert "'swift.output_dir' is set by the pipeline from its inputs; remove it" in msg


def test_the_pinned_argument_list_is_the_installed_ms_swifts():
    import dataclasses
    from importlib.metadata import version

    from swift.arguments import SftArguments

    from components.common.swift import pinned_sft_args

    pinned_version, names = pinned_sft_args()
    assert pinned_version == version("ms-swift")
    assert names == {f.name for f in dataclasses.fields(SftArguments)}


def test_cli_compile_refuses_an_unknown_swift_argument(tmp_path):
    path = write(tmp_path, MINIMAL.replace("/cache/models", str(tmp_path / "cache")) + "swift:\n  not_a_flag: 3\n")
    result = cli("pipelines.compile", "--config", str(path), "--output", str(tmp_path / "p.yaml"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "'swift.not_a_flag' is not an argument of ms-swift" in result.stderr
    assert not (tmp_path / "p.yaml").exists()


def test_padding_free_or_packing_without_flash_attention_is_refused_at_load(tmp_path):
    """Seen on an H100: ms-swift 4.6 refuses padding_free with sdpa, after the job has started (benchmarks/README.md)."""
    seed = Path(__file__).resolve().parent.parent / "configs" / "qwen3_vl_4b" / "lora_seed.yaml"
    for key in ("padding_free", "packing"):
        with pytest.raises(ConfigError, match=rf"swift.{key}: true' needs a flash-attention kernel.*attn_impl"):
            load_config(seed, {f"swift.{key}": True})
        assert load_config(seed, {f"swift.{key}": True, "swift.attn_impl": "flash_attn"}).swift[key] is True
