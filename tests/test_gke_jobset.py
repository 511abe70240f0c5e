"""The training JobSet (issue 55): manifests validated against the JobSet CRD's own OpenAPI v3 schema
(kubernetes-sigs/jobset v0.12.0, tests/fixtures/README.md), the Kueue / topology / restart settings, and
`vlm-lora gke jobset` (the manifest for `kubectl apply`, a folder of another config refused)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from components.common import jobset as js
from pipelines import gke
from pipelines.cli import main as vlm_lora
from pipelines.config import load_config

CRD_FIXTURE = Path(__file__).parent / "fixtures" / "jobset.x-k8s.io_jobsets.v0.12.0.yaml.gz"
SEED = "configs/qwen3_vl_4b/lora_seed.yaml"
TWO_NODE = "configs/qwen3_vl_4b/lora_h100_x8_2node.yaml"
URIS = ["--model", "gs://b/models/qwen", "--train", "gs://b/data/train", "--eval", "gs://b/data/eval",
        "--adapter", "gs://b/out/adapter", "--model-type", "qwen3_vl"]  # fmt: skip


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    crd = yaml.safe_load(gzip.decompress(CRD_FIXTURE.read_bytes()))
    assert crd["kind"] == "CustomResourceDefinition" and crd["spec"]["group"] == "jobset.x-k8s.io"
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2")
    schema = version["schema"]["openAPIV3Schema"]
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def pruned(schema: dict, value, path: str = "") -> list[str]:
    """Fields the API server would drop (structural schemas prune undeclared fields rather than refuse them)."""
    if isinstance(value, list) and "items" in schema:
        return [p for i, v in enumerate(value) for p in pruned(schema["items"], v, f"{path}[{i}]")]
    if not isinstance(value, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    props = schema.get("properties")
    if props is None:
        extra = schema.get("additionalProperties")
        return [p for k, v in value.items() for p in pruned(extra, v, f"{path}.{k}")] if isinstance(extra, dict) else []
    out = [f"{path}.{k}" for k in value if k not in props]
    return out + [p for k, v in value.items() if k in props for p in pruned(props[k], v, f"{path}.{k}")]


def errors(validator, manifest: dict) -> list[str]:
    found = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(manifest)]
    metadata_free = {k: v for k, v in manifest.items() if k != "metadata"}  # ObjectMeta is not in the CRD's schema
    return found + [f"{p}: not in the schema (pruned)" for p in pruned(validator.schema, metadata_free)]


def spec_of(config: str, **overrides) -> js.JobSetSpec:
    cfg = load_config(config, overrides)
    command, args = gke.train_command(cfg, *URIS[1:8:2], "gs://b/ckpt", {"NCCL_DEBUG": "INFO"})
    return gke.jobset_spec(cfg, "registry/train:tag", "run-1", command, args)


def test_the_schema_catches_a_wrong_manifest(validator):
    manifest = js.build_jobset(spec_of(TWO_NODE))
    manifest["spec"]["failurePolicy"]["maxRestarts"] = "two"
    manifest["spec"]["replicatedJobs"][0]["replicas"] = "1"
    manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["paralelism"] = 2
    found = errors(validator, manifest)
    assert any("maxRestarts" in e for e in found) and any("replicas" in e for e in found)
    assert any(e.endswith("template.spec.paralelism: not in the schema (pruned)") for e in found)


@pytest.mark.parametrize(
    ("config", "overrides", "nodes", "gpus"),
    [
        (SEED, {}, 1, 1),
        (TWO_NODE, {}, 2, 8),
        (TWO_NODE, {"gke.kueue": True, "gke.queue": "team-a", "gke.topology": "cloud.google.com/gce-topology-block"}, 2, 8),
        (TWO_NODE, {"gke.kueue": True, "gke.queue": "team-a", "gke.topology": "kubernetes.io/hostname",
                    "gke.topology_mode": "preferred", "gke.max_restarts": 5}, 2, 8),
    ],
)  # fmt: skip
def test_manifests_are_valid_jobsets_of_one_pod_per_node(validator, config, overrides, nodes, gpus):
    spec = spec_of(config, **overrides)
    manifest = js.build_jobset(spec)
    assert errors(validator, manifest) == []
    job = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]
    pod = job["template"]["spec"]
    container = pod["containers"][0]
    assert (job["parallelism"], job["completions"], job["completionMode"], job["backoffLimit"]) == (
        nodes,
        nodes,
        "Indexed",
        0,
    )
    assert container["resources"]["requests"] == container["resources"]["limits"] == {"nvidia.com/gpu": str(gpus)}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert manifest["spec"]["network"] == {"enableDNSHostnames": True, "subdomain": "run-1"}
    assert {"name": "gcs", "mountPath": "/gcs/YOUR_BUCKET"} in container["volumeMounts"]
    assert container["image"] == "registry/train:tag" and container["command"] == [
        "python3",
        "-m",
        "components.train_lora",
    ]
    args = dict(zip(container["args"][::2], container["args"][1::2]))
    assert args["--model"] == "/gcs/b/models/qwen" and args["--adapter"] == "/gcs/b/out/adapter"
    assert json.loads(args["--swift-args"]) == load_config(config, overrides).swift
    assert manifest["spec"]["failurePolicy"]["maxRestarts"] == overrides.get("gke.max_restarts", 2)
    labels, annotations = manifest["metadata"]["labels"], job["template"]["metadata"]["annotations"]
    if overrides.get("gke.kueue"):
        assert labels[js.QUEUE_LABEL] == "team-a" and manifest["spec"]["suspend"] is True
        mode = overrides.get("gke.topology_mode", "required")
        assert annotations[f"kueue.x-k8s.io/podset-{mode}-topology"] == overrides["gke.topology"]
    else:
        assert js.QUEUE_LABEL not in labels and "suspend" not in manifest["spec"]
        assert not any(k.startswith("kueue.x-k8s.io/") for k in annotations)


def test_the_launcher_fills_a_compiled_template_into_a_valid_manifest(validator):
    cfg = load_config(TWO_NODE)
    template = gke.jobset_template(cfg, "registry/train:tag")
    _, args = gke.train_command(cfg, *URIS[1:8:2], "gs://b/ckpt", {})
    manifest = js.with_run(template, "vlm-lora-0123456789abcdef", args)
    assert errors(validator, manifest) == []
    assert manifest["metadata"]["name"] == manifest["spec"]["network"]["subdomain"] == "vlm-lora-0123456789abcdef"
    assert template["metadata"]["name"] == "vlm-lora-run", "the template is not changed"
    with pytest.raises(js.JobSetSpecError, match="at most 40"):
        js.with_run(template, "x" * 41, args)


def test_the_cli_writes_the_jobset_and_the_buckets_volume(tmp_path, capsys):
    out = tmp_path / "manifests"
    assert vlm_lora(["gke", "jobset", "--config", TWO_NODE, "--out", str(out), "--image", "r/train:t", *URIS]) == 0
    assert "kubectl apply -f" in capsys.readouterr().out
    (manifest,) = yaml.safe_load_all((out / "jobset.yaml").read_text())
    pv, pvc = yaml.safe_load_all((out / "storage.yaml").read_text())
    assert (
        manifest["kind"] == "JobSet"
        and manifest["metadata"]["annotations"][js.CONFIG_ANNOTATION] == load_config(TWO_NODE).pipeline.name
    )
    assert pv["spec"]["csi"] == {"driver": "gcsfuse.csi.storage.gke.io", "volumeHandle": "YOUR_BUCKET"}
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    claim = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["volumes"][0]
    assert claim["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    # the same config again: replaced whole
    assert vlm_lora(["gke", "jobset", "--config", TWO_NODE, "--out", str(out), "--image", "r/train:t", *URIS]) == 0


def test_a_folder_with_another_configs_manifest_is_refused_and_kept(tmp_path, capsys):
    out = tmp_path / "manifests"
    assert vlm_lora(["gke", "jobset", "--config", TWO_NODE, "--out", str(out), "--image", "r/t:1", *URIS]) == 0
    before = (out / "jobset.yaml").read_bytes()
    capsys.readouterr()
    assert vlm_lora(["gke", "jobset", "--config", SEED, "--out", str(out), "--image", "r/t:1", *URIS]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --out") and "manifest of config 'qwen3-vl-4b-lora-h100-x8-2node'" in err
    assert "\n" not in err and (out / "jobset.yaml").read_bytes() == before


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["gke.queue=team-a"], "'gke.kueue' is false"),
        (["gke.bucket=/data"], "must be a gs://bucket URI"),
        (["gke.machine_type=a3-highgpu-4g"], "8 GPUs per node but a3-highgpu-4g has 4"),
    ],
)
def test_bad_settings_write_nothing(tmp_path, capsys, extra, words):
    out = tmp_path / "m"
    assert vlm_lora(["gke", "jobset", "--config", TWO_NODE, "--out", str(out), "--image", "r/t:1", *URIS, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err and not out.exists()


def test_a_path_that_is_not_gs_is_refused(tmp_path, capsys):
    uris = [*URIS[:1], "/local/model", *URIS[2:]]
    assert vlm_lora(["gke", "jobset", "--config", TWO_NODE, "--out", str(tmp_path / "m"), "--image", "r:1", *uris]) == 2
    assert "--model '/local/model': must be a gs:// URI" in capsys.readouterr().err


class _Response:
    def __init__(self, obj: dict):
        self.data = json.dumps(obj)


def round_trip(obj: dict, kind: str) -> dict:
    """The object through the kubernetes client's own generated models: a misspelt or undeclared field is dropped."""
    from kubernetes import client

    api = client.ApiClient()
    return api.sanitize_for_serialization(api.deserialize(_Response(obj), kind))


def test_the_core_types_keep_every_field_through_the_kubernetes_models(tmp_path):
    out = tmp_path / "setup"
    assert vlm_lora(["gke", "setup", "--config", TWO_NODE, "--out", str(out), "gke.namespace=team-a"]) == 0
    docs = [
        *yaml.safe_load_all((out / "storage.yaml").read_text()),
        *yaml.safe_load_all((out / "rbac.yaml").read_text()),
    ]
    kinds = ["V1PersistentVolume", "V1PersistentVolumeClaim", "V1Role", "V1RoleBinding"]
    assert [d["kind"] for d in docs] == [k[2:] for k in kinds]
    for doc, kind in zip(docs, kinds):
        assert round_trip(doc, kind) == doc, kind
    role, binding = docs[2:]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pipeline-runner", "namespace": "team-a"}]
    assert {"create", "watch", "delete"} <= set(role["rules"][0]["verbs"])
    pod = js.build_jobset(spec_of(TWO_NODE))["spec"]["replicatedJobs"][0]["template"]
    assert round_trip(pod, "V1JobTemplateSpec") == pod
    broken = {**docs[0], "spec": {**docs[0]["spec"], "acessModes": ["ReadWriteMany"]}}
    assert round_trip(broken, "V1PersistentVolume") != broken, "the check catches a misspelt field"
