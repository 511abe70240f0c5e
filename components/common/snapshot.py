"""Data snapshots: the exact data files a run reads, and reading exactly those.

A snapshot is what `snapshot-data` resolves the configured data sources (files, folders /
prefixes, globs; local or gs://) to at the start of a run. It is plain JSON:

    {"version": 1,
     "train": [entry, ...], "eval": [entry, ...],
     "fingerprint": "<16 hex>"}

with one entry per JSONL file:

    gs://   {"uri", "size", "generation", "crc32c", "assets": {"count", "digest"}}
    local   {"uri", "size", "sha256", "assets": {"count", "digest"}}

`assets` summarises every other file under the JSONL file's folder (the images that rows
reference by relative path): their names and generations (gs://) or sizes and
modification times (local). So replacing an image under the dataset folder changes the
snapshot, cheaply, without reading any image. Images referenced by absolute gs:// URIs
outside the folder, or by http(s) URLs, are not tracked: give a changed image a new name.

The snapshot has no time stamp or run id in it: identical data gives byte-identical JSON,
so a task that takes it as a parameter is a cache hit exactly when the data is the same.
`read_entry` returns a file's bytes only when they are still those of the snapshot.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VERSION = 1
SPLITS = ("train", "eval")
LINEAGE_FILE = "data_snapshot.json"  # in the train dataset, the adapter and the merged model


class SnapshotError(ValueError):
    """The sources cannot be resolved, or a file changed since the snapshot; the message says which and how to fix."""


def canonical(data: Any) -> str:
    """Returns the canonical JSON text of a value (sorted keys, no spaces): equal data, equal text."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def fingerprint_of(train: list[dict[str, Any]], eval_: list[dict[str, Any]]) -> str:
    """Returns the 16-hex fingerprint of a snapshot's entries (train and eval lists)."""
    return hashlib.sha256(canonical({"train": train, "eval": eval_}).encode()).hexdigest()[:16]


def make(train: list[dict[str, Any]], eval_: list[dict[str, Any]]) -> dict[str, Any]:
    """Returns a snapshot dict (with its fingerprint) for train and eval entries."""
    return {"version": VERSION, "train": train, "eval": eval_, "fingerprint": fingerprint_of(train, eval_)}


def parse(text: str, where: str = "snapshot") -> dict[str, Any]:
    """Parses and checks a snapshot's JSON text.

    Args:
        text: The JSON (what snapshot-data outputs).
        where: Name used in error messages.

    Returns:
        The snapshot dict.

    Raises:
        SnapshotError: Not JSON, wrong version, missing fields, or a fingerprint that does
            not match the entries (a hand-edited snapshot).
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SnapshotError(f"{where}: not valid JSON ({exc}); pass the `snapshot` output of snapshot-data") from None
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise SnapshotError(f"{where}: expected a version-{VERSION} snapshot object")
    for split in SPLITS:
        entries = data.get(split)
        if not isinstance(entries, list) or not all(isinstance(e, dict) and e.get("uri") for e in entries):
            raise SnapshotError(f"{where}: '{split}' must be a list of entries with a 'uri'")
    if not data["train"]:
        raise SnapshotError(f"{where}: no training files")
    if data.get("fingerprint") != fingerprint_of(data["train"], data["eval"]):
        raise SnapshotError(
            f"{where}: fingerprint does not match its entries; it was edited after snapshot-data wrote it"
        )
    return data


def crc32c_b64(data: bytes) -> str:
    """Returns the base64 big-endian CRC32C of bytes, as Cloud Storage reports it."""
    import google_crc32c

    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()


@dataclass(frozen=True)
class Change:
    """What differs between two snapshots (an older one, e.g. the champion's, and this run's).

    Attributes:
        added: URIs of files in the new snapshot only.
        removed: URIs of files in the old snapshot only.
        changed: URIs in both whose content (generation / hash) or assets differ.
        unchanged: Number of files identical in both.
    """

    added: list[str]
    removed: list[str]
    changed: list[str]
    unchanged: int

    @property
    def any(self) -> bool:
        """Whether anything differs."""
        return bool(self.added or self.removed or self.changed)


def _content_key(entry: dict[str, Any]) -> tuple:
    return (
        entry.get("generation"),
        entry.get("sha256"),
        entry.get("size"),
        entry.get("crc32c"),
        canonical(entry.get("assets")),
    )


def diff(old: dict[str, Any], new: dict[str, Any]) -> Change:
    """Compares two snapshots file by file (train and eval together).

    Args:
        old: The earlier snapshot (the champion's).
        new: This run's snapshot.

    Returns:
        The Change.
    """
    before = {e["uri"]: _content_key(e) for s in SPLITS for e in old.get(s, [])}
    after = {e["uri"]: _content_key(e) for s in SPLITS for e in new.get(s, [])}
    common = sorted(set(before) & set(after))
    changed = [u for u in common if before[u] != after[u]]
    return Change(
        added=sorted(set(after) - set(before)),
        removed=sorted(set(before) - set(after)),
        changed=changed,
        unchanged=len(common) - len(changed),
    )


def read_entry(entry: dict[str, Any], timeout: float = 300.0) -> bytes:
    """Returns a snapshot file's bytes, only if they are still the snapshot's.

    gs:// objects are read at the snapshot's generation (`ifGenerationMatch`) and their
    CRC32C and size are checked again after the download; local files by size and sha256.

    Args:
        entry: A snapshot entry.
        timeout: Seconds the download may take.

    Returns:
        The file's bytes.

    Raises:
        SnapshotError: The file was deleted or overwritten since the snapshot (never a
            silent mix of old and new data), or cannot be read.
    """
    uri = entry["uri"]
    if uri.startswith("gs://"):
        data = _read_gs(entry, timeout)
        same = len(data) == entry.get("size") and crc32c_b64(data) == entry.get("crc32c")
    else:
        try:
            data = Path(uri).read_bytes()
        except FileNotFoundError:
            raise SnapshotError(f"{uri}: deleted since the data snapshot was taken; run the pipeline again") from None
        except OSError as exc:
            raise SnapshotError(f"{uri}: cannot be read ({exc.strerror or exc})") from None
        same = len(data) == entry.get("size") and hashlib.sha256(data).hexdigest() == entry.get("sha256")
    if not same:
        raise SnapshotError(
            f"{uri}: overwritten since the data snapshot was taken (content no longer matches the snapshot); "
            "write new data to new file names while a run may be reading, and run the pipeline again"
        )
    return data


def _read_gs(entry: dict[str, Any], timeout: float) -> bytes:
    from google.api_core import exceptions as gexc

    from components.common import storage

    uri = entry["uri"]
    bucket, name = storage.split_gs(uri)
    generation = int(entry["generation"])
    try:
        blob = storage.client().bucket(bucket).get_blob(name, timeout=timeout)
        if blob is None:
            raise SnapshotError(
                f"{uri}: deleted since the data snapshot was taken (generation {generation}); run the pipeline again"
            )
        if int(blob.generation) != generation:
            raise SnapshotError(
                f"{uri}: overwritten since the data snapshot was taken (generation {generation}, "
                f"now {blob.generation}); write new data to new object names and run the pipeline again"
            )
        return blob.download_as_bytes(if_generation_match=generation, timeout=timeout)
    except SnapshotError:
        raise
    except gexc.PreconditionFailed:
        raise SnapshotError(
            f"{uri}: overwritten while it was being read (generation {generation}); run the pipeline again"
        ) from None
    except gexc.NotFound:
        raise SnapshotError(f"{uri}: deleted since the data snapshot was taken; run the pipeline again") from None
    except gexc.GoogleAPIError as exc:
        raise SnapshotError(f"{uri}: cannot be read ({type(exc).__name__}: {str(exc)[:300]})") from None


def read_lineage(model_dir: str) -> dict[str, Any] | None:
    """Returns the data lineage stored with a model (adapter or merged), or None when unknown.

    The lineage is `LINEAGE_FILE`: {"snapshot", "training_key", "files": {uri: {"rows",
    "quarantined"}}, "n_train", "n_eval"}, written by validate-data and carried on by
    train-lora and merge-export.

    Args:
        model_dir: The model folder (a local or /gcs/ path; gs:// is read through the FUSE
            mount); "" = none.

    Returns:
        The lineage dict; None when `model_dir` is "" or has no lineage file (a model from
        before snapshots: its data is not known).

    Raises:
        SnapshotError: The file exists but cannot be read, is not JSON, or a field has the
            wrong shape; the message names the file and the field.
    """
    from components.common.storage import to_fuse_path

    if not model_dir:
        return None
    path = Path(to_fuse_path(model_dir)) / LINEAGE_FILE
    fix = (
        "the champion's data lineage is damaged: restore the file from the run that trained the champion, "
        "or delete it (its data then counts as unknown and the run trains)"
    )
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None  # a model from before snapshots: "not known"
    except (OSError, UnicodeDecodeError) as exc:
        raise SnapshotError(f"{path}: cannot be read ({getattr(exc, 'strerror', None) or exc}); {fix}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SnapshotError(f"{path}: not valid JSON ({exc}); {fix}") from None
    problem = lineage_problem(data)
    if problem:
        raise SnapshotError(f"{path}: {problem}; {fix}")
    return data


def lineage_problem(data: Any) -> str:
    """Returns what is wrong with the shape of a data lineage ("" when nothing): the field and what it must be.

    Checks the fields that readers use: `snapshot` (its `train` / `eval` entries and their
    `uri`, `fingerprint`), `training_key`, `n_rows` / `n_train` / `n_eval` and `files`.
    """
    if not isinstance(data, dict):
        return f"expected a JSON object {{...}}, found {_kind(data)}"
    snapshot = data.get("snapshot")
    if not isinstance(snapshot, dict):
        return f"field 'snapshot' must be an object (the data snapshot), found {_kind(snapshot)}"
    for split in SPLITS:
        entries = snapshot.get(split, [])
        if not isinstance(entries, list):
            return f"field 'snapshot.{split}' must be a list of file entries, found {_kind(entries)}"
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                return f"field 'snapshot.{split}[{i}]' must be an object, found {_kind(entry)}"
            if not isinstance(entry.get("uri"), str) or not entry["uri"]:
                return f"field 'snapshot.{split}[{i}].uri' must be a file name, found {_kind(entry.get('uri'))}"
    for name, where in (("fingerprint", snapshot), ("training_key", data)):
        if name in where and not isinstance(where[name], str):
            prefix = "snapshot." if where is snapshot else ""
            return f"field '{prefix}{name}' must be a string, found {_kind(where[name])}"
    for name in ("n_rows", "n_train", "n_eval"):
        value = data.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return f"field '{name}' must be a whole number, found {_kind(value)}"
    files = data.get("files")
    if files is not None and not (isinstance(files, dict) and all(isinstance(v, dict) for v in files.values())):
        return f"field 'files' must be an object {{file: {{rows, quarantined}}}}, found {_kind(files)}"
    return ""


def _kind(value: Any) -> str:
    """Names a JSON value's type, with a short view of it: 'a list ([1, 2])'."""
    if value is None:
        return "null (or missing)"
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    text = json.dumps(value)
    return f"{kinds.get(type(value), type(value).__name__)} ({text if len(text) <= 60 else text[:57] + '...'})"
