"""What a promoted model becomes: the `register` (Model Registry) section, and `deploy`'s checks across sections.

The `deploy` section is the deploy step's own settings type (`components.deploy.settings.DeploySettings`,
with its field checks); what it needs of other sections (a registered model, the Vertex project and region,
the machine tables) is checked here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from components.deploy.settings import DeploySettings
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


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_NAME = re.compile(r"(?i)(secret|token|password|passwd|api_?key|credential)")


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


def serving_checks(reg: RegisterSection) -> list[Check]:
    """The serving container's own field checks (port, routes); the deploy section's are `DeploySettings.checks`."""
    return [
        ("register.serving_port", 1 <= reg.serving_port <= 65535, "a port number 1..65535"),
        ("register.predict_route", reg.predict_route.startswith("/"), "a route starting with '/'"),
        ("register.health_route", reg.health_route.startswith("/"), "a route starting with '/'"),
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


def check_deploy(reg: RegisterSection, d: DeploySettings, v: VertexSection, where: Where) -> None:
    """Checks a deploy step (when `deploy.endpoint` is set) against the other sections: what it deploys, where, on what.

    The section's own field checks (`DeploySettings.checks`: endpoint form, traffic, replicas, the GPU
    type and count together, ...) ran before.

    Raises:
        ConfigError: No registered model or alias to deploy, an endpoint of another project or
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
    problem = d.endpoint_location_problem(v.project, v.region)
    if problem:
        raise ConfigError(f"{where('deploy.endpoint')}: {problem}")
    _check_serving_machine(d, v, where)


def _check_serving_machine(d: DeploySettings, v: VertexSection, where: Where) -> None:
    """Refuses a serving machine and GPU that the machine tables do not pair, or a GPU the region does not offer."""
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
