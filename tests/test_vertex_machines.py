"""Vertex's newest machines by the API's own types (issue 51): Hyperdisk boot disks on A3 Ultra and A4,
the restart of a multi-node job, a persistent resource, and what a compile refuses with exit 2.

Each compiled CustomJob is rebuilt the way GCPC's launcher builds it and parsed as
`aiplatform_v1.CustomJob` with unknown fields refused (`tests.custom_job_payload`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipelines import shapes
from pipelines.compile import compile_pipeline, main
from pipelines.config import ConfigError, load_config
from tests.custom_job_payload import custom_job, payload_dict

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "configs" / "qwen3_vl_30b_a3b" / "lora_h200_x8.yaml"
B200 = ROOT / "configs" / "qwen3_vl_30b_a3b" / "lora_b200_x8.yaml"
TWO_NODES = ROOT / "configs" / "qwen3_vl_4b" / "lora_h100_x8_2node.yaml"
SEED = ROOT / "configs" / "qwen3_vl_4b" / "lora_seed.yaml"
LOCAL = ROOT / "configs" / "local" / "tiny_cpu.yaml"


def _job(config: Path, tmp_path: Path, **overrides):
    out = compile_pipeline(str(config), str(tmp_path / "p.yaml"), overrides=overrides or None)
    raw = yaml.safe_load(out.read_text())
    return custom_job(raw), payload_dict(raw)


@pytest.mark.parametrize(
    "config, machine, gpu",
    [(H200, "a3-ultragpu-8g", "NVIDIA_H200_141GB"), (B200, "a4-highgpu-8g", "NVIDIA_B200")],
    ids=["a3-ultra", "a4"],
)
def test_a3_ultra_and_a4_profiles_boot_from_hyperdisk(config, machine, gpu, tmp_path):
    job, payload = _job(config, tmp_path)
    (pool,) = job.job_spec.worker_pool_specs
    assert (pool.machine_spec.machine_type, pool.machine_spec.accelerator_type.name) == (machine, gpu)
    assert pool.machine_spec.accelerator_count == 8
    assert pool.disk_spec.boot_disk_type == "hyperdisk-balanced" and pool.disk_spec.boot_disk_size_gb == 500
    assert payload["job_spec"]["worker_pool_specs"][0]["disk_spec"]["boot_disk_type"] == "hyperdisk-balanced"
    assert not job.job_spec.scheduling.restart_job_on_worker_restart  # one node: nothing to restart together


@pytest.mark.parametrize(
    "machine, gpu, count, disk",
    [
        ("a3-megagpu-8g", "NVIDIA_H100_MEGA_80GB", 8, "pd-ssd"),
        ("a3-ultragpu-8g", "NVIDIA_H200_141GB", 8, "hyperdisk-balanced"),
        ("a4-highgpu-8g", "NVIDIA_B200", 8, "hyperdisk-balanced"),
        ("g2-standard-12", "NVIDIA_L4", 1, "pd-ssd"),
    ],
)
def test_machine_variants_compile_to_a_custom_job_with_the_machines_default_disk(machine, gpu, count, disk, tmp_path):
    """The seed on other machines, resources.boot_disk_type left out: the payload carries the machine's default."""
    overrides = {
        "resources.machine_type": machine,
        "resources.accelerator_type": gpu,
        "resources.accelerator_count": count,
        "resources.scheduling": "spot",
    }
    job, _ = _job(SEED, tmp_path, **overrides)
    (pool,) = job.job_spec.worker_pool_specs
    assert (pool.machine_spec.machine_type, pool.machine_spec.accelerator_type.name) == (machine, gpu)
    assert pool.machine_spec.accelerator_count == count and pool.disk_spec.boot_disk_type == disk


def test_the_b200_profile_is_priced_and_planned():
    from components.common import cost, model_fit
    from components.common.preflight import lookup_gpu

    assert cost.PRICES["a4-highgpu-8g"][1] < cost.PRICES["a4-highgpu-8g"][0]
    assert "NVIDIA_B200" in cost.GPU_RATIO and model_fit.GPU_MEMORY_GIB["NVIDIA_B200"] == 178.4
    assert ("a4-highgpu-8g", "NVIDIA_B200", 8) in model_fit.PROFILES
    spec = lookup_gpu("NVIDIA B200")
    assert spec is not None and spec.label == "B200" and spec.tflops > lookup_gpu("NVIDIA H200").tflops
    assert load_config(B200).resources.price_usd_per_hour == 0  # the table's estimate, printed with its note


def test_the_default_disk_is_the_machines():
    assert shapes.boot_disk_type("a3-ultragpu-8g", "") == "hyperdisk-balanced"
    assert shapes.boot_disk_type("a4-highgpu-8g", "") == "hyperdisk-balanced"
    assert shapes.boot_disk_type("a3-highgpu-8g", "") == "pd-ssd"
    assert shapes.boot_disk_type("a2-highgpu-1g", "pd-standard") == "pd-standard"
    assert shapes.check_disk("a3-megagpu-8g", "hyperdisk-balanced") is None  # accepted where the type allows it


@pytest.mark.parametrize("machine, gpu", [("a3-ultragpu-8g", "NVIDIA_H200_141GB"), ("a4-highgpu-8g", "NVIDIA_B200")])
def test_pd_ssd_on_a3_ultra_or_a4_is_a_named_error(machine, gpu, capsys, tmp_path):
    args = [f"resources.machine_type={machine}", f"resources.accelerator_type={gpu}", "resources.boot_disk_type=pd-ssd"]
    assert main(["--config", str(H200), "--output", str(tmp_path / "o.yaml"), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{H200} (override resources.boot_disk_type=" in err
    assert f"{machine} (Hyperdisk only) does not take boot disk type 'pd-ssd'; valid: hyperdisk-balanced" in err
    assert not (tmp_path / "o.yaml").exists()


def test_pd_ssd_written_in_the_file_names_its_line(tmp_path):
    text = H200.read_text().replace("boot_disk_type: hyperdisk-balanced", "boot_disk_type: pd-ssd")
    path = tmp_path / "h200.yaml"
    path.write_text(text)
    line = next(n for n, t in enumerate(text.splitlines(), 1) if "boot_disk_type: pd-ssd" in t)
    with pytest.raises(ConfigError, match=rf"^{path}:{line}: 'resources.boot_disk_type': a3-ultragpu-8g"):
        load_config(path)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["resources.boot_disk_type=hyperdisk-balanced"],
            "a2-highgpu-1g does not take boot disk type 'hyperdisk-balanced'; valid: pd-ssd, pd-standard",
        ),
        (["resources.boot_disk_type=pd-balanced"], "aiplatform_v1.DiskSpec documents pd-ssd, pd-standard, hyperdisk"),
        (
            ["resources.machine_type=a4-highgpu-8g", "resources.accelerator_type=NVIDIA_H200_141GB"],
            "a4-highgpu-8g comes with exactly 8 x NVIDIA_B200, got 1 x NVIDIA_H200_141GB",
        ),
    ],
    ids=["hyperdisk-on-a2", "unknown-disk", "b200-machine-h200-gpu"],
)
def test_combinations_the_types_do_not_document_are_named(overrides, message, capsys, tmp_path):
    assert main(["--config", str(SEED), "--output", str(tmp_path / "o.yaml"), *overrides]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


# --- several nodes: the whole job restarts ------------------------------------------------


def test_a_multi_node_job_restarts_whole_and_a_single_node_one_does_not(tmp_path):
    job, payload = _job(TWO_NODES, tmp_path)
    assert [p.replica_count for p in job.job_spec.worker_pool_specs] == [1, 1]
    assert job.job_spec.scheduling.restart_job_on_worker_restart is True
    assert payload["job_spec"]["scheduling"]["restart_job_on_worker_restart"] is True
    single, _ = _job(TWO_NODES, tmp_path, **{"resources.replica_count": 1})
    assert single.job_spec.scheduling.restart_job_on_worker_restart is False


def test_a_persistent_resource_reaches_the_custom_job(tmp_path):
    job, _ = _job(SEED, tmp_path, **{"vertex.persistent_resource_id": "vlm-lora-a100-pool"})
    assert job.job_spec.persistent_resource_id == "vlm-lora-a100-pool"
    plain, _ = _job(SEED, tmp_path)
    assert plain.job_spec.persistent_resource_id == ""  # the run's own (none): GCPC's runtime placeholder


# --- refused at load or compile: exit 2, one line, file:line and the fix --------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["resources.scheduling=flex_start", "resources.reservation=any"],
            "'resources.reservation' 'any' with 'resources.scheduling: flex_start': Flex Start",
        ),
        (
            ["vertex.service_account=", "vertex.tensorboard=projects/p/locations/us-central1/tensorboards/1"],
            "'vertex.tensorboard' is set but 'vertex.service_account' is empty",
        ),
        (
            ["resources.scheduling=flex_start", "resources.max_wait_s=-1"],
            "'resources.max_wait_s' must be 0 (no limit) or a positive number of seconds, got -1",
        ),
        (
            ["resources.scheduling=flex_start", "resources.timeout_s=700000"],
            "Flex Start jobs run at most 7 days; set resources.timeout_s to at most 604800",
        ),
        (
            ["vertex.persistent_resource_id=projects/p/locations/l/persistentResources/r"],
            "'vertex.persistent_resource_id' must be a persistent resource ID",
        ),
        (["vertex.persistent_resource_id=pool-"], "not ending in '-'"),
    ],
    ids=["reservation-flex-start", "tensorboard-no-sa", "max-wait", "flex-timeout", "pr-name", "pr-dash"],
)
def test_refusals_at_load(overrides, message, capsys, tmp_path):
    assert main(["--config", str(SEED), "--output", str(tmp_path / "o.yaml"), *overrides]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith(f"error: {SEED}") and err.count("\n") == 1, err
    assert not (tmp_path / "o.yaml").exists()


def test_flex_start_without_a_wait_limit_is_the_types_zero(tmp_path):
    job, _ = _job(SEED, tmp_path, **{"resources.scheduling": "flex_start", "resources.max_wait_s": 0})
    assert job.job_spec.scheduling.strategy.name == "FLEX_START"
    assert job.job_spec.scheduling.max_wait_duration.total_seconds() == 0  # 0 = wait without limit


def test_a_local_config_compiled_for_vertex_is_refused(capsys, tmp_path):
    line = next(n for n, t in enumerate(LOCAL.read_text().splitlines(), 1) if t.strip().startswith("root:"))
    assert main(["--config", str(LOCAL), "--output", str(tmp_path / "o.yaml")]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"error: {LOCAL}:{line}: 'pipeline.root' 'runs' is a local folder") and "--target local" in err
    )
    assert main(["--config", str(LOCAL), "--target", "local", "--output", str(tmp_path / "l.yaml")]) == 0


def test_another_configs_default_output_is_not_overwritten(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(SEED.read_text())
    second.write_text("# another config, same pipeline.name\n" + SEED.read_text())
    name = load_config(first).pipeline.name
    assert main(["--config", str(first)]) == 0
    before = (tmp_path / "build" / f"{name}.yaml").read_bytes()
    assert main(["--config", str(first)]) == 0  # the same config again: fine
    assert main(["--config", str(second)]) == 2
    err = capsys.readouterr().err
    assert f"build/{name}.yaml was compiled from {first}, not {second}" in err and "--output FILE" in err
    assert (tmp_path / "build" / f"{name}.yaml").read_bytes() == before
    assert main(["--config", str(second), "--output", str(tmp_path / "b-out.yaml")]) == 0  # its own output
