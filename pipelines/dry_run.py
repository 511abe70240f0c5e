"""What a run would do, without credentials, network or any task (`python -m pipelines.run --dry-run`).

`dry_run` compiles the config in a temporary folder and prints the plan (the compiled
tasks in run order, `plan_tasks`), the machine, the expected time and cost
(`pipelines.estimate`) and what would be submitted: pipeline name, root, caching, labels and
the parameters that differ from the config file (`differing_arguments`). It returns every
problem that would stop a submission (placeholders, a missing project) at once.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pipelines.config import Config, load_config
from pipelines.estimate import estimate_lines
from pipelines.vertex import VertexError, run_labels, submission_problems


def plan_tasks(spec: dict[str, Any]) -> list[str]:
    """Returns a compiled pipeline's tasks in run order; a task under a condition says which.

    Args:
        spec: The compiled pipeline YAML, parsed.

    Returns:
        e.g. ["find-champion", "snapshot-data", "stage-model (if new data)", ..., "register (if the gate
        passed)", "nothing-to-train (if no new data)"].
    """
    components = spec.get("components", {})

    def when(condition: str) -> str:
        if "up_to_date" in condition:
            return "if no new data" if condition.startswith("!") else "if new data"
        return "if the gate passed" if "passed" in condition else "if ..."

    def walk(dag: dict[str, Any], label: str) -> list[str]:
        tasks, names = dict(dag.get("tasks", {})), []
        while tasks:  # dependencies first; the compiled order is alphabetical
            ready = [n for n, t in tasks.items() if set(t.get("dependentTasks") or ()) & set(tasks) <= {n}]
            name = sorted(ready or tasks, key=lambda n: n.startswith("condition"))[0]
            task = tasks.pop(name)
            inner = components.get(task.get("componentRef", {}).get("name", ""), {}).get("dag")
            condition = task.get("triggerPolicy", {}).get("condition", "")
            if inner is not None:  # a dsl.If / Elif / Else group
                names += walk(inner, when(condition) if condition else label)
            else:
                names.append(f"{name} ({label})" if label else name)
        return names

    return walk(spec.get("root", {}).get("dag", {}), "")


def differing_arguments(cfg: Config) -> dict[str, Any]:
    """The run's pipeline parameters that differ from the config file's own (what the overrides changed).

    Args:
        cfg: The config as the run will use it (overrides, --project, --root applied).

    Returns:
        {parameter: value}; a mapping parameter (the swift arguments) shows only its changed keys.
    """
    from pipelines.pipeline import pipeline_arguments

    ours = pipeline_arguments(cfg)
    try:
        base = pipeline_arguments(load_config(cfg.path))
    except Exception:  # noqa: BLE001 - the file alone may not load (an override fixed it): show all
        return ours
    changed: dict[str, Any] = {}
    for key, value in ours.items():
        old = base.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            keys = {k: v for k, v in value.items() if old.get(k) != v}
            changed.update({f"{key}.{k}": v for k, v in keys.items()})
        elif value != old:
            changed[key] = value
    return changed


def dry_run(cfg: Config, *, local: bool, enable_caching: bool | None, out: Any = None) -> list[str]:
    """Prints what a run would do, without credentials, network or any task: plan, machine, time, cost, job.

    Args:
        cfg: The validated config.
        local: Describe a `--local` run instead of a Vertex submission.
        enable_caching: The --no-cache switch (False), else the config's setting.
        out: Stream for the lines. Default stdout.

    Returns:
        The problems that would stop the run (placeholders, a missing project), all of them; [] if none.
    """
    import tempfile

    import yaml
    from kfp import compiler

    from pipelines.pipeline import build_pipeline

    out = out or sys.stdout
    target = "local" if local else "vertex"
    problems = [] if local else submission_problems(cfg)
    print(f"dry run ({target}): nothing submitted, no credentials or network used", file=out)
    try:
        with tempfile.TemporaryDirectory(prefix="vlm-lora-dry-") as tmp:
            compiler.Compiler().compile(build_pipeline(cfg, target), package_path=f"{tmp}/p.yaml")
            spec = yaml.safe_load(Path(f"{tmp}/p.yaml").read_text())
        print("plan: " + " -> ".join(plan_tasks(spec)), file=out)
    except VertexError as exc:
        problems.append(str(exc))
    print("\n".join(estimate_lines(cfg, local=local)), file=out)
    caching = cfg.pipeline.enable_caching if enable_caching is None else enable_caching
    print("would submit:" if not local else "would run:", file=out)
    rows = [("pipeline", cfg.pipeline.name), ("root", cfg.pipeline.root), ("caching", "on" if caching else "off")]
    if not local:
        v = cfg.vertex
        rows += [("project", v.project or "(not set)"), ("region", v.region)]
        rows += [("service account", v.service_account or "(the project's default)")]
        rows += [("labels", ", ".join(f"{k}={val}" for k, val in run_labels(cfg).items()))]
    changed = differing_arguments(cfg)
    rows.append(
        ("parameters", "as in the config file" if not changed else f"{len(changed)} differ from the config file")
    )
    for key, value in rows:
        print(f"  {key + ':':<17} {value}", file=out)
    for key, value in changed.items():
        print(f"    {key} = {json.dumps(value, default=str)}", file=out)
    return problems
