"""Compile tests: every config compiles; the spec parses back and Vertex accepts it."""

from pathlib import Path

import pytest
import yaml
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from pipelines.compile import compile_pipeline, main
from pipelines.config import load_config
from pipelines.pipeline import (
    CHAMPION_TASK,
    NOTHING_TASK,
    REGISTER_TASK,
    REGRESSION_TASK,
    RUN_PARAMETERS,
    SNAPSHOT_TASK,
    TASK_ORDER,
    pipeline_arguments,
    reference_plan,
)
from tests.custom_job_payload import custom_job
from tests.pipeline_spec import container_tasks, source, tasks, upstream

CONFIGS = sorted(str(p) for p in Path(__file__).resolve().parent.parent.glob("configs/**/*.yaml"))
# A Vertex compile needs gs:// roots (pipelines.compile_guards): the local configs get test ones.
GS_ROOTS = {"pipeline.root": "gs://test-bucket/pipeline-root", "model.cache": "gs://test-bucket/models"}


def _vertex_overrides(config: str) -> dict:
    return GS_ROOTS if "/configs/local/" in config else {}


def _tasks_of(cfg) -> set[str]:
    """The tasks every build of a config has: TASK_ORDER, and validate-regression with eval.regression."""
    return set(TASK_ORDER) | ({REGRESSION_TASK} if cfg.eval.regression else set())


def _spec(path: Path) -> pipeline_spec_pb2.PipelineSpec:
    return json_format.ParseDict(yaml.safe_load(path.read_text()), pipeline_spec_pb2.PipelineSpec())


def _direct(spec: pipeline_spec_pb2.PipelineSpec) -> dict[str, set[str]]:
    """{task: its own dependentTasks} for every task at any depth."""
    return {name: set(t.spec.get("dependentTasks", [])) for name, t in tasks(spec).items()}


@pytest.mark.parametrize("config", CONFIGS)
def test_every_config_compiles_to_a_pipeline_spec(config, tmp_path):
    out = compile_pipeline(config, str(tmp_path / "p.yaml"), overrides=_vertex_overrides(config))
    spec = _spec(out)
    cfg = load_config(config, _vertex_overrides(config))
    # the CustomJob GCPC's launcher sends parses as aiplatform_v1.CustomJob, unknown fields refused
    job = custom_job(yaml.safe_load(out.read_text()))
    pools = job.job_spec.worker_pool_specs
    assert pools[0].machine_spec.machine_type == cfg.resources.machine_type
    assert pools[0].disk_spec.boot_disk_type in ("pd-ssd", "pd-standard", "hyperdisk-balanced")
    assert job.job_spec.scheduling.restart_job_on_worker_restart == (cfg.resources.replica_count > 1)
    assert spec.pipeline_info.name == cfg.pipeline.name
    # the six tasks, plus on Vertex register (behind the gate), with a champion its look-up and the
    # branch taken when the champion already saw this data, and with a regression set its check
    gate = {REGISTER_TASK} if cfg.register.serving_image else set()
    champion = reference_plan(cfg, "vertex")[0] == "champion"
    found = container_tasks(spec)
    assert set(found) == _tasks_of(cfg) | gate | ({CHAMPION_TASK, NOTHING_TASK} if champion else set())
    if gate:
        assert found[REGISTER_TASK].group_names[-1] == "gate-passed"
    for name in TASK_ORDER[1:]:  # after snapshot-data: at the root, or in the branch that trains
        assert found[name].group_names[-1:] == (("new-data-or-settings",) if champion else ())
    if champion:
        assert found[NOTHING_TASK].group_names[-1] == "champion-up-to-date"
    # snapshot-data: at the root, first (after the champion look-up it compares with), never cached
    snapshot = found[SNAPSHOT_TASK]
    assert snapshot.groups == () and not snapshot.caches
    assert set(snapshot.spec.get("dependentTasks", [])) == ({CHAMPION_TASK} if champion else set())
    index = tasks(spec)
    assert all(SNAPSHOT_TASK in upstream(index, name) for name in TASK_ORDER[1:])
    assert str(source(index, "validate-data", "snapshot")) == "snapshot-data.snapshot"
    # the config's values are the parameters' defaults
    params = spec.root.input_definitions.parameters
    assert params["model_source"].default_value.string_value == cfg.model.source
    assert params["data_train"].default_value.string_value == cfg.data.train
    swift = json_format.MessageToDict(params["swift_args"].default_value)
    assert swift == {
        k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v) for k, v in cfg.swift.items()
    }


@pytest.mark.parametrize("config", CONFIGS)
def test_every_config_compiles_for_the_local_target(config, tmp_path):
    spec = _spec(compile_pipeline(config, str(tmp_path / "p.yaml"), target="local"))
    assert set(spec.root.dag.tasks) == _tasks_of(load_config(config))
    assert "train-lora" in spec.root.dag.tasks and not spec.deployment_spec.fields["executors"].struct_value.fields[
        "exec-train-lora"
    ].struct_value.fields.get("customJob")
    assert not spec.default_pipeline_root


def test_tasks_are_wired_in_order(tmp_path):
    config = next(c for c in CONFIGS if c.endswith("tiny_cpu_kv.yaml"))  # no registry model (the base), no regression
    assert not load_config(config).eval.regression
    spec = _spec(compile_pipeline(config, str(tmp_path / "p.yaml"), overrides=GS_ROOTS))
    up = _direct(spec)
    assert up[SNAPSHOT_TASK] == set()  # first: resolves the data (and pins the model) for the rest
    assert up["stage-model"] == {SNAPSHOT_TASK}  # stages the model source snapshot-data pinned
    assert up["validate-data"] == {SNAPSHOT_TASK, "stage-model"}  # the snapshot; the tokenizer for the token check
    assert up["train-lora"] == {"stage-model", "validate-data"}
    assert up["merge-export"] == {"stage-model", "train-lora"}
    assert up["evaluate"] == {"stage-model", "merge-export", "validate-data"}
    index = tasks(spec)
    assert str(source(index, "stage-model", "source")) == "snapshot-data.model_source"
    assert str(source(index, "validate-data", "snapshot")) == "snapshot-data.snapshot"
    assert str(source(index, "evaluate", "tuned_model", artifact=True)) == "merge-export.merged_model"
    assert str(source(index, "evaluate", "eval_dataset", artifact=True)) == "validate-data.eval_dataset"
    # the leakage rule changes the splits: validate-data applies it and it is part of snapshot-data's training key
    for task in (SNAPSHOT_TASK, "validate-data"):
        assert source(index, task, "leakage").value == "data_leakage"


def test_vertex_pipeline_job_accepts_the_template(tmp_path):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import aiplatform

    out = compile_pipeline("configs/qwen3_vl_4b/lora_seed.yaml", str(tmp_path / "seed.yaml"))
    job = aiplatform.PipelineJob(
        display_name="compile-test",
        template_path=str(out),
        pipeline_root="gs://test-bucket/root",
        project="test-project",
        location="us-central1",
        credentials=AnonymousCredentials(),
        enable_caching=False,
    )
    runtime = job._gca_resource.runtime_config
    assert runtime.gcs_output_directory == "gs://test-bucket/root"
    assert job._gca_resource.pipeline_spec["pipelineInfo"]["name"] == "qwen3-vl-4b-lora-seed"
    assert "components" in job._gca_resource.pipeline_spec


def test_compile_cli_reports_bad_config_without_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipeline:\n  name: x\n  colour: red\nmodel: {source: a, cache: b}\ndata: {train: t}\n")
    assert main(["--config", str(bad), "--output", str(tmp_path / "o.yaml")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3" in err and "pipeline.colour" in err and "Traceback" not in err
    assert not (tmp_path / "o.yaml").exists()


# --- run-time parameters: one table, one naming rule ------------------------------------


def test_parameter_names_follow_the_section_key_rule():
    for name, path in RUN_PARAMETERS:
        whole = {"swift": "swift_args", "eval": "eval_settings"}  # whole sections
        assert name == whole.get(path, path.replace(".", "_")), (name, path)
    assert len({name for name, _ in RUN_PARAMETERS}) == len(RUN_PARAMETERS)


@pytest.mark.parametrize("target", ["vertex", "local"])
def test_pipeline_signature_and_parameter_table_agree(target, tmp_path):
    """The compiled pipeline's parameters are exactly the table's, with the config's values as defaults."""
    overrides = GS_ROOTS if target == "vertex" else {}
    spec = _spec(compile_pipeline(CONFIGS[0], str(tmp_path / "p.yaml"), target=target, overrides=overrides))
    params = spec.root.input_definitions.parameters
    assert set(params) == {name for name, _ in RUN_PARAMETERS}
    defaults = {name: json_format.MessageToDict(p.default_value) for name, p in params.items()}
    for name, value in pipeline_arguments(load_config(CONFIGS[0], overrides)).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert defaults[name] == pytest.approx(value), name
        elif not isinstance(value, dict):  # swift_args: compared in test_every_config_compiles_to_a_pipeline_spec
            assert defaults[name] == value, name


def test_readme_names_every_run_time_parameter():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("## Config reference") : readme.index("Seed default (")]
    for name, path in RUN_PARAMETERS:
        assert f"`{name}`" in table, (name, path)


def test_local_root_moves_the_model_cache_that_lived_under_the_old_root(tmp_path):
    import dataclasses

    from pipelines.config import load_config
    from pipelines.local_run import with_local_root

    cfg = load_config(Path(__file__).resolve().parent.parent / "configs" / "local" / "tiny_cpu.yaml")  # root runs
    moved = with_local_root(cfg, str(tmp_path / "elsewhere"))
    assert moved.pipeline.root == str(tmp_path / "elsewhere")
    assert moved.model.cache == str(tmp_path / "elsewhere" / "model-cache")
    own = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, cache=str(tmp_path / "my-cache")))
    assert with_local_root(own, str(tmp_path / "r")).model.cache == str(tmp_path / "my-cache")  # the user's, kept
    gcs = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, cache="gs://b/models"))
    assert with_local_root(gcs, str(tmp_path / "r")).model.cache == "gs://b/models"


def test_regression_set_is_checked_before_training_and_reaches_evaluate(tmp_path):
    """With eval.regression (the demo): validate-regression reads snapshot-data's regression snapshot, train-lora
    waits for it (a set that quarantines to nothing stops the run before the GPU job), evaluate takes its dataset."""
    cfg = load_config(CONFIGS[0])
    assert cfg.eval.regression == "demo://drawings/regression"
    for target in ("vertex", "local"):
        overrides = GS_ROOTS if target == "vertex" else {}
        spec = _spec(compile_pipeline(CONFIGS[0], str(tmp_path / f"{target}.yaml"), target=target, overrides=overrides))
        up, index = _direct(spec), tasks(spec)
        assert up[REGRESSION_TASK] == {SNAPSHOT_TASK, "stage-model"}
        assert REGRESSION_TASK in up["train-lora"]
        assert REGRESSION_TASK in up["evaluate"]
        assert str(source(index, REGRESSION_TASK, "snapshot")) == "snapshot-data.regression_snapshot"
        assert str(source(index, "evaluate", "regression_dataset", artifact=True)) == (
            "validate-regression.regression_dataset"
        )
        assert source(index, "evaluate", "settings").value == "eval_settings"  # the rule is in the settings
        assert source(index, SNAPSHOT_TASK, "regression_sources").value == cfg.eval.regression
    params = spec.root.input_definitions.parameters
    settings = json_format.MessageToDict(params["eval_settings"].default_value)
    assert settings["regression_max_drop"] == cfg.eval.regression_max_drop
