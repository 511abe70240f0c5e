"""The `eval` section's checks across sections; the section is the evaluate step's own settings type.

The `eval` section is `components.evaluate.settings.EvalSettings` (its field checks beside its
fields: budgets, IoU, the gate metric and its thresholds' range, quantisation, the regression
rule); what it needs of other sections, or of the file system, is checked here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.common.reference import CHAMPION, reference_problem
from components.evaluate.settings import EvalSettings
from pipelines._load_checks import budget_problem
from pipelines.config._errors import ConfigError, Where


def check_gate(e: EvalSettings, swift: Mapping[str, Any], alias: str, where: Where) -> None:
    """Checks the generation budget against training and the reference model against the registry.

    The section's own field checks (`EvalSettings.checks`) ran before.

    Args:
        e: The `eval` section.
        swift: The `swift` section (its `max_length` bounds `eval.max_new_tokens`).
        alias: `register.alias` (`eval.reference: champion` needs one).
        where: `file:line` of a dotted key.

    Raises:
        ConfigError: The first of these that is wrong.
    """
    found = budget_problem(e.max_new_tokens, swift)
    if found:
        raise ConfigError(f"{where(found[0])}: {found[1]}")
    problem = reference_problem(e.reference)
    if problem:
        raise ConfigError(f"{where('eval.reference')}: 'eval.reference' {e.reference!r}: {problem}")
    if e.reference == CHAMPION and not alias:
        raise ConfigError(
            f"{where('eval.reference')}: 'eval.reference' is 'champion' but 'register.alias' is empty; "
            "set register.alias (the alias that marks the champion, e.g. champion)"
        )
