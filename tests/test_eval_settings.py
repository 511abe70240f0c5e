"""`EvalSettings`: the one eval settings type, its checks, the config section that is it, the run parameter.

Pure (no model): each field check names `eval.<field>`, what it must be and the value, both from
the type itself and through `load_config` (with the file and line); `from_dict` takes back what
the pipeline hands the evaluate task (numbers as JSON doubles too); the compiled pipeline has one
`eval_settings` parameter, the config's section less its compile-time keys, and an override of one
key changes only that key; evaluate's step refuses a console-edited value, naming the field.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from components.evaluate.settings import COMPILE_TIME_KEYS, EvalSettings, EvalSettingsError
from components.evaluate.step import checked_settings, run_step
from pipelines.compile import compile_pipeline
from pipelines.config import Config, ConfigError, load_config, parse_overrides
from pipelines.pipeline import RUN_PARAMETERS, pipeline_arguments
from tests.pipeline_spec import source, tasks

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "configs" / "qwen3_vl_4b" / "lora_seed.yaml"
TINY = ROOT / "configs" / "local" / "tiny_cpu.yaml"
OLD_PARAMETERS = (
    "eval_max_new_tokens",
    "eval_batch_size",
    "eval_max_samples",
    "eval_iou_threshold",
    "eval_metric",
    "eval_min_value",
    "eval_min_margin",
    "eval_regression_max_drop",
    "eval_quantization",
)

BAD = [
    ({"max_new_tokens": 0}, "eval.max_new_tokens", "a positive integer"),
    ({"batch_size": -2}, "eval.batch_size", "a positive integer"),
    ({"max_samples": -1}, "eval.max_samples", "0 (all) or a positive integer"),
    ({"iou_threshold": 1.5}, "eval.iou_threshold", "a number in (0, 1]"),
    ({"metric": "bleu"}, "eval.metric", "one of f1, precision, recall"),
    ({"quantization": "fp4"}, "eval.quantization", "one of none, nf4, int8"),
    ({"gate_on": "mean"}, "eval.gate_on", "point or lower_bound"),
    ({"min_value": 2.0}, "eval.min_value", "within the range of eval.metric 'f1' (0 to 1"),
    ({"min_margin": -1.5}, "eval.min_margin", "within what eval.metric 'f1' (0 to 1) can differ by (-1 to 1"),
    ({"regression_max_drop": {"ocrr": 0.1}}, "eval.regression_max_drop", "names an unknown kind 'ocrr'"),
    ({"regression_max_drop": {"ocr": -0.1}}, "eval.regression_max_drop", "ocr: must be a number >= 0"),
]


def _config(tmp_path: Path, change: dict) -> Path:
    raw = yaml.safe_load(SEED.read_text())
    raw["eval"] = {**raw.get("eval", {}), **change}
    path = tmp_path / "eval.yaml"
    path.write_text("# test config\n" + yaml.safe_dump(raw))
    return path


def test_the_defaults_and_the_shipped_configs_pass_their_own_checks():
    assert EvalSettings().problems() == []
    assert EvalSettings(metric="recall", min_value=0.5, min_margin=-0.02, gate_on="lower_bound").problems() == []
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        assert type(load_config(path).eval) is EvalSettings, path


@pytest.mark.parametrize(("change", "key", "expected"), BAD)
def test_each_bad_value_is_named_with_what_it_must_be(change, key, expected):
    settings = EvalSettings(**change)
    first = settings.problems()[0]
    value = getattr(settings, key.split(".")[1])
    assert first.startswith(f"'{key}' must be ") and expected in first and first.endswith(f"got {value!r}")
    assert [k for k, ok, _ in settings.checks() if not ok][0] == key


@pytest.mark.parametrize(("change", "key", "expected"), BAD)
def test_the_config_refuses_them_at_the_file_and_line(tmp_path, change, key, expected):
    path = _config(tmp_path, change)
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if text.startswith("eval:"))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert message.startswith(f"{path}:") and f"'{key}' must be " in message and expected in message
    assert int(message.split(":")[1]) > line  # the key's own line, inside the eval section


def test_checks_across_sections_stay_with_the_config(tmp_path):
    with pytest.raises(ConfigError, match=r"more than swift.max_length"):  # needs the swift section
        load_config(_config(tmp_path, {"max_new_tokens": 4000}))
    with pytest.raises(ConfigError, match=r"'eval.reference' is 'champion' but 'register.alias' is empty"):
        load_config(SEED, parse_overrides(["eval.reference=champion", "register.alias="]))


def test_from_dict_takes_back_what_the_pipeline_hands_the_task():
    settings = EvalSettings(
        max_new_tokens=64, max_samples=4, iou_threshold=0.75, metric="recall", min_value=1, min_margin=0.1,
        regression_max_drop={"ocr": 0.1}, quantization="nf4", gate_on="lower_bound", reference="base",
    )  # fmt: skip
    assert EvalSettings.from_dict(dataclasses.asdict(settings)) == settings
    run = settings.run_settings()
    assert set(run) == {f.name for f in dataclasses.fields(EvalSettings)} - set(COMPILE_TIME_KEYS)
    as_doubles = {k: float(v) if isinstance(v, int) else v for k, v in run.items()}  # a JSON struct's numbers
    rebuilt = EvalSettings.from_dict(as_doubles)
    assert rebuilt == dataclasses.replace(settings, reference="auto") and type(rebuilt.max_new_tokens) is int
    assert type(EvalSettings.from_dict({"iou_threshold": 1}).iou_threshold) is float  # an int where a number goes
    assert EvalSettings.from_dict({"metric": "recall"}) == EvalSettings(metric="recall")  # the rest: defaults


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"max_tokens": 60}, "unknown eval setting 'eval.max_tokens'; the eval section has: max_new_tokens, "),
        ({"max_samples": 2.5}, "'eval.max_samples' must be an integer, got 2.5"),
        ({"batch_size": True}, "'eval.batch_size' must be an integer, got True"),
        ({"min_value": "high"}, "'eval.min_value' must be a number, got 'high'"),
        ({"metric": 1}, "'eval.metric' must be a string, got 1"),
        ({"regression_max_drop": 0.1}, "'eval.regression_max_drop' must be a mapping, got 0.1"),
    ],
)
def test_from_dict_refuses_what_the_section_does_not_hold(values, message):
    with pytest.raises(EvalSettingsError, match=message.replace(".", r"\.").replace("(", r"\(")):
        EvalSettings.from_dict(values)


def test_the_config_section_is_the_settings_type():
    """One type: the loader builds the component's EvalSettings itself, no section of its own."""
    field_types = {f.name: f.type for f in dataclasses.fields(Config)}
    assert field_types["eval"] in (EvalSettings, "EvalSettings")
    cfg = load_config(TINY)
    assert type(cfg.eval) is EvalSettings and cfg.eval.min_margin == 0.1


def _spec(path: Path) -> pipeline_spec_pb2.PipelineSpec:
    return json_format.ParseDict(yaml.safe_load(path.read_text()), pipeline_spec_pb2.PipelineSpec())


@pytest.mark.parametrize("target", ["vertex", "local"])
def test_the_pipeline_has_one_eval_settings_parameter_the_sections_run_part(tmp_path, target):
    roots = {"pipeline.root": "gs://test-bucket/root", "model.cache": "gs://test-bucket/models"}
    overrides = roots if target == "vertex" else {}
    spec = _spec(compile_pipeline(str(TINY), str(tmp_path / "p.yaml"), target, overrides))
    params = spec.root.input_definitions.parameters
    assert not set(OLD_PARAMETERS) & set(params) and "eval_settings" in params
    assert ("eval_settings", "eval") in RUN_PARAMETERS
    cfg = load_config(TINY, overrides)
    expected = {k: v for k, v in dataclasses.asdict(cfg.eval).items() if k not in ("reference", "regression")}
    assert json_format.MessageToDict(params["eval_settings"].default_value) == expected  # 160.0 == 160
    assert pipeline_arguments(cfg)["eval_settings"] == expected
    found = source(tasks(spec), "evaluate", "settings")
    assert (found.kind, found.value) == ("pipeline parameter", "eval_settings")


def test_an_override_of_one_key_changes_only_that_key():
    base = pipeline_arguments(load_config(TINY))["eval_settings"]
    ours = pipeline_arguments(load_config(TINY, parse_overrides(["eval.metric=recall"])))["eval_settings"]
    assert ours == {**base, "metric": "recall"} and base["min_margin"] == 0.1  # the file's other keys kept


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"metric": "bleu"}, "'eval.metric' must be one of f1, "),
        ({"max_new_tokens": "many"}, "'eval.max_new_tokens' must be an integer, got 'many'"),
        ({"batch_size": 0.0}, "'eval.batch_size' must be a positive integer, got 0"),
        ({"gate_on": "mean"}, "'eval.gate_on' must be point or lower_bound, got 'mean'"),
        ({"min_value": 3.0}, "'eval.min_value' must be within the range of eval.metric 'f1'"),
        ({"reference": "base"}, "'eval.reference' is fixed when the pipeline is compiled"),
        ({"matric": "f1"}, "unknown eval setting 'eval.matric'"),
    ],
)
def test_evaluate_refuses_a_bad_console_edit_naming_the_field_and_the_fix(settings, message):
    with pytest.raises(SystemExit) as err:
        checked_settings(settings)
    text = str(err.value)
    assert text.startswith("evaluate: eval_settings: ") and message in text
    assert "correct it in the run's eval_settings" in text


def test_the_step_refuses_before_it_reads_any_model(tmp_path):
    class Art:  # no model, no data: the settings are checked first
        uri = path = str(tmp_path / "missing")
        metadata: dict = {}

    with pytest.raises(SystemExit, match=r"evaluate: eval_settings: 'eval\.iou_threshold' must be a number in"):
        run_step(Art(), Art(), Art(), Art(), Art(), settings={"iou_threshold": 0.0}, swift_args={})
    assert checked_settings(EvalSettings().run_settings()) == EvalSettings()
