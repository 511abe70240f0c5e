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
  compared with (base, the registry's champion, or a model folder) and the promotion gate:
  the evaluate step's own settings type, `components.evaluate.settings.EvalSettings` (its field
  checks beside its fields), composed here.
* `vertex`: project, region, service account, network, experiment, labels, CMEK key,
  TensorBoard and template repository of the Vertex target (all optional: compiling
  needs none of them, submitting needs `project` and a gs:// `pipeline.root`).
* `resources`: the GPU profile of train-lora's CustomJob (machine, accelerators, replicas,
  disk, Spot / FLEX_START, reservation) and the machines of the other tasks; checked
  against the machine-shape and region tables in `pipelines.shapes`.
* `images`: container image overrides (default: `components.images`).
* `register`: the Vertex Model Registry entry a passing model becomes a version of.
* `deploy`: the endpoint a promoted model is deployed to: the deploy step's own settings type,
  `components.deploy.settings.DeploySettings` (its field checks beside its fields), composed here.
* `schedule`: the recurring run of `python -m pipelines.schedule`.
* `tracking`: the MLflow server and W&B project results go to (`components.common.tracking`, docs/tracking.md);
  `swift.report_to` names only what the images can serve (W&B is refused here, not in the GPU job).

train-lora's settings besides `swift` (the preflight mode, the GPU check, the durable checkpoints, the
job's environment) are its own settings type, `components.train_lora.settings.TrainSettings`, read from
`resources`, `pipeline.root`, `environment` and `tracking` by `train_settings(cfg, vertex)` (`_train`).

Unknown keys and wrong types are errors that name the file, the line, the key and what
is expected: `ConfigError`, raised before any work starts. So are careless and hostile
files: a duplicate key at any depth (never "last one wins"), a file over 1 MiB, YAML that
anchors and aliases expand past a small bound (a "billion laughs" bomb), nesting deeper
than a config needs, non-finite numbers (.inf, .nan), a hub token pasted where its name
belongs, a local pipeline root or model cache under a file, and `swift` values of the
wrong type or range for the ms-swift arguments whose meaning is well known
(`SWIFT_ARG_RULES`).

Which keys a run can change (pipeline parameters) and which are fixed when the pipeline
is compiled: `pipelines.run_parameters.RUN_PARAMETERS` and README.md's config table.

The package, one concept per module (each section's dataclass with its checks beside its fields):

* `_yaml`: the bounded YAML reader and its file:line:column errors; `_overrides`: `section.key=value`
  words; `_paths`: the shipped configs and the demo sources; `_cron`: cron expressions.
* `_inputs` (pipeline, model, data), `_eval` (eval's checks across sections), `_swift`,
  `_vertex` (vertex, resources, images),
  `_serving` (register; deploy's checks across sections), `_schedule`, `_tracking`: the sections
  and their checks; `_train`: train-lora's settings from the sections.
* `_schema`: `Config` and the section table; `_checks`: the order the checks run in;
  `_load`: `load_config`; `_local_dirs`: the local folders a run writes.
"""

from __future__ import annotations

from pipelines.config._checks import check_gke
from pipelines.config._cron import cron_problem
from pipelines.config._errors import ConfigError
from pipelines.config._inputs import DataSection, ModelSection, PipelineSection
from pipelines.config._load import load_config
from pipelines.config._local_dirs import check_local_dirs, local_dir_problem
from pipelines.config._overrides import parse_overrides
from pipelines.config._paths import (
    CONFIG_DIR,
    DEFAULT_LOCAL_CONFIG,
    DEMO_DATA_EVAL,
    DEMO_DATA_TRAIN,
    DEMO_DOCUMENTS_EVAL,
    DEMO_DOCUMENTS_TRAIN,
    DEMO_DRAWINGS_REGRESSION,
    DEMO_MODEL,
    resolve_config_path,
    shipped_configs,
)
from pipelines.config._schedule import ScheduleSection
from pipelines.config._schema import Config
from pipelines.config._serving import TRAIN_SERVING, RegisterSection
from pipelines.config._swift import SWIFT_ARG_RULES
from pipelines.config._tracking import TrackingSection
from pipelines.config._train import train_settings
from pipelines.config._vertex import ImagesSection, ResourcesSection, VertexSection
from pipelines.config._yaml import MAX_CONFIG_BYTES, MAX_YAML_ALIASES, MAX_YAML_DEPTH, MAX_YAML_NODES, where_in
from pipelines.gke_section import GkeSection

__all__ = [
    "CONFIG_DIR",
    "DEFAULT_LOCAL_CONFIG",
    "DEMO_DATA_EVAL",
    "DEMO_DATA_TRAIN",
    "DEMO_DOCUMENTS_EVAL",
    "DEMO_DOCUMENTS_TRAIN",
    "DEMO_DRAWINGS_REGRESSION",
    "DEMO_MODEL",
    "MAX_CONFIG_BYTES",
    "MAX_YAML_ALIASES",
    "MAX_YAML_DEPTH",
    "MAX_YAML_NODES",
    "SWIFT_ARG_RULES",
    "TRAIN_SERVING",
    "Config",
    "ConfigError",
    "DataSection",
    "GkeSection",
    "ImagesSection",
    "ModelSection",
    "PipelineSection",
    "RegisterSection",
    "ResourcesSection",
    "ScheduleSection",
    "TrackingSection",
    "VertexSection",
    "check_gke",
    "check_local_dirs",
    "cron_problem",
    "load_config",
    "local_dir_problem",
    "parse_overrides",
    "resolve_config_path",
    "shipped_configs",
    "train_settings",
    "where_in",
]
