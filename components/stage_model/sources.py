"""Where a model comes from: a local folder, gs://, or a hub (hf:// / ms://) resolved to a commit.

A source is resolved to its exact file list and revision before anything is copied
(`resolve_local`, `resolve_remote`); a remote one is then downloaded into a work folder and
checked against the sizes and checksums the source reported (`download`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from components.common.model_sources import Listing, SourceSpec, fingerprint, read_token, resolve_hf, resolve_ms
from components.common.progress import tree_bytes
from components.stage_model import _gcs
from components.stage_model.entry import bad_name
from components.stage_model.errors import NO_SPACE, StageError, size_text
from components.stage_model.listing import list_files, local_revision, select_files
from components.stage_model.transfer import Prepared, parallel, prepare_local


def download(
    spec: SourceSpec, listing: Listing, files: list[str], workdir: Path, workers: int, progress: bool
) -> Prepared:
    """Fetches the files of a remote source into workdir, checks sizes and known checksums."""

    def fetch(rel: str) -> int:
        try:
            path = listing.fetch(rel, workdir)
        except OSError as exc:
            if exc.errno in NO_SPACE:
                need = sum(listing.files[r] for r in files)
                raise StageError(
                    f"no space left on device while downloading {rel} of {spec.uri} to {workdir}: "
                    f"the download needs {size_text(need)}; free that much there or set TMPDIR to a larger disk"
                ) from None
            raise
        if path != workdir / rel:
            (workdir / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, workdir / rel)
        return (workdir / rel).stat().st_size

    total = sum(listing.files[r] for r in files)
    parallel(fetch, files, workers, total, progress, f"download {spec.uri}", measure=lambda: tree_bytes(workdir))
    for rel in files:
        size = (workdir / rel).stat().st_size
        if listing.files[rel] and size != listing.files[rel]:
            raise StageError(
                f"model source {spec.uri}: {rel} downloaded {size} bytes, expected {listing.files[rel]}; stage again"
            )
    prepared = prepare_local(workdir, files, workers, progress)
    for rel, known in listing.expected.items():
        for kind, value in known.items():
            if rel in prepared.infos and prepared.infos[rel][kind] != value:
                raise StageError(f"model source {spec.uri}: {rel} {kind} differs from the source's; stage again")
    return prepared


@dataclass
class Resolved:
    """A source resolved to exact files and the revision that names its cache entry."""

    uri: str
    files: list[str]
    revision: str  # the entry's name: commit hash or content fingerprint (+ selection suffix)
    listing: Listing | None = None  # remote sources: where to download the files from
    prepared: Prepared | None = None  # local sources: hashed in place, nothing to download

    @property
    def source_revision(self) -> str:
        """The revision the manifest records (the source's own, without a selection suffix)."""
        return self.listing.revision if self.listing else self.revision


def resolve_local(
    spec: SourceSpec, allow: list[str] | None, ignore: list[str] | None, workers: int, progress: bool = False
) -> Resolved:
    """Lists, checks and hashes a local model folder; its revision is the content fingerprint."""
    src = Path(spec.uri).expanduser()
    if not src.is_dir():
        raise StageError(f"model source {spec.uri!r}: folder not found; pass an existing model folder")
    src = src.resolve()
    files = list_files(src, allow, ignore)
    if not files:
        raise StageError(f"model source {src}: no files to stage (after allow/ignore patterns)")
    prepared = prepare_local(src, files, workers, progress)
    hashes = {rel: info["sha256"] for rel, info in prepared.infos.items()}
    return Resolved(str(src), files, local_revision(src, files, hashes), prepared=prepared)


def resolve_remote(
    spec: SourceSpec, allow: list[str] | None, ignore: list[str] | None, token_from: str | None
) -> Resolved:
    """Resolves a gs://, hf:// or ms:// source to its file listing and exact revision (nothing downloaded)."""
    if spec.scheme == "gs":
        try:
            objects = _gcs.list_source(spec.uri)
        except FileNotFoundError as exc:
            raise StageError(f"model source {spec.uri}: {exc}; check the bucket name") from None
        if not objects:
            raise StageError(f"model source {spec.uri}: no objects under this prefix; check the path")
        names = select_files(list(objects), allow, ignore)
        listing = Listing(
            fingerprint({n: objects[n][1] for n in names}),
            {n: objects[n][0] for n in names},
            lambda rel, workdir: _gs_fetch(spec.uri, rel, workdir),
            {n: {"crc32c": objects[n][1]} for n in names},
        )
    else:
        token = read_token(token_from, "HF_TOKEN" if spec.scheme == "hf" else "MODELSCOPE_API_TOKEN")
        listing = resolve_hf(spec, token) if spec.scheme == "hf" else resolve_ms(spec, token)
    files = select_files(list(listing.files), allow, ignore)
    if not files:
        raise StageError(f"model source {spec.uri}: no files to stage (after allow/ignore patterns)")
    for rel in files:
        if why := bad_name(rel):
            raise StageError(
                f"model source {spec.uri}: file {rel!r} is not a path inside the model folder ({why}); "
                "rename or delete it at the source, or skip it with --ignore (model.ignore)"
            )
    if "config.json" not in files:
        raise StageError(f"model source {spec.uri}: no config.json; not a Hugging Face model repo/folder")
    if not any(f.endswith(".safetensors") for f in files):
        raise StageError(
            f"model source {spec.uri}: no *.safetensors weights; use a safetensors revision or convert the model first"
        )
    revision = listing.revision
    if spec.scheme in ("hf", "ms") and (allow or ignore):  # a file selection is its own entry
        revision += "-" + fingerprint({f: "" for f in files})[len("sha256-") :][:8]
    return Resolved(spec.uri, files, revision, listing=listing)


def _gs_fetch(uri: str, rel: str, workdir: Path) -> Path:
    _gcs.download(uri, rel, workdir / rel)
    return workdir / rel
