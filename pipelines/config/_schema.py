"""The schema: the config's sections, composed into one `Config`, and a section built from its YAML mapping."""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import json
import typing
from dataclasses import dataclass, field
from typing import Any

from components.deploy.settings import DeploySettings
from components.evaluate.settings import EvalSettings
from pipelines.config._errors import ConfigError, Where
from pipelines.config._inputs import DataSection, ModelSection, PipelineSection
from pipelines.config._schedule import ScheduleSection
from pipelines.config._serving import RegisterSection
from pipelines.config._tracking import TrackingSection
from pipelines.config._vertex import ImagesSection, ResourcesSection, VertexSection
from pipelines.gke_section import GkeSection


@dataclass(frozen=True)
class Config:
    """A whole validated config file."""

    pipeline: PipelineSection
    model: ModelSection
    data: DataSection
    swift: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    eval: EvalSettings = field(default_factory=EvalSettings)
    vertex: VertexSection = field(default_factory=VertexSection)
    resources: ResourcesSection = field(default_factory=ResourcesSection)
    images: ImagesSection = field(default_factory=ImagesSection)
    register: RegisterSection = field(default_factory=RegisterSection)
    deploy: DeploySettings = field(default_factory=DeploySettings)
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    tracking: TrackingSection = field(default_factory=TrackingSection)
    gke: GkeSection = field(default_factory=GkeSection)
    path: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Returns the config as plain data (what gets logged and recorded)."""
        out = dataclasses.asdict(self)
        out.pop("path")
        return out


# The config's sections (besides `swift` and `environment`, free-form mappings) and their schemas.
SECTIONS: dict[str, type] = {
    "pipeline": PipelineSection,
    "model": ModelSection,
    "data": DataSection,
    "eval": EvalSettings,
    "vertex": VertexSection,
    "resources": ResourcesSection,
    "images": ImagesSection,
    "register": RegisterSection,
    "deploy": DeploySettings,
    "schedule": ScheduleSection,
    "tracking": TrackingSection,
    "gke": GkeSection,
}


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is dict:
        return "a mapping"
    if typing.get_origin(tp) is list:
        return "a list of strings"
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _check_value(value: Any, tp: Any) -> Any:
    """Returns `value` converted to `tp`, or raises TypeError."""
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif typing.get_origin(tp) is dict:
        if isinstance(value, dict):
            return value
    elif typing.get_origin(tp) is list:
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
    raise TypeError


def did_you_mean(word: str, choices: typing.Iterable[str], prefix: str = "") -> str:
    """Returns " (did you mean 'PREFIX+closest'?)" for the closest of `choices`, or "" when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{prefix}{close[0]}'?)" if close else ""


def build_section(cls: type, raw: Any, name: str, where: Where) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where(name)}: section '{name}' must be a mapping of keys to values")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields), key=str)  # YAML keys may be non-strings (1, on, yes)
    if unknown:
        key = f"{name}.{unknown[0]}"
        raise ConfigError(
            f"{where(key)}: unknown key '{key}'{did_you_mean(str(unknown[0]), fields, name + '.')}; "
            f"allowed keys in '{name}': {', '.join(fields)}"
        )
    values = {}
    for fname, f in fields.items():
        key = f"{name}.{fname}"
        if fname not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{where(name)}: missing required key '{key}' ({_type_name(hints[fname])})")
            continue
        value = raw[fname]
        if hints[fname] is str and fname.endswith("_date") and isinstance(value, datetime.date):
            value = value.isoformat()  # `price_date: 2026-11-24` unquoted: YAML reads a date
        try:
            values[fname] = _check_value(value, hints[fname])
        except TypeError:
            raise ConfigError(
                f"{where(key)}: '{key}' must be {_type_name(hints[fname])}, got {json.dumps(raw[fname], default=str)}"
            ) from None
    return cls(**values)
