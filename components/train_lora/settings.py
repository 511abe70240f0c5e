"""The train-lora step's settings: what it reads from the config besides the `swift` section, one frozen type.

The config has no `train:` section: these settings come from the sections that describe the
training job (`CONFIG_KEYS` names the field each one is read from), and
`pipelines.config.train_settings` builds them for a target. The config refuses a file whose
`checks()` fail (file, line, key); the pipeline hands the settings to the train-lora task as one
value (`as_param()`); the task rebuilds them with `from_dict` and refuses what `problems()` finds
before any work (`components.train_lora.step`). The `swift` section stays apart: ms-swift's own
argument names, passed through as `swift_args`. Pure: no kfp, no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from components.common.errors import TrainError
from components.common.preflight import MODES as PREFLIGHT_MODES
from components.common.settings_fields import rebuild
from components.train_lora.job_env import JobEnvError, check_job_env

# (dotted key, whether its value is fine, what it must be): the config's field-check form.
Check = tuple[str, bool, str]

# The config field each setting is read from (`pipelines.config.train_settings`), which messages name.
# checkpoint_dir and ddp_timeout_s are no config field: the pipeline leaves them at their defaults; a
# direct caller of the component sets them (`settings.<field>` in messages).
CONFIG_KEYS = {
    "preflight": "resources.preflight",
    "accelerator_count": "resources.accelerator_count",
    "checkpoint_root": "pipeline.root",
    "checkpoint_dir": "settings.checkpoint_dir",
    "ddp_timeout_s": "settings.ddp_timeout_s",
    "job_env": "environment",
}


class TrainSettingsError(TrainError):
    """A train-lora setting the step cannot take (unknown key, wrong type, failed check)."""


@dataclass(frozen=True)
class TrainSettings:
    """How the train-lora step runs the job around `swift sft` (the GPU check, checkpoints, the environment).

    Attributes:
        preflight: GPU and interconnect check on every node before training
            (`components.common.preflight`, from `resources.preflight`): "fail" (stop on a slow
            GPU / link or a missing node), "warn" (log and train) or "off". Skipped without a
            GPU. Default "fail".
        accelerator_count: GPUs per node the resources profile asks for (from
            `resources.accelerator_count` on the Vertex and GKE targets, 0 without
            `resources.accelerator_type`); fewer visible GPUs stop the task before training.
            0 = no check. Default 0.
        checkpoint_root: Durable checkpoints go to `<checkpoint_root>/<key>/train-lora`, the key a
            hash of the input artifacts' URIs and the swift arguments
            (`core.durable_checkpoint_dir`), so retries of one run share the folder and no per-run
            value breaks the cache (on the Vertex and GKE targets `/gcs/<pipeline.root>/checkpoints`).
            "" = none (no resume). Default "".
        checkpoint_dir: A durable checkpoint folder used as is, in place of checkpoint_root's
            (on Vertex a `/gcs/...` path, stable across retries of the job); a restarted job
            resumes from the newest complete checkpoint there. "" = checkpoint_root's. Default "".
        ddp_timeout_s: NCCL timeout of a distributed run when swift.ddp_timeout is unset, s;
            0 = the default (1 hour). Default 0.
        job_env: Extra environment variables of the training job (the `environment` section,
            then the MLflow and W&B variables of `tracking`: NCCL_*, TORCH_NCCL_*,
            CUDA_DEVICE_MAX_CONNECTIONS, the train-lora plugin's switches, ...;
            `components.train_lora.job_env`), applied to the preflight and to `swift sft`; other
            names and secrets are refused. Default {} (none).
    """

    preflight: str = "fail"
    accelerator_count: int = 0
    checkpoint_root: str = ""
    checkpoint_dir: str = ""
    ddp_timeout_s: int = 0
    job_env: dict[str, Any] = field(default_factory=dict)

    def checks(self) -> list[Check]:
        """The field checks of the settings a config sets, in the order they are reported (the config runs them).

        The job environment is checked apart (`check_job_env`, also when the config is read).

        Returns:
            (config key, ok, what it must be) for each check; `problems()` words the failed ones.
        """
        return [
            (CONFIG_KEYS["preflight"], self.preflight in PREFLIGHT_MODES, "one of " + ", ".join(PREFLIGHT_MODES)),
            (CONFIG_KEYS["accelerator_count"], self.accelerator_count >= 0, "0 or a positive integer"),
        ]

    def _own_checks(self) -> list[Check]:
        """`checks()` and those of the settings no config field sets (a direct caller's)."""
        timeout_ok = self.ddp_timeout_s >= 0
        return [
            *self.checks(),
            (CONFIG_KEYS["ddp_timeout_s"], timeout_ok, "0 (the default, 1 hour) or a positive number of seconds"),
        ]

    def problems(self) -> list[str]:
        """Returns "'<key>' must be <what>, got <value>" for each failed check, then the job environment's problem.

        The job environment's is `check_job_env`'s message ("environment.<NAME>: ..."): a name
        outside the allow-list, a reserved name, a secret, or a value a plugin switch does not take.
        """
        fields = {key: name for name, key in CONFIG_KEYS.items()}
        out = [
            f"'{key}' must be {expected}, got {getattr(self, fields[key])!r}"
            for key, ok, expected in self._own_checks()
            if not ok
        ]
        try:
            check_job_env(self.job_env, CONFIG_KEYS["job_env"])
        except JobEnvError as exc:
            out.append(str(exc))
        return out

    def as_param(self) -> dict[str, Any]:
        """The train-lora task's `settings` input: every field (the job environment copied)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrainSettings:
        """Rebuilds the settings from `as_param()` (the train-lora task's `settings` input).

        A whole number that arrives as a float (a JSON struct carries numbers as doubles) is
        taken as the integer it is. Keys left out take their defaults. The values' own checks
        are `problems()`.

        Raises:
            TrainSettingsError: Not a mapping, a key the settings do not have, or a value of the wrong type.
        """
        if not isinstance(values, Mapping):
            raise TrainSettingsError(f"train-lora settings must be a mapping, got {type(values).__name__}")
        return rebuild(
            cls, values, TrainSettingsError,
            unknown=lambda key, names: f"unknown train-lora setting {key!r}; the settings have: {', '.join(names)}",
            wrong=lambda name, wanted, value: f"'{CONFIG_KEYS[name]}' must be {wanted}, got {value!r}",
            mapping="a mapping of NAME: value",
        )  # fmt: skip
