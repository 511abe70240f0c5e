"""Resolve data sources (files, folders / prefixes, globs; local or gs://) to an exact snapshot.

A source is one of (several, comma-separated, in one string):

* a file: `gs://b/data/train.jsonl`, `data/train.jsonl` (taken whatever its name);
* a folder / prefix: `gs://b/drawings/` (trailing slash) or a local directory: every
  `*.jsonl` below it, at any depth;
* a glob: `gs://b/drawings/2026-*/part-*.jsonl`, `data/**/*.jsonl` (`*` and `?` stay inside
  one path segment, `**` crosses segments, `[...]` is a character class).

Under a folder or glob, only `*.jsonl` files are data; every other file (the images,
READMEs) is skipped, counted and listed in the snapshot's `skipped` summary, and covered
by the `assets` digest of the JSONL file's folder (see components.common.snapshot).

Locally a folder or glob is walked without following directory symlinks (each one skipped is
named in a note: `..` loops would list the tree again and again); symlinks to files are
followed; one that leads nowhere is a note, or an error where it would be a JSONL file; and a
file that changes while it is listed makes the listing start again (see `_local`).

For gs:// only object listings are made, no object is read: one per source (names,
generations, sizes and CRC32Cs), plus one per folder holding JSONL files (its images), each
folder listed once. Locally a JSONL file is hashed (sha256); other files under its
folder count by their content (blake2b, cached by inode, size, mtime and ctime: see
`_hashes`), so an image rewritten with the same size and mtime changes the snapshot.

Errors (`SnapshotError`) name the source and the fix: a source that matches no JSONL file,
a file or bucket that does not exist, a storage error.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.common import snapshot as snap
from components.common.files import write_json_atomic
from components.common.snapshot import SnapshotError
from components.snapshot_data import _local

DATA_SUFFIX = ".jsonl"
GLOB_CHARS = "*?["
MAX_ASSETS = 200_000  # objects under one dataset folder tracked in its assets digest
SKIPPED_EXAMPLES = 20
LIST_TRIES = 3  # listings of the sources before files that keep changing are an error
LIST_RETRY_S = 1.0  # seconds between them


@dataclass
class Resolution:
    """A snapshot and how it was found.

    Attributes:
        snapshot: The snapshot dict (components.common.snapshot).
        skipped: Number of non-JSONL files under folders / globs (not data).
        skipped_examples: The first few of them.
        notes: Warnings for the log (assets not tracked, duplicates across sources).
    """

    snapshot: dict[str, Any]
    skipped: int = 0
    skipped_examples: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def split_sources(text: str) -> list[str]:
    """Returns the non-empty, stripped comma-separated sources of a string."""
    return [s.strip() for s in (text or "").split(",") if s.strip()]


def glob_regex(pattern: str) -> re.Pattern:
    """Returns the regex of a glob: `*`/`?` within a segment, `**` across segments, `[...]` classes."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = pattern.find("]", i + 2)
            if end < 0:
                out.append(re.escape(c))
                i += 1
            else:
                body = pattern[i + 1 : end]
                out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
                i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out) + r"\Z")


def _is_glob(source: str) -> bool:
    return any(ch in source for ch in GLOB_CHARS)


# ---------------------------------------------------------------- Cloud Storage


def _gs_list(bucket: str, prefix: str) -> list[Any]:
    from google.api_core import exceptions as gexc

    from components.common import storage

    try:
        return list(storage.client().list_blobs(bucket, prefix=prefix))
    except gexc.NotFound:
        raise SnapshotError(f"gs://{bucket}: bucket not found; check the data source's bucket name") from None
    except gexc.Forbidden as exc:
        raise SnapshotError(
            f"gs://{bucket}/{prefix}: listing forbidden ({str(exc)[:200]}); grant the pipeline's "
            "service account roles/storage.objectViewer on the bucket"
        ) from None
    except gexc.GoogleAPIError as exc:
        raise SnapshotError(f"gs://{bucket}/{prefix}: cannot list ({type(exc).__name__}: {str(exc)[:300]})") from None


def _gs_matches(source: str) -> tuple[list[Any], str]:
    """Returns (blobs the source covers, kind) for one gs:// source; kind is file, prefix or glob."""
    from components.common import storage

    try:
        bucket, path = storage.split_gs(source)
    except ValueError as exc:
        raise SnapshotError(f"data source {source!r}: {exc}; write gs://BUCKET/PATH") from None
    if _is_glob(path):
        first = min(path.index(c) for c in GLOB_CHARS if c in path)
        regex = glob_regex(path)
        return [b for b in _gs_list(bucket, path[:first]) if regex.match(b.name)], "glob"
    if source.endswith("/") or not path:
        prefix = f"{path}/" if path else ""
        return _gs_list(bucket, prefix), "prefix"
    listing = _gs_list(bucket, path)
    exact = [b for b in listing if b.name == path]
    if exact:
        return exact, "file"
    under = [b for b in listing if b.name.startswith(path + "/")]
    if under:  # a folder named without its trailing slash
        return under, "prefix"
    raise SnapshotError(
        f"data source {source}: no such object or prefix; check the path "
        "(a folder needs objects under it; a glob needs * ? or [...])"
    )


def _gs_assets(bucket: str, folder: str, cache: dict[str, dict[str, Any]], notes: list[str]) -> dict[str, Any]:
    """Returns {count, digest} of the non-JSONL objects under gs://bucket/folder/ (one listing, cached)."""
    key = f"gs://{bucket}/{folder}"
    if key not in cache:
        prefix = f"{folder}/" if folder else ""
        blobs = [b for b in _gs_list(bucket, prefix) if not b.name.endswith(DATA_SUFFIX) and not b.name.endswith("/")]
        if len(blobs) > MAX_ASSETS:
            notes.append(
                f"{key}/: {len(blobs)} objects, more than {MAX_ASSETS}: images there are not part of the "
                "snapshot; give changed images new names"
            )
            cache[key] = {"count": len(blobs), "digest": "not-tracked"}
        else:
            lines = sorted(f"{b.name[len(prefix) :]}\0{b.generation}" for b in blobs)
            cache[key] = {"count": len(lines), "digest": hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]}
    return cache[key]


def _gs_entry(blob: Any, assets: dict[str, Any]) -> dict[str, Any]:
    return {
        "uri": f"gs://{blob.bucket.name}/{blob.name}",
        "size": int(blob.size or 0),
        "generation": str(blob.generation),
        "crc32c": blob.crc32c or "",
        "assets": assets,
    }


# ---------------------------------------------------------------- local files


def _local_matches(source: str, notes: list[str]) -> tuple[list[Path], str]:
    """Returns (files the source covers, kind) for one local source; see `_local` for symlinks.

    Raises:
        SnapshotError: No such file or folder; a symlink that leads nowhere named as a
            source or covered by it as a JSONL file.
        _local.Changed: A folder disappeared while it was listed.
    """
    expanded = os.path.expanduser(source)
    path = Path(expanded)
    if _is_glob(expanded):
        base, rel = _local.glob_base(expanded)
        if not base.is_dir():
            return [], "glob"
        regex = glob_regex(rel)
        depth = None if "**" in rel else rel.count("/")
        hidden = any(part.startswith(".") for part in rel.split("/"))
        listing = _local.walk(base, depth, hidden)
        matched = [p for p in listing.files if regex.match(p.relative_to(base).as_posix())]
        broken = [(p, why) for p, why in listing.broken if regex.match(p.relative_to(base).as_posix())]
        kind = "glob"
    elif path.is_dir():
        listing = _local.walk(path)
        matched, broken, kind = listing.files, listing.broken, "prefix"
    elif path.is_file():
        return [path.resolve()], "file"
    elif path.is_symlink():
        try:
            os.stat(path)
            problem = "not a file or folder"
        except OSError as exc:
            problem = _local._link_problem(path, exc)
        raise _local.broken_error(path, problem)
    else:
        raise SnapshotError(
            f"data source {source}: no such file or folder; check the path (relative paths are "
            f"resolved against {os.getcwd()})"
        )
    for link, why in broken:
        if link.name.endswith(DATA_SUFFIX):
            raise _local.broken_error(link, why)
        notes.append(f"{link}: {why}; skipped")
    notes.extend(_local.dir_link_notes(listing.dir_links))
    notes.extend(_local.output_notes(listing.outputs))
    return sorted({p.resolve() for p in matched}), kind


def _local_assets(folder: Path, cache: dict[str, dict[str, Any]], notes: list[str]) -> dict[str, Any]:
    key = str(folder)
    if key not in cache:
        cache[key] = _local.assets(folder, MAX_ASSETS, notes)
    return cache[key]


# ---------------------------------------------------------------- resolution


@dataclass
class _State:
    assets: dict[str, dict[str, Any]] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    skipped: int = 0  # non-JSONL files seen under folders / globs (the images): counted, a few kept as examples
    skipped_examples: list[str] = field(default_factory=list)

    def skip(self, name: str) -> None:
        self.skipped += 1
        if len(self.skipped_examples) < SKIPPED_EXAMPLES:
            self.skipped_examples.append(name)

    notes: list[str] = field(default_factory=list)


def _resolve_one(source: str, state: _State) -> list[dict[str, Any]]:
    """Returns the entries of one source, in name order; skipped files go to `state`."""
    entries: list[dict[str, Any]] = []
    skipped_before, first_skipped = state.skipped, None
    if source.startswith("gs://"):
        blobs, kind = _gs_matches(source)
        blobs = [b for b in blobs if not b.name.endswith("/")]
        for blob in sorted(blobs, key=lambda b: b.name):
            uri = f"gs://{blob.bucket.name}/{blob.name}"
            if kind != "file" and not blob.name.endswith(DATA_SUFFIX):
                first_skipped = first_skipped or uri
                state.skip(uri)
                continue
            if uri in state.seen:
                state.notes.append(f"{uri}: named by more than one source; read once")
                continue
            state.seen.add(uri)
            folder = blob.name.rpartition("/")[0]
            entries.append(_gs_entry(blob, _gs_assets(blob.bucket.name, folder, state.assets, state.notes)))
    else:
        files, kind = _local_matches(source, state.notes)
        for path in files:
            if kind != "file" and not path.name.endswith(DATA_SUFFIX):
                first_skipped = first_skipped or str(path)
                state.skip(str(path))
                continue
            if str(path) in state.seen:
                state.notes.append(f"{path}: named by more than one source; read once")
                continue
            state.seen.add(str(path))
            entries.append(_local.entry(path, _local_assets(path.parent, state.assets, state.notes)))
    if not entries:
        n_skipped = state.skipped - skipped_before
        hint = f" ({n_skipped} other files there, e.g. {first_skipped})" if n_skipped else ""
        raise SnapshotError(
            f"data source {source}: matches no {DATA_SUFFIX} file{hint}; check the prefix or glob, "
            "or wait until the data has arrived"
        )
    return entries


def resolve_sources(train: str, eval_: str = "") -> Resolution:
    """Resolves the train and eval sources to a snapshot.

    A local file that disappears or changes while the sources are listed makes the whole
    listing start again (up to LIST_TRIES times, LIST_RETRY_S apart).

    Args:
        train: Training data sources, comma-separated (files, folders / prefixes, globs).
        eval_: Held-out data sources, the same way. Default "" (validate-data splits train).

    Returns:
        The Resolution (snapshot, skipped files, notes).

    Raises:
        SnapshotError: No training source; a source that matches no JSONL file or does not
            exist; a symlink that leads nowhere where data should be; files that kept
            changing while they were listed; a file named both as train and eval data; a
            storage error.
    """
    train_sources, eval_sources = split_sources(train), split_sources(eval_)
    if not train_sources:
        raise SnapshotError("data.train is empty: name at least one JSONL file, folder / prefix or glob")
    for attempt in range(1, LIST_TRIES + 1):
        try:
            return _resolve_all(train_sources, eval_sources)
        except _local.Changed as exc:
            if attempt == LIST_TRIES:
                raise SnapshotError(
                    f"{exc} ({LIST_TRIES} listings in a row saw files change); retry once the data stops "
                    "changing, and write new files under a temporary name and rename them into place"
                ) from None
            time.sleep(LIST_RETRY_S)
    raise AssertionError("unreachable")


def _resolve_all(train_sources: list[str], eval_sources: list[str]) -> Resolution:
    """One listing of all sources (see `resolve_sources`); raises _local.Changed when a file changed meanwhile."""
    state = _State()
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "eval": []}
    for split, sources in (("train", train_sources), ("eval", eval_sources)):
        state.seen = set()  # duplicates within a split are read once; across splits they are an error
        for source in sources:
            splits[split].extend(_resolve_one(source, state))
    both = {e["uri"] for e in splits["train"]} & {e["uri"] for e in splits["eval"]}
    if both:
        raise SnapshotError(
            f"{sorted(both)[0]}: is both training and held-out data; held-out rows must not be "
            "trained on: fix data.train / data.eval"
        )
    return Resolution(
        snapshot=snap.make(splits["train"], splits["eval"]),
        skipped=state.skipped,
        skipped_examples=state.skipped_examples,
        notes=list(dict.fromkeys(state.notes)),  # a broken link is met by the listing and by its folder's assets
    )


def summary(resolution: Resolution, previous: dict[str, Any] | None = None) -> str:
    """Returns the log lines that say what the snapshot holds and what changed since `previous`."""
    s = resolution.snapshot
    size = sum(e["size"] for split in snap.SPLITS for e in s[split])
    lines = [
        f"data snapshot {s['fingerprint']}: {len(s['train'])} train file(s), {len(s['eval'])} eval file(s), "
        f"{size} bytes"
    ]
    if resolution.skipped:
        lines.append(
            f"skipped {resolution.skipped} non-JSONL file(s) under the sources (not data), e.g. "
            + ", ".join(resolution.skipped_examples[:3])
        )
    lines += resolution.notes
    if previous is not None:
        change = snap.diff(previous, s)
        if not change.any:
            lines.append(f"no new data since snapshot {previous.get('fingerprint')} (the champion's)")
        else:
            lines.append(
                f"since snapshot {previous.get('fingerprint')} (the champion's): {len(change.added)} file(s) "
                f"added, {len(change.removed)} removed, {len(change.changed)} changed"
            )
    return "\n".join(lines)


# ---------------------------------------------------------------- the task


def training_key(snapshot: dict[str, Any], training: dict[str, Any]) -> str:
    """Returns the 16-hex key of what a training run learns from: the data snapshot and the training settings.

    Args:
        snapshot: This run's snapshot.
        training: Everything else that makes the model: base model source and revision,
            the swift arguments, the split and validation settings.
    """
    return hashlib.sha256(snap.canonical({"data": snapshot["fingerprint"], "training": training}).encode()).hexdigest()[
        :16
    ]


_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def pin_model(source: str, revision: str = "", token_from: str = "") -> tuple[str, str, str]:
    """Pins a hub model source to the commit its revision names now (one hub API call).

    A branch or tag (or none: the default branch) moves when the repo gets a new commit;
    the pinned form makes the new commit part of stage-model's cache key, and records it.
    gs:// and local folders are returned as they are (stage-model fingerprints their content).

    Args:
        source: `hf://org/name[@rev]`, `ms://org/name[@rev]`, gs:// or a folder.
        revision: Revision that overrides none in the URI. Default "".
        token_from: Hub token source (`env:VAR` or a Secret Manager name). Default "".

    Returns:
        (source, revision, note): for hub sources `scheme://org/name@<commit>` and "".

    Raises:
        SnapshotError: The source cannot be parsed or resolved (repo or revision not found,
            gated, hub unreachable); the message never holds the token.
    """
    from components.common import model_sources as ms

    if not source.startswith(("hf://", "ms://")):
        return source, revision, ""
    try:
        spec = ms.parse_source(source, revision or None)
        if spec.revision and _COMMIT.match(spec.revision):
            return f"{spec.uri}@{spec.revision}", "", f"model {spec.uri} pinned to commit {spec.revision}"
        token = ms.read_token(token_from or None, "HF_TOKEN" if spec.scheme == "hf" else "MODELSCOPE_API_TOKEN")
        listing = ms.resolve_hf(spec, token) if spec.scheme == "hf" else ms.resolve_ms(spec, token)
    except ms.SourceError as exc:
        raise SnapshotError(str(exc)) from None
    asked = spec.revision or "the default branch"
    return f"{spec.uri}@{listing.revision}", "", f"model {spec.uri}: {asked} is commit {listing.revision} now"


def _write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """Writes the manifest whole or not at all (a temporary file unique to this process, renamed into place).

    Raises:
        SnapshotError: The path cannot be written (a folder, a read-only place, a file where
            a folder should be); the message names it.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, manifest, indent=1)
    except OSError as exc:
        raise SnapshotError(
            f"{path}: cannot write the manifest there ({exc.strerror or exc}); pass --out a writable file path"
        ) from None


@dataclass
class SnapshotResult:
    """What snapshot-data outputs.

    Attributes:
        snapshot_json: The snapshot as canonical JSON (the parameter validate-data reads).
        fingerprint: The snapshot's 16-hex fingerprint.
        training_key: Key of data + training settings (see `training_key`).
        up_to_date: True when the champion was trained on exactly this data and these
            settings: nothing to train.
        model_source: The model source to stage: a hub source pinned to its commit.
        model_revision: The revision to stage with it ("" when pinned into the source).
        regression_json: The regression set's own snapshot as canonical JSON (`regression_snapshot`),
            "" without one. Not part of the fingerprint or the training key: it changes what
            evaluate checks, not what is trained.
        summary: Log lines (files, skipped, what changed since the champion).
        metadata: Figures for the manifest artifact.
    """

    snapshot_json: str
    fingerprint: str
    training_key: str
    up_to_date: bool
    summary: str
    metadata: dict[str, Any]
    model_source: str = ""
    model_revision: str = ""
    regression_json: str = ""


def snapshot_data(
    *,
    train: str,
    eval_: str = "",
    training: dict[str, Any] | None = None,
    champion_dir: str = "",
    manifest_out: str | Path | None = None,
    token_from: str = "",
    regression: str = "",
) -> SnapshotResult:
    """Resolves the sources, compares with the champion's data, writes the manifest.

    Args:
        train: Training data sources, comma-separated.
        eval_: Held-out data sources, comma-separated. Default "".
        training: Training settings that, with the data, make the model (see `training_key`).
            Default {}.
        champion_dir: The champion's merged model folder; "" = none (nothing is up to date).
        manifest_out: Where to write the manifest JSON (snapshot + skipped files). Default:
            not written.
        token_from: Hub token source for pinning a gated hub model. Default "".
        regression: The regression set's sources (`eval.regression`), comma-separated; resolved
            to a snapshot of their own (`regression_snapshot`). Default "" (none).

    Returns:
        The SnapshotResult.

    Raises:
        SnapshotError: As `resolve_sources`, for the regression sources too, or a regression file
            that is also training or held-out data.
    """

    training = dict(training or {})
    model = (training.get("model_source", ""), training.get("model_revision", ""), "")
    if model[0]:
        model = pin_model(model[0], model[1], token_from)
        training.update(model_source=model[0], model_revision=model[1])
    resolution = resolve_sources(train, eval_)
    s = resolution.snapshot
    key = training_key(s, training)
    champion = snap.read_lineage(champion_dir)
    up_to_date = bool(champion) and champion.get("training_key") == key
    text = summary(resolution, champion["snapshot"] if champion else None)
    if model[2]:
        text += "\n" + model[2]
    if up_to_date:
        text += f"\nthe champion was trained on this data with these settings (key {key}): nothing to train"
    regression_set = regression_snapshot(regression, s) if regression.strip() else None
    if regression_set is not None:
        text += f"\nregression set: {len(regression_set['train'])} file(s), snapshot {regression_set['fingerprint']}"
    metadata = {
        "fingerprint": s["fingerprint"],
        "training_key": key,
        "train_files": len(s["train"]),
        "eval_files": len(s["eval"]),
        "bytes": sum(e["size"] for split in snap.SPLITS for e in s[split]),
        "skipped_files": resolution.skipped,
        "up_to_date": up_to_date,
        "model_source": model[0],
        "regression_files": len(regression_set["train"]) if regression_set else 0,
    }
    if manifest_out is not None:
        manifest = {
            **s,
            "training_key": key,
            "skipped": {"count": resolution.skipped, "examples": resolution.skipped_examples},
            **({"regression": regression_set} if regression_set else {}),
        }
        _write_manifest(Path(manifest_out), manifest)
    return SnapshotResult(
        snap.canonical(s), s["fingerprint"], key, up_to_date, text, metadata, model_source=model[0],
        model_revision=model[1], regression_json=snap.canonical(regression_set) if regression_set else "",
    )  # fmt: skip


def regression_snapshot(sources: str, data: dict[str, Any]) -> dict[str, Any]:
    """Resolves the regression set's sources to a snapshot of their own.

    The snapshot has the form of every snapshot (`components.common.snapshot`), its files in the
    `train` list (the one the form requires) and `eval` empty, so validate-data reads exactly
    them the same way. It stays out of the data's fingerprint and the training key: a new
    regression row changes what evaluate checks, not what is trained (no new training run).

    Args:
        sources: `eval.regression`, comma-separated (files, folders / prefixes, globs).
        data: This run's data snapshot: a regression file may not be one of its files.

    Returns:
        The regression snapshot.

    Raises:
        SnapshotError: As `resolve_sources`, or a regression file that is also training or
            held-out data (a model tuned on its rows would be checked on what it memorised).
    """
    if not split_sources(sources):
        raise SnapshotError(
            f"eval.regression {sources!r} names no source: name JSONL files, folders or globs, or leave it empty"
        )
    found = resolve_sources(sources).snapshot
    data_files = {e["uri"] for split in snap.SPLITS for e in data[split]}
    for entry in found["train"]:
        if entry["uri"] in data_files:
            raise SnapshotError(
                f"{entry['uri']}: is both regression data (eval.regression) and training or held-out data "
                "(data.train / data.eval); a regression row must be one the model was not tuned on: name it once"
            )
    return found
