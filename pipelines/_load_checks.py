"""Load-time checks of values whose meaning another system fixes: Vertex names, generation budgets, ms-swift's choices.

Each returns (dotted key, what is wrong and the fix) or None; `pipelines.config.load_config`
raises them as one-line `ConfigError`s with the file and line, before anything runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from components.common.swift import choice_problem, pinned_sft_choices

# Vertex's pipeline job ID (`aiplatform.PipelineJob`): [a-z][-a-z0-9]{0,127}, made of the pipeline
# name and a 15-character "-YYYYMMDDHHMMSS" suffix, so a name has at most 128 - 15 characters.
MAX_PIPELINE_NAME = 113
_PIPELINE_NAME = re.compile(r"[a-z](?:[-a-z0-9]*[a-z0-9])?")
# A greedy answer longer than this is a runaway generation, not an answer (the demo's is ~200 tokens).
MAX_NEW_TOKENS = 32768


def pipeline_name_problem(name: str) -> str | None:
    """Why `pipeline.name` cannot name a Vertex pipeline job, or None."""
    if len(name) <= MAX_PIPELINE_NAME and _PIPELINE_NAME.fullmatch(name):
        return None
    return (
        f"'pipeline.name' must be lowercase letters, digits and '-', starting with a letter and not ending with '-', "
        f"ASCII only, at most {MAX_PIPELINE_NAME} characters (Vertex's job ID is the name and a timestamp, "
        f"[a-z][-a-z0-9]{{0,127}}), got {name[:140]!r}" + (f" ({len(name)} characters)" if len(name) > 20 else "")
    )


def budget_problem(max_new_tokens: int, swift: Mapping[str, Any]) -> tuple[str, str] | None:
    """A generation budget beyond `MAX_NEW_TOKENS` or beyond what training saw (`swift.max_length`)."""
    if max_new_tokens > MAX_NEW_TOKENS:
        return "eval.max_new_tokens", (
            f"'eval.max_new_tokens' is {max_new_tokens}, above {MAX_NEW_TOKENS}: a greedy answer that long is a "
            "runaway generation; give the longest answer the task needs (the gold answers' tokens plus a margin)"
        )
    max_length = swift.get("max_length")
    if isinstance(max_length, int) and not isinstance(max_length, bool) and 0 < max_length < max_new_tokens:
        return "eval.max_new_tokens", (
            f"'eval.max_new_tokens' is {max_new_tokens}, more than swift.max_length {max_length} (prompt and answer "
            "together in training): no trained answer is that long; lower eval.max_new_tokens or raise swift.max_length"
        )
    return None


def swift_choice_problem(swift: Mapping[str, Any]) -> tuple[str, str] | None:
    """A `swift` value that is not one of ms-swift's (or transformers') own choices (`swift.optim: bogus`)."""
    choices = pinned_sft_choices()
    for name, value in swift.items():
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            problem = choice_problem(name, value, choices)
            if problem:
                return f"swift.{name}", problem
    return None
