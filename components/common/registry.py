"""The Model Registry's champion, checked where a run is about to act on it (register, deploy, promote).

A run compares its model with the version `MODEL@ALIAS` points at when it starts
(find-champion). Before it changes anything that decides what serves (a new version with the
alias, an endpoint's traffic, the alias itself) it checks the alias still points there:
if another run promoted a model meanwhile, this one was never compared with it.
"""

from __future__ import annotations

from typing import Any


class ChampionChanged(RuntimeError):
    """The alias moved to another version since evaluate looked it up; the message says what to do."""


def alias_version(parent: str, alias: str, project: str, location: str, credentials: Any = None) -> str:
    """The version ID `parent@alias` points at; "" when the model or the alias does not exist."""
    from google.api_core import exceptions
    from google.cloud import aiplatform

    try:
        model = aiplatform.Model(f"{parent}@{alias}", project=project, location=location, credentials=credentials)
    except exceptions.NotFound:
        return ""
    return str(model.version_id)


def check_champion(parent: str, alias: str, expected: str, current: str, *, action: str = "promoted") -> None:
    """Raises ChampionChanged unless the alias still points at `expected` ("" = still no champion).

    Args:
        parent: Parent model resource name.
        alias: The champion alias.
        expected: Version ID evaluate compared with ("" = there was none).
        current: Version ID the alias points at now ("" = none).
        action: What is refused, for the message. Default "promoted".
    """
    if current == expected:
        return
    was = f"version {expected}" if expected else "no champion"
    now = f"version {current}" if current else "no version"
    raise ChampionChanged(
        f"the champion changed during this run: evaluate compared with {was} of {parent}, but alias "
        f"{alias!r} now points at {now}; this model was not compared with the current champion, "
        f"so it is not {action}. Run the pipeline again to evaluate against the new champion"
    )
