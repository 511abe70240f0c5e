"""What a promoted model becomes: the `register` (Model Registry) and `deploy` (endpoint) sections, with their checks."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pipelines import shapes
from pipelines.config._errors import Check, ConfigError, Where
from pipelines.config._values import looks_like_token
from pipelines.config._vertex import VertexSection


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


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_NAME = re.compile(r"(?i)(secret|token|password|passwd|api_?key|credential)")
_ENDPOINT_NAME = re.compile(r"^projects/([^/]+)/locations/([^/]+)/endpoints/([^/]+)$")


def register_checks(reg: RegisterSection) -> list[Check]:
    """The registry names' own checks (`register.model_id`, `register.alias`)."""
    return [
        (
            "register.model_id",
            reg.model_id == "" or _is_model_id(reg.model_id),
            "'' (the pipeline name) or a Vertex model ID: up to 63 of a-z, 0-9, '_' and '-', "
            "not starting with a digit or '-'",
        ),
        (
            "register.alias",
            reg.alias == "" or _is_alias(reg.alias),
            "'' or a version alias: a lowercase letter, then letters, digits and '-', ending in a lowercase letter "
            "or digit (not a number, so it cannot be taken for a version ID)",
        ),
    ]


def serving_checks(reg: RegisterSection, d: DeploySection) -> list[Check]:
    """The serving container's and the deployment's own field checks (port, routes, traffic, replicas)."""
    return [
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


def check_serving_env(reg: RegisterSection, where: Where) -> None:
    """Refuses a `register.serving_env` name that is no variable name, or one that looks like a secret."""
    for name, value in reg.serving_env.items():
        key = f"register.serving_env.{name}"
        if not _ENV_NAME.match(str(name)):
            raise ConfigError(f"{where(key)}: '{key}' is not an environment variable name")
        if _SECRET_NAME.search(str(name)) or looks_like_token(str(value)):
            raise ConfigError(
                f"{where(key)}: '{key}' looks like a secret; the container spec is stored in the Model "
                "Registry in clear: give the serving container a service account or Secret Manager access instead"
            )


def check_deploy(reg: RegisterSection, d: DeploySection, v: VertexSection, where: Where) -> None:
    """Checks a deploy step (when `deploy.endpoint` is set): what it deploys, where, and on which machine.

    Raises:
        ConfigError: No registered model or alias to deploy, an endpoint of another form, project or
            region, or a serving machine Vertex does not offer there.
    """
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
    _check_endpoint(d, v, where)
    _check_serving_machine(d, v, where)


def _check_endpoint(d: DeploySection, v: VertexSection, where: Where) -> None:
    """Refuses a `deploy.endpoint` resource name of another form, project or region."""
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


def _check_serving_machine(d: DeploySection, v: VertexSection, where: Where) -> None:
    """Refuses a serving machine and GPU that do not go together, or a GPU the region does not offer."""
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
