"""Model sources: parse `hf://`, `ms://`, `gs://` URIs and local folders; resolve and fetch.

Each source resolves to a `Listing`: the resolved revision (a commit hash, or a content
fingerprint for gs:// and local folders), the files with their sizes, and a `fetch`
that downloads one file. Hub tokens come from an environment variable or Secret Manager
(by resource name) and are never put into messages, manifests or metadata. Every hub and
Secret Manager request retries transient failures (HTTP 408 / 429 / 5xx, resets,
timeouts) with backoff (`components.common.retry`); errors say how many attempts were made.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.common import retry

SCHEMES = ("hf", "ms", "gs")
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_SECRET = re.compile(r"^projects/[^/]+/secrets/[^/]+(/versions/[^/]+)?$")
# Secret Manager's REST API (v1). Tests point it at a local fake of the service.
SECRET_MANAGER_URL = "https://secretmanager.googleapis.com"


class SourceError(ValueError):
    """A source could not be parsed or resolved; the message names it and the fix."""


@dataclass
class SourceSpec:
    """A parsed model source.

    Attributes:
        scheme: 'hf', 'ms', 'gs' or 'local'.
        uri: The source as given, without revision (a local folder: its resolved path).
        parts: Path parts of the cache entry under `<cache>/<scheme>/`.
        revision: Requested revision, or None for the default branch.
    """

    scheme: str
    uri: str
    parts: list[str]
    revision: str | None = None


@dataclass
class Listing:
    """What a resolved source holds.

    Attributes:
        revision: Resolved revision (commit hash or content fingerprint).
        files: {relative path: size in bytes}.
        fetch: fetch(rel, workdir) downloads one file to workdir/rel and returns its path;
            None for local folders.
        expected: Checksums known before download, {rel: {"sha256"|"crc32c": value}}.
    """

    revision: str
    files: dict[str, int]
    fetch: Callable[[str, Path], Path] | None = None
    expected: dict[str, dict[str, str]] = field(default_factory=dict)


def parse_source(source: str, revision: str | None = None) -> SourceSpec:
    """Parses a model source.

    Args:
        source: `hf://org/name[@rev]`, `ms://org/name[@rev]`, `gs://bucket/prefix` or a folder.
        revision: Revision that overrides none in the URI. Default None.

    Returns:
        The SourceSpec.

    Raises:
        SourceError: Unknown scheme, malformed repo id, a revision given twice and
            different, or a revision on a source that has none.
    """
    if "://" not in source:
        if revision:
            raise SourceError(f"model source {source!r}: a local folder has no revisions; drop --revision")
        path = Path(source).expanduser()
        return SourceSpec("local", str(path), [path.resolve().name if path.exists() else path.name], None)
    scheme, rest = source.split("://", 1)
    if scheme not in SCHEMES:
        raise SourceError(
            f"model source {source!r}: unknown scheme '{scheme}://'; use hf://org/name, ms://org/name, "
            "gs://bucket/prefix or a local folder"
        )
    if scheme == "gs":
        if revision or "@" in rest:
            raise SourceError(f"model source {source!r}: gs:// sources have no revision; drop '@…'/--revision")
        bucket, _, prefix = rest.partition("/")
        parts = [p for p in [bucket, *prefix.split("/")] if p]
        if not bucket or len(parts) < 2:
            raise SourceError(f"model source {source!r}: need gs://bucket/prefix of a model folder")
        return SourceSpec("gs", "gs://" + "/".join(parts), parts, None)
    repo, _, rev = rest.partition("@")
    repo = repo.strip("/")
    if not _REPO.match(repo):
        raise SourceError(f"model source {source!r}: expected {scheme}://org/name[@revision]")
    if rev and revision and rev != revision:
        raise SourceError(f"model source {source!r}: revision '@{rev}' differs from --revision {revision!r}; give one")
    return SourceSpec(scheme, f"{scheme}://{repo}", repo.split("/"), rev or revision or None)


def read_token(token_from: str | None, default_env: str) -> str | None:
    """Reads a hub token, never from a parameter in clear text.

    Args:
        token_from: 'env:NAME' (an environment variable), a Secret Manager version
            'projects/P/secrets/S[/versions/V]' (default version 'latest'), or None
            for the environment variable `default_env` if set. Default None.
        default_env: Environment variable read when token_from is None ('HF_TOKEN', ...).

    Returns:
        The token, or None.

    Raises:
        SourceError: token_from is neither form, the variable is unset, or Secret Manager fails.
    """
    if token_from is None:
        return os.environ.get(default_env) or None
    if token_from.startswith("env:"):
        name = token_from[4:]
        value = os.environ.get(name)
        if not value:
            raise SourceError(f"token: environment variable {name} is not set; export it or drop the token option")
        return value
    if _SECRET.match(token_from):
        name = token_from if "/versions/" in token_from else token_from + "/versions/latest"
        return _access_secret(name)
    raise SourceError(
        "token: expected 'env:VARIABLE' or a Secret Manager name 'projects/P/secrets/S[/versions/V]' "
        "(never the token itself)"
    )


def _access_secret(name: str) -> str:
    """Reads a Secret Manager secret version over REST with the default credentials."""
    import google.auth
    from google.auth.transport.requests import AuthorizedSession

    def attempt():
        resp = session.get(f"{SECRET_MANAGER_URL}/v1/{name}:access", timeout=30)
        if retry.is_transient(resp.status_code):
            resp.raise_for_status()  # an HTTPError carrying the status: retried
        return resp

    tally = retry.Tally()
    try:
        creds, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
        session = AuthorizedSession(creds)
        resp = retry.call_with_retry(attempt, f"secret {name}", tally=tally)
    except Exception as exc:  # noqa: BLE001 - any auth/transport failure is one message
        raise SourceError(
            f"token: cannot read secret {name} ({exc.__class__.__name__}{tally.note()}); check credentials"
        ) from None
    if resp.status_code != 200:
        raise SourceError(
            f"token: secret {name}: HTTP {resp.status_code}; grant roles/secretmanager.secretAccessor "
            "to the pipeline's service account"
        )
    return base64.b64decode(resp.json()["payload"]["data"]).decode().strip()


# --- Hugging Face ------------------------------------------------------------------


def resolve_hf(spec: SourceSpec, token: str | None) -> Listing:
    """Resolves an hf:// source to its commit and file list (HF_ENDPOINT honoured).

    Raises:
        SourceError: repo not found, gated/no permission, revision not found, hub unreachable.
    """
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub import errors as hfe

    endpoint = os.environ.get("HF_ENDPOINT") or None
    repo = "/".join(spec.parts)
    api = HfApi(endpoint=endpoint)
    tally = retry.Tally()
    try:
        info = retry.call_with_retry(
            lambda: api.model_info(repo, revision=spec.revision, files_metadata=True, token=token or False),
            f"hub {spec.uri}@{spec.revision or 'main'}: model info",
            tally=tally,
        )
    except Exception as exc:  # noqa: BLE001 - mapped below, message never carries the token
        raise _hf_error(spec, exc, hfe, bool(token), tally=tally) from None
    files = {s.rfilename: int(s.size or 0) for s in info.siblings or []}
    expected = {s.rfilename: {"sha256": s.lfs.sha256} for s in info.siblings or [] if s.lfs and s.lfs.sha256}
    commit = info.sha

    def fetch(rel: str, workdir: Path) -> Path:
        tally = retry.Tally()
        try:
            return Path(
                retry.call_with_retry(
                    lambda: hf_hub_download(
                        repo, rel, revision=commit, local_dir=workdir, endpoint=endpoint, token=token or False
                    ),
                    f"hub {spec.uri}@{commit}: download {rel}",
                    tally=tally,
                )
            )
        except Exception as exc:  # noqa: BLE001
            raise _hf_error(spec, exc, hfe, bool(token), rel, tally) from None

    return Listing(commit, files, fetch, expected)


def _hf_error(
    spec: SourceSpec, exc: Exception, hfe, has_token: bool, rel: str = "", tally: retry.Tally | None = None
) -> SourceError:
    tries = tally.note() if tally else ""
    where = f"model source {spec.uri}" + (f"@{spec.revision}" if spec.revision else "") + (f" ({rel})" if rel else "")
    if isinstance(exc, hfe.GatedRepoError):
        if has_token:
            return SourceError(f"{where}: gated repo and the token has no access; request access on the hub")
        return SourceError(
            f"{where}: gated repo needs a token; set HF_TOKEN or pass a Secret Manager name as the token source"
        )
    if isinstance(exc, hfe.RevisionNotFoundError):
        return SourceError(f"{where}: revision {spec.revision!r} not found; use a branch, tag or commit of the repo")
    if isinstance(exc, hfe.RepositoryNotFoundError):
        return SourceError(f"{where}: repo not found (or private without a token); check the org/name")
    if isinstance(exc, hfe.HfHubHTTPError):
        code = getattr(getattr(exc, "response", None), "status_code", "?")
        if code in (401, 403):
            return SourceError(f"{where}: no permission (HTTP {code}); check the token's access to the repo")
        return SourceError(f"{where}: hub error HTTP {code}{tries}; retry later")
    return SourceError(
        f"{where}: cannot reach the hub ({exc.__class__.__name__}{tries}); check the network or HF_ENDPOINT"
    )


# --- ModelScope --------------------------------------------------------------------


def _ms_api(token: str | None):
    from modelscope.hub.api import HubApi

    return HubApi(token=token) if token else HubApi()


def resolve_ms(spec: SourceSpec, token: str | None, api_factory: Callable[[str | None], Any] = None) -> Listing:
    """Resolves an ms:// source: revision detail to a commit id, then its file list.

    Raises:
        SourceError: repo or revision not found, or the hub unreachable.
    """
    api = (api_factory or _ms_api)(token)
    model_id = "/".join(spec.parts)
    where = f"model source {spec.uri}" + (f"@{spec.revision}" if spec.revision else "")
    tally = retry.Tally()
    try:
        detail = retry.call_with_retry(
            lambda: api.get_valid_revision_detail(model_id, revision=spec.revision or "master"),
            f"ModelScope {spec.uri}@{spec.revision or 'master'}: revision",
            tally=tally,
        )
        commit = str((detail or {}).get("CommitId") or (detail or {}).get("Revision") or spec.revision or "master")
        entries = retry.call_with_retry(
            lambda: api.get_model_files(model_id, revision=commit, recursive=True),
            f"ModelScope {spec.uri}@{commit}: file list",
            tally=tally,
        )
    except Exception as exc:  # noqa: BLE001 - the ModelScope client raises many types
        text = str(exc).lower()
        if "revision" in text:
            return _raise(f"{where}: revision {spec.revision!r} not found; use a branch, tag or commit of the repo")
        if "not found" in text or "404" in text or "not exist" in text:
            return _raise(f"{where}: repo not found; check the org/name on modelscope.cn")
        if "401" in text or "403" in text or "permission" in text:
            return _raise(f"{where}: no permission; set MODELSCOPE_API_TOKEN")
        return _raise(f"{where}: ModelScope error ({exc.__class__.__name__}{tally.note()}); retry later")
    files = {e["Path"]: int(e.get("Size") or 0) for e in entries if e.get("Type", "blob") != "tree"}
    expected = {e["Path"]: {"sha256": e["Sha256"]} for e in entries if e.get("Sha256")}

    def fetch(rel: str, workdir: Path) -> Path:
        if hasattr(api, "model_file_download"):  # fakes in tests
            download = functools.partial(
                api.model_file_download, model_id, rel, revision=commit, local_dir=str(workdir)
            )
        else:
            from modelscope.hub.file_download import model_file_download

            download = functools.partial(
                model_file_download, model_id, rel, revision=commit, local_dir=str(workdir), token=token
            )
        return Path(retry.call_with_retry(download, f"ModelScope {spec.uri}@{commit}: download {rel}"))

    return Listing(commit, files, fetch, expected)


def _raise(message: str):
    raise SourceError(message)


def fingerprint(items: dict[str, str]) -> str:
    """Content fingerprint of {rel: checksum}: 'sha256-' + 16 hex digits."""
    digest = hashlib.sha256()
    for rel in sorted(items):
        digest.update(f"{rel}\0{items[rel]}\n".encode())
    return "sha256-" + digest.hexdigest()[:16]
