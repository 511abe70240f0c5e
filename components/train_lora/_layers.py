"""The `swift sft` arguments as ordered layers: each layer sets some keys for one reason, the final arguments are the
layers merged in order (a later layer wins, and the override is recorded), and the table says which layer set each key.

The layers themselves (defaults, user, quantisation, strategy, distributed, tracking, checkpoints, batch_plan, inputs)
are built in `_swift_args`; this module merges them, logs the table, counts it for the run's metrics and writes it
beside the adapter's args.json (`ARGS_LAYERS`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.common.files import write_json_atomic

# The layer table beside the adapter's args.json (ms-swift's own record of the final arguments).
ARGS_LAYERS = "args_layers.json"


class _Dropped:
    """A layer's value that removes the key (`swift.deepspeed: none` drops the key for swift)."""

    def __repr__(self) -> str:
        return "<dropped>"


DROPPED: Any = _Dropped()


@dataclass(frozen=True)
class Layer:
    """One layer of the arguments.

    Attributes:
        name: The layer's name (an identifier: it names a metric).
        keys: {argument: value} it sets, in order; `DROPPED` removes the argument.
        reason: One line: why it sets them.
    """

    name: str
    keys: dict[str, Any] = field(default_factory=dict)
    reason: str = ""

    def line(self) -> str:
        """`<name>: key=value ... (reason)`, as the task log shows it."""
        pairs = " ".join(f"{k}={_show(v)}" for k, v in self.keys.items()) or "(nothing)"
        return f"{self.name}: {pairs}" + (f" ({self.reason})" if self.reason else "")


@dataclass(frozen=True)
class Override:
    """A key a later layer set again: which layers, and the values before and after."""

    key: str
    layer: str
    over: str
    old: Any
    new: Any


@dataclass(frozen=True)
class Layered:
    """The layers merged in order.

    Attributes:
        layers: The layers, first to last.
        final: The merged arguments (a key in its first layer's position; dropped keys absent).
        source: {argument: the last layer that set it} (dropped keys included).
        overrides: Each key a later layer set again, in order.
    """

    layers: tuple[Layer, ...]
    final: dict[str, Any]
    source: dict[str, str]
    overrides: tuple[Override, ...]

    def log_lines(self) -> list[str]:
        """The table as log lines: one per layer, then one per override."""
        lines = [f"train-lora: args: {layer.line()}" for layer in self.layers]
        lines += [
            f"train-lora: args: override: {o.key}={_show(o.new)} ({o.layer}) over {_show(o.old)} ({o.over})"
            for o in self.overrides
        ]
        return lines

    def metrics(self) -> dict[str, float]:
        """Numbers for the run's Metrics: keys each layer set (`args_layer_<name>_keys`) and the overrides."""
        out = {f"args_layer_{layer.name}_keys": float(len(layer.keys)) for layer in self.layers}
        out["args_overrides"] = float(len(self.overrides))
        return out

    def record(self) -> dict[str, Any]:
        """The whole table as JSON-able data (`ARGS_LAYERS`)."""
        return {
            "layers": [{"name": la.name, "reason": la.reason, "keys": _jsonable(la.keys)} for la in self.layers],
            "source": dict(self.source),
            "overrides": [
                {"key": o.key, "layer": o.layer, "over": o.over, "old": _jsonable(o.old), "new": _jsonable(o.new)}
                for o in self.overrides
            ],
        }


def merge(layers: Iterable[Layer]) -> Layered:
    """Merges the layers in order: a later layer's value wins and the override is recorded.

    Args:
        layers: The layers, first to last.

    Returns:
        The Layered arguments.
    """
    layers = tuple(layers)
    final: dict[str, Any] = {}
    source: dict[str, str] = {}
    overrides: list[Override] = []
    for layer in layers:
        for key, value in layer.keys.items():
            if key in source:
                overrides.append(Override(key, layer.name, source[key], final.get(key, DROPPED), value))
            source[key] = layer.name
            if value is DROPPED:
                final.pop(key, None)
            else:
                final[key] = value
    return Layered(layers, final, source, tuple(overrides))


def write_record(layered: Layered, folder: str | Path) -> Path:
    """Writes the table into `folder` as `ARGS_LAYERS`, whole or not at all (staging file, then rename)."""
    path = Path(folder) / ARGS_LAYERS
    write_json_atomic(path, layered.record())
    return path


def _show(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return repr(value) if value is DROPPED else str(value)


def _jsonable(value: Any) -> Any:
    if value is DROPPED:
        return "<dropped>"
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value if isinstance(value, str | int | float | bool) or value is None else str(value)
