"""The GKE target: task placement for Kubeflow Pipelines on GKE, and the training JobSet of a config.

    vlm-lora gke setup --config NAME --out DIR       # the bucket's volume and the launcher's RBAC, once
    vlm-lora gke jobset --config NAME --out DIR --model gs://.. --train gs://.. --eval gs://.. --adapter gs://..

`--target gke` (`pipelines.compile`) compiles the same DAG for open-source KFP 2; this module gives
its tasks their Kubernetes settings through `kfp-kubernetes` (the GPU tasks: the accelerator's
node selector, GPU requests / limits, the `nvidia.com/gpu` toleration; every task: the bucket's
claim mounted at `/gcs/<bucket>` with the GCS FUSE sidecar annotation; the light tasks: a CPU node
pool where named). `jobset` writes the training JobSet (`components.common.jobset`) and the
bucket's PersistentVolume / Claim for `kubectl apply`; `setup` the volume and the Role that lets the
pipeline's pods create and follow JobSets. Exit codes: 0 written, 2 a bad config or
argument, or a folder that holds another config's manifest (one line, nothing written).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from components.common import gpudirect
from components.common import jobset as js
from pipelines.config import Config, ConfigError, check_gke, load_config, parse_overrides, train_settings
from pipelines.gke_section import GKE_ACCELERATORS, gke_bucket

JOBSET_FILE, STORAGE_FILE, RBAC_FILE = "jobset.yaml", "storage.yaml", "rbac.yaml"


class ManifestFolderError(ConfigError):
    """The manifest folder holds another config's manifest (or is not a folder)."""


def claim_name(cfg: Config) -> str:
    """The bucket's PersistentVolumeClaim: gke.volume_claim, else `<pipeline.name>-gcs`."""
    return cfg.gke.volume_claim or f"{cfg.pipeline.name}-gcs"[:63]


def check_target(cfg: Config) -> str:
    """Checks a config for the GKE target (every `gke` rule, even for a config without the section).

    Returns:
        The bucket mounted at /gcs/<bucket>.

    Raises:
        ConfigError: The first problem (`pipelines.config.check_gke`).
    """
    check_gke(cfg)
    return gke_bucket(cfg.gke, cfg.pipeline.root)


def place_task(task: Any, cfg: Config, gpus: int, accelerator_type: str = "", node_pool: str = "") -> Any:
    """Gives one KFP task its GKE placement and the bucket mount (kfp-kubernetes).

    Args:
        task: The PipelineTask.
        cfg: The validated config.
        gpus: GPUs the task asks for (0 = a light task on CPU nodes).
        accelerator_type: resources' Vertex accelerator enum of the GPU (mapped to GKE's label).
        node_pool: `cloud.google.com/gke-nodepool` to select ("" = none).

    Returns:
        The task.
    """
    from kfp import kubernetes

    kubernetes.mount_pvc(task, pvc_name=claim_name(cfg), mount_path=f"/gcs/{gke_bucket(cfg.gke, cfg.pipeline.root)}")
    kubernetes.add_pod_annotation(task, js.FUSE_ANNOTATION, "true")
    if node_pool:
        kubernetes.add_node_selector(task, js.NODE_POOL_LABEL, node_pool)
    if gpus:
        task.set_accelerator_type(js.GPU_RESOURCE).set_accelerator_limit(gpus)
        kubernetes.add_node_selector(task, js.ACCELERATOR_LABEL, GKE_ACCELERATORS[accelerator_type])
        kubernetes.add_toleration(task, key=js.GPU_RESOURCE, operator="Exists", effect="NoSchedule")
        kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory")
    return task


def place_training(train: Any, cfg: Config) -> None:
    """Places train-lora: a GPU pod on one node; with several nodes the launcher on CPU (the JobSet has the GPUs)."""
    r = cfg.resources
    if r.replica_count == 1:
        place_task(train, cfg, r.accelerator_count, r.accelerator_type, cfg.gke.node_pool)
        train.set_retry(num_retries=cfg.gke.max_restarts)  # a lost pod resumes from its newest complete checkpoint
        return
    place_task(train, cfg, 0, node_pool=cfg.gke.cpu_node_pool)
    train.set_retry(num_retries=1)  # a retried launcher follows the JobSet of the same inputs


def jobset_template(cfg: Config, image: str) -> dict[str, Any]:
    """The JobSet compiled into the pipeline; the launcher sets each run's name and arguments (`jobset.with_run`)."""
    command, _ = js.training_command("", "", "", "", "", {}, 0, "off", {})
    try:
        return js.build_jobset(jobset_spec(cfg, image, "vlm-lora-run", command, []))
    except js.JobSetSpecError as exc:
        raise ConfigError(f"{cfg.path}: {exc}") from None


def train_command(
    cfg: Config,
    model: str,
    train: str,
    eval_dir: str,
    adapter: str,
    checkpoint_dir: str,
    job_env: dict[str, Any],
    model_type: str = "",
) -> tuple[list[str], list[str]]:
    """The JobSet container's command and arguments for a config (`components.common.jobset.training_command`)."""
    s = train_settings(cfg)  # train-lora's GPU check and preflight mode, as the pipeline's task gets them
    gpus, preflight = s.accelerator_count, s.preflight
    return js.training_command(
        model, train, eval_dir, adapter, checkpoint_dir, cfg.swift, gpus, preflight, job_env, model_type
    )


def jobset_spec(cfg: Config, image: str, name: str, command: list[str], args: list[str]) -> js.JobSetSpec:
    """The JobSet settings of a config (its `resources` profile and `gke` section; GPUDirect by the pool's machine)."""
    r, g = cfg.resources, cfg.gke
    machine = g.machine_type or r.machine_type
    return js.JobSetSpec(
        name=name,
        namespace=g.namespace,
        image=image,
        command=command,
        args=args,
        nnodes=r.replica_count,
        gpus_per_node=r.accelerator_count if r.accelerator_type else 0,
        accelerator=GKE_ACCELERATORS.get(r.accelerator_type, ""),
        bucket=gke_bucket(g, cfg.pipeline.root),
        volume_claim=claim_name(cfg),
        service_account=g.service_account,
        node_pool=g.node_pool,
        queue=g.queue if g.kueue else "",
        topology=g.topology,
        topology_mode=g.topology_mode,
        max_restarts=g.max_restarts,
        master_port=g.master_port,
        annotations={js.CONFIG_ANNOTATION: cfg.pipeline.name},
        gpudirect=machine if gpudirect.for_machine(machine, g.gpudirect, r.replica_count) else "",
        gpudirect_networks=tuple(g.gpudirect_networks),
    )


def _job_env(cfg: Config) -> dict[str, Any]:
    return train_settings(cfg).job_env  # the environment section, then tracking's MLflow and W&B variables


def _check_folder(out: Path, name: str) -> None:
    """Refuses a folder that is a file or holds a manifest written from another config."""
    if out.exists() and not out.is_dir():
        raise ManifestFolderError(f"--out {out}: is a file, not a folder; pass a folder for the manifests")
    existing = out / JOBSET_FILE
    if not existing.is_file():
        return
    try:
        meta = yaml.safe_load(existing.read_text(encoding="utf-8"))["metadata"]
        owner = (meta.get("annotations") or {}).get(js.CONFIG_ANNOTATION, "")
    except (OSError, yaml.YAMLError, TypeError, KeyError, AttributeError):
        owner = "?"
    if owner != name:
        raise ManifestFolderError(
            f"--out {out}: {existing} is the manifest of config {owner!r}, not {name!r}; "
            "pass another folder (or remove that one)"
        )


def _write_docs(out: Path, file: str, docs: list[dict[str, Any]]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{file}.tmp"
    tmp.write_text(yaml.safe_dump_all(docs, sort_keys=False), encoding="utf-8")
    return tmp.replace(out / file)


def write_setup(cfg: Config, out: Path) -> list[Path]:
    """Writes storage.yaml (the bucket's PV / PVC) and rbac.yaml (the launcher's Role) into `out`.

    Raises:
        ConfigError: The config does not suit GKE, or `out` is a file.
    """
    bucket = check_target(cfg)
    if out.exists() and not out.is_dir():
        raise ManifestFolderError(f"--out {out}: is a file, not a folder; pass a folder for the manifests")
    g = cfg.gke
    return [
        _write_docs(out, STORAGE_FILE, js.storage_manifests(bucket, claim_name(cfg), g.namespace)),
        _write_docs(out, RBAC_FILE, js.rbac_manifests(g.namespace, g.runner_service_account)),
    ]


def write_manifests(
    cfg: Config, out: Path, image: str, model: str, train: str, eval_dir: str, adapter: str, model_type: str
) -> Path:
    """Writes jobset.yaml and storage.yaml into `out` (each whole); returns the JobSet file.

    Raises:
        ConfigError: The config does not suit GKE, a path is not gs://, or `out` holds another config's manifest.
    """
    bucket = check_target(cfg)
    for flag, uri in (("--model", model), ("--train", train), ("--eval", eval_dir), ("--adapter", adapter)):
        if not uri.startswith("gs://"):
            raise ConfigError(f"{flag} {uri!r}: must be a gs:// URI (the pods read it at /gcs/<bucket>/...)")
    _check_folder(out, cfg.pipeline.name)
    key = hashlib.sha256(json.dumps([model, train, eval_dir, cfg.swift], sort_keys=True).encode()).hexdigest()[:16]
    checkpoints = f"{cfg.pipeline.root.rstrip('/')}/checkpoints/{key}/train-lora"
    command, args = train_command(cfg, model, train, eval_dir, adapter, checkpoints, _job_env(cfg), model_type)
    name = f"{cfg.pipeline.name[:31].rstrip('-')}-{key[:8]}"
    try:
        manifest = js.build_jobset(jobset_spec(cfg, image, name, command, args))
    except js.JobSetSpecError as exc:
        raise ConfigError(f"{cfg.path}: {exc}") from None
    _write_docs(out, STORAGE_FILE, js.storage_manifests(bucket, claim_name(cfg), cfg.gke.namespace))
    return _write_docs(out, JOBSET_FILE, [manifest])


def main(argv: list[str] | None = None) -> int:
    from pipelines.cli import program
    from pipelines.vertex import command_errors

    parser = argparse.ArgumentParser(prog=program("python -m pipelines.gke"), description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    setup = sub.add_parser("setup", help="write the bucket's volume and the launcher's RBAC for kubectl apply")
    setup.add_argument("--config", required=True, help="config YAML or shipped name")
    setup.add_argument("--out", required=True, help="folder for storage.yaml and rbac.yaml")
    setup.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    p = sub.add_parser("jobset", help="write the training JobSet and the bucket's volume for kubectl apply")
    p.add_argument("--config", required=True, help="config YAML or shipped name")
    p.add_argument("--out", required=True, help="folder for jobset.yaml and storage.yaml")
    for flag, what in (("model", "staged model"), ("train", "training set"), ("eval", "held-out set")):
        p.add_argument(f"--{flag}", required=True, help=f"gs:// folder of the {what}")
    p.add_argument("--adapter", required=True, help="gs:// folder the adapter is written to")
    p.add_argument("--model-type", required=True, help="ms-swift model_type of the staged model, e.g. qwen3_vl")
    p.add_argument("--image", default="", help="training image (default: the config's / the project's)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    args = parser.parse_args(argv)
    with command_errors() as outcome:
        from components.images import ImageTagError, resolve_images

        cfg = load_config(args.config, parse_overrides(args.overrides))
        if args.command == "setup":
            paths = write_setup(cfg, Path(args.out))
            print(f"wrote {', '.join(map(str, paths))}: kubectl apply {' '.join(f'-f {p}' for p in paths)}")
            return outcome.code
        try:
            image = args.image or resolve_images(cfg.images.light, cfg.images.train)["train"]
        except ImageTagError as exc:
            raise ConfigError(f"{cfg.path}: {exc}") from None
        path = write_manifests(
            cfg, Path(args.out), image, args.model, args.train, args.eval, args.adapter, args.model_type
        )
        print(
            f"wrote {path} and {path.with_name(STORAGE_FILE)}: kubectl apply -f {path.with_name(STORAGE_FILE)} -f {path}"
        )
    return outcome.code


if __name__ == "__main__":
    sys.exit(main())
