"""GPUDirect in the training JobSet (issue 55): what GKE documents per machine (components.common.gpudirect).

A3 Mega gets TCPXO (the daemon sidecar, the NCCL_FASTRAK_* configuration, its volumes and the eight GPU
NICs), A3 Ultra and A4 get RDMA through gIB (the /usr/local/gib mounts, set_nccl_env.sh sourced before
training, gvnic-1 and rdma-0..7), every other machine and one node nothing; `gke.gpudirect: skip` turns it
off, `require` on a machine without it is a named error before anything is written. The manifests are
checked against the JobSet CRD's schema and the kubernetes client's models, as in tests/test_gke_jobset.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from components.common import gpudirect as gd
from components.common import jobset as js
from pipelines import gke
from pipelines.cli import main as vlm_lora
from pipelines.config import load_config
from pipelines.gke_section import GkeSection, gke_problems
from tests.test_gke_jobset import TWO_NODE, URIS, errors, round_trip, spec_of, validator  # noqa: F401 (fixture)

MEGA = {"resources.machine_type": "a3-megagpu-8g", "resources.accelerator_type": "NVIDIA_H100_MEGA_80GB"}
ULTRA = {"resources.machine_type": "a3-ultragpu-8g", "resources.accelerator_type": "NVIDIA_H200_141GB"}
A4 = {"resources.machine_type": "a4-highgpu-8g", "resources.accelerator_type": "NVIDIA_B200"}


def pod_of(**overrides) -> dict:
    return js.build_jobset(spec_of(TWO_NODE, **overrides))["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def nics(pod: dict) -> list[tuple[str, str]]:
    rows = json.loads(pod["metadata"]["annotations"][gd.INTERFACES_ANNOTATION])
    return [(r["interfaceName"], r["network"]) for r in rows]


def test_a3_mega_gets_tcpxo_the_daemon_its_volumes_and_eight_nics(validator):
    manifest = js.build_jobset(spec_of(TWO_NODE, **MEGA))
    assert errors(validator, manifest) == []
    template = manifest["spec"]["replicatedJobs"][0]["template"]
    assert round_trip(template, "V1JobTemplateSpec") == template, "every field is a Kubernetes field"
    pod = template["spec"]["template"]
    assert nics(pod) == [("eth0", "default")] + [(f"eth{i}", f"vpc{i}") for i in range(1, 9)]
    annotations = pod["metadata"]["annotations"]
    assert annotations[gd.DEFAULT_INTERFACE_ANNOTATION] == "eth0" and annotations[js.FUSE_ANNOTATION] == "true"
    assert yaml.safe_load(annotations[gd.TCPXO_DEVICES_ANNOTATION])[-1] == {"path": "/dev/dmabuf_import_helper"}
    (daemon,) = pod["spec"]["initContainers"]
    assert daemon["name"] == "tcpxo-daemon" and daemon["restartPolicy"] == "Always", "a native sidecar"
    assert daemon["image"].endswith("/tcpgpudmarxd-dev:v1.0.21") and "startupProbe" in daemon
    assert {"name": "aperture-devices", "hostPath": {"path": "/dev/aperture_devices"}} in pod["spec"]["volumes"]
    env = env_of(pod)
    assert env["NCCL_FASTRAK_IFNAME"] == "eth1,eth2,eth3,eth4,eth5,eth6,eth7,eth8"
    assert env["NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY"] == "/dev/aperture_devices"
    assert env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64" and "NCCL_DEBUG" not in env
    assert env["JOBSET_NNODES"] == "2", "the JobSet's own variables stay"
    container = pod["spec"]["containers"][0]
    assert {"name": "nvidia", "mountPath": "/usr/local/nvidia/lib64"} in container["volumeMounts"]
    assert container["command"] == ["python3", "-m", "components.train_lora"]


@pytest.mark.parametrize("machine", [ULTRA, A4])
def test_a3_ultra_and_a4_get_rdma_through_gib(validator, machine):
    manifest = js.build_jobset(spec_of(TWO_NODE, **machine))
    assert errors(validator, manifest) == []
    template = manifest["spec"]["replicatedJobs"][0]["template"]
    assert round_trip(template, "V1JobTemplateSpec") == template
    pod = template["spec"]["template"]
    assert nics(pod) == [("eth0", "default"), ("eth1", "gvnic-1")] + [(f"eth{i + 2}", f"rdma-{i}") for i in range(8)]
    assert "initContainers" not in pod["spec"] and gd.TCPXO_DEVICES_ANNOTATION not in pod["metadata"]["annotations"]
    assert {"name": "gib", "hostPath": {"path": "/home/kubernetes/bin/gib"}} in pod["spec"]["volumes"]
    container = pod["spec"]["containers"][0]
    assert {"name": "gib", "mountPath": "/usr/local/gib", "readOnly": True} in container["volumeMounts"]
    env = env_of(pod)
    assert env["NCCL_NET"] == "gIB" and env["LD_LIBRARY_PATH"].split(":") == [
        "/usr/local/gib/lib64",
        "/usr/local/nvidia/lib64",
    ]
    assert not any(k.startswith("NCCL_FASTRAK") for k in env)
    assert container["command"][:2] == ["/bin/bash", "-c"] and gd.GIB_SCRIPT in container["command"][2]
    assert container["command"][3:] == ["python3", "-m", "components.train_lora"]
    _, args = js.training_command("gs://b/m", "gs://b/t", "gs://b/e", "gs://b/a", "", {}, 8, "fail", {})
    run = js.with_run(manifest, "run-2", args)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert run["spec"]["containers"][0]["command"] == container["command"], "a run sets only the arguments"


def test_the_gib_prefix_sources_the_script_then_runs_the_command_with_its_arguments(tmp_path):
    script = tmp_path / "set_nccl_env.sh"
    script.write_text("export NCCL_IB_TC=52\n")
    prefix = [part.replace(gd.GIB_SCRIPT, str(script)) for part in gd.GIB_PREFIX]
    program = [sys.executable, "-c", "import os, sys; print(os.environ['NCCL_IB_TC'], sys.argv[1:])", "a b", "--c"]
    done = subprocess.run([*prefix, *program], capture_output=True, text=True, env={**os.environ}, check=True)
    assert done.stdout.strip() == "52 ['a b', '--c']"
    script.unlink()
    failed = subprocess.run([*prefix, *program], capture_output=True, text=True)
    assert failed.returncode == 1 and "nccl-rdma-installer DaemonSet" in failed.stderr and failed.stdout == ""


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # a3-highgpu-8g: no GPUDirect pod settings documented (TCPX is not added)
        {"resources.machine_type": "g2-standard-96", "resources.accelerator_type": "NVIDIA_L4"},
        {"resources.machine_type": "a2-highgpu-8g", "resources.accelerator_type": "NVIDIA_TESLA_A100"},
        {**A4, "resources.replica_count": 1},  # one node: nothing crosses a node
        {**MEGA, "gke.gpudirect": "skip"},
        {**A4, "gke.gpudirect": "skip"},
    ],
)
def test_other_machines_one_node_and_off_get_nothing(overrides):
    pod = pod_of(**overrides)
    assert set(pod["metadata"]["annotations"]) == {js.FUSE_ANNOTATION}
    assert "initContainers" not in pod["spec"] and [v["name"] for v in pod["spec"]["volumes"]] == ["gcs", "dshm"]
    assert not any(k.startswith("NCCL_") or k == "LD_LIBRARY_PATH" for k in env_of(pod))
    assert pod["spec"]["containers"][0]["command"] == ["python3", "-m", "components.train_lora"]


def test_require_adds_it_on_one_node_and_other_network_names_are_used():
    pod = pod_of(**A4, **{"resources.replica_count": 1, "gke.gpudirect": "require"})
    assert env_of(pod)["NCCL_NET"] == "gIB"
    nets = [f"team-rdma-{i}" for i in range(9)]
    pod = pod_of(**MEGA, **{"gke.gpudirect_networks": nets[:8]})
    assert [n for _, n in nics(pod)] == ["default", *nets[:8]]


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["gke.gpudirect=require"], "'gke.gpudirect' is require but the node pool's machine 'a3-highgpu-8g' has no"),
        (["gke.gpudirect=always"], "'gke.gpudirect' must be one of auto, require, skip"),
        (["gke.gpudirect_networks=[rdma-0]"], "'gke.gpudirect_networks' is set but no GPUDirect is added"),
        ([*(f"{k}={v}" for k, v in A4.items()), "gke.gpudirect_networks=[rdma-0]"], "must name 9 GKE Networks"),
    ],
)
def test_bad_gpudirect_settings_are_named_errors_before_anything_is_written(tmp_path, capsys, extra, words):
    out = tmp_path / "m"
    assert vlm_lora(["gke", "jobset", "--config", TWO_NODE, "--out", str(out), "--image", "r/t:1", *URIS, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err and not out.exists()


def test_the_cli_writes_tcpxo_and_the_node_pools_machine_decides(tmp_path):
    out = tmp_path / "m"
    mega = [f"{k}={v}" for k, v in MEGA.items()]
    assert vlm_lora(["gke", "jobset", "--config", TWO_NODE, "--out", str(out), "--image", "r/t:1", *URIS, *mega]) == 0
    (manifest,) = yaml.safe_load_all((out / "jobset.yaml").read_text())
    pod = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert pod["spec"]["initContainers"][0]["name"] == "tcpxo-daemon"
    pool = GkeSection(machine_type="a4-highgpu-8g")
    assert gke_problems(pool, "a3-highgpu-8g", "NVIDIA_H100_80GB", 8, "gs://b/root", 2) == []
    assert gke.jobset_spec(
        load_config(TWO_NODE, {"gke.machine_type": "a4-highgpu-8g"}), "i", "n", [], []
    ).gpudirect == ("a4-highgpu-8g")
    ((key, message),) = gke_problems(GkeSection(), "a3-megagpu-8g", "NVIDIA_H100_MEGA_80GB", 4, "gs://b/root", 2)
    assert key == "resources.accelerator_count" and "needs every GPU of the node (8)" in message


def test_the_compiled_gke_pipeline_carries_gib_in_its_jobset_template(tmp_path):
    from google.protobuf import json_format

    from tests.pipeline_spec import tasks
    from tests.test_gke import compiled

    spec, _ = compiled(tmp_path, TWO_NODE, *(f"{k}={v}" for k, v in A4.items()))
    task = tasks(json_format.MessageToDict(spec))["train-lora-jobset"].spec
    pod = task["inputs"]["parameters"]["jobset"]["runtimeValue"]["constant"]["spec"]["replicatedJobs"][0]
    pod = pod["template"]["spec"]["template"]
    assert pod["spec"]["nodeSelector"][js.ACCELERATOR_LABEL] == "nvidia-b200"
    assert env_of(pod)["NCCL_NET"] == "gIB" and nics(pod)[-1] == ("eth9", "rdma-7")
    assert pod["spec"]["containers"][0]["command"][:2] == ["/bin/bash", "-c"]
