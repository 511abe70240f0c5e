"""The config's secret sweep: every string it holds, through one detector (`components.common.secrets`).

Every value of every section (lists, mappings and their keys, URLs and their query strings
included) is checked before anything else reads the config, so no later message can quote a
secret. Fields meant for free text (names, experiments, the serving command line, job
environment values, ms-swift's string arguments) are also checked for high-entropy strings.
`model.token_from` has its own check (a reference, never the token: `pipelines.config._inputs.check_token_ref`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from components.common import secrets

# Dotted keys (or section names: everything under them) whose strings are words, not names,
# paths or hashes: a high-entropy run there is a pasted key.
FREE_TEXT = frozenset(
    {
        "swift",
        "environment",
        "register.display_name",
        "register.serving_command",
        "register.serving_args",
        "register.serving_env",
        "vertex.experiment",
        "vertex.labels",
        "tracking.experiment",
        "data.split_seed",
        "deploy.served_model_name",
    }
)
_OWN_CHECK = frozenset({"model.token_from"})
# Where a secret a key needs comes from instead (after the general fix).
_KEY_FIX = {
    "tracking": "; an MLflow server that needs credentials reads MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME / "
    "MLFLOW_TRACKING_PASSWORD from the task's environment, never from the config",
    "register": "; the serving container's spec is stored in the Model Registry in clear: give it a service account "
    "with Secret Manager access and read the secret there",
}
FIX = (
    "never put a secret in a config (it becomes pipeline parameters, the compiled YAML and the Model Registry "
    "entry, all in clear): name it instead, env:VAR or projects/P/secrets/S[/versions/V], resolved inside the job "
    "(model.token_from; docs/setup.md)"
)


def _free(key: str) -> bool:
    return key in FREE_TEXT or key.split(".", 1)[0] in FREE_TEXT or key.rsplit(".", 1)[0] in FREE_TEXT


def _walk(value: Any, key: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield key, k  # a mapping key is checked as a value of its parent
            yield from _walk(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v, key)
        if all(isinstance(v, str) for v in value):
            yield key, value  # a command line: `--token VALUE` as two words
    else:
        yield key, value


def secret_problem(raw: Any) -> tuple[str, str] | None:
    """Returns (dotted key, message) for the first secret in a raw config mapping, or None.

    The message names the key, the kind and a mask (length, last 4 characters at most), never the value.
    """
    for key, value in _walk(raw, ""):
        if key in _OWN_CHECK:
            continue
        found = None
        if isinstance(value, list):
            hit = secrets.find_in_args(value)
            found = hit[1:] if hit else None
        elif isinstance(value, str):
            found = secrets.find_secret(value, free_text=_free(key))
        if found:
            kind, secret = found
            shown = key or "(top level)"
            verb = "holds" if kind.startswith("credentials") else "holds what looks like"
            fix = FIX + _KEY_FIX.get(key.split(".", 1)[0], "")
            return key, f"'{shown}' {verb} {kind}, {secrets.mask(secret)} (not echoed); {fix}"
    return None
