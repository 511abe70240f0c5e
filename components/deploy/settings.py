"""The deploy step's settings: the config's `deploy` section, one frozen type with its checks.

`pipelines.config` builds `DeploySettings` from the YAML's `deploy:` mapping and refuses a
config whose `checks()` fail (file, line, key); the pipeline hands the settings to the deploy
task as one value (`dataclasses.asdict`); the task rebuilds them with `from_dict` and the core
(`components.deploy.core`) reads them. Pure: no kfp, no Google Cloud import.

What needs more than the section (the endpoint's project and region, the serving machine
against the machine tables, a registered model to deploy) is checked by whoever has it: the
config against its `vertex` and `register` sections, the core against the job's project and
region.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from components.common.settings_fields import rebuild
from components.deploy.errors import DeployError

# (dotted key, whether its value is fine, what it must be): the config's field-check form.
Check = tuple[str, bool, str]

ENDPOINT_NAME = re.compile(r"^projects/([^/]+)/locations/([^/]+)/endpoints/([^/]+)$")


@dataclass(frozen=True)
class DeploySettings:
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

    def checks(self) -> list[Check]:
        """The section's own field checks, in the order they are reported.

        Returns:
            (`deploy.<field>`, ok, what it must be) for each check; `problems()` words the failed ones.
        """
        return [
            (
                "deploy.endpoint",
                not self.endpoint.startswith("projects/") or bool(ENDPOINT_NAME.match(self.endpoint)),
                "a display name or projects/P/locations/R/endpoints/ID",
            ),
            ("deploy.machine_type", bool(self.machine_type), "a Vertex serving machine type, e.g. g2-standard-12"),
            ("deploy.accelerator_count", self.accelerator_count >= 0, "0 or a positive integer"),
            (
                "deploy.accelerator_type",
                bool(self.accelerator_type) == (self.accelerator_count > 0),
                "set together with deploy.accelerator_count (they go together: both set, or '' and 0)",
            ),
            ("deploy.traffic_percent", 1 <= self.traffic_percent <= 100, "1..100 (100 = all traffic)"),
            ("deploy.min_replicas", self.min_replicas >= 1, "a positive integer"),
            ("deploy.max_replicas", self.max_replicas >= self.min_replicas, "at least deploy.min_replicas"),
            ("deploy.smoke_rows", self.smoke_rows >= 1, "a positive integer (rows of the smoke test)"),
            ("deploy.timeout_s", self.timeout_s > 0, "a positive number of seconds"),
            ("deploy.served_model_name", bool(self.served_model_name), "the serving container's model name"),
        ]

    def problems(self) -> list[str]:
        """Returns "'deploy.<field>' must be <what>, got <value>" for each failed check, in order."""
        return [
            f"'{key}' must be {expected}, got {getattr(self, key.split('.')[1])!r}"
            for key, ok, expected in self.checks()
            if not ok
        ]

    def endpoint_location_problem(self, project: str, region: str) -> str:
        """Returns why `endpoint` cannot serve a model of `project` and `region`, or "" when it can.

        A display name always can (it is looked up, or created, where the model is deployed).

        Args:
            project: The deployment's project ID; "" = not known yet (only the region is compared).
            region: The deployment's Vertex region.
        """
        m = ENDPOINT_NAME.match(self.endpoint)
        if not m or (m.group(2) == region and (not project or m.group(1) == project)):
            return ""
        return (
            f"'deploy.endpoint' is in project {m.group(1)!r}, region {m.group(2)!r}, but the model is deployed in "
            f"project {project or '(the job project)'!r}, region {region!r}: a model is served only in its own "
            "region; use an endpoint of this project and region, or a display name (created when missing)"
        )

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> DeploySettings:
        """Rebuilds the settings from `dataclasses.asdict` (the deploy task's `settings` input).

        A whole number that arrives as a float (a JSON struct carries numbers as doubles) is
        taken as the integer it is.

        Raises:
            DeployError: A key the settings do not have, or a value of the wrong type.
        """
        return rebuild(
            cls, values, DeployError,
            unknown=lambda key, names: f"unknown deploy setting 'deploy.{key}'; the deploy section has: {', '.join(names)}",
            wrong=lambda name, wanted, value: f"'deploy.{name}' must be {wanted}, got {value!r}",
        )  # fmt: skip
