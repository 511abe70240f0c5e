"""Vertex target: CustomJob worker pools per GPU profile, task machines, the register gate,
and the named errors of bad profiles, shapes, regions and cron expressions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from components import images
from pipelines.compile import compile_pipeline, main
from pipelines.config import ConfigError, load_config
from pipelines.shapes import expected_worker_pools
from tests.pipeline_spec import container_tasks, inputs, source, tasks, upstream

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted(str(p) for p in ROOT.glob("configs/**/*.yaml"))
SEED = ROOT / "configs" / "qwen3_vl_4b" / "lora_seed.yaml"
PROFILES = {  # the GPU profiles: config -> (machine, GPU, GPUs per node, nodes)
    "lora_seed.yaml": ("a2-highgpu-1g", "NVIDIA_TESLA_A100", 1, 1),
    "lora_h100_tuned.yaml": ("a3-highgpu-1g", "NVIDIA_H100_80GB", 1, 1),
    "lora_a100_80gb_x2.yaml": ("a2-ultragpu-2g", "NVIDIA_A100_80GB", 2, 1),
    "lora_h100_x8.yaml": ("a3-highgpu-8g", "NVIDIA_H100_80GB", 8, 1),
    "lora_h100_x8_2node.yaml": ("a3-highgpu-8g", "NVIDIA_H100_80GB", 8, 2),
}


def _compiled(config: str, tmp_path: Path, gs_roots: bool = False) -> tuple[dict, str]:
    """Compiles for Vertex (with gs:// test roots when `gs_roots`: a local config's are refused there)."""
    roots = (
        {"pipeline.root": "gs://test-bucket/pipeline-root", "model.cache": "gs://test-bucket/models"}
        if gs_roots
        else {}
    )
    out = compile_pipeline(config, str(tmp_path / "p.yaml"), overrides=roots)
    text = out.read_text()
    raw = yaml.safe_load(text)
    json_format.ParseDict(raw, pipeline_spec_pb2.PipelineSpec())  # parses into PipelineSpec
    return raw, text


def _worker_pools(raw: dict) -> list[dict]:
    return raw["components"]["comp-train-lora"]["inputDefinitions"]["parameters"]["worker_pool_specs"]["defaultValue"]


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_training_custom_job_matches_the_profile(name, tmp_path):
    raw, _ = _compiled(str(SEED.parent / name), tmp_path)
    machine, gpu, count, nodes = PROFILES[name]
    pools = _worker_pools(raw)
    got = [
        (
            p["machine_spec"]["machine_type"],
            p["machine_spec"]["accelerator_type"],
            int(p["machine_spec"]["accelerator_count"]),
            int(p["replica_count"]),
        )
        for p in pools
    ]
    want = [
        (w.machine_type, w.accelerator_type, w.accelerator_count, w.replica_count)
        for w in expected_worker_pools(machine, gpu, count, nodes)
    ]
    assert got == want
    assert sum(int(p["replica_count"]) for p in pools) == nodes
    # the training image runs the real train_lora component inside the job
    assert "train_lora" in " ".join(pools[0]["container_spec"]["command"])
    assert pools[0]["container_spec"]["image_uri"].endswith(f"/train:{images.TAG}")
    # the executor is the GCPC CustomJob launcher
    assert "custom_job" in str(raw["deploymentSpec"]["executors"]["exec-train-lora"]["container"]["command"])


def test_custom_job_settings_come_from_the_config(tmp_path):
    raw, _ = _compiled(str(SEED.parent / "lora_h100_x8_2node.yaml"), tmp_path)
    params = raw["components"]["comp-train-lora"]["inputDefinitions"]["parameters"]
    assert params["strategy"]["defaultValue"] == "FLEX_START"
    assert params["max_wait_duration"]["defaultValue"] == "43200s"
    assert params["service_account"]["defaultValue"] == "vlm-lora-pipeline@YOUR_PROJECT.iam.gserviceaccount.com"
    assert params["labels"]["defaultValue"] == {"app": "vlm-lora", "model": "qwen3-vl-4b"}
    # one folder per pipeline, no job id: a per-run value here would be in train-lora's cache key
    name = load_config(SEED.parent / "lora_h100_x8_2node.yaml").pipeline.name
    assert params["base_output_directory"]["defaultValue"] == f"gs://YOUR_BUCKET/pipeline-root/custom-jobs/{name}"
    pool = _worker_pools(raw)[0]
    assert pool["disk_spec"] == {"boot_disk_type": "pd-ssd", "boot_disk_size_gb": 500}
    spot, _ = _compiled(str(SEED.parent / "lora_h100_x8.yaml"), tmp_path)
    assert spot["components"]["comp-train-lora"]["inputDefinitions"]["parameters"]["strategy"]["defaultValue"] == "SPOT"
    assert tasks(spot)["train-lora"].spec["retryPolicy"]["maxRetryCount"] == 2


def test_reservation_affinity_reaches_the_worker_pool(tmp_path):
    text = SEED.read_text().replace(
        "  scheduling: standard\n",
        "  scheduling: standard\n  reservation: projects/p/zones/us-central1-a/reservations/r1\n",
    )
    cfg = tmp_path / "res.yaml"
    cfg.write_text(text)
    raw, _ = _compiled(str(cfg), tmp_path)
    affinity = _worker_pools(raw)[0]["machine_spec"]["reservation_affinity"]
    assert affinity == {
        "reservation_affinity_type": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": ["projects/p/zones/us-central1-a/reservations/r1"],
    }


def test_gpu_and_light_tasks_get_their_machines(tmp_path):
    raw, _ = _compiled(str(SEED), tmp_path)
    executors = raw["deploymentSpec"]["executors"]
    for name in ("exec-merge-export", "exec-evaluate"):
        res = executors[name]["container"]["resources"]
        assert (
            res["accelerator"]["resourceType"] == "NVIDIA_TESLA_A100" and int(res["accelerator"]["resourceCount"]) == 1
        )
        assert res["resourceCpuLimit"] == "12" and res["resourceMemoryLimit"] == "85G"
    for name in ("exec-stage-model", "exec-validate-data", "exec-register"):
        res = executors[name]["container"]["resources"]
        assert res["resourceCpuLimit"] == "4" and res["resourceMemoryLimit"] == "16G" and "accelerator" not in res
        assert executors[name]["container"]["image"].endswith(f"/light:{images.TAG}")
    assert raw["defaultPipelineRoot"] == "gs://YOUR_BUCKET/pipeline-root"


def test_register_runs_only_when_the_gate_passes(tmp_path):
    raw, _ = _compiled(str(SEED), tmp_path)
    index = tasks(raw)
    register = index["register"]
    assert register.group_names[-1] == "gate-passed"
    condition = index[register.groups[-1]].spec
    assert condition["triggerPolicy"]["condition"] == (
        "inputs.parameter_values['pipelinechannel--evaluate-passed'] == true"
    )
    assert str(source(index, "register", "merged_model", artifact=True)) == "merge-export.merged_model"
    assert {"evaluate", "merge-export"} <= upstream(index, "register")
    inner = register.spec
    assert inner["inputs"]["parameters"]["model_id"]["runtimeValue"]["constant"] == "qwen3-vl-4b-drawings"
    assert inner["inputs"]["parameters"]["serving_image"]["runtimeValue"]["constant"].endswith(f"/train:{images.TAG}")


def test_config_images_override_the_defaults(tmp_path):
    cfg = tmp_path / "img.yaml"
    cfg.write_text(SEED.read_text() + "images:\n  light: reg.example/l:1\n  train: reg.example/t:2\n")
    raw, _ = _compiled(str(cfg), tmp_path)
    assert _worker_pools(raw)[0]["container_spec"]["image_uri"] == "reg.example/t:2"
    assert raw["deploymentSpec"]["executors"]["exec-evaluate"]["container"]["image"] == "reg.example/t:2"
    assert raw["deploymentSpec"]["executors"]["exec-stage-model"]["container"]["image"] == "reg.example/l:1"


def test_parameters_have_console_descriptions(tmp_path):
    raw, _ = _compiled(str(SEED), tmp_path)
    params = raw["root"]["inputDefinitions"]["parameters"]
    assert all(p.get("description") for p in params.values()), [
        k for k, p in params.items() if not p.get("description")
    ]


SECRET_PATTERNS = [
    r"hf_[A-Za-z0-9]{30,}",
    r"-----BEGIN [A-Z ]*PRIVATE KEY",
    r"AIza[0-9A-Za-z_\-]{35}",
    r"\"private_key\"",
    r"ya29\.[0-9A-Za-z_\-]+",
    r"gh[pousr]_[A-Za-z0-9]{36}",
]


@pytest.mark.parametrize("config", CONFIGS)
def test_no_secret_and_no_absolute_local_path_in_compiled_yaml(config, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_" + "x" * 34)  # a token in the environment must not leak
    raw, text = _compiled(config, tmp_path, "/configs/local/" in config)
    assert "hf_" + "x" * 34 not in text
    for pattern in SECRET_PATTERNS:
        assert not re.search(pattern, text), pattern
    for local in (str(ROOT), str(tmp_path), str(Path.home()), "/tmp/", "/work/"):
        assert local not in text, local


# --- bad input: named errors at compile time, before anything is created -----------


def _bad(tmp_path: Path, old: str, new: str) -> str:
    text = SEED.read_text()
    assert old in text
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace(old, new))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}:"), msg
    return msg


def test_unknown_machine_type_is_named(tmp_path):
    msg = _bad(tmp_path, "machine_type: a2-highgpu-1g", "machine_type: a9-hugegpu-3g")
    assert "unknown machine type 'a9-hugegpu-3g'" in msg and "a3-highgpu-8g" in msg


def test_unknown_accelerator_type_is_named(tmp_path):
    msg = _bad(tmp_path, "  eval_accelerator_type: NVIDIA_TESLA_A100", "  eval_accelerator_type: NVIDIA_RTX_9090")
    assert "'resources.eval_accelerator_type' must be one of" in msg


@pytest.mark.parametrize("count", [3, 2])
def test_accelerator_count_the_machine_does_not_take(tmp_path, count):
    msg = _bad(tmp_path, "  accelerator_count: 1\n", f"  accelerator_count: {count}\n")
    assert "a2-highgpu-1g comes with exactly 1 x NVIDIA_TESLA_A100" in msg


def test_n1_accelerator_count_lists_allowed_counts(tmp_path):
    text = "machine_type: n1-standard-16\n  accelerator_type: NVIDIA_TESLA_T4\n  accelerator_count: 3"
    msg = _bad(
        tmp_path, "machine_type: a2-highgpu-1g\n  accelerator_type: NVIDIA_TESLA_A100\n  accelerator_count: 1", text
    )
    assert "allows accelerator_count 1/2/4, got 3" in msg


def test_region_without_that_gpu(tmp_path):
    msg = _bad(tmp_path, "  region: us-central1", "  region: southamerica-east1")
    assert "NVIDIA_TESLA_A100 is not offered for Vertex training in 'southamerica-east1'" in msg
    assert "snapshot" in msg


def test_region_check_can_be_turned_off(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(
        SEED.read_text().replace("  region: us-central1", "  region: southamerica-east1\n  region_check: false")
    )
    assert load_config(path).vertex.region == "southamerica-east1"


@pytest.mark.parametrize(
    "cron, fragment",
    [
        ("0 3 * *", "must have 5 fields"),
        ("61 3 * * 1", "minute field '61'"),
        ("0 3 * * funday", "day of week field"),
        ("*/0 * * * *", "step '0'"),
    ],
)
def test_cron_syntax_error(tmp_path, cron, fragment):
    msg = _bad(tmp_path, 'cron: "0 3 * * 1"', f'cron: "{cron}"')
    assert "'schedule.cron'" in msg and fragment in msg


def test_unknown_scheduling_and_preemptible_only_shape(tmp_path):
    assert "'resources.scheduling' must be one of standard, spot, flex_start" in _bad(
        tmp_path, "scheduling: standard", "scheduling: cheap"
    )
    msg = _bad(
        tmp_path,
        "machine_type: a2-highgpu-1g\n  accelerator_type: NVIDIA_TESLA_A100",
        "machine_type: a3-highgpu-1g\n  accelerator_type: NVIDIA_H100_80GB",
    )
    assert "runs only with scheduling spot or flex_start" in msg


def test_unknown_key_in_resources_names_file_and_line(tmp_path):
    msg = _bad(tmp_path, "  scheduling: standard\n", "  scheduling: standard\n  profile: h100-x3\n")
    assert "unknown key 'resources.profile'" in msg


def test_compile_cli_reports_bad_profile_without_output(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(SEED.read_text().replace("accelerator_count: 1", "accelerator_count: 5"))
    assert main(["--config", str(bad), "--output", str(tmp_path / "o.yaml")]) == 2
    assert "comes with exactly 1" in capsys.readouterr().err
    assert not (tmp_path / "o.yaml").exists()


def test_training_gets_durable_checkpoints_under_the_pipeline_root(tmp_path):
    """A retried (preempted) job finds its checkpoints: the folder under the root is keyed by the
    task's inputs at run time, not by the run, so no per-run value is among train-lora's inputs."""
    raw, _ = _compiled("configs/qwen3_vl_4b/lora_h100_x8.yaml", tmp_path)
    cfg = load_config(ROOT / "configs/qwen3_vl_4b/lora_h100_x8.yaml")
    index = tasks(raw)
    params = index["train-lora"].spec["inputs"]["parameters"]
    root = cfg.pipeline.root[len("gs://") :].rstrip("/")
    settings = params["settings"]["runtimeValue"]["constant"]  # train-lora's settings, one value
    assert settings["checkpoint_root"] == f"/gcs/{root}/checkpoints" and settings["checkpoint_dir"] == ""
    assert settings["accelerator_count"] == cfg.resources.accelerator_count
    assert "run_id" not in params and "run_id" not in raw["components"]["comp-train-lora"]["inputDefinitions"]
    assert "run_id" not in index["merge-export"].spec.get("inputs", {}).get("parameters", {})
    for name in ("train-lora", "merge-export"):
        for key, src in inputs(index, name).items():
            assert not re.search(r"\{\{\$\.pipeline_(job|task)", str(src.value)), (name, key, src)


# --- the champion: evaluate compares with the registry's current champion on Vertex ----


def _with_eval_reference(tmp_path: Path, reference: str | None, **register) -> Path:
    raw = yaml.safe_load(SEED.read_text())
    if reference is not None:
        raw["eval"]["reference"] = reference
    raw["register"] = {**raw["register"], **register}
    path = tmp_path / "ref.yaml"
    path.write_text("# test config\n" + yaml.safe_dump(raw))
    return path


def test_champion_is_looked_up_before_evaluate_and_checked_by_register(tmp_path):
    raw, _ = _compiled(str(SEED), tmp_path)  # the seed: eval.reference auto + a register model -> champion
    index = tasks(raw)
    lookup = index["find-champion"]
    assert lookup.groups == () and not lookup.spec.get("dependentTasks")  # runs first
    # a failed look-up stops the run before the GPU job: train-lora's branch waits for it
    assert "find-champion" in upstream(index, "train-lora")
    assert not lookup.caches  # never a cached (stale) champion
    params = lookup.spec["inputs"]["parameters"]
    assert params["model_id"]["runtimeValue"]["constant"] == "qwen3-vl-4b-drawings"
    assert params["alias"]["runtimeValue"]["constant"] == "champion"
    assert "find-champion" in upstream(index, "evaluate")
    assert str(source(index, "evaluate", "reference_uri")) == "find-champion.uri"
    assert str(source(index, "evaluate", "reference_version")) == "find-champion.version_id"
    reg = index["register"].spec["inputs"]["parameters"]
    assert reg["check_champion"]["runtimeValue"]["constant"] is True
    assert str(source(index, "register", "champion_version")) == "find-champion.version_id"
    # snapshot-data reads the champion's data lineage; with the same data and settings nothing trains
    assert str(source(index, "snapshot-data", "champion_uri")) == "find-champion.uri"
    assert index["train-lora"].group_names[-1] == "new-data-or-settings"
    branch = index[index["train-lora"].groups[-1]].spec
    assert branch["triggerPolicy"]["condition"] == (
        "inputs.parameter_values['pipelinechannel--snapshot-data-up_to_date'] == false"
    )
    assert index["nothing-to-train"].group_names[-1] == "champion-up-to-date"
    executor = raw["deploymentSpec"]["executors"]["exec-find-champion"]["container"]
    assert executor["image"].endswith(f"/light:{images.TAG}") and executor["resources"]["resourceCpuLimit"] == "4"
    assert "components.find_champion.core" in " ".join(executor["command"])


def test_reference_base_has_no_lookup(tmp_path):
    raw, _ = _compiled(str(_with_eval_reference(tmp_path, "base")), tmp_path)
    tasks = raw["root"]["dag"]["tasks"]
    assert "find-champion" not in tasks and "find-champion" not in tasks["evaluate"].get("dependentTasks", [])
    assert "reference_uri" not in tasks["evaluate"]["inputs"]["parameters"]
    condition = tasks["condition-1"]
    reg = raw["components"][condition["componentRef"]["name"]]["dag"]["tasks"]["register"]["inputs"]["parameters"]
    assert "check_champion" not in reg


def test_auto_without_a_registry_model_compares_with_the_base(tmp_path):
    raw, _ = _compiled(str(_with_eval_reference(tmp_path, None, model_id="", serving_image="")), tmp_path)
    five = {"stage-model", "validate-data", "train-lora", "merge-export", "evaluate"}
    assert set(raw["root"]["dag"]["tasks"]) == set(container_tasks(raw)) == {"snapshot-data"} | five  # no groups


def test_reference_gs_folder_is_passed_to_evaluate(tmp_path):
    raw, _ = _compiled(str(_with_eval_reference(tmp_path, "gs://test-bucket/models/golden/")), tmp_path)
    tasks = raw["root"]["dag"]["tasks"]
    assert "find-champion" not in tasks
    ev = tasks["evaluate"]["inputs"]["parameters"]
    assert ev["reference_uri"]["runtimeValue"]["constant"] == "gs://test-bucket/models/golden"


def test_local_target_keeps_the_base_even_with_champion(tmp_path):
    out = compile_pipeline(str(_with_eval_reference(tmp_path, "champion")), str(tmp_path / "l.yaml"), target="local")
    tasks = yaml.safe_load(out.read_text())["root"]["dag"]["tasks"]
    assert "find-champion" not in tasks and "reference_uri" not in tasks["evaluate"]["inputs"]["parameters"]


def test_local_folder_reference_is_refused_on_vertex_but_used_locally(tmp_path, capsys):
    model = tmp_path / "golden"
    model.mkdir()
    (model / "config.json").write_text("{}")
    cfg = _with_eval_reference(tmp_path, str(model))
    assert main(["--config", str(cfg), "--output", str(tmp_path / "o.yaml")]) == 2
    err = capsys.readouterr().err
    assert "'eval.reference'" in err and "Vertex tasks cannot read" in err and "Traceback" not in err
    out = compile_pipeline(str(cfg), str(tmp_path / "l.yaml"), target="local")
    ev = yaml.safe_load(out.read_text())["root"]["dag"]["tasks"]["evaluate"]["inputs"]["parameters"]
    assert ev["reference_uri"]["runtimeValue"]["constant"] == str(model)


def test_training_job_execs_python_so_sigterm_reaches_train_lora(tmp_path):
    """Vertex sends SIGTERM on preemption to the container's main process: it must be Python."""
    raw, _ = _compiled(str(SEED), tmp_path)
    container = _worker_pools(raw)[0]["container_spec"]
    script = container["command"][2]
    assert "exec env _KFP_RUNTIME=true python3 -m kfp.dsl.executor_main" in script
    # nothing after the exec line that would never run
    assert script.rstrip().endswith('"$@"')


def test_preflight_mode_and_job_environment_reach_train_lora(tmp_path):
    raw = yaml.safe_load(SEED.read_text())
    raw["resources"]["preflight"] = "warn"
    raw["environment"] = {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_NVLS_ENABLE": 0}
    path = tmp_path / "env.yaml"
    path.write_text("# test\n" + yaml.safe_dump(raw))
    compiled, _ = _compiled(str(path), tmp_path)
    index = tasks(compiled)
    settings = index["train-lora"].spec["inputs"]["parameters"]["settings"]["runtimeValue"]["constant"]
    assert settings["preflight"] == "warn"
    assert settings["job_env"] == {
        "NCCL_DEBUG": "INFO",
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_NVLS_ENABLE": 0,
    }


@pytest.mark.parametrize(
    ("section", "value", "message"),
    [
        ("resources", {"preflight": "maybe"}, "'resources.preflight' must be one of fail, warn, off"),
        ("environment", {"HF_TOKEN": "hf_x"}, "environment"),
        ("environment", {"LD_PRELOAD": "/tmp/x.so"}, "environment"),
        ("environment", ["NCCL_DEBUG"], "must be a mapping"),
    ],
)
def test_bad_preflight_or_environment_is_refused_at_load(tmp_path, section, value, message):
    raw = yaml.safe_load(SEED.read_text())
    raw[section] = {**raw.get(section, {}), **value} if isinstance(value, dict) and section == "resources" else value
    path = tmp_path / "bad.yaml"
    path.write_text("# test\n" + yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=message) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}:")
