"""The one schema every file under `configs/` loads into.

A config is value-only YAML with eleven sections (`pipeline`, `model` and `data` required):

* `pipeline`: name and pipeline root (where every task writes its artifacts).
* `model`: the base model source and the model cache it is staged into.
* `data`: training / held-out JSONL files and the validation policy.
* `swift`: arguments for `swift sft`, in ms-swift's own names, passed through unchanged.
  Loading refuses a name the pinned ms-swift's `swift sft` does not know (with the closest
  names) or one the pipeline sets itself (`components/common/swift_sft_args.json`, kept
  equal to the installed ms-swift by a test; train-lora checks again against the ms-swift
  it runs), and checks value types and ranges and `tuner_type: lora`.
* `eval`: generation settings, the IoU threshold, the reference model the tuned model is
  compared with (base, the registry's champion, or a model folder) and the promotion gate.
* `vertex`: project, region, service account, network, experiment, labels, CMEK key,
  TensorBoard and template repository of the Vertex target (all optional: compiling
  needs none of them, submitting needs `project` and a gs:// `pipeline.root`).
* `resources`: the GPU profile of train-lora's CustomJob (machine, accelerators, replicas,
  disk, Spot / FLEX_START, reservation) and the machines of the other tasks; checked
  against the machine-shape and region tables in `pipelines.shapes`.
* `images`: container image overrides (default: `components.images`).
* `register`: the Vertex Model Registry entry a passing model becomes a version of.
* `schedule`: the recurring run of `python -m pipelines.schedule`.
* `tracking`: the MLflow server results go to (`components.common.tracking`, docs/tracking.md);
  `swift.report_to` names only what the images can serve (W&B is refused here, not in the GPU job).

Unknown keys and wrong types are errors that name the file, the line, the key and what
is expected: `ConfigError`, raised before any work starts. So are careless and hostile
files: a duplicate key at any depth (never "last one wins"), a file over 1 MiB, YAML that
anchors and aliases expand past a small bound (a "billion laughs" bomb), nesting deeper
than a config needs, non-finite numbers (.inf, .nan), a hub token pasted where its name
belongs, a local pipeline root or model cache under a file, and `swift` values of the
wrong type or range for the ms-swift arguments whose meaning is well known
(`SWIFT_ARG_RULES`).

Which keys a run can change (pipeline parameters) and which are fixed when the pipeline
is compiled: `pipelines.pipeline.RUN_PARAMETERS` and README.md's config table.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import difflib
import json
import math
import os
import re
import stat
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from components.common import data_policy, secrets
from components.common.boxes import AUTO as AUTO_CONVENTION
from components.common.boxes import CONVENTIONS
from components.common.metrics import GATE_METRICS
from components.common.model_fit import (
    GPU_MEMORY_GIB,
    LIGER_WITH_PARAMETERS,
    ModelTooLarge,
    check_fits,
    known_model_bytes,
)
from components.common.quantization import QUANTIZATIONS, known_quantized_bytes, swift_conflict, swift_quant_args
from components.common.reference import CHAMPION, reference_problem
from components.common.regression import max_drop_problem, max_drops
from components.common.swift import pinned_sft_args, swift_arg_problem
from components.common.tasks import TASK_NAMES
from components.common.tracking import ENV_EXPERIMENT, ENV_REQUIRED, ENV_URI, Settings, report_to_problem, uri_problem
from components.train_lora.job_env import JobEnvError, check_job_env
from components.train_lora.preflight import MODES as PREFLIGHT_MODES
from pipelines import shapes
from pipelines._config_secrets import secret_problem
from pipelines._load_checks import budget_problem, gate_problem, pipeline_name_problem, swift_choice_problem
from pipelines._yaml_forms import ambiguous_form
from pipelines.gke_section import GkeSection, gke_problems
from pipelines.job_rules import job_rule_problems

# The shipped configs: pipelines/configs/ in an installed package (setup.py copies them there),
# configs/ at the root of a checkout (or an editable install).
_PACKAGED_CONFIGS = Path(__file__).resolve().parent / "configs"
CONFIG_DIR = _PACKAGED_CONFIGS if _PACKAGED_CONFIGS.is_dir() else Path(__file__).resolve().parent.parent / "configs"
DEFAULT_LOCAL_CONFIG = CONFIG_DIR / "local" / "tiny_cpu.yaml"

# Sources that `pipelines.run --local` builds on the fly instead of reading from disk.
DEMO_MODEL = "demo://tiny-qwen3-vl"
DEMO_DATA_TRAIN = "demo://drawings/train"
DEMO_DATA_EVAL = "demo://drawings/eval"
DEMO_DOCUMENTS_TRAIN = "demo://documents/train"
DEMO_DOCUMENTS_EVAL = "demo://documents/eval"
DEMO_DRAWINGS_REGRESSION = "demo://drawings/regression"  # eval.regression: general questions about other drawings


# A config is a few KB of a few dozen keys: anything far beyond is a mistake or an attack,
# refused before it can take minutes or gigabytes.
MAX_CONFIG_BYTES = 1 << 20  # refused before parsing
MAX_YAML_NODES = 10_000  # values after aliases are expanded
MAX_YAML_ALIASES = 100
MAX_YAML_DEPTH = 32  # nesting of mappings and lists

# A hub token pasted where its name belongs: Hugging Face `hf_...`, ModelScope `ms-<uuid>`.
_TOKEN_RE = re.compile(r"hf_[A-Za-z0-9]{20,}|ms-[0-9a-fA-F]{8}-[0-9a-fA-F-]{20,}")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SECRET_RE = re.compile(r"projects/[^/\s]+/secrets/[A-Za-z0-9_-]{1,255}(/versions/[A-Za-z0-9_-]+)?")


class ConfigError(ValueError):
    """A config file is invalid; the message names file, line, key and the fix."""


@dataclass(frozen=True)
class PipelineSection:
    """Where and under which name the pipeline runs.

    Attributes:
        name: Pipeline name (lowercase letters, digits and '-'), shown in the console.
        root: Pipeline root: a local folder (kfp.local) or `gs://bucket/prefix` (Vertex).
            Relative local paths are taken from the current directory. Default `runs`.
        enable_caching: Reuse results of tasks whose inputs did not change. Default true.
    """

    name: str
    root: str = "runs"
    enable_caching: bool = True


@dataclass(frozen=True)
class ModelSection:
    """The base model and its cache.

    Attributes:
        source: `hf://org/name[@rev]`, `ms://org/name[@rev]`, `gs://bucket/prefix`, a local
            model folder, or `demo://tiny-qwen3-vl` (the tiny offline model).
        cache: Model cache root: a local folder or `gs://bucket/models`.
        revision: Branch, tag or commit for hf:// and ms:// sources; "" = default branch.
        token_from: Where a gated model's hub token is read: `env:VAR` or a Secret Manager
            name `projects/P/secrets/S[/versions/V]`; never the token itself. Default "".
        allow: Only stage files matching these globs. Default [] (all).
        ignore: Skip files matching these globs (e.g. `*.bin`, `original/*`). Default [].
        quantization: Train LoRA on a bitsandbytes-quantised base (QLoRA): `none`, `nf4` or
            `int8`; train-lora gets ms-swift's quant arguments, merge-export still merges into
            the staged bf16 base (docs/training.md). Default `none`.
    """

    source: str
    cache: str
    revision: str = ""
    token_from: str = ""
    allow: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    quantization: str = "none"


@dataclass(frozen=True)
class DataSection:
    """Training data and the validation policy.

    Attributes:
        train: ms-swift JSONL data (`messages` + `images`, image paths relative to the
            file): files, folders / prefixes (every `*.jsonl` below) and globs, local or
            gs://, comma-separated; snapshot-data resolves them to exact files each run.
        eval: Held-out JSONL data, the same forms; empty = split `eval_fraction` off
            `train`. Default "".
        eval_fraction: Fraction of `train` held out when `eval` is empty, 0 < f < 1. Default 0.1.
        max_invalid_fraction: Largest fraction of invalid lines tolerated (they are
            quarantined and reported); above it validation fails. Default 0.0.
        split_seed: Salt of the deterministic hash split. Default "split-v1".
        box_convention: What the detection boxes' numbers mean (components.common.boxes):
            "pixel" (pixels of the original image), "norm1000" (relative, [0, 1000]:
            Qwen2-VL / Qwen3-VL), "resized_pixel" (pixels after the processor's smart resize:
            Qwen2.5-VL), or "auto" (the staged model family's own). evaluate maps boxes to
            pixels of the original image before IoU. Default "pixel".
        task: Check of the assistant answers: "" (none), "json" (fenced JSON) or
            "detection" (fenced JSON list of {label, bbox}). Default "".
        leakage: What validation does with an eval row whose image (by content hash), or
            images and prompt, a train row has too: "quarantine" (the eval copy, code
            E_LEAK), "error" (validation fails, naming both rows' file:line) or "warn"
            (kept; counted and listed in the report). The hash split keeps rows that share
            an image on one side (unless every row shares one). Default "quarantine".
    """

    train: str
    eval: str = ""
    eval_fraction: float = 0.1
    max_invalid_fraction: float = 0.0
    split_seed: str = "split-v1"
    task: str = ""
    box_convention: str = "pixel"
    leakage: str = data_policy.DEFAULT_LEAKAGE


@dataclass(frozen=True)
class EvalSection:
    """Held-out evaluation and the promotion gate.

    Attributes:
        max_new_tokens: Greedy generation budget per sample, tokens. Default 512.
        batch_size: Samples generated together. Default 8.
        max_samples: Evaluate at most this many held-out samples; 0 = all. Default 0.
        iou_threshold: A predicted box matches a gold box of the same label at IoU >= this.
            Default 0.5.
        metric: Gate metric: one of f1, precision, recall, json_valid_rate,
            exact_match_rate. Default f1.
        min_value: The tuned model's metric must be at least this. Default 0.0.
        min_margin: ... and beat the reference model by at least this (a positive value
            demands a strict improvement). Default 0.0.
        reference: The model the tuned model is compared with:
            `auto` (default): on the Vertex target the champion when the config names a
            registry model (`register.model_id` or `register.serving_image` set), else the
            base model; on the local target always the base model.
            `champion`: the Model Registry version `register.model_id@register.alias`,
            looked up at run time by the find-champion task; the base model when none
            exists yet (first run). Vertex only; the local target has no registry and
            uses the base model.
            `base`: the staged base model.
            A merged model folder: `gs://bucket/prefix` (read through /gcs/ on Vertex) or,
            for local runs, a local folder with a config.json.
        regression: The regression set: general rows that guard what the model already knew
            (`components.common.regression`: each row's `kind` is vqa, ocr or grounding), in
            the forms of `data.train` (files, folders / prefixes, globs; local or gs://,
            comma-separated). Checked by a validate-regression task before training, scored
            for both models by evaluate. Fixed when the pipeline is compiled (it decides
            whether that task exists). Default "" (none).
        regression_max_drop: The regression rule of the gate: the absolute drop allowed per
            kind and `overall` (the mean of the kinds' scores); a CER rise counts as a drop.
            Names left out take 0.05; an unknown name is refused. Default 0.05 for each.
        quantization: How evaluate loads both models (the reference and the tuned one) for
            generation: `none` (bf16), `nf4` or `int8` (both quantised by bitsandbytes, with the
            settings of `model.quantization`): the scores a 4-bit deployment would get, not the
            bf16 merged model's. Default `none`.
        gate_on: What the gate compares with min_value and min_margin: `point` (the figures, as
            measured) or `lower_bound` (the lower bounds of their 95 % bootstrap intervals over the
            held-out rows: promote only what is better beyond the rows' noise). Default `point`.
    """

    max_new_tokens: int = 512
    batch_size: int = 8
    max_samples: int = 0
    iou_threshold: float = 0.5
    metric: str = "f1"
    min_value: float = 0.0
    min_margin: float = 0.0
    reference: str = "auto"
    regression: str = ""
    regression_max_drop: dict[str, float] = field(default_factory=max_drops)
    quantization: str = "none"
    gate_on: str = "point"

    def __post_init__(self) -> None:
        # the rule is whole wherever it goes (the pipeline's parameter, the run form): left-out names take the default
        if not max_drop_problem(self.regression_max_drop):
            object.__setattr__(self, "regression_max_drop", max_drops(self.regression_max_drop))


@dataclass(frozen=True)
class VertexSection:
    """Where the Vertex target runs. Every key is optional until a run is submitted.

    Attributes:
        project: Google Cloud project ID. Required by run / schedule / upload. Default "".
        region: Vertex region (also where GPUs must be offered). Default us-central1.
        service_account: Service account the pipeline and its jobs run as
            (docs/setup.md creates it). Default "" (the Compute Engine default account).
        network: VPC network `projects/NUMBER/global/networks/NAME` for peering. Default "".
        experiment: Vertex experiment the runs join, to compare metrics across runs. Default "".
        labels: Labels of runs, jobs and models (lowercase keys and values). Default {}.
        encryption_key: CMEK key `projects/P/locations/R/keyRings/K/cryptoKeys/C`. Default "".
        tensorboard: Vertex TensorBoard `projects/P/locations/R/tensorboards/ID` for
            train-lora's logs (needs a gs:// `pipeline.root`). Default "".
        template_repo: Artifact Registry KFP repository
            `https://REGION-kfp.pkg.dev/PROJECT/REPO` for `pipelines.upload`. Default "".
        region_check: Check the region against the GPU table in `pipelines.shapes` (a
            snapshot; turn off if Vertex has added the GPU there since). Default true.
        persistent_resource_id: ID of a Vertex persistent resource (a reserved cluster) of this
            project and region that train-lora's CustomJob runs on: a lowercase letter, then up to
            62 of a-z, 0-9 and '-', not ending in '-'; "" = on-demand machines. Default "".
    """

    project: str = ""
    region: str = "us-central1"
    service_account: str = ""
    network: str = ""
    experiment: str = ""
    labels: dict[str, Any] = field(default_factory=dict)
    encryption_key: str = ""
    tensorboard: str = ""
    template_repo: str = ""
    region_check: bool = True
    persistent_resource_id: str = ""


@dataclass(frozen=True)
class ResourcesSection:
    """Machines of the Vertex target. Defaults are the seed profile (1 x A100 40GB).

    Attributes:
        machine_type: train-lora's machine type. Default a2-highgpu-1g.
        accelerator_type: Vertex accelerator enum, e.g. NVIDIA_H100_80GB. Default NVIDIA_TESLA_A100.
        accelerator_count: GPUs per replica (must match the machine type). Default 1.
        replica_count: Machines (nodes) of the training job; > 1 = multi-node. Default 1.
        boot_disk_gb: Boot disk per replica, GB (checkpoints land here first). Default 200.
        boot_disk_type: pd-ssd, pd-standard or hyperdisk-balanced, as the machine takes
            (`pipelines.shapes.disk_types`: A3 Ultra and A4 take hyperdisk-balanced only);
            "" = the machine's default (hyperdisk-balanced on those, else pd-ssd). Default "".
        scheduling: standard (on demand), spot or flex_start (Dynamic Workload
            Scheduler). Default standard.
        max_wait_s: Longest wait for capacity with flex_start, seconds; 0 = no limit
            (aiplatform_v1.Scheduling.max_wait_duration). Default 86400.
        timeout_s: Longest training run, seconds. Default 604800 (7 days).
        reservation: "" (none), "any" (any matching reservation) or a reservation name
            `projects/P/zones/Z/reservations/R` (that one only). Default "".
        eval_accelerator_type: GPU of merge-export and evaluate (one each).
            Default NVIDIA_TESLA_A100.
        eval_cpu: vCPUs of merge-export and evaluate. Default 12.
        eval_memory_gb: Memory of merge-export and evaluate, GB. Default 85.
        light_cpu: vCPUs of stage-model, validate-data, find-champion and register. Default 4.
        light_memory_gb: Memory of the light tasks, GB. Default 16.
        preflight: GPU and interconnect check train-lora runs on every node before training
            (`components.train_lora.preflight`): "fail" stops a bad node, "warn" logs and
            trains, "off" skips it. Default "fail".
        price_usd_per_hour: Price of one training machine per hour, USD, for the cost estimate
            `pipelines.run` prints and train-lora logs; 0 = the approximate list price in
            `components.common.cost.PRICES` (on-demand or Spot by `scheduling`). Default 0.
        price_date: The date of `price_usd_per_hour` (YYYY-MM-DD), printed with it. Default "".
    """

    machine_type: str = "a2-highgpu-1g"
    accelerator_type: str = "NVIDIA_TESLA_A100"
    accelerator_count: int = 1
    replica_count: int = 1
    boot_disk_gb: int = 200
    boot_disk_type: str = ""
    scheduling: str = "standard"
    max_wait_s: int = 86400
    timeout_s: int = 604800
    reservation: str = ""
    eval_accelerator_type: str = "NVIDIA_TESLA_A100"
    eval_cpu: int = 12
    eval_memory_gb: int = 85
    light_cpu: int = 4
    light_memory_gb: int = 16
    preflight: str = "fail"
    price_usd_per_hour: float = 0.0
    price_date: str = ""


@dataclass(frozen=True)
class ImagesSection:
    """Container image overrides; "" = the tag in `components.images`.

    Attributes:
        light: CPU image of stage-model, validate-data, find-champion and register. Default "".
        train: CUDA image of train-lora, merge-export and evaluate. Default "".
    """

    light: str = ""
    train: str = ""


@dataclass(frozen=True)
class RegisterSection:
    """The Vertex Model Registry entry a model that passed the gate becomes a version of.

    Attributes:
        model_id: ID of the parent model (created by the first registration): up to 63
            of [a-z0-9_-], not starting with a digit or '-'. Default: the pipeline name.
        display_name: Display name of the parent model. Default: the pipeline name.
        serving_image: Serving container image of the model; "train" = the project's training
            image (`images.train`), which serves with `swift deploy` through the default
            `serving_command`; another image (e.g. a vLLM one) needs its own `serving_command`
            / `serving_args`. "" skips the register step.
        alias: Version alias moved to every newly registered version; `eval.reference:
            champion` compares with the version that carries it. With a deploy step it moves
            only after the deployed model passed its smoke test. Default champion.
        serving_command: The container's command; [] = the project's entry point
            `python3 -m components.deploy.container` (copies AIP_STORAGE_URI, runs `swift
            deploy`; the training image has it). Set it for another runtime (e.g. vLLM).
        serving_args: The container's arguments. Default [].
        serving_port: The port the container listens on (Vertex sets AIP_HTTP_PORT). Default 8080.
        predict_route: The container's predict route. Default /v1/chat/completions.
        health_route: The container's health route. Default /health.
        serving_env: Environment variables of the container (no secrets). Default {}.
    """

    model_id: str = ""
    display_name: str = ""
    serving_image: str = ""
    alias: str = "champion"
    serving_command: list[str] = field(default_factory=list)
    serving_args: list[str] = field(default_factory=list)
    serving_port: int = 8080
    predict_route: str = "/v1/chat/completions"
    health_route: str = "/health"
    serving_env: dict[str, str] = field(default_factory=dict)

    def container(self) -> dict[str, Any]:
        """The serving container spec register sends (`components.register.core.serving_container_args`)."""
        return {
            "command": list(self.serving_command),
            "args": list(self.serving_args),
            "port": self.serving_port,
            "predict_route": self.predict_route,
            "health_route": self.health_route,
            "env": {str(k): str(v) for k, v in self.serving_env.items()},
        }


TRAIN_SERVING = "train"  # register.serving_image: the project's training image serves the model


@dataclass(frozen=True)
class DeploySection:
    """The Vertex AI endpoint a promoted model is deployed to (after register, before the alias moves).

    Attributes:
        endpoint: Endpoint display name (created when missing) or resource name
            `projects/P/locations/R/endpoints/ID` of this project and region; "" = no deploy step.
        machine_type: Serving machine. Default g2-standard-12 (one L4).
        accelerator_type: Serving GPU; "" = none. Default NVIDIA_L4.
        accelerator_count: GPUs per replica. Default 1.
        min_replicas: Default 1.
        max_replicas: Default 1.
        traffic_percent: Share of the endpoint's traffic the new version takes once its smoke
            test passed, 1..100; 100 undeploys the previous models, less is a canary beside
            them. Default 100.
        smoke_rows: Held-out eval rows sent through the deployed model; each answer must parse
            for `data.task`. Default 3.
        served_model_name: The serving container's model name (`model` of each request).
            Default tuned (the default container's).
        timeout_s: Longest wait for the deployment, s. Default 3600.
    """

    endpoint: str = ""
    machine_type: str = "g2-standard-12"
    accelerator_type: str = "NVIDIA_L4"
    accelerator_count: int = 1
    min_replicas: int = 1
    max_replicas: int = 1
    traffic_percent: int = 100
    smoke_rows: int = 3
    served_model_name: str = "tuned"
    timeout_s: int = 3600


@dataclass(frozen=True)
class TrackingSection:
    """Where results are tracked besides Vertex Experiments and TensorBoard (docs/tracking.md).

    Attributes:
        mlflow_uri: MLflow tracking server, http(s)://host[:port]: train-lora's curves (ms-swift's
            report_to mlflow), evaluate's figures, the data snapshot and the lineage go to one run per
            adapter. `environment.MLFLOW_TRACKING_URI` sets it too. "" = no MLflow. Default "".
        experiment: MLflow experiment; "" = pipeline.name. `environment.MLFLOW_EXPERIMENT_NAME`
            sets it too. Default "".
        required: An MLflow server that cannot be reached stops the run before training (true), or
            is one warning line and the run goes on without MLflow (false). Default true.
    """

    mlflow_uri: str = ""
    experiment: str = ""
    required: bool = True

    def settings(self, pipeline_name: str) -> Settings:
        """The components' tracking settings (`components.common.tracking.Settings`)."""
        return Settings(self.mlflow_uri, self.experiment or pipeline_name, self.required)


@dataclass(frozen=True)
class ScheduleSection:
    """The recurring run created by `python -m pipelines.schedule create`.

    Attributes:
        cron: Five-field cron expression, e.g. "0 3 * * 1" (Mondays 03:00). Default "".
        time_zone: IANA time zone the cron is read in. Default UTC.
        max_concurrent_runs: Runs of this schedule at the same time. Default 1.
        start_time: First possible run, RFC 3339 (e.g. 2026-01-01T00:00:00Z); "" = now.
        end_time: No runs after this, RFC 3339; "" = never.
    """

    cron: str = ""
    time_zone: str = "UTC"
    max_concurrent_runs: int = 1
    start_time: str = ""
    end_time: str = ""


@dataclass(frozen=True)
class Config:
    """A whole validated config file."""

    pipeline: PipelineSection
    model: ModelSection
    data: DataSection
    swift: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    eval: EvalSection = field(default_factory=EvalSection)
    vertex: VertexSection = field(default_factory=VertexSection)
    resources: ResourcesSection = field(default_factory=ResourcesSection)
    images: ImagesSection = field(default_factory=ImagesSection)
    register: RegisterSection = field(default_factory=RegisterSection)
    deploy: DeploySection = field(default_factory=DeploySection)
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    tracking: TrackingSection = field(default_factory=TrackingSection)
    gke: GkeSection = field(default_factory=GkeSection)
    path: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Returns the config as plain data (what gets logged and recorded)."""
        out = dataclasses.asdict(self)
        out.pop("path")
        return out


_GATE_METRICS = GATE_METRICS  # components.common.metrics: the one record of the figures


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _steps(v: Any) -> bool:  # transformers: a step count, or below 1 a fraction of all steps
    return (_is_int(v) and v > 0) or (isinstance(v, float) and 0 < v < 1)


_POSITIVE_INT = (lambda v: _is_int(v) and v > 0, "a positive integer")
_BOOL = (lambda v: isinstance(v, bool), "true or false")
_FRACTION = (lambda v: _is_number(v) and 0 <= v <= 1, "a number from 0 to 1")

# The `swift sft` arguments whose type and range are well known (ms-swift 4.x / transformers),
# checked when a config loads so a bad value stops before a GPU is booked, not minutes into
# train-lora. {name: (check, what it must be)}. Other keys pass through unchanged (their
# names are checked against the installed ms-swift by `components.train_lora.core`).
SWIFT_ARG_RULES: dict[str, tuple[typing.Callable[[Any], bool], str]] = {
    "learning_rate": (lambda v: _is_number(v) and v > 0, "a number > 0, e.g. 1.0e-4"),
    "num_train_epochs": (lambda v: _is_number(v) and v > 0, "a number > 0, e.g. 2"),
    "max_steps": (lambda v: _is_int(v) and (v == -1 or v > 0), "-1 (use num_train_epochs) or a positive integer"),
    # `auto`: train-lora sizes the micro-batch from the data, the model and the GPU (components/train_lora/_plan.py)
    "per_device_train_batch_size": (lambda v: v == "auto" or (_is_int(v) and v > 0), "a positive integer or auto"),
    "per_device_eval_batch_size": _POSITIVE_INT,
    "gradient_accumulation_steps": _POSITIVE_INT,
    "lora_rank": _POSITIVE_INT,
    "lora_alpha": (lambda v: _is_number(v) and v > 0, "a number > 0, e.g. 32"),
    "lora_dropout": (lambda v: _is_number(v) and 0 <= v < 1, "a number from 0 to 1 (1 excluded), e.g. 0.05"),
    "max_length": _POSITIVE_INT,
    "max_pixels": _POSITIVE_INT,
    "warmup_ratio": _FRACTION,
    "warmup_steps": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    "weight_decay": (lambda v: _is_number(v) and v >= 0, "a number >= 0, e.g. 0.1"),
    "max_grad_norm": (lambda v: _is_number(v) and v >= 0, "a number >= 0, e.g. 1.0"),
    "adam_beta1": (lambda v: _is_number(v) and 0 <= v < 1, "a number from 0 to 1 (1 excluded), e.g. 0.9"),
    "adam_beta2": (lambda v: _is_number(v) and 0 <= v < 1, "a number from 0 to 1 (1 excluded), e.g. 0.95"),
    "save_steps": (_steps, "a positive integer (or a fraction of all steps below 1)"),
    "eval_steps": (_steps, "a positive integer (or a fraction of all steps below 1)"),
    "logging_steps": _POSITIVE_INT,
    "save_total_limit": _POSITIVE_INT,
    "seed": (lambda v: _is_int(v) and 0 <= v < 1 << 32, "an integer from 0 to 4294967295"),
    "data_seed": (lambda v: _is_int(v) and 0 <= v < 1 << 32, "an integer from 0 to 4294967295"),
    "dataloader_num_workers": (lambda v: _is_int(v) and v >= 0, "0 or a positive integer"),
    "split_dataset_ratio": (lambda v: _is_number(v) and 0 <= v < 1, "a number from 0 to 1 (1 excluded)"),
    "torch_dtype": (lambda v: v in ("bfloat16", "float16", "float32"), "bfloat16, float16 or float32"),
    "bf16": _BOOL,
    "fp16": _BOOL,
    "gradient_checkpointing": (lambda v: isinstance(v, bool) or v == "auto", "true, false or auto"),
    "freeze_vit": _BOOL,
    "freeze_llm": _BOOL,
    "freeze_aligner": _BOOL,
    "use_liger_kernel": _BOOL,
    "save_only_model": _BOOL,
    "use_rslora": _BOOL,
    "use_dora": _BOOL,
    "packing": _BOOL,
    "padding_free": _BOOL,
    # train-lora sets these unless the config does (components/train_lora/core.py, _launch.py, ddp_comm.py)
    "logging_nan_inf_filter": _BOOL,
    "ddp_find_unused_parameters": _BOOL,
    "ddp_broadcast_buffers": _BOOL,
    "ddp_bucket_cap_mb": _POSITIVE_INT,
    "target_modules": (
        lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)),
        "a string or a list of strings, e.g. all-linear",
    ),
}


def _check_swift(swift: dict[str, Any], where: typing.Callable[[str], str]) -> None:
    """Checks the `swift` values in `SWIFT_ARG_RULES` and refuses a token in `swift.hub_token`.

    Raises:
        ConfigError: A value of the wrong type or range, named with file, line and key.
    """
    if "hub_token" in swift:
        raise ConfigError(
            f"{where('swift.hub_token')}: 'swift.hub_token' puts a token in the config (not echoed); remove it, "
            "put the token in an environment variable or Secret Manager and name it in model.token_from "
            "(env:HF_TOKEN)"
        )
    version, known = pinned_sft_args()
    for name in swift:
        problem = swift_arg_problem(name, known, version)
        if problem:
            raise ConfigError(f"{where('swift.' + name)}: {problem}")
    for name, value in swift.items():
        if name not in SWIFT_ARG_RULES:
            continue
        ok, expected = SWIFT_ARG_RULES[name]
        if ok(value):
            continue
        key = f"swift.{name}"
        hint = ""
        if isinstance(value, str):
            try:
                float(value)
                hint = f" (YAML reads {value} as text, not a number: write it with a dot, e.g. 1.0e-4 for 1e-4)"
            except ValueError:
                hint = " (text, not a number)" if "number" in expected or "integer" in expected else ""
        raise ConfigError(f"{where(key)}: '{key}' must be {expected}, got {value!r}{hint}")


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is dict:
        return "a mapping"
    if typing.get_origin(tp) is list:
        return "a list of strings"
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _line_map(node: yaml.Node, prefix: str = "") -> dict[str, int]:
    """Maps dotted key paths to 1-based line numbers in the YAML source."""
    lines: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = f"{prefix}{key_node.value}"
            lines.setdefault(key, key_node.start_mark.line + 1)
            for sub, line in _line_map(value_node, key + ".").items():
                lines.setdefault(sub, line)
    return lines


class _YamlTooBig(Exception):
    """The YAML would expand past `MAX_YAML_NODES` / `MAX_YAML_ALIASES` / `MAX_YAML_DEPTH`."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line


class _BoundedLoader(yaml.SafeLoader):
    """A SafeLoader that counts values while composing, aliases expanded, and stops early.

    PyYAML shares an aliased node instead of copying it, so a "billion laughs" file loads
    fast and small; it explodes later, in whatever walks or serialises the data (the line
    map, `dataclasses.asdict`, the pipeline compiler). Counting the expanded size here
    bounds every later step.
    """

    def __init__(self, stream: str):
        super().__init__(stream)
        self._sizes: dict[int, int] = {}  # id(node) -> values in it, aliases expanded
        self._expanded = 0
        self.aliases = 0  # alias references read so far
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            self.aliases += 1
            target = self.anchors.get(event.anchor)
            if target is not None:
                size = self._sizes.get(id(target))
                if size is None:
                    raise _YamlTooBig(line, f"alias *{event.anchor} is inside its own anchor (a recursive structure)")
                self._count(line, size)
            if self.aliases > MAX_YAML_ALIASES:
                raise _YamlTooBig(line, f"the YAML uses more than {MAX_YAML_ALIASES} aliases (*name)")
            return super().compose_node(parent, index)
        self._count(line, 1)
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            raise _YamlTooBig(line, f"the YAML nests more than {MAX_YAML_DEPTH} levels deep")
        node = super().compose_node(parent, index)
        self._depth -= 1
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        self._sizes[id(node)] = 1 + sum(self._sizes[id(c)] for c in children)
        return node

    def _count(self, line: int, size: int) -> None:
        self._expanded += size
        if self._expanded > MAX_YAML_NODES:
            how = " once its aliases (*name) are expanded" if self.aliases else ""
            raise _YamlTooBig(line, f"the YAML has more than {MAX_YAML_NODES} values{how}")


def _duplicate_key(loader: yaml.SafeLoader, node: yaml.Node) -> tuple[str, int, str] | None:
    """Returns (dotted key, line, where the first is) of the first key repeated in one mapping, or None.

    Keys are compared as loaded, so `on:` and `true:` or `1:` and `0x1:` are the same key;
    the keys a merge (`<<: *base`) brings in may be overridden, as YAML intends.
    """
    stack, seen_nodes = collections.deque([(node, "")]), set()
    while stack:
        current, prefix = stack.popleft()
        if id(current) in seen_nodes:
            continue
        seen_nodes.add(id(current))
        if isinstance(current, yaml.SequenceNode):
            stack.extend((child, f"{prefix}[{i}].") for i, child in enumerate(current.value))
            continue
        if not isinstance(current, yaml.MappingNode):
            continue
        first: dict[Any, yaml.Node] = {}
        for key_node, value_node in current.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue  # a mapping or list as a key is refused when the document is constructed
            key = loader.construct_object(key_node)
            dotted = f"{prefix}{key}"
            if key in first:
                earlier = first[key]
                spelled = f" as '{earlier.value}'" if earlier.value != key_node.value else ""
                first_at = f"line {earlier.start_mark.line + 1}{spelled}"
                return dotted.replace(".[", "["), key_node.start_mark.line + 1, first_at
            first[key] = key_node
            stack.append((value_node, dotted + "."))
    return None


def _read_yaml(path: Path) -> tuple[Any, yaml.Node | None]:
    """Reads, size-checks and parses a config file into (data, its YAML node tree).

    Raises:
        ConfigError: Missing, not a regular file, over `MAX_CONFIG_BYTES`, not UTF-8, not
            YAML, a duplicate key, or past the node / alias / depth bounds.
    """
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise ConfigError(
            f"{path}: is a folder, not a config file; pass a .yaml file (e.g. configs/local/tiny_cpu.yaml)"
        )
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{path}: cannot read config: not a regular file (a config is a .yaml file on disk)")
    too_big = (
        f"{path}: config is larger than {MAX_CONFIG_BYTES // (1 << 20)} MiB; a config is a few KB of settings: "
        "keep data, prompts and file lists in their own files and name them (data.train)"
    )
    if info.st_size > MAX_CONFIG_BYTES:
        raise ConfigError(too_big)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:  # grew since stat, or a file that reports no size
            raise ConfigError(too_big)
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from None
    try:
        loader = _BoundedLoader(text)  # the reader refuses control characters (a NUL byte) here
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        code = exc.character if isinstance(exc.character, int) else -1
        what = "a NUL byte" if code == 0 else f"the control character #x{code:04x}" if code >= 0 else "a byte"
        raise ConfigError(
            f"{path}:{line}: not valid YAML: {what} is not allowed in a config; remove it (a binary file, or a "
            "copy-paste accident?)"
        ) from None
    try:
        node = loader.get_single_node()
        form = ambiguous_form(node)
        duplicate = _duplicate_key(loader, node) if node is not None else None
        if duplicate is None and form is None:
            raw = loader.construct_document(node) if node is not None else None
    except _YamlTooBig as exc:
        fix = (
            "a config needs no anchors (&name) or aliases (*name): write each value out once"
            if loader.aliases
            else "a config is a few dozen values, a few levels deep"
        )
        raise ConfigError(f"{path}:{exc.line}: {exc}; {fix}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        what = "; ".join(filter(None, (exc.context, exc.problem)))  # no snippet: the line may hold a secret
        raise ConfigError(f"{where}: not valid YAML: {what}") from None
    except ValueError as exc:  # Python refuses to convert integers of more than 4300 digits
        what = "a number is too long" if "digits" in str(exc) else "a value YAML reads as a date is not one"
        raise ConfigError(f"{path}: not valid YAML: {what} ({str(exc).split(';')[0]})") from None
    except yaml.YAMLError as exc:  # e.g. a control character (ReaderError)
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    finally:
        loader.dispose()
    if duplicate is not None:
        key, line, first = duplicate
        raise ConfigError(f"{path}:{line}: duplicate key '{key}' (first at {first}); keep one")
    if form is not None:
        line, key, written, problem = form
        raise ConfigError(f"{path}:{line}: '{key}: {written}' is {problem}")
    return raw, node


def _override_of(key: str, overridden: Mapping[str, Any]) -> str:
    """The override `key` (or a key under it, `register.serving_env.X`) came from, else `key`."""
    return next((k for k in overridden if key == k or key.startswith(k + ".")), key)


def _number_problem(value: Any) -> str | None:
    """What is wrong with a number anywhere in a config (non-finite, too large), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}; write a number such as 0.1"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 1 << 63:
        return "must be an integer below 2**63, got a number with more digits"
    return None


def _scan_values(value: Any, key: str, where: typing.Callable[[str], str]) -> None:
    """Checks every number and string under `key`, lists and mappings included.

    Raises:
        ConfigError: A non-finite or oversized number, or a string that looks like a hub token.
    """
    if isinstance(value, dict):
        for k, v in value.items():
            _scan_values(v, f"{key}.{k}" if key else str(k), where)
    elif isinstance(value, list):
        for v in value:
            _scan_values(v, key, where)
    elif isinstance(value, str):
        if _TOKEN_RE.search(value):
            raise ConfigError(
                f"{where(key)}: '{key}' holds what looks like a hub token (not echoed); never put a token in a "
                "config: put it in an environment variable or Secret Manager and name it in model.token_from "
                "(env:HF_TOKEN)"
            )
    else:
        problem = _number_problem(value)
        if problem:
            raise ConfigError(f"{where(key)}: '{key}' {problem}")


def _check_value(value: Any, tp: Any) -> Any:
    """Returns `value` converted to `tp`, or raises TypeError."""
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif typing.get_origin(tp) is dict:
        if isinstance(value, dict):
            return value
    elif typing.get_origin(tp) is list:
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
    raise TypeError


def _did_you_mean(word: str, choices: typing.Iterable[str], prefix: str = "") -> str:
    """Returns " (did you mean 'PREFIX+closest'?)" for the closest of `choices`, or "" when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{prefix}{close[0]}'?)" if close else ""


_NUMBER_TEXT = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _override_value(section: str, name: str, value: Any) -> Any:
    """An override's value as the schema wants it: number-like text becomes a number where a number is wanted.

    YAML 1.1 reads `1e-4` (no dot) as text; on the command line users write it so. Text that
    is a number becomes a float where the field is a number (an integer when it is a whole
    number and the field an integer), and in `swift` (ms-swift's numeric arguments). Text
    elsewhere (a name, a path) stays text.

    Args:
        section: The override's section, e.g. "swift".
        name: The key in it, e.g. "learning_rate".
        value: The value `parse_overrides` read.

    Returns:
        The value, converted or unchanged.
    """
    if not (isinstance(value, str) and _NUMBER_TEXT.fullmatch(value.strip())):
        return value
    number = float(value)
    if section == "swift":
        return int(number) if number.is_integer() and "e" not in value.lower() and "." not in value else number
    cls = _SECTIONS.get(section)
    field_type = typing.get_type_hints(cls).get(name) if cls else None
    if field_type is float:
        return number
    if field_type is int and number.is_integer():
        return int(number)
    return value


def _build_section(cls: type, raw: Any, name: str, where: typing.Callable[[str], str]) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where(name)}: section '{name}' must be a mapping of keys to values")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields), key=str)  # YAML keys may be non-strings (1, on, yes)
    if unknown:
        key = f"{name}.{unknown[0]}"
        raise ConfigError(
            f"{where(key)}: unknown key '{key}'{_did_you_mean(str(unknown[0]), fields, name + '.')}; "
            f"allowed keys in '{name}': {', '.join(fields)}"
        )
    values = {}
    for fname, f in fields.items():
        key = f"{name}.{fname}"
        if fname not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{where(name)}: missing required key '{key}' ({_type_name(hints[fname])})")
            continue
        value = raw[fname]
        if hints[fname] is str and fname.endswith("_date") and isinstance(value, datetime.date):
            value = value.isoformat()  # `price_date: 2026-11-24` unquoted: YAML reads a date
        try:
            values[fname] = _check_value(value, hints[fname])
        except TypeError:
            raise ConfigError(
                f"{where(key)}: '{key}' must be {_type_name(hints[fname])}, got {json.dumps(raw[fname], default=str)}"
            ) from None
    return cls(**values)


# The config's sections (besides `swift` and `environment`, free-form mappings) and their schemas.
_SECTIONS: dict[str, type] = {
    "pipeline": PipelineSection,
    "model": ModelSection,
    "data": DataSection,
    "eval": EvalSection,
    "vertex": VertexSection,
    "resources": ResourcesSection,
    "images": ImagesSection,
    "register": RegisterSection,
    "deploy": DeploySection,
    "schedule": ScheduleSection,
    "tracking": TrackingSection,
    "gke": GkeSection,
}


def shipped_configs() -> list[Path]:
    """The configs that come with the project (installed with it), sorted."""
    return sorted(CONFIG_DIR.glob("**/*.yaml"))


def resolve_config_path(name: str | Path) -> Path:
    """A config file by path, or by the name of a shipped config (`tiny_cpu`, `qwen3_vl_4b/lora_seed`).

    An existing file wins; otherwise `name` (with or without `.yaml`) is looked up under the
    shipped configs (`shipped_configs`), by relative path or by file name when that is unique.

    Raises:
        ConfigError: Neither a file nor a shipped config (the shipped names are listed).
    """
    path = Path(name)
    if path.exists() or path.is_symlink():  # anything on disk (a folder, a device) gets load_config's own message
        return path
    text = str(name)
    stem = text[: -len(".yaml")] if text.endswith(".yaml") else text
    shipped = shipped_configs()
    by_rel = {str(p.relative_to(CONFIG_DIR).with_suffix("")): p for p in shipped}
    rel = stem[len("configs/") :] if stem.startswith("configs/") else stem
    if rel in by_rel:
        return by_rel[rel]
    by_name = [p for p in shipped if p.stem == rel]
    if len(by_name) == 1:
        return by_name[0]
    if by_name:
        several = ", ".join(str(p.relative_to(CONFIG_DIR).with_suffix("")) for p in by_name)
        raise ConfigError(f"{name}: several shipped configs have that name ({several}); give the folder too")
    names = ", ".join(sorted(by_rel))
    raise ConfigError(f"{name}: config file not found, and no shipped config has that name (shipped: {names})")


def parse_overrides(items: typing.Iterable[str]) -> dict[str, Any]:
    """Parses `section.key=value` command-line overrides; values are read as YAML scalars.

    `eval.max_samples=4` → {"eval.max_samples": 4}; `swift.lora_rank=16`, `data.train=gs://b/x`,
    `vertex.labels={team: vision}` (a YAML flow mapping) work the same way.

    Raises:
        ConfigError: An item without `=`, or a key that is not `section.key`.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*", key):
            raise ConfigError(
                f"override {secrets.redact(repr(item))}: expected section.key=value (e.g. eval.max_samples=4 or "
                "swift.lora_rank=16)"
            )
        try:
            value = yaml.safe_load(text) if text.strip() else ""
            form = ambiguous_form(yaml.compose(text, Loader=yaml.SafeLoader)) if text.strip() else None
        except (yaml.YAMLError, ValueError) as exc:  # ValueError: a date that is none (2026-13-01), a huge number
            first = secrets.redact(str(exc).splitlines()[0])
            raise ConfigError(f"override {secrets.redact(repr(item))}: the value is not YAML ({first})") from None
        if form:
            raise ConfigError(f"override {key}={secrets.redact(form[2])}: the value is {form[3]}")
        out[key] = value
    return out


def load_config(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Config:
    """Loads and validates one config file, with optional `section.key` overrides.

    Args:
        path: The YAML file.
        overrides: {"section.key": value} applied on top of the file before any check
            (`parse_overrides` reads them from `key=value` words); checked by the same schema,
            and an error in one names the override. Default none.

    Returns:
        The validated `Config`.

    Raises:
        ConfigError: The file is missing or unreadable, over `MAX_CONFIG_BYTES`, not YAML,
            has a duplicate key, expands past `MAX_YAML_NODES` through aliases, has an
            unknown key, a missing required key, a value of the wrong type or range, a
            non-finite number, a hub token in place of its name, or a local pipeline root /
            model cache under a file. The message names the file, the line and the key.
    """
    path = resolve_config_path(path)
    raw, node = _read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a config must be a mapping with sections pipeline, model, data, swift, eval")
    lines = _line_map(node) if node is not None else {}
    overridden = dict(overrides or {})
    for key, value in overridden.items():
        section, name = key.split(".", 1)
        if not isinstance(raw.get(section, {}), dict):
            raise ConfigError(f"override {key}: section '{section}' of {path} is not a mapping")
        overridden[key] = value = _override_value(section, name, value)
        raw[section] = {**(raw.get(section) or {}), name: value}

    def where(key: str) -> str:
        if key in overridden:  # quoted with any secret in it masked (the sweep below refuses it)
            return f"{path} (override {key}={secrets.redact(json.dumps(overridden[key], default=str))})"
        line = lines.get(key) or lines.get(key.split(".")[0])
        return f"{path}:{line}" if line else str(path)

    found = secret_problem(raw)
    if found:
        key = _override_of(found[0], overridden)
        raise ConfigError(f"{f'{path} (override {key}=...)' if key in overridden else where(key)}: {found[1]}")

    sections = _SECTIONS
    unknown = sorted(map(str, set(raw) - set(sections) - {"swift", "environment"}))  # YAML keys may be non-strings
    if unknown:
        hint = _did_you_mean(unknown[0], [*sections, "swift", "environment"])
        raise ConfigError(
            f"{where(unknown[0])}: unknown section '{unknown[0]}'{hint}; allowed: pipeline, model, data, swift, eval, "
            "vertex, resources, images, register, deploy, schedule, tracking, gke, environment"
        )
    for required in ("pipeline", "model", "data"):
        if required not in raw:
            raise ConfigError(f"{path}: missing required section '{required}'")
    built = {name: _build_section(cls, raw[name], name, where) for name, cls in sections.items() if name in raw}
    swift = raw.get("swift") or {}
    if not isinstance(swift, dict):
        raise ConfigError(f"{where('swift')}: section 'swift' must be a mapping of ms-swift argument names to values")
    for key, value in swift.items():
        if not isinstance(value, (str, int, float, bool, list)) or value is None:
            raise ConfigError(
                f"{where('swift.' + str(key))}: 'swift.{key}' must be a string, number, boolean or list, got {value!r}"
            )
    environment = raw.get("environment") or {}
    if not isinstance(environment, dict):
        raise ConfigError(
            f"{where('environment')}: section 'environment' must be a mapping of variable names to values"
        )
    try:
        check_job_env(environment, "environment")
    except JobEnvError as exc:
        key = next((f"environment.{k}" for k in map(str, environment) if f"environment.{k}" in str(exc)), "environment")
        raise ConfigError(f"{where(key)}: {exc}") from None
    cfg = Config(path=str(path), swift=dict(swift), environment=dict(environment), **built)
    _check_token_ref(cfg.model.token_from, where)
    _scan_values(raw, "", where)
    _check_ranges(cfg, where)
    _check_swift(cfg.swift, where)
    if found := swift_choice_problem(cfg.swift):
        raise ConfigError(f"{where(found[0])}: {found[1]}")
    cfg = _check_quantization(cfg, where)
    _check_parameter_targets(cfg.swift, where)
    _check_packing(cfg.swift, where)
    cfg = _check_tracking(cfg, where)
    if "gke" in raw:  # only a config that names the section (`--target gke` checks every config it compiles)
        check_gke(cfg, where)
    for key, value in (("pipeline.root", cfg.pipeline.root), ("model.cache", cfg.model.cache)):
        problem = local_dir_problem(value, writable=False)
        if problem:
            raise ConfigError(f"{where(key)}: '{key}' {problem}")
    return cfg


_BOX_CONVENTIONS = (AUTO_CONVENTION, *CONVENTIONS)


def _check_quantization(cfg: Config, where: typing.Callable[[str], str]) -> Config:
    """Checks `model.quantization` and adds its ms-swift arguments to the `swift` section.

    A `swift.quant_*` / `swift.bnb_*` argument that contradicts the setting (or any such
    argument without one) is refused with one line naming both keys.
    """
    q = cfg.model.quantization
    if q not in QUANTIZATIONS:
        raise ConfigError(
            f"{where('model.quantization')}: 'model.quantization' must be one of {', '.join(QUANTIZATIONS)}, got {q!r}"
        )
    clash = swift_conflict(cfg.swift, q)
    if clash:
        name, value, need = clash
        fix = f"set swift.{name}: {need} or drop it" if need is not None else f"drop swift.{name}"
        raise ConfigError(
            f"{where('swift.' + name)}: 'swift.{name}: {value}' contradicts 'model.quantization: {q}' "
            f"({where('model.quantization')}); the setting passes ms-swift's quant arguments itself: {fix}, "
            "or choose another model.quantization (none, nf4, int8)"
        )
    if q == "none":
        return cfg
    return dataclasses.replace(cfg, swift={**cfg.swift, **swift_quant_args(q)})


def _check_tracking(cfg: Config, where: typing.Callable[[str], str]) -> Config:
    """Checks the `tracking` section and `swift.report_to`; folds environment.MLFLOW_* into `tracking`.

    Returns:
        The config with `tracking` holding what the environment section set.

    Raises:
        ConfigError: A tracking URI that is not an http(s) server or holds credentials, a
            `report_to` the images cannot serve (W&B and the like, or mlflow without a URI),
            environment.MLFLOW_* that differ from `tracking`, or VLM_LORA_TRACKING_REQUIRED set by hand.
    """
    t = cfg.tracking
    values = {"mlflow_uri": t.mlflow_uri, "experiment": t.experiment}
    if ENV_REQUIRED in cfg.environment:
        key = f"environment.{ENV_REQUIRED}"
        raise ConfigError(f"{where(key)}: '{key}' is set by the pipeline; use tracking.required instead")
    for name, var in (("mlflow_uri", ENV_URI), ("experiment", ENV_EXPERIMENT)):
        if var not in cfg.environment:
            continue
        value = str(cfg.environment[var])
        if values[name] and values[name] != value:
            key = f"environment.{var}"
            raise ConfigError(f"{where(key)}: '{key}' differs from 'tracking.{name}'; set only one of them")
        values[name] = value
    if values["mlflow_uri"]:
        key = "tracking.mlflow_uri" if t.mlflow_uri else f"environment.{ENV_URI}"
        problem = uri_problem(values["mlflow_uri"])
        if problem:
            raise ConfigError(f"{where(key)}: '{key}': {problem}")
    if "report_to" in cfg.swift:
        problem = report_to_problem(cfg.swift["report_to"], values["mlflow_uri"])
        if problem:
            raise ConfigError(f"{where('swift.report_to')}: 'swift.report_to' {problem}")
    return dataclasses.replace(cfg, tracking=dataclasses.replace(t, **values))


def check_gke(cfg: Config, where: typing.Callable[[str], str] | None = None) -> None:
    """Checks the `gke` section with the resources profile (`pipelines.gke_section.gke_problems`).

    Raises:
        ConfigError: The first problem, with the file, line and key (a bucket that is not gs://, a Kueue
            queue without kueue, more GPUs per node than the node pool's machine has, ...).
    """
    r = cfg.resources
    problems = gke_problems(cfg.gke, r.machine_type, r.accelerator_type, r.accelerator_count, cfg.pipeline.root)
    if problems:
        key, message = problems[0]
        raise ConfigError(f"{where(key) if where else cfg.path}: {message}")


def _check_ranges(cfg: Config, where: typing.Callable[[str], str]) -> None:
    d, e = cfg.data, cfg.eval
    checks = [
        *(  # the rules validate-data's core and CLI check with too (components.common.data_policy)
            (f"data.{name}", not data_policy.setting_problem(name, getattr(d, name)), data_policy.expected(name))
            for name in data_policy.RULES
        ),
        ("data.task", d.task in TASK_NAMES, "one of " + ", ".join(repr(name) for name in TASK_NAMES)),
        ("data.box_convention", d.box_convention in _BOX_CONVENTIONS, "one of " + ", ".join(_BOX_CONVENTIONS)),
        ("eval.max_new_tokens", e.max_new_tokens > 0, "a positive integer"),
        ("eval.batch_size", e.batch_size > 0, "a positive integer"),
        ("eval.max_samples", e.max_samples >= 0, "0 (all) or a positive integer"),
        ("eval.iou_threshold", 0.0 < e.iou_threshold <= 1.0, "a number in (0, 1]"),
        ("eval.metric", e.metric in _GATE_METRICS, "one of " + ", ".join(_GATE_METRICS)),
        ("eval.quantization", e.quantization in QUANTIZATIONS, "one of " + ", ".join(QUANTIZATIONS)),
        ("eval.gate_on", e.gate_on in ("point", "lower_bound"), "point or lower_bound"),
        ("model.source", bool(cfg.model.source.strip()), "a model folder or URI"),
        ("model.cache", bool(cfg.model.cache.strip()), "a folder or gs:// URI"),
        ("data.train", bool(cfg.data.train.strip()), "a JSONL file, folder / prefix or glob (local or gs://)"),
    ]
    for key, ok, expected in checks:
        if not ok:
            section, name = key.split(".")
            value = getattr(getattr(cfg, section), name)
            raise ConfigError(f"{where(key)}: '{key}' must be {expected}, got {value!r}")
    if problem := pipeline_name_problem(cfg.pipeline.name):
        raise ConfigError(f"{where('pipeline.name')}: {problem}")
    for found in (gate_problem(e.metric, e.min_value, e.min_margin), budget_problem(e.max_new_tokens, cfg.swift)):
        if found:
            raise ConfigError(f"{where(found[0])}: {found[1]}")
    problem = reference_problem(e.reference)
    if problem:
        raise ConfigError(f"{where('eval.reference')}: 'eval.reference' {e.reference!r}: {problem}")
    if problem := max_drop_problem(e.regression_max_drop):
        raise ConfigError(f"{where('eval.regression_max_drop')}: 'eval.regression_max_drop' {problem}")
    if e.reference == CHAMPION and not cfg.register.alias:
        raise ConfigError(
            f"{where('eval.reference')}: 'eval.reference' is 'champion' but 'register.alias' is empty; "
            "set register.alias (the alias that marks the champion, e.g. champion)"
        )
    if "tuner_type" in cfg.swift and cfg.swift["tuner_type"] != "lora":
        raise ConfigError(
            f"{where('swift.tuner_type')}: 'swift.tuner_type' must be 'lora' (this pipeline trains LoRA adapters)"
        )
    _check_vertex(cfg, where)
    _check_serving(cfg, where)


def _check_vertex(cfg: Config, where: typing.Callable[[str], str]) -> None:
    """Checks the Vertex sections: shapes and regions against `pipelines.shapes`' tables."""
    v, r, s = cfg.vertex, cfg.resources, cfg.schedule
    checks = [
        ("resources.accelerator_count", r.accelerator_count >= 0, "0 or a positive integer"),
        ("resources.replica_count", r.replica_count >= 1, "a positive integer (machines of the training job)"),
        ("resources.boot_disk_gb", 100 <= r.boot_disk_gb <= 65536, "an integer from 100 to 65536 (GB)"),
        ("resources.scheduling", r.scheduling in shapes.SCHEDULING, "one of " + ", ".join(shapes.SCHEDULING)),
        ("resources.max_wait_s", r.max_wait_s >= 0, "0 (no limit) or a positive number of seconds"),
        ("resources.preflight", r.preflight in PREFLIGHT_MODES, "one of " + ", ".join(PREFLIGHT_MODES)),
        ("resources.timeout_s", r.timeout_s > 0, "a positive number of seconds"),
        (
            "resources.price_usd_per_hour",
            0 <= r.price_usd_per_hour < 10_000,
            "0 (the list price table) or the machine's price per hour in USD, e.g. 4.22",
        ),
        (
            "resources.price_date",
            r.price_date == "" or _is_date(r.price_date),
            "'' or the price's date as YYYY-MM-DD",
        ),
        (
            "resources.reservation",
            r.reservation in ("", "any") or _is_reservation(r.reservation),
            "'', 'any' or 'projects/P/zones/Z/reservations/R'",
        ),
        (
            "resources.eval_accelerator_type",
            r.eval_accelerator_type in shapes.GPU_REGIONS,
            "one of " + ", ".join(shapes.ACCELERATOR_TYPES),
        ),
        ("resources.eval_cpu", r.eval_cpu > 0, "a positive integer"),
        ("resources.eval_memory_gb", r.eval_memory_gb > 0, "a positive integer"),
        ("resources.light_cpu", r.light_cpu > 0, "a positive integer"),
        ("resources.light_memory_gb", r.light_memory_gb > 0, "a positive integer"),
        ("vertex.region", _is_region(v.region), "a Vertex region such as 'us-central1'"),
        (
            "vertex.labels",
            all(_is_label(k, 1) and _is_label(str(x), 0) for k, x in v.labels.items()),
            "a mapping of lowercase labels (letters, digits, '_' and '-', at most 63 characters)",
        ),
        (
            "vertex.service_account",
            v.service_account == "" or v.service_account.endswith(".gserviceaccount.com"),
            "'' or a service account e-mail NAME@PROJECT.iam.gserviceaccount.com",
        ),
        (
            "vertex.template_repo",
            v.template_repo == "" or v.template_repo.startswith(("https://", "http://")),
            "'' or https://REGION-kfp.pkg.dev/PROJECT/REPO",
        ),
        (
            "vertex.tensorboard",
            v.tensorboard == "" or "/tensorboards/" in v.tensorboard,
            "'' or projects/P/locations/R/tensorboards/ID",
        ),
        ("schedule.max_concurrent_runs", s.max_concurrent_runs >= 1, "a positive integer"),
        (
            "register.model_id",
            cfg.register.model_id == "" or _is_model_id(cfg.register.model_id),
            "'' (the pipeline name) or a Vertex model ID: up to 63 of a-z, 0-9, '_' and '-', "
            "not starting with a digit or '-'",
        ),
        (
            "register.alias",
            cfg.register.alias == "" or _is_alias(cfg.register.alias),
            "'' or a version alias: a lowercase letter, then letters, digits and '-', ending in a lowercase letter "
            "or digit (not a number, so it cannot be taken for a version ID)",
        ),
    ]
    for key, ok, expected in checks:
        if not ok:
            section, name = key.split(".")
            value = getattr(getattr(cfg, section), name)
            raise ConfigError(f"{where(key)}: '{key}' must be {expected}, got {value!r}")
    problem = shapes.check_machine(r.machine_type, r.accelerator_type, r.accelerator_count)
    if problem:
        n1_count = "count" in problem and r.machine_type.startswith("n1-")
        key = "resources.accelerator_count" if n1_count else "resources.machine_type"
        raise ConfigError(f"{where(key)}: {problem}")
    for key, problem in job_rule_problems(cfg)[:1]:
        raise ConfigError(f"{where(key)}: {problem}")
    if r.machine_type in shapes.PREEMPTIBLE_ONLY and r.scheduling == "standard":
        raise ConfigError(
            f"{where('resources.scheduling')}: {r.machine_type} runs only with scheduling spot or flex_start"
        )
    _check_model_fits(cfg, where)
    if v.region_check:
        gpus = (
            ("resources.accelerator_type", r.accelerator_type),
            ("resources.eval_accelerator_type", r.eval_accelerator_type),
        )
        for key, gpu in gpus:
            problem = shapes.check_region(gpu, v.region)
            if problem:
                raise ConfigError(f"{where(key)}: {problem} (vertex.region at {where('vertex.region')})")
    if s.cron:
        problem = cron_problem(s.cron)
        if problem:
            raise ConfigError(f"{where('schedule.cron')}: 'schedule.cron' {s.cron!r}: {problem}")


def _check_model_fits(cfg: Config, where: typing.Callable[[str], str]) -> None:
    """Refuses a released model whose bf16 weights do not fit the profile's GPUs even with ZeRO-3.

    The size comes from the model's name (`components.common.model_fit.KNOWN_MODELS`); other
    sources are checked by train-lora once staged, before `swift sft`.
    """
    r = cfg.resources
    q = cfg.model.quantization
    size = known_quantized_bytes(known_model_bytes(cfg.model.source), q, moe=bool(_MOE_NAME.search(cfg.model.source)))
    gib = GPU_MEMORY_GIB.get(r.accelerator_type)
    if not size or not gib or r.accelerator_count < 1 or "deepspeed" in cfg.swift:
        return  # a DeepSpeed setting of the user's own (e.g. ZeRO-3 with CPU offload) is theirs to size
    what = f"{cfg.model.source} on {r.replica_count} x {r.accelerator_count} x {r.accelerator_type}"
    what += f" (model.quantization: {q})" if q != "none" else ""
    try:
        check_fits(size, int(gib * 1024**3), r.accelerator_count, r.replica_count, what)
    except ModelTooLarge as exc:
        raise ConfigError(f"{where('resources.machine_type')}: {exc}") from None


# A mixture-of-experts name (Qwen3-VL-30B-A3B): its fused 3-D experts stay bf16 under bitsandbytes.
_MOE_NAME = re.compile(r"-a\d+(\.\d+)?b", re.IGNORECASE)

_FLASH_ATTN = ("flash_attn", "flash_attention_2", "flash_attention_3", "flash_attention_4")


def _check_packing(swift: Mapping[str, Any], where: typing.Callable[[str], str]) -> None:
    """padding_free / packing need a flash-attention kernel: ms-swift 4.6 refuses them otherwise, inside the GPU job."""
    for key in ("padding_free", "packing"):
        if swift.get(key) is True and swift.get("attn_impl") not in _FLASH_ATTN:
            raise ConfigError(
                f"{where('swift.' + key)}: 'swift.{key}: true' needs a flash-attention kernel (ms-swift refuses it "
                f"with attn_impl {swift.get('attn_impl', 'unset (sdpa)')!r}, after the job has started): set "
                "swift.attn_impl: flash_attn (the training image builds flash-attn; the lent GPU machines have none, "
                f"so it is not measured here) or drop swift.{key}"
            )


def _check_parameter_targets(swift: Mapping[str, Any], where: typing.Callable[[str], str]) -> None:
    """LoRA on parameters (`swift.target_parameters`, e.g. a MoE model's experts) needs lora_dropout 0."""
    if not swift.get("target_parameters"):
        return
    if swift.get("use_liger_kernel") is True:
        raise ConfigError(f"{where('swift.target_parameters')}: {LIGER_WITH_PARAMETERS}")
    dropout = swift.get("lora_dropout", 0.05)
    if dropout != 0:
        raise ConfigError(
            f"{where('swift.target_parameters')}: 'swift.target_parameters' is set, and peft's LoRA on parameters "
            f"(ParamWrapper) does not work with dropout, but swift.lora_dropout is {dropout!r} "
            "(ms-swift's default is 0.05): set swift.lora_dropout: 0"
        )


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_NAME = re.compile(r"(?i)(secret|token|password|passwd|api_?key|credential)")
_ENDPOINT_NAME = re.compile(r"^projects/([^/]+)/locations/([^/]+)/endpoints/([^/]+)$")


def _check_serving(cfg: Config, where: typing.Callable[[str], str]) -> None:
    """Checks register's serving container and the deploy section (refused here, before any job)."""
    reg, d, v = cfg.register, cfg.deploy, cfg.vertex
    checks = [
        ("register.serving_port", 1 <= reg.serving_port <= 65535, "a port number 1..65535"),
        ("register.predict_route", reg.predict_route.startswith("/"), "a route starting with '/'"),
        ("register.health_route", reg.health_route.startswith("/"), "a route starting with '/'"),
        ("deploy.traffic_percent", 1 <= d.traffic_percent <= 100, "1..100 (100 = all traffic)"),
        ("deploy.min_replicas", d.min_replicas >= 1, "a positive integer"),
        ("deploy.max_replicas", d.max_replicas >= d.min_replicas, "at least deploy.min_replicas"),
        ("deploy.smoke_rows", d.smoke_rows >= 1, "a positive integer (rows of the smoke test)"),
        ("deploy.timeout_s", d.timeout_s > 0, "a positive number of seconds"),
        ("deploy.accelerator_count", d.accelerator_count >= 0, "0 or a positive integer"),
    ]
    for key, ok, expected in checks:
        if not ok:
            section, name = key.split(".")
            value = getattr(getattr(cfg, section), name)
            raise ConfigError(f"{where(key)}: '{key}' must be {expected}, got {value!r}")
    for name, value in reg.serving_env.items():
        key = f"register.serving_env.{name}"
        if not _ENV_NAME.match(str(name)):
            raise ConfigError(f"{where(key)}: '{key}' is not an environment variable name")
        if _SECRET_NAME.search(str(name)) or _looks_like_token(str(value)):
            raise ConfigError(
                f"{where(key)}: '{key}' looks like a secret; the container spec is stored in the Model "
                "Registry in clear: give the serving container a service account or Secret Manager access instead"
            )
    if not d.endpoint:
        return
    if not reg.serving_image:
        raise ConfigError(
            f"{where('deploy.endpoint')}: 'deploy.endpoint' is set but 'register.serving_image' is empty: only a "
            "registered model can be deployed; set register.serving_image (e.g. the training image) or remove "
            "deploy.endpoint"
        )
    if not reg.alias:
        raise ConfigError(f"{where('register.alias')}: a deploy step promotes with 'register.alias'; it is empty")
    m = _ENDPOINT_NAME.match(d.endpoint)
    if d.endpoint.startswith("projects/") and not m:
        raise ConfigError(
            f"{where('deploy.endpoint')}: 'deploy.endpoint' must be a display name or "
            "projects/P/locations/R/endpoints/ID"
        )
    if m and (m.group(2) != v.region or (v.project and m.group(1) != v.project)):
        raise ConfigError(
            f"{where('deploy.endpoint')}: 'deploy.endpoint' is in project {m.group(1)!r}, region {m.group(2)!r}, but "
            f"the pipeline runs in project {v.project or '(the job project)'!r}, region {v.region!r}: a model is "
            "served only in its own region; use an endpoint of this project and region, or a display name"
        )
    if bool(d.accelerator_type) != (d.accelerator_count > 0):
        raise ConfigError(
            f"{where('deploy.accelerator_type')}: 'deploy.accelerator_type' and 'deploy.accelerator_count' go "
            "together (both set, or '' and 0)"
        )
    problem = shapes.check_machine(d.machine_type, d.accelerator_type, d.accelerator_count)
    if problem:
        raise ConfigError(f"{where('deploy.machine_type')}: {problem}")
    if v.region_check and d.accelerator_type:
        problem = shapes.check_region(d.accelerator_type, v.region)
        if problem:
            raise ConfigError(
                f"{where('deploy.accelerator_type')}: {problem} (vertex.region at {where('vertex.region')})"
            )


_CRON_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7))
_CRON_NAMES = {
    "jan": 1,
    "feb": 2,
    "mar": 3,
    "apr": 4,
    "may": 5,
    "jun": 6,
    "jul": 7,
    "aug": 8,
    "sep": 9,
    "oct": 10,
    "nov": 11,
    "dec": 12,
    "sun": 0,
    "mon": 1,
    "tue": 2,
    "wed": 3,
    "thu": 4,
    "fri": 5,
    "sat": 6,
}


def cron_problem(cron: str) -> str | None:
    """Checks a five-field cron expression (unix-cron, as Vertex schedules read it).

    Args:
        cron: e.g. "0 3 * * 1"; a leading "TZ=Area/City " is not allowed (use the time zone key).

    Returns:
        None when valid, else what is wrong.
    """
    fields = cron.split()
    if len(fields) != 5:
        return f"must have 5 fields (minute hour day-of-month month day-of-week), got {len(fields)}"
    for text, (name, low, high) in zip(fields, _CRON_FIELDS):
        for part in text.split(","):
            base, _, step = part.partition("/")
            if step and not (step.isdigit() and int(step) > 0):
                return f"{name} field {text!r}: step {step!r} must be a positive integer"
            if base == "*":
                continue
            for bound in base.split("-", 1):
                value = _CRON_NAMES.get(bound.lower()) if not bound.isdigit() else int(bound)
                if value is None or not low <= value <= high:
                    return f"{name} field {text!r}: {bound!r} is not in {low}-{high}"
    return None


def local_dir_problem(path: str, writable: bool = True) -> str | None:
    """Checks a local folder a task will create and write (pipeline root, model cache).

    Args:
        path: The folder; a URI (`gs://...`) is not local and never a problem.
        writable: Also check the nearest existing folder on its path can be written (and
            so the folder created) by this user. Default true.

    Returns:
        None when fine, else what is wrong and how to fix it.
    """
    if not path or "://" in path:
        return None
    folder = Path(path).expanduser()
    for candidate in (folder, *folder.parents):
        try:
            if not candidate.exists():
                continue
            if not candidate.is_dir():
                return (
                    f"{path!r} is inside {str(candidate)!r}, which is a file, not a folder; "
                    "name a folder (it is created if missing) or a gs:// URI"
                )
            if writable and not os.access(candidate, os.W_OK | os.X_OK):
                return (
                    f"{path!r} cannot be created or written: {str(candidate)!r} is not writable by this user; "
                    "name a folder you can write to (e.g. runs) or a gs:// URI"
                )
        except OSError as exc:
            return f"{path!r} cannot be checked: {exc.strerror or exc}; name a folder you can read and write"
        return None
    return None


def check_local_dirs(cfg: Config, root_from: str = "") -> None:
    """Checks a local run can create and write its pipeline root and model cache.

    `load_config` checks neither is under a file; this also checks they can be written,
    which only matters on the machine that runs the pipeline (`pipelines.run --local`,
    `pipelines.compile --target local`).

    Args:
        cfg: The loaded config.
        root_from: Where the root came from when not the config, e.g. "--root". Default "".

    Raises:
        ConfigError: The root or the cache is under a file or cannot be written.
    """
    for key, value in (("pipeline.root", cfg.pipeline.root), ("model.cache", cfg.model.cache)):
        problem = local_dir_problem(value)
        if problem:
            if key == "pipeline.root" and root_from:
                raise ConfigError(f"{root_from} {problem}")
            raise ConfigError(f"{_where_in(cfg.path, key)}: '{key}' {problem}")


def where_in(path: str, key: str) -> str:
    """`file:line` of `key` (or of its section) in a config that already loaded; `file` if not found."""
    return _where_in(path, key)


def _where_in(path: str, key: str) -> str:
    """`file:line` of `key` (or of its section) in a config that already loaded; `file` if not found."""
    try:
        lines = _line_map(_read_yaml(Path(path))[1])
    except ConfigError:  # changed or removed since it loaded
        return path
    line = lines.get(key) or lines.get(key.split(".")[0])
    return f"{path}:{line}" if line else path


def _is_model_id(text: str) -> bool:
    return (
        1 <= len(text) <= 63
        and text[0] not in "0123456789-"
        and all(c.isascii() and (c.islower() or c.isdigit() or c in "_-") for c in text)
    )


def _is_alias(text: str) -> bool:
    return (
        2 <= len(text) <= 128
        and text[0].islower()
        and text[0].isascii()
        and (text[-1].islower() or text[-1].isdigit())
        and all(c.isascii() and (c.isalnum() or c == "-") for c in text)
    )


def _is_date(text: str) -> bool:
    return bool(re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])", text))


def _is_reservation(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 6 and parts[0] == "projects" and parts[2] == "zones" and parts[4] == "reservations"


def _is_region(region: str) -> bool:
    parts = region.split("-")
    return len(parts) >= 2 and all(p.isalnum() and p.islower() for p in parts) and parts[-1][-1].isdigit()


def _is_label(text: str, min_len: int) -> bool:
    return min_len <= len(text) <= 63 and all(c.islower() or c.isdigit() or c in "_-" for c in text)


def _looks_like_token(text: str) -> bool:
    """A hub token or another long random string: mixed case and digits, no separators."""
    if _TOKEN_RE.search(text):
        return True
    run = max(re.findall(r"[A-Za-z0-9]+", text), key=len, default="")
    mixed = any(c.islower() for c in run) and any(c.isupper() for c in run) and any(c.isdigit() for c in run)
    return len(run) >= 32 or (len(run) >= 16 and mixed)


def _check_token_ref(ref: str, where: typing.Callable[[str], str]) -> None:
    """Checks `model.token_from` is a reference to a token, never the token; never echoes it.

    Raises:
        ConfigError: The value looks like a token itself, or is not `env:NAME` or a Secret
            Manager name.
    """
    key = "model.token_from"
    if ref == "":
        return
    name = ref[len("env:") :] if ref.startswith("env:") else ref
    env_name_ok = _ENV_NAME_RE.fullmatch(name) and not name.startswith("hf_") and not _looks_like_token(name)
    if ref.startswith("env:") and env_name_ok:
        return
    if _SECRET_RE.fullmatch(ref) and not _looks_like_token(ref.split("/")[3]):
        return
    if _looks_like_token(name) or ref.startswith("env:"):
        raise ConfigError(
            f"{where(key)}: {key} looks like a token itself (not echoed); put the token in an environment "
            "variable or Secret Manager and name it: env:HF_TOKEN or projects/P/secrets/S"
        )
    raise ConfigError(
        f"{where(key)}: '{key}' must be '' or 'env:VAR' (an environment variable name such as HF_TOKEN) or "
        "'projects/P/secrets/S[/versions/V]' (a reference, never the token itself); got a value that is "
        "neither (not echoed)"
    )
