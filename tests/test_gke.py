"""`--target gke` (issue 55): the compiled pipeline read back with kfp's and kfp-kubernetes' own protos (PipelineSpec,
PlatformSpec, KubernetesExecutorConfig) for the seed's profile and a 2-node one, and the `gke` section's named errors."""

from __future__ import annotations

import pytest
import yaml
from google.protobuf import json_format
from kfp.kubernetes import kubernetes_executor_config_pb2 as k8s_pb
from kfp.pipeline_spec import pipeline_spec_pb2

from components.common import jobset as js
from pipelines import compile as compile_cmd
from pipelines.config import ConfigError, load_config
from tests.pipeline_spec import tasks

SEED = "configs/qwen3_vl_4b/lora_seed.yaml"
TWO_NODE = "configs/qwen3_vl_4b/lora_h100_x8_2node.yaml"
GPU_TASKS = {"exec-merge-export", "exec-evaluate"}


def compiled(tmp_path, config: str, *overrides: str) -> tuple[pipeline_spec_pb2.PipelineSpec, dict]:
    """Compiles with --target gke; returns the PipelineSpec proto and {executor: KubernetesExecutorConfig}."""
    out = tmp_path / "gke.yaml"
    assert compile_cmd.main(["--config", config, "--target", "gke", "--output", str(out), *overrides]) == 0
    spec_doc, platform_doc = yaml.safe_load_all(out.read_text())
    spec = json_format.ParseDict(spec_doc, pipeline_spec_pb2.PipelineSpec())
    platform = json_format.ParseDict(platform_doc, pipeline_spec_pb2.PlatformSpec())
    executors = platform.platforms["kubernetes"].deployment_spec.executors
    configs = {
        name: json_format.ParseDict(json_format.MessageToDict(s), k8s_pb.KubernetesExecutorConfig())
        for name, s in executors.items()
    }
    return spec, configs


def containers(spec: pipeline_spec_pb2.PipelineSpec) -> dict:
    deployment = json_format.MessageToDict(spec.deployment_spec)
    return {name: e["container"] for name, e in deployment["executors"].items()}


def _is_gpu(cfg: k8s_pb.KubernetesExecutorConfig) -> bool:
    return js.ACCELERATOR_LABEL in cfg.node_selector.labels


def test_seed_profile_compiles_for_gke_with_placement_gpus_and_the_bucket(tmp_path):
    spec, configs = compiled(tmp_path, SEED)
    images = containers(spec)
    assert set(configs) == set(images), "every task gets its Kubernetes settings"
    for cfg in configs.values():
        assert [(m.mount_path, m.constant) for m in cfg.pvc_mount] == [
            ("/gcs/YOUR_BUCKET", "qwen3-vl-4b-lora-seed-gcs")
        ]
        assert cfg.pod_metadata.annotations[js.FUSE_ANNOTATION] == "true"
    gpu = {name for name, cfg in configs.items() if _is_gpu(cfg)}
    assert gpu == GPU_TASKS | {"exec-train-lora"}
    for name in gpu:
        cfg = configs[name]
        assert cfg.node_selector.labels[js.ACCELERATOR_LABEL] == "nvidia-tesla-a100"
        assert [(t.key, t.operator, t.effect) for t in cfg.tolerations] == [("nvidia.com/gpu", "Exists", "NoSchedule")]
        accelerator = images[name]["resources"]["accelerator"]
        assert (accelerator["resourceType"], accelerator["resourceCount"]) == ("nvidia.com/gpu", "1")
        assert "/train:" in images[name]["image"]
        assert [m.mount_path for m in cfg.empty_dir_mounts] == ["/dev/shm"]
    for name in set(configs) - gpu:
        assert not configs[name].tolerations and "accelerator" not in images[name].get("resources", {})
        assert "/light:" in images[name]["image"]
    assert spec.default_pipeline_root == "gs://YOUR_BUCKET/pipeline-root"


def test_two_node_profile_trains_as_a_jobset_the_light_launcher_follows(tmp_path):
    spec, configs = compiled(tmp_path, TWO_NODE, "gke.node_pool=h100-pool", "gke.cpu_node_pool=cpu-pool")
    images = containers(spec)
    launcher = "exec-train-lora-jobset"
    assert not _is_gpu(configs[launcher]) and "/light:" in images[launcher]["image"]
    assert configs[launcher].node_selector.labels[js.NODE_POOL_LABEL] == "cpu-pool"
    task = tasks(json_format.MessageToDict(spec))["train-lora-jobset"].spec  # at any depth (champion branches)
    manifest = task["inputs"]["parameters"]["jobset"]["runtimeValue"]["constant"]
    job = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]
    pod = job["template"]["spec"]
    assert (job["parallelism"], job["completions"], job["completionMode"]) == (2, 2, "Indexed")
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert pod["nodeSelector"] == {js.ACCELERATOR_LABEL: "nvidia-h100-80gb", js.NODE_POOL_LABEL: "h100-pool"}
    assert "/train:" in pod["containers"][0]["image"]
    assert task["taskInfo"]["name"] == "train-lora"


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        (["resources.machine_type=a2-highgpu-2g", "resources.accelerator_count=2", "gke.machine_type=a2-highgpu-1g"],
         "resources.accelerator_count", "2 GPUs per node but a2-highgpu-1g has 1"),
        (["gke.queue=team-a"], "gke.queue", "'gke.kueue' is false"),
        (["gke.kueue=true", "gke.queue=team-a", "gke.topology_mode=sometimes"], "gke.topology_mode", "required, preferred"),
        (["gke.topology=cloud.google.com/gce-topology-block"], "gke.topology", "'gke.kueue' is false"),
        (["gke.bucket=/mnt/data"], "gke.bucket", "must be a gs://bucket URI"),
        (["gke.bucket=s3://data"], "gke.bucket", "must be a gs://bucket URI"),
    ],
)  # fmt: skip
def test_bad_gke_settings_are_named_errors_before_anything_is_written(tmp_path, capsys, overrides, key, words):
    out = tmp_path / "gke.yaml"
    code = compile_cmd.main(["--config", SEED, "--target", "gke", "--output", str(out), *overrides])
    err = capsys.readouterr().err.strip()
    assert code == 2 and not out.exists()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    assert key in err and words in err
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):  # the same error when the config loads
        load_config(SEED, {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in overrides)})


def test_a_local_root_without_a_bucket_is_refused_for_gke_only(tmp_path, capsys):
    local = "configs/local/tiny_cpu.yaml"
    assert load_config(local).gke.bucket == ""  # loads: the section is only checked for gke
    assert compile_cmd.main(["--config", local, "--target", "gke", "--output", str(tmp_path / "x.yaml")]) == 2
    assert "set gke.bucket: gs://BUCKET" in capsys.readouterr().err


def test_registry_skip_drops_register_on_gke(tmp_path):
    spec, configs = compiled(tmp_path, SEED, "register.serving_image=train")
    assert "exec-register" in configs
    spec, configs = compiled(tmp_path, SEED, "register.serving_image=train", "gke.registry=skip")
    assert "exec-register" not in configs


def test_the_champion_is_found_as_on_vertex_unless_the_registry_is_skipped(tmp_path, capsys):
    _, configs = compiled(tmp_path, SEED, "register.serving_image=train")
    assert "exec-find-champion" in configs  # eval.reference auto: the registry's champion, as on Vertex
    _, configs = compiled(tmp_path, SEED, "register.serving_image=train", "gke.registry=skip")
    assert "exec-find-champion" not in configs and "exec-register" not in configs
    out, folder = tmp_path / "x.yaml", tmp_path / "merged"
    folder.mkdir()
    (folder / "config.json").write_text("{}")  # a local model folder: fine locally, unreadable by the pods
    args = ["--config", SEED, "--target", "gke", "--output", str(out), f"eval.reference={folder}"]
    assert compile_cmd.main(args) == 2 and not out.exists()
    assert "is a local folder" in capsys.readouterr().err
