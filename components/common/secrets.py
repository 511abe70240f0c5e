"""One secret detector for every value a config, a parameter or a message may hold.

A secret never belongs in a config: the config becomes pipeline parameters, the compiled
pipeline YAML and, for the serving container, a Model Registry entry, all readable in clear.
A real secret is passed as a reference resolved inside the job at run time (`env:VAR` or a
Secret Manager name `projects/P/secrets/S[/versions/V]`: `model_sources.read_token`).

`find_secret` says whether a string holds one, and of which kind:

* a known key prefix: Hugging Face `hf_`, ModelScope `ms-<uuid>`, GitHub `ghp_` / `gho_` /
  `ghu_` / `ghs_` / `ghr_` / `github_pat_`, OpenAI-style `sk-`, Slack `xox?-`, Google API
  `AIza`, GitLab `glpat-`, AWS access keys `AKIA` / `ASIA`, a Google OAuth token `ya29.`,
  Databricks `dapi`, a PEM private key;
* credentials in a URL's user info (`https://user:pass@host`);
* a URL query parameter named like a credential (`token`, `key`, `sig`, `signature`,
  `password`, `secret`, `access_token`, `X-Amz-Credential`, ...) with a value;
* a command-line flag named like a credential with a value (`--api-key=...`, `--token X`);
* in fields meant for free text only (`free_text=True`), a high-entropy run of 20+ characters
  (an AWS secret key, a base64 key): names, paths and hashes elsewhere would be false alarms.

`mask` shows at most the last four characters of a value; messages name the key, the kind
and the mask, never the value.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from urllib.parse import parse_qsl, urlsplit

# (kind, pattern): checked in this order; the first match names the kind.
_PREFIXES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a hub token (Hugging Face hf_...)", re.compile(r"hf_[A-Za-z0-9]{20,}")),
    ("a hub token (ModelScope ms-...)", re.compile(r"ms-[0-9a-fA-F]{8}-[0-9a-fA-F-]{20,}")),
    ("a GitHub token (github_pat_...)", re.compile(r"github_pat_[A-Za-z0-9_]{20,}")),
    ("a GitHub token (gh?_...)", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}")),
    ("an API key (sk-...)", re.compile(r"\bsk-[A-Za-z0-9_-]{16,}")),
    ("a Slack token (xox?-...)", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("a Google API key (AIza...)", re.compile(r"AIza[0-9A-Za-z_-]{30,}")),
    ("a GitLab token (glpat-...)", re.compile(r"glpat-[A-Za-z0-9_-]{20,}")),
    ("an AWS access key (AKIA/ASIA...)", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("a Google OAuth token (ya29....)", re.compile(r"\bya29\.[A-Za-z0-9_-]{20,}")),
    ("a Databricks token (dapi...)", re.compile(r"\bdapi[0-9a-f]{32}")),
    ("a private key (-----BEGIN ...)", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY")),
)

# A query parameter, flag or mapping key named like a credential: the words, split on - _ . and case.
_SECRET_WORDS = frozenset(
    {
        "token",
        "accesstoken",
        "apikey",
        "key",
        "sig",
        "signature",
        "password",
        "passwd",
        "pwd",
        "secret",
        "credential",
        "credentials",
        "auth",
        "authorization",
        "sas",
    }
)
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]+")
_FLAG = re.compile(r"^--?([A-Za-z][A-Za-z0-9_.-]*)(?:=(.*))?$", re.DOTALL)
_RUN = re.compile(r"[A-Za-z0-9+/=_-]{20,}")
MIN_ENTROPY_BITS = 4.0  # per character; English words score ~3, random base64 of 20+ characters ~4.3+


def secret_name(name: str) -> bool:
    """Whether a key, flag or parameter name reads like a credential (`api_key`, `X-Amz-Signature`, `token`)."""
    words = [w.lower() for w in re.split(r"[-_.\s]+|(?<=[a-z])(?=[A-Z])", name) if w]
    joined = "".join(words)
    return any(w in _SECRET_WORDS for w in words) or joined in _SECRET_WORDS or joined.endswith(("token", "apikey"))


def _entropy(text: str) -> float:
    counts = {c: text.count(c) for c in set(text)}
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


def _high_entropy(text: str) -> str | None:
    """A run of 20+ key characters with upper and lower case letters and digits and high entropy; a path is none."""
    for run in _RUN.findall(text):
        if run.startswith("/"):  # a path (/usr/..., ./x, ~/x, gs://b/x): its parts are names
            continue
        classes = sum(any(f(c) for c in run) for f in (str.islower, str.isupper, str.isdigit))
        if classes == 3 and _entropy(run) >= MIN_ENTROPY_BITS:
            return run
    return None


def _in_url(text: str) -> tuple[str, str] | None:
    for match in _URL.finditer(text):
        try:
            parts = urlsplit(match.group(0))
            password = parts.password
        except ValueError:  # a malformed port or bracket: not a URL we can read, checked as text
            continue
        if password:
            return "credentials in a URL (user:password@host)", password
        for name, value in parse_qsl(parts.query, keep_blank_values=False):
            if secret_name(name):
                return f"credentials in a URL query parameter ({name}=...)", value
    return None


def find_secret(text: str, free_text: bool = False) -> tuple[str, str] | None:
    """Returns (kind, the secret part) when `text` holds a secret, else None.

    Args:
        text: Any string.
        free_text: Also flag a high-entropy run of 20+ characters (fields meant for words:
            display names, experiments, arguments). Default False.

    Returns:
        The kind in words ("a GitHub token (gh?_...)") and the matched secret, or None.
    """
    for kind, pattern in _PREFIXES:
        match = pattern.search(text)
        if match:
            return kind, match.group(0)
    found = _in_url(text)
    if found:
        return found
    flag = _FLAG.match(text.strip())
    if flag and flag.group(2) and secret_name(flag.group(1)):
        dashes = "-" * (2 if text.strip().startswith("--") else 1)
        return f"credentials in a flag ({dashes}{flag.group(1)}=...)", flag.group(2)
    if free_text:
        run = _high_entropy(text)
        if run:
            return "a high-entropy string (an API key or password?)", run
    return None


def find_in_args(args: Sequence[str]) -> tuple[int, str, str] | None:
    """Like `find_secret` for a command line: also `--token VALUE` as two words.

    Returns:
        (index of the word holding the secret, kind, secret), or None.
    """
    for i, word in enumerate(args):
        found = find_secret(word, free_text=True)
        if found:
            return i, *found
        flag = _FLAG.match(word.strip())
        if flag and not flag.group(2) and secret_name(flag.group(1)) and i + 1 < len(args):
            value = args[i + 1]
            if value and not value.startswith("-"):
                return i + 1, f"credentials in a flag ({word.strip()} VALUE)", value
    return None


def mask(secret: str) -> str:
    """The secret as messages show it: its length and at most its last four characters."""
    tail = secret[-4:] if len(secret) >= 12 else ""
    return f"<{len(secret)} characters{', ending ' + repr(tail) if tail else ''}>"


def redact(text: str, free_text: bool = True) -> str:
    """`text` with every secret `find_secret` finds replaced by its mask (for messages that quote input)."""
    masks: set[str] = set()
    for _ in range(20):  # each pass removes one secret; a line holds a few at most
        found = find_secret(text, free_text=free_text)
        if not found or not found[1] or found[1] not in text or found[1] in masks:
            break
        masks.add(mask(found[1]))
        text = text.replace(found[1], mask(found[1]))
    return text
