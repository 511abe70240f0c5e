"""stage-model on JSON files of the wrong shape (issue #41): a config.json that is a list or
has nested `architectures`, an index whose `weight_map` is a list or maps to numbers. Each
is a named error that names the file, the field and the fix, from the core and from the
command line (exit 1, no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from components.stage_model.core import stage_model
from components.stage_model.entry import MANIFEST
from components.stage_model.errors import StageError
from tests.test_stage_model import ARCH, make_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def model(tmp_path) -> Path:
    return make_model(tmp_path / "src" / "tiny")


def _config(model: Path, value) -> None:
    (model / "config.json").write_text(json.dumps(value))


def _index(model: Path, value) -> None:
    (model / "model.safetensors.index.json").write_text(json.dumps(value))


CASES = {
    "config-list": (lambda m: _config(m, []), "config.json", "expected a JSON object {...}, found a list"),
    "config-string": (lambda m: _config(m, "Qwen3VL"), "config.json", "found a string"),
    "architectures-nested": (
        lambda m: _config(m, {"architectures": [[ARCH]]}),
        "config.json",
        "field 'architectures' must be a list of class names",
    ),
    "architectures-string": (
        lambda m: _config(m, {"architectures": ARCH}),
        "config.json",
        "field 'architectures' must be a list of class names",
    ),
    "text-config-list": (
        lambda m: _config(m, {"architectures": [ARCH], "text_config": [1]}),
        "config.json",
        "field 'text_config' must be an object, found a list",
    ),
    "weight-map-list": (
        lambda m: _index(m, {"weight_map": ["model.safetensors"]}),
        "model.safetensors.index.json",
        "field 'weight_map' must be an object {tensor name: shard file}, found a list",
    ),
    "weight-map-ints": (
        lambda m: _index(m, {"weight_map": {"a": 1}}),
        "model.safetensors.index.json",
        "field 'weight_map' maps 'a' to 1, not a shard file name",
    ),
    "weight-map-missing": (
        lambda m: _index(m, {"metadata": {}}),
        "model.safetensors.index.json",
        "cannot parse: no field 'weight_map' {tensor name: shard file}",
    ),
    "index-list": (
        lambda m: _index(m, []),
        "model.safetensors.index.json",
        "expected a JSON object {...}, found a list",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_wrong_shape_is_a_named_error(case, model, tmp_path):
    spoil, name, words = CASES[case]
    spoil(model)
    with pytest.raises(StageError) as err:
        stage_model(str(model), str(tmp_path / "cache"))
    message = str(err.value)
    assert f"{model.resolve() / name}: " in message and words in message, message
    assert "restore the" in message  # the fix
    assert not list((tmp_path / "cache").rglob(MANIFEST))  # nothing published


def test_cli_reports_a_nested_architectures_without_a_traceback(model, tmp_path):
    _config(model, {"architectures": [[ARCH]]})
    proc = subprocess.run(
        [sys.executable, "-m", "components.stage_model", str(model), "--cache", str(tmp_path / "cache")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "config.json: field 'architectures' must be a list of class names" in proc.stderr
