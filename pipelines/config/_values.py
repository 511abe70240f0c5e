"""Rules for single values anywhere in a config: integers, numbers, and what looks like a token."""

from __future__ import annotations

import math
import re
from typing import Any

from pipelines.config._errors import ConfigError, Where

# A hub token pasted where its name belongs: Hugging Face `hf_...`, ModelScope `ms-<uuid>`.
TOKEN_RE = re.compile(r"hf_[A-Za-z0-9]{20,}|ms-[0-9a-fA-F]{8}-[0-9a-fA-F-]{20,}")


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def looks_like_token(text: str) -> bool:
    """A hub token or another long random string: mixed case and digits, no separators."""
    if TOKEN_RE.search(text):
        return True
    run = max(re.findall(r"[A-Za-z0-9]+", text), key=len, default="")
    mixed = any(c.islower() for c in run) and any(c.isupper() for c in run) and any(c.isdigit() for c in run)
    return len(run) >= 32 or (len(run) >= 16 and mixed)


def number_problem(value: Any) -> str | None:
    """What is wrong with a number anywhere in a config (non-finite, too large), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}; write a number such as 0.1"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 1 << 63:
        return "must be an integer below 2**63, got a number with more digits"
    return None


def scan_values(value: Any, key: str, where: Where) -> None:
    """Checks every number and string under `key`, lists and mappings included.

    Raises:
        ConfigError: A non-finite or oversized number, or a string that looks like a hub token.
    """
    if isinstance(value, dict):
        for k, v in value.items():
            scan_values(v, f"{key}.{k}" if key else str(k), where)
    elif isinstance(value, list):
        for v in value:
            scan_values(v, key, where)
    elif isinstance(value, str):
        if TOKEN_RE.search(value):
            raise ConfigError(
                f"{where(key)}: '{key}' holds what looks like a hub token (not echoed); never put a token in a "
                "config: put it in an environment variable or Secret Manager and name it in model.token_from "
                "(env:HF_TOKEN)"
            )
    else:
        problem = number_problem(value)
        if problem:
            raise ConfigError(f"{where(key)}: '{key}' {problem}")
