"""The order a loaded config's checks run in: each section's own checks, then those across sections.

The first problem found is the one reported, so the order is part of the behaviour: the
field checks of `data`, `eval`, `model` first, then the gate, the Vertex sections, serving,
`swift`, quantisation, tracking, `gke` and the local folders.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pipelines.config._errors import ConfigError, Where, refuse_bad_fields
from pipelines.config._eval import check_gate
from pipelines.config._inputs import check_pipeline_name, check_token_ref, data_checks, quantized_swift, source_checks
from pipelines.config._local_dirs import local_dir_problem
from pipelines.config._schedule import check_cron, schedule_checks
from pipelines.config._schema import Config
from pipelines.config._serving import check_deploy, check_serving_env, register_checks, serving_checks
from pipelines.config._swift import (
    check_packing,
    check_parameter_targets,
    check_swift,
    check_swift_choices,
    check_tuner_type,
)
from pipelines.config._tracking import check_tracking
from pipelines.config._train import train_settings
from pipelines.config._values import scan_values
from pipelines.config._vertex import (
    check_machine,
    check_model_fits,
    check_preemptible,
    check_regions,
    resources_checks,
    vertex_checks,
)
from pipelines.gke_section import gke_problems
from pipelines.job_rules import job_rule_problems


def check_config(cfg: Config, raw: dict[str, Any], where: Where) -> Config:
    """Runs every check of a built config, in order; returns it with what the checks fold in.

    Args:
        cfg: The config as built from the file (and its overrides).
        raw: The file's data with the overrides applied (every value is scanned).
        where: `file:line` of a dotted key.

    Returns:
        The config with the quantisation's ms-swift arguments in `swift` and `tracking` holding
        what the environment section set.

    Raises:
        ConfigError: The first problem, naming the file, the line and the key.
    """
    check_token_ref(cfg.model.token_from, where)
    scan_values(raw, "", where)
    _check_sections(cfg, where)
    check_swift(cfg.swift, where)
    check_swift_choices(cfg.swift, where)
    cfg = dataclasses.replace(cfg, swift=quantized_swift(cfg.model, cfg.swift, where))
    check_parameter_targets(cfg.swift, where)
    check_packing(cfg.swift, where)
    cfg = dataclasses.replace(cfg, tracking=check_tracking(cfg.tracking, cfg.environment, cfg.swift, where))
    if "gke" in raw:  # only a config that names the section (`--target gke` checks every config it compiles)
        check_gke(cfg, where)
    for key, value in (("pipeline.root", cfg.pipeline.root), ("model.cache", cfg.model.cache)):
        problem = local_dir_problem(value, writable=False)
        if problem:
            raise ConfigError(f"{where(key)}: '{key}' {problem}")
    return cfg


def check_gke(cfg: Config, where: Where | None = None) -> None:
    """Checks the `gke` section with the resources profile (`pipelines.gke_section.gke_problems`).

    Raises:
        ConfigError: The first problem, with the file, line and key (a bucket that is not gs://, a Kueue
            queue without kueue, more GPUs per node than the node pool's machine has, ...).
    """
    r = cfg.resources
    problems = gke_problems(
        cfg.gke, r.machine_type, r.accelerator_type, r.accelerator_count, cfg.pipeline.root, r.replica_count
    )
    if problems:
        key, message = problems[0]
        raise ConfigError(f"{where(key) if where else cfg.path}: {message}")


def _check_sections(cfg: Config, where: Where) -> None:
    """The sections' own checks and the gate: what the run reads, evaluation, then Vertex and serving."""
    refuse_bad_fields(cfg, [*data_checks(cfg.data), *cfg.eval.checks(), *source_checks(cfg.model, cfg.data)], where)
    check_pipeline_name(cfg.pipeline, where)
    check_gate(cfg.eval, cfg.swift, cfg.register.alias, where)
    check_tuner_type(cfg.swift, where)
    _check_vertex(cfg, where)
    _check_serving(cfg, where)


def _check_vertex(cfg: Config, where: Where) -> None:
    """Checks the Vertex sections: shapes and regions against `pipelines.shapes`' tables, the job's rules, the cron."""
    v, r, s = cfg.vertex, cfg.resources, cfg.schedule
    train = train_settings(cfg).checks()  # train-lora's own (resources.preflight, the GPU count)
    refuse_bad_fields(
        cfg,
        [*resources_checks(r), *train, *vertex_checks(v), *schedule_checks(s), *register_checks(cfg.register)],
        where,
    )
    check_machine(r, where)
    for key, problem in job_rule_problems(cfg)[:1]:
        raise ConfigError(f"{where(key)}: {problem}")
    check_preemptible(r, where)
    check_model_fits(cfg.model, r, cfg.swift, where)
    check_regions(v, r, where)
    check_cron(s, where)


def _check_serving(cfg: Config, where: Where) -> None:
    """Checks register's serving container and the deploy section (refused here, before any job)."""
    refuse_bad_fields(cfg, [*serving_checks(cfg.register), *cfg.deploy.checks()], where)
    check_serving_env(cfg.register, where)
    check_deploy(cfg.register, cfg.deploy, cfg.vertex, where)
