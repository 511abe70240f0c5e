"""Row checks that keep a row from forging where it came from or sneaking in what is not checked.

* `is_clean_set`: only the rows of a clean set validate-data wrote (its completion marker
  beside the file lists these very bytes) or of a file `vlm-lora import` wrote (`is_import_output`:
  its `<file>.boxes.json` lists these very bytes) may carry the origin record `ORIGIN_KEY`; in any
  other file the key is refused (E_RESERVED_KEY), so a raw row cannot make reports name
  another file:line (`/etc/passwd:1`). A row the conversion step (`_formats`) made from another
  form gets its origin there, from the file's own name and line; a raw row of another form that
  carries the key is refused the same (`check_keys` on the raw row).
* `check_keys`: that, and the media keys ms-swift reads but validate-data does not check yet
  (`videos`, `audios`: E_MEDIA_KEY), refused by name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from components.common import manifest
from components.common.dataset import DATA_FILE
from components.common.files import sha256_file
from components.common.provenance import ORIGIN_KEY
from components.validate_data import _sources
from components.validate_data._sources import Reject

IMPORT_PRODUCER = "vlm-lora import"  # `producer` of the `<rows>.boxes.json` that `vlm-lora import` writes
CONVERT_PRODUCER = "validate-data convert"  # ... and `validate-data convert`, of rows whose origins it kept
SEAL_PRODUCERS = (IMPORT_PRODUCER, CONVERT_PRODUCER)
SIDECAR_SUFFIX = ".boxes.json"  # as `_convert.SIDECAR_SUFFIX` (not imported: the import CLI stays light)
UNSUPPORTED_MEDIA = ("videos", "audios")  # ms-swift reads them; refused by name until validate-data checks them


def check_keys(row: dict[str, Any], origin_ok: bool) -> None:
    """Refuses a forged origin record (a row of a file that is not a clean set) and media keys not checked yet."""
    if ORIGIN_KEY in row and not origin_ok:
        raise Reject(
            "E_RESERVED_KEY", f"key {ORIGIN_KEY!r} is reserved: validate-data writes it into the rows of a clean "
            "set it made, to name the user's file:line; this file is not such a set (no validate-data completion "
            "marker beside it lists these bytes: made elsewhere, or edited since): remove the key from the row",
        )  # fmt: skip
    for key in UNSUPPORTED_MEDIA:
        if key in row:
            raise Reject(
                "E_MEDIA_KEY", f"field {key!r}: ms-swift would read it, but validate-data does not check {key} "
                "(files, sizes, tokens) and evaluate does not score them yet: remove the key, or describe the "
                "content with images",
            )  # fmt: skip


def origin_trusted(name: str, local: Path) -> bool:
    """Whether a data file's rows may carry an origin record: a clean set validate-data wrote (`is_clean_set`)
    or rows `vlm-lora import` wrote (`is_import_output`), either with these very bytes."""
    return is_clean_set(name, local) or is_import_output(name, local)


def _read_text(uri: str) -> str:
    if uri.startswith("gs://"):
        return _sources.read_gs(uri, timeout=60).decode("utf-8")
    return Path(uri).read_text(encoding="utf-8")


def import_seal(rows: Path, producer: str = IMPORT_PRODUCER) -> dict[str, Any]:
    """Returns what `vlm-lora import` (or `validate-data convert` of trusted rows) writes into `<rows>.boxes.json`
    so validate-data keeps the rows' origins: the producer and the rows file's size and sha256 (an edit since,
    or another file, has other bytes)."""
    return {"producer": producer, "rows": {"size": rows.stat().st_size, "sha256": sha256_file(rows)}}


def is_import_output(name: str, local: Path) -> bool:
    """Whether a data file is rows `vlm-lora import` wrote (or `validate-data convert` made of such rows or of a
    clean set): its `<name>.boxes.json` (a SEAL_PRODUCERS producer) lists it with these very bytes (size and
    sha256). Such rows carry their source record in `ORIGIN_KEY`."""
    try:
        body = json.loads(_read_text(name + SIDECAR_SUFFIX))
        entry = body["rows"]
        ok = body.get("producer") in SEAL_PRODUCERS and entry["size"] == local.stat().st_size
        return bool(ok and entry["sha256"] == sha256_file(local))
    except (Reject, OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def is_clean_set(name: str, local: Path) -> bool:
    """Whether a data file is a clean set's `data.jsonl`: validate-data's completion marker beside it lists it
    with these very bytes (size and sha256). Only such rows may carry an origin record (`ORIGIN_KEY`)."""
    if name.rsplit("/", 1)[-1] != DATA_FILE:
        return False
    marker_uri = name.rsplit("/", 1)[0] + "/" + manifest.MANIFEST_FILE if "/" in name else manifest.MANIFEST_FILE
    try:
        body = json.loads(_read_text(marker_uri))
        entry = body["files"][DATA_FILE]
        ok = body.get("producer") == "validate-data" and entry["size"] == local.stat().st_size
        return bool(ok and entry["sha256"] == sha256_file(local))
    except (Reject, OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
