"""train-lora's settings from a config: `components.train_lora.settings.TrainSettings`, composed here.

The config has no `train:` section: the settings are read from the sections that describe the
training job (`TrainSettings.CONFIG_KEYS`): `resources.preflight`, `resources.accelerator_count`
(the GPU check), `pipeline.root` (the durable checkpoints) and the job's environment
(`environment`, then `tracking`'s MLflow and W&B variables). The field checks are the settings'
own (`TrainSettings.checks`), run when the config loads.
"""

from __future__ import annotations

from components.common.storage import to_fuse_path
from components.train_lora.settings import TrainSettings
from pipelines.config._schema import Config


def train_settings(cfg: Config, vertex: bool = True) -> TrainSettings:
    """Returns the train-lora task's settings for a config and target.

    Args:
        cfg: The config (the checks need not have run: `check_config` calls this too).
        vertex: Whether the pipeline runs on Vertex or GKE (the GPU check and durable checkpoints
            under `pipeline.root`); False = the local target (neither). Default True.

    Returns:
        The settings; `as_param()` is the task's `settings` input.
    """
    r = cfg.resources
    job_env = {
        **{str(k): v for k, v in cfg.environment.items()},
        **cfg.tracking.job_env(cfg.pipeline.name),  # MLflow and W&B (docs/tracking.md)
    }
    if not vertex:
        return TrainSettings(preflight=r.preflight, job_env=job_env)
    return TrainSettings(
        preflight=r.preflight,
        # durable, verified checkpoints under the pipeline root: a retried job resumes
        checkpoint_root=to_fuse_path(cfg.pipeline.root.rstrip("/")) + "/checkpoints",
        accelerator_count=r.accelerator_count if r.accelerator_type else 0,
        job_env=job_env,
    )
