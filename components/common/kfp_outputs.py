"""What a step's core returns, and the one helper that writes it into the KFP outputs.

A component's body is its signature and one call (`write_outputs(core_step(...), ...)`): the
core (pure: no kfp) reads the input artifacts' `.path`, `.uri` and `.metadata` (any object with
them: `Artifact`), writes its files under the output artifacts' paths (or names a finished
file to copy onto one) and returns a `StepOutputs`; `write_outputs` copies those files whole,
puts its figures into the `Metrics` artifact (numbers with `log_metric`, other JSON values as
metadata, in the core's order), its metadata and URIs onto the named output artifacts, and
returns the component's return values. No kfp import: KFP ships the component function's
source only, so the wrapper imports this module inside its body.
"""

from __future__ import annotations

import json
from collections import namedtuple
from dataclasses import dataclass, field
from typing import Any, Protocol

from components.common.files import copy_atomic


class ArtifactLike(Protocol):
    """What a core reads of a KFP artifact (a `dsl.Artifact` or a stand-in in tests)."""

    path: str
    uri: str
    metadata: dict[str, Any]


@dataclass
class StepOutputs:
    """A step's outputs as plain data.

    Attributes:
        metrics: Entries of the `Metrics` output, in order: numbers are logged with
            `log_metric`, anything else (text, nested blocks) is set as metadata. Default none.
        metadata: {output name: metadata entries to add to that artifact}. Default none.
        uris: {output name: the URI the artifact is given}. Default none.
        values: The component's return values, in its `Outputs` order. Default none.
        files: {output name: a finished local file copied whole onto that artifact's path}
            (staged beside it, then renamed: a reader never sees half of it). Default none.
    """

    metrics: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)
    uris: dict[str, str] = field(default_factory=dict)
    values: tuple[Any, ...] = ()
    files: dict[str, str] = field(default_factory=dict)


def is_metric(value: Any) -> bool:
    """Whether a `Metrics` entry is a scalar metric (a number, not a bool) rather than metadata."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def write_outputs(
    outputs: StepOutputs, metrics: Any = None, names: tuple[str, ...] = (), **artifacts: Any
) -> tuple[Any, ...] | None:
    """Writes a core's outputs into the KFP artifacts and returns the component's values.

    Args:
        outputs: What the core returned.
        metrics: The `Output[Metrics]` artifact; None = the step has none. Default None.
        names: The component's `Outputs` field names; () = it returns nothing. Default ().
        **artifacts: The output artifacts `outputs.metadata` and `outputs.uris` name.

    Returns:
        A namedtuple "Outputs" of `outputs.values` under `names`, or None without names.

    Raises:
        KeyError: `outputs` names an artifact not passed (a bug of the wrapper).
        TypeError: A `Metrics` entry is neither a number nor JSON data (the message names it).
    """
    for name, src in outputs.files.items():
        copy_atomic(src, artifacts[name].path)
    if metrics is not None:
        for key, value in outputs.metrics.items():
            if is_metric(value):
                metrics.log_metric(key, value)
            else:
                metrics.metadata[key] = _json_data(key, value)
    for name, uri in outputs.uris.items():
        artifacts[name].uri = uri
    for name, entries in outputs.metadata.items():
        artifacts[name].metadata.update(entries)
    if not names:
        return None
    return namedtuple("Outputs", names)(*outputs.values)


def _json_data(key: str, value: Any) -> Any:
    """`value` when KFP can write it as a `Metrics` metadata entry (JSON data); else a TypeError naming `key`."""
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"Metrics entry {key!r} is {type(value).__name__} {value!r:.80}: neither a number (log_metric) nor "
            f"JSON data ({exc}); return an int/float or a JSON value from the step"
        ) from None
    return value
