"""Reading a compiled pipeline spec in tests: every task at any depth, where its inputs come from, what it waits for.

KFP compiles `dsl.If` / `dsl.Else` / `dsl.Condition` into sub-DAGs: a task inside one is
listed in `components["comp-condition-N"].dag.tasks`, the group is itself a task of the DAG
above it, and a value from outside reaches the task through the group's inputs
(`componentInputParameter: pipelinechannel--...`). An order across levels (`.after()` on a
task outside the group) is the group's `dependentTasks`. These helpers follow all of that,
so a test can say "train-lora waits for find-champion" or "validate-data's snapshot is
snapshot-data's output" wherever the tasks sit.

The spec is the dict of the compiled YAML (or of a request body); a `PipelineSpec` proto
is converted first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Task:
    """One task of a compiled pipeline, at any depth.

    Attributes:
        name: The task's key in its DAG (unique in the whole pipeline).
        spec: The task's spec (`componentRef`, `inputs`, `dependentTasks`, `cachingOptions`, ...).
        component: Its component (`dag` for a group; `executorLabel` for a container task).
        groups: The condition groups it sits in, by task key, outermost first (() = the root DAG).
        group_names: The same groups by display name (`new-data-or-settings`, `gate-passed`, ...).
    """

    name: str
    spec: dict
    component: dict
    groups: tuple[str, ...]
    group_names: tuple[str, ...]

    @property
    def is_group(self) -> bool:
        """Whether the task is a condition / branch group (a sub-DAG), not a container task."""
        return "dag" in self.component

    @property
    def display_name(self) -> str:
        return self.spec.get("taskInfo", {}).get("name", self.name)

    @property
    def caches(self) -> bool:
        """Whether the task may be a cache hit (`cachingOptions.enableCache`)."""
        return bool(self.spec.get("cachingOptions", {}).get("enableCache"))


@dataclass(frozen=True)
class Source:
    """Where one input of a task comes from, followed through the condition groups to its origin.

    Attributes:
        kind: "constant", "pipeline parameter", "task output parameter" or "task output artifact".
        value: The constant, or the pipeline parameter's name; None otherwise.
        producer: The producing task's name (task outputs); "" otherwise.
        key: The producer's output key (task outputs); "" otherwise.
    """

    kind: str
    value: Any = None
    producer: str = ""
    key: str = ""

    def __str__(self) -> str:
        if self.kind == "constant":
            return f"constant {self.value!r}"
        if self.kind == "pipeline parameter":
            return f"pipeline parameter {self.value}"
        return f"{self.producer}.{self.key}"


def as_dict(spec: Any) -> dict:
    """Returns the spec as a dict (a `PipelineSpec` proto is converted with its JSON names)."""
    if isinstance(spec, dict):
        return spec
    from google.protobuf import json_format

    return json_format.MessageToDict(spec)


def tasks(spec: Any) -> dict[str, Task]:
    """Returns every task of the pipeline, container tasks and groups, at any depth.

    Args:
        spec: The compiled pipeline (dict of the YAML, or a `PipelineSpec`).

    Returns:
        {task key: Task}.

    Raises:
        AssertionError: Two tasks with the same key (KFP keeps them unique).
    """
    raw = as_dict(spec)
    components = raw.get("components", {})
    found: dict[str, Task] = {}

    def walk(dag: dict, groups: tuple[str, ...], names: tuple[str, ...]) -> None:
        for name, task in dag.get("tasks", {}).items():
            assert name not in found, f"task {name} appears twice"
            component = components.get(task.get("componentRef", {}).get("name", ""), {})
            found[name] = Task(name, task, component, groups, names)
            if "dag" in component:
                display = task.get("taskInfo", {}).get("name", name)
                walk(component["dag"], groups + (name,), names + (display,))

    walk(raw["root"]["dag"], (), ())
    return found


def container_tasks(spec: Any) -> dict[str, Task]:
    """Returns the tasks that run a container (every task but the condition groups)."""
    return {name: t for name, t in tasks(spec).items() if not t.is_group}


def source(index: dict[str, Task], task: str, name: str, artifact: bool = False) -> Source:
    """Returns where a task's input comes from, followed out through its condition groups.

    Args:
        index: `tasks(spec)`.
        task: The task's key.
        name: The input's name.
        artifact: Whether it is an input artifact (else a parameter). Default False.

    Returns:
        The Source.

    Raises:
        KeyError: The task has no such input.
    """
    t = index[task]
    section = "artifacts" if artifact else "parameters"
    binding = t.spec.get("inputs", {}).get(section, {})[name]
    outer = "componentInputArtifact" if artifact else "componentInputParameter"
    if outer in binding:
        if not t.groups:
            return Source("pipeline parameter", value=binding[outer])
        return source(index, t.groups[-1], binding[outer], artifact)
    if "taskOutputParameter" in binding:
        out = binding["taskOutputParameter"]
        return Source("task output parameter", producer=out["producerTask"], key=out["outputParameterKey"])
    if "taskOutputArtifact" in binding:
        out = binding["taskOutputArtifact"]
        return Source("task output artifact", producer=out["producerTask"], key=out["outputArtifactKey"])
    if "runtimeValue" in binding:
        return Source("constant", value=binding["runtimeValue"].get("constant"))
    raise AssertionError(f"{task}.{name}: unknown input binding {binding}")


def inputs(index: dict[str, Task], task: str) -> dict[str, Source]:
    """Returns every input of a task (parameters and artifacts) with its Source."""
    bound = index[task].spec.get("inputs", {})
    found = {name: source(index, task, name) for name in bound.get("parameters", {})}
    found.update({name: source(index, task, name, artifact=True) for name in bound.get("artifacts", {})})
    return found


def upstream(index: dict[str, Task], task: str) -> set[str]:
    """Returns every task that has finished before `task` starts.

    A task waits for its own `dependentTasks` and for those of every group it sits in (a
    dependency across DAG levels is put on the group); waiting for a group is waiting for
    every task inside it.

    Args:
        index: `tasks(spec)`.
        task: The task's key.

    Returns:
        The set of task keys (groups and the tasks inside them included).
    """
    before: set[str] = set()
    for node in (task, *reversed(index[task].groups)):
        for dep in index[node].spec.get("dependentTasks", []):
            inside = {name for name, t in index.items() if dep in t.groups}
            before |= {dep} | inside | upstream(index, dep)
    return before
