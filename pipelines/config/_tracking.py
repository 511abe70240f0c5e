"""The `tracking` section: the MLflow server and the W&B project results go to (docs/tracking.md).

`components.common.tracking` (MLflow), `components.common.mlflow_registry` (register_model) and
`components.common.wandb_tracking` (tracking.wandb) read what it builds. `swift.report_to` names only
what the images can serve and the config has set up (refused here, not in the GPU job).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from components.common import wandb_tracking
from components.common.tracking import ENV_EXPERIMENT, ENV_REQUIRED, ENV_URI, Settings, report_to_problem, uri_problem
from components.common.wandb_tracking import WandbSettings
from pipelines.config._errors import ConfigError, Where


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
        register_model: Also make the adapter's run a version of a registered model in MLflow's
            model registry, tagged with the gate's decision (`components.common.mlflow_registry`).
            Needs mlflow_uri. Default false.
        model_name: The registered model; "" = pipeline.name. Default "".
        wandb: W&B: {project, entity (optional), api_key_from (optional: env:VAR or
            projects/P/secrets/S[/versions/V], read at run time; never the key)}; train-lora's curves
            (report_to wandb), evaluate's figures, the lineage and the reports go to one run per adapter.
            {} = no W&B. Default {}.
    """

    mlflow_uri: str = ""
    experiment: str = ""
    required: bool = True
    register_model: bool = False
    model_name: str = ""
    wandb: dict[str, Any] = field(default_factory=dict)

    def settings(self, pipeline_name: str) -> Settings:
        """The components' MLflow settings (`components.common.tracking.Settings`)."""
        model = (self.model_name or pipeline_name) if self.register_model else ""
        return Settings(self.mlflow_uri, self.experiment or pipeline_name, self.required, model)

    def wandb_settings(self) -> WandbSettings:
        """The components' W&B settings (`components.common.wandb_tracking.WandbSettings`)."""
        w = self.wandb
        return WandbSettings(w.get("project", ""), w.get("entity", ""), w.get("api_key_from", ""), self.required)

    def param(self, pipeline_name: str) -> dict[str, Any]:
        """evaluate's and register's `tracking` argument: MLflow's settings and a `wandb` entry ({} = neither)."""
        w = self.wandb_settings().as_param()
        return {**self.settings(pipeline_name).as_param(), **({"wandb": w} if w else {})}

    def job_env(self, pipeline_name: str) -> dict[str, str]:
        """train-lora's job environment for MLflow and W&B ({} = neither)."""
        return {**self.settings(pipeline_name).job_env(), **self.wandb_settings().job_env()}


def check_tracking(
    t: TrackingSection, environment: Mapping[str, Any], swift: Mapping[str, Any], where: Where
) -> TrackingSection:
    """Checks the `tracking` section and `swift.report_to`; folds environment.MLFLOW_* into `tracking`.

    Args:
        t: The `tracking` section as read.
        environment: The `environment` section.
        swift: The `swift` section.
        where: `file:line` of a dotted key.

    Returns:
        The `tracking` section holding what the environment section set.

    Raises:
        ConfigError: A tracking URI that is not an http(s) server or holds credentials, a
            `report_to` the images cannot serve (W&B and the like, or mlflow without a URI),
            environment.MLFLOW_* that differ from `tracking`, or VLM_LORA_TRACKING_REQUIRED set by hand.
    """
    values = {"mlflow_uri": t.mlflow_uri, "experiment": t.experiment}
    if ENV_REQUIRED in environment:
        key = f"environment.{ENV_REQUIRED}"
        raise ConfigError(f"{where(key)}: '{key}' is set by the pipeline; use tracking.required instead")
    for name, var in (("mlflow_uri", ENV_URI), ("experiment", ENV_EXPERIMENT)):
        if var not in environment:
            continue
        value = str(environment[var])
        if values[name] and values[name] != value:
            key = f"environment.{var}"
            raise ConfigError(f"{where(key)}: '{key}' differs from 'tracking.{name}'; set only one of them")
        values[name] = value
    if values["mlflow_uri"]:
        key = "tracking.mlflow_uri" if t.mlflow_uri else f"environment.{ENV_URI}"
        problem = uri_problem(values["mlflow_uri"])
        if problem:
            raise ConfigError(f"{where(key)}: '{key}': {problem}")
    _check_registry(t, values["mlflow_uri"], where)
    _check_wandb(t.wandb, environment, where)
    if "report_to" in swift:
        problem = report_to_problem(swift["report_to"], values["mlflow_uri"], str(t.wandb.get("project") or ""))
        if problem:
            raise ConfigError(f"{where('swift.report_to')}: 'swift.report_to' {problem}")
    return dataclasses.replace(t, **values)


# MLflow refuses these in a registered model's name (its REST paths and `models:/name/version` URIs).
_BAD_MODEL_NAME = ("/", ":", "%", "'", '"', "\\")


def _check_registry(t: TrackingSection, mlflow_uri: str, where: Where) -> None:
    """Refuses register_model without a server, a model_name without register_model, and a name MLflow refuses."""
    if t.register_model and not mlflow_uri:
        raise ConfigError(
            f"{where('tracking.register_model')}: 'tracking.register_model' needs an MLflow server: set "
            "tracking.mlflow_uri (http://host:port), or remove register_model"
        )
    if t.model_name and not t.register_model:
        raise ConfigError(
            f"{where('tracking.model_name')}: 'tracking.model_name' is set but tracking.register_model is not "
            "true: set register_model: true to register, or remove model_name"
        )
    bad = [c for c in _BAD_MODEL_NAME if c in t.model_name]
    if bad or t.model_name != t.model_name.strip():
        raise ConfigError(
            f"{where('tracking.model_name')}: 'tracking.model_name' {t.model_name!r} may not hold "
            f"{' '.join(bad) or 'leading or trailing spaces'}: use letters, digits, '-', '_' and '.'"
        )


_WANDB_KEYS = ("project", "entity", "api_key_from")
_WANDB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_ENV_REF = re.compile(r"env:[A-Za-z_][A-Za-z0-9_]*")
_SECRET_REF = re.compile(r"projects/[^/\s]+/secrets/[^/\s]+(/versions/[^/\s]+)?")
_PIPELINE_SETS = (wandb_tracking.ENV_PROJECT, wandb_tracking.ENV_ENTITY, wandb_tracking.ENV_LOGIN_FROM)


def _check_wandb(w: Mapping[str, Any], environment: Mapping[str, Any], where: Where) -> None:
    """Refuses a `tracking.wandb` without a project, an unknown key, a name W&B refuses, an API key that is
    not a reference, and WANDB_PROJECT / WANDB_ENTITY set in `environment` (the pipeline sets them)."""
    for var in _PIPELINE_SETS:
        if var in environment:
            key = f"environment.{var}"
            raise ConfigError(f"{where(key)}: '{key}' is set by the pipeline from tracking.wandb; set it there")
    if not w:
        return
    unknown = sorted(map(str, set(w) - set(_WANDB_KEYS)))
    if unknown:
        key = f"tracking.wandb.{unknown[0]}"
        raise ConfigError(f"{where(key)}: unknown key '{key}'; allowed keys in 'tracking.wandb': project, entity, "
                          "api_key_from")  # fmt: skip
    for name in ("project", "entity"):
        value, key = w.get(name, ""), f"tracking.wandb.{name}"
        if (name == "project" or value) and not (isinstance(value, str) and _WANDB_NAME.fullmatch(value)):
            need = "is required" if name == "project" and not value else "must be a W&B name"
            raise ConfigError(f"{where(key)}: '{key}' {need}: letters, digits, '-', '_' and '.', e.g. vlm-lora")
    ref, key = w.get("api_key_from", ""), "tracking.wandb.api_key_from"
    if ref and not (isinstance(ref, str) and (_ENV_REF.fullmatch(ref) or _SECRET_REF.fullmatch(ref))):
        raise ConfigError(
            f"{where(key)}: '{key}' must be 'env:VAR' (an environment variable of the task, e.g. env:WANDB_API_KEY) "
            "or 'projects/P/secrets/S[/versions/V]' (Secret Manager), read at run time; never the key itself "
            "(the value is not echoed)"
        )
