"""`DeploySettings`: the one deploy settings type, its checks, and the config section that is it.

Pure (no server): each field check names `deploy.<field>`, what it must be and the value, both
from the type itself and through `load_config` (with the file and line); `from_dict` takes back
what the pipeline hands the deploy task; the config's `deploy` section is a `DeploySettings`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from components.deploy.errors import DeployError
from components.deploy.settings import DeploySettings
from pipelines.config import Config, ConfigError, load_config

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "configs" / "qwen3_vl_4b" / "lora_seed.yaml"

BAD = [
    (
        {"endpoint": "projects/p/endpoints/1"},
        "deploy.endpoint",
        "a display name or projects/P/locations/R/endpoints/ID",
    ),
    ({"machine_type": ""}, "deploy.machine_type", "a Vertex serving machine type"),
    ({"accelerator_count": -1}, "deploy.accelerator_count", "0 or a positive integer"),
    ({"accelerator_count": 0}, "deploy.accelerator_type", "set together with deploy.accelerator_count"),
    ({"accelerator_type": "", "accelerator_count": 2}, "deploy.accelerator_type", "they go together"),
    ({"traffic_percent": 101}, "deploy.traffic_percent", "1..100"),
    ({"min_replicas": 0, "max_replicas": 0}, "deploy.min_replicas", "a positive integer"),
    ({"min_replicas": 3, "max_replicas": 2}, "deploy.max_replicas", "at least deploy.min_replicas"),
    ({"smoke_rows": 0}, "deploy.smoke_rows", "a positive integer (rows of the smoke test)"),
    ({"timeout_s": -5}, "deploy.timeout_s", "a positive number of seconds"),
    ({"served_model_name": ""}, "deploy.served_model_name", "the serving container's model name"),
]


def _config(tmp_path: Path, deploy: dict) -> Path:
    raw = yaml.safe_load(SEED.read_text())
    raw["deploy"] = deploy
    path = tmp_path / "deploy.yaml"
    path.write_text("# test config\n" + yaml.safe_dump(raw))
    return path


def test_the_defaults_pass_their_own_checks():
    assert DeploySettings().problems() == []
    assert DeploySettings(endpoint="qwen-drawings").problems() == []
    assert (
        DeploySettings(
            endpoint="projects/p/locations/r/endpoints/1", accelerator_type="", accelerator_count=0
        ).problems()
        == []
    )


@pytest.mark.parametrize(("change", "key", "expected"), BAD)
def test_each_bad_value_is_named_with_what_it_must_be(change, key, expected):
    settings = DeploySettings(**{"endpoint": "e", **change})
    first = settings.problems()[0]
    value = getattr(settings, key.split(".")[1])
    assert first.startswith(f"'{key}' must be ") and expected in first and first.endswith(f"got {value!r}")
    assert [k for k, ok, _ in settings.checks() if not ok][0] == key


@pytest.mark.parametrize(("change", "key", "expected"), BAD)
def test_the_config_refuses_them_at_the_file_and_line(tmp_path, change, key, expected):
    path = _config(tmp_path, {"endpoint": "e", **change})
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert message.startswith(f"{path}:") and f"'{key}' must be " in message and expected in message


def test_an_endpoint_of_another_project_or_region_is_named():
    here = DeploySettings(endpoint="projects/p/locations/us-central1/endpoints/1")
    assert here.endpoint_location_problem("p", "us-central1") == ""
    assert here.endpoint_location_problem("", "us-central1") == ""  # project not known yet: the region decides
    assert DeploySettings(endpoint="qwen-drawings").endpoint_location_problem("p", "europe-west4") == ""
    for project, region in (("q", "us-central1"), ("p", "europe-west4"), ("", "europe-west4")):
        problem = here.endpoint_location_problem(project, region)
        assert problem.startswith("'deploy.endpoint' is in project 'p', region 'us-central1'")
        assert "use an endpoint of this project and region" in problem


def test_from_dict_takes_back_what_the_pipeline_hands_the_task():
    settings = DeploySettings(endpoint="e", traffic_percent=10, smoke_rows=2, served_model_name="m", timeout_s=60)
    assert DeploySettings.from_dict(dataclasses.asdict(settings)) == settings
    as_doubles = {k: float(v) if isinstance(v, int) else v for k, v in dataclasses.asdict(settings).items()}
    rebuilt = DeploySettings.from_dict(as_doubles)
    assert rebuilt == settings and type(rebuilt.timeout_s) is int
    assert DeploySettings.from_dict({"endpoint": "e"}) == DeploySettings(endpoint="e")  # the rest: defaults


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"timeout": 60}, "unknown deploy setting 'deploy.timeout'; the deploy section has: endpoint, "),
        ({"smoke_rows": 2.5}, "'deploy.smoke_rows' must be an integer, got 2.5"),
        ({"smoke_rows": True}, "'deploy.smoke_rows' must be an integer, got True"),
        ({"timeout_s": "1h"}, "'deploy.timeout_s' must be an integer, got '1h'"),
        ({"endpoint": 7}, "'deploy.endpoint' must be a string, got 7"),
    ],
)
def test_from_dict_refuses_what_the_section_does_not_hold(values, message):
    with pytest.raises(DeployError, match=message.replace(".", r"\.")):
        DeploySettings.from_dict(values)


def test_the_config_section_is_the_settings_type(tmp_path):
    """One type: the loader builds the component's DeploySettings itself, no section of its own."""
    field_types = {f.name: f.type for f in dataclasses.fields(Config)}
    assert field_types["deploy"] in (DeploySettings, "DeploySettings")
    cfg = load_config(_config(tmp_path, {"endpoint": "e", "timeout_s": 120, "smoke_rows": 2}))
    assert type(cfg.deploy) is DeploySettings
    assert cfg.deploy == DeploySettings(endpoint="e", timeout_s=120, smoke_rows=2)
    assert type(load_config(SEED).deploy) is DeploySettings and load_config(SEED).deploy == DeploySettings()
