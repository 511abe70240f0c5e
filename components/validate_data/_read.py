"""Reading input files: each line through the conversion step (`_formats`) and the text checks.

A line's text checks: its length (MAX_LINE_BYTES), UTF-8, JSON (a key twice is E_DUPLICATE_KEY,
never last-wins), the row's shape (`_schema`) and keys (`_rows.check_keys`), and that its image
references resolve (`_sources.resolve`). A line that passes waits for its images (`PendingRow`);
one that fails is quarantined (`RejectedLine`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from components.common import snapshot as snap
from components.common.provenance import strip_origin
from components.validate_data import _formats, _rows, _schema, _sources
from components.validate_data._sources import Reject
from components.validate_data.types import (
    MAX_LINE_BYTES,
    DataError,
    PendingRow,
    ReadFile,
    RejectedLine,
    issue_of,
)


def read_lines(path: Path):
    """Yields (line number, raw bytes, length) of a JSONL file, tolerating a BOM and CRLF.

    A line longer than MAX_LINE_BYTES is not held in memory: its first 64 KiB are yielded
    with its full length, and the rest is skipped.
    """
    limit = MAX_LINE_BYTES
    with open(path, "rb") as f:
        number = 0
        while True:
            raw = f.readline(limit + 2)
            if not raw:
                return
            number += 1
            length = len(raw)
            if length == limit + 2 and not raw.endswith(b"\n"):
                head, tail = raw, raw
                while True:
                    more = f.readline(1 << 20)
                    length += len(more)
                    if len(head) < 65536:
                        head += more[: 65536 - len(head)]
                    tail = (tail + more)[-2:]
                    if not more or more.endswith(b"\n"):
                        break
                length -= 2 if tail == b"\r\n" else 1 if tail.endswith(b"\n") else 0
                yield number, head[:65536].rstrip(b"\r\n"), length
                continue
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            raw = raw.rstrip(b"\r\n")
            yield number, raw, len(raw)


def _open_input(name: str, staging: Path, index: int, entry: dict[str, Any] | None = None) -> tuple[Path, str]:
    """Returns (local JSONL path, folder that relative image paths resolve against).

    With a snapshot `entry`, the file's bytes are read only if they are still the
    snapshot's (gs:// generation and CRC32C, local sha256), and parsed from a staging copy.
    """
    if entry is not None:
        local = staging / f"_input_{index}.jsonl"
        try:
            local.write_bytes(snap.read_entry(entry))
        except snap.SnapshotError as exc:
            raise DataError(str(exc)) from None
        return local, name.rsplit("/", 1)[0]
    if name.startswith("gs://"):
        local = staging / f"_input_{index}.jsonl"
        try:
            local.write_bytes(_sources.read_gs(name, timeout=300))
        except Reject as rej:
            raise DataError(f"{name}: data file cannot be read ({rej.message})") from None
        return local, name.rsplit("/", 1)[0]
    path = Path(name)
    if not path.is_file() and not _formats.is_container(path):
        raise DataError(f"{path}: data file not found")
    return path, str(path.parent)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads' object_pairs_hook: the object as a dict; Reject when a key repeats (no silent last-wins)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise Reject("E_DUPLICATE_KEY", "")  # _load_json says which key, off the fast path
    return obj


def _load_json(text: str) -> Any:
    """Parses one line's JSON; raises Reject E_JSON, or E_DUPLICATE_KEY naming the first repeated key."""
    repeated: list[tuple[str, list[str]]] = []

    def note_repeated(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        if not repeated and len(set(keys)) != len(keys):
            repeated.append((next(k for i, k in enumerate(keys) if k in keys[:i]), keys))
        return dict(pairs)

    try:
        try:
            return json.loads(text, object_pairs_hook=_unique_keys)
        except Reject:  # parse again to name the key, or to find that the line is not JSON at all
            json.loads(text, object_pairs_hook=note_repeated)
    except json.JSONDecodeError as exc:
        raise Reject("E_JSON", f"{exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise Reject("E_JSON", "JSON nested too deeply") from None
    except ValueError as exc:  # an integer over Python's digit limit (sys.get_int_max_str_digits)
        raise Reject("E_JSON", f"a number cannot be read ({exc}); write it as a string or with fewer digits") from None
    key, keys = repeated[0]
    shown = ", ".join(map(repr, keys[:12])) + (", ..." if len(keys) > 12 else "")
    raise Reject(
        "E_DUPLICATE_KEY",
        f"key {key!r} appears {keys.count(key)} times in one object (keys {shown}); "
        "a JSON reader keeps only the last one: remove the duplicate",
    )


def _parse_line(raw: bytes, length: int, task: str, origin_ok: bool = False) -> dict[str, Any]:
    """Runs the text checks of one non-blank line; returns its row or raises Reject.

    `origin_ok`: the file is a clean set validate-data wrote or rows `vlm-lora import` wrote
    (`_rows.origin_trusted`), or the row was converted from another form by `_formats` (which refused an
    origin in the raw row and wrote its own), so the row may carry its origin record."""
    if length > MAX_LINE_BYTES:
        raise Reject("E_TOO_LONG", f"line has {length} bytes (limit {MAX_LINE_BYTES})")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Reject("E_ENCODING", f"not UTF-8 at byte {exc.start}") from None
    row = _load_json(text)
    try:  # a \\ud800-style escape decodes to a lone surrogate, which no UTF-8 writer accepts
        json.dumps(row, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise Reject(
            "E_ENCODING",
            f"a JSON string holds a lone surrogate escape (\\u{ord(exc.object[exc.start]):04x}) "
            "that cannot be encoded as UTF-8",
        ) from None
    messages = _schema.check_messages(row)
    _rows.check_keys(row, origin_ok)
    if "objects" in row:  # ms-swift's grounding form: <ref-object> / <bbox> placeholders filled from `objects`
        _schema.check_objects(row)
    elif task:
        _schema.check_answer(messages, task)
    return row


def parse_file(
    name: str, *, index: int, is_eval: bool, task: str, staging: Path, entry: dict[str, Any] | None = None,
    columns: _formats.ColumnMap | None = None,
) -> ReadFile:  # fmt: skip
    """Reads one file (a snapshot `entry` when given) through the conversion step (`_formats`) and runs the text
    checks on each of its non-blank lines."""
    path, base = _open_input(name, staging, index, entry)
    origin_ok = _rows.origin_trusted(name, path)
    read = ReadFile(name, n_read=0, n_blank=0, pending=[], rejected=[])
    conversion = _formats.Conversion(name, path, staging / f"_formats_{index}", columns)
    try:
        lines = list(conversion.lines(read_lines)) if _formats.is_container(path) else conversion.lines(read_lines)
    except _formats.FormatError as exc:
        raise DataError(str(exc)) from None
    for number, raw, length in lines:
        read.n_read += 1
        if not raw.strip():
            read.n_blank += 1  # blank lines are not rows
            continue
        try:
            raw = conversion.convert(number, raw)
            made = conversion.made_origin(number)  # converted from another form: the origin is the step's own
            row = _parse_line(raw, length if length > MAX_LINE_BYTES else len(raw), task, origin_ok or made)
            sources = [(ref, _sources.resolve(ref, base)) for ref in row.get("images", [])]  # E_IMAGE_PATH
        except (Reject, _formats.ConvertReject) as rej:
            row = _json_or_none(raw)
            if not (origin_ok or conversion.made_origin(number)) and isinstance(row, dict):  # a forged origin never
                # names the line in the quarantine
                row = strip_origin(row)
            issue = issue_of(name, number, rej, raw, row)
            read.rejected.append(RejectedLine(issue, _local_images(row, base)))
            continue
        read.pending.append(PendingRow(name, number, raw, row, sources, is_eval))
    read.forms = dict(conversion.counts)
    if read.n_read == read.n_blank:
        raise DataError(f"{name}: file is empty (no JSONL rows)")
    return read


def _json_or_none(raw: bytes) -> Any:
    """Returns a line's JSON value, or None when it does not parse (a rejected line, read again for its report)."""
    try:
        return json.loads(raw[:MAX_LINE_BYTES].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


def _local_images(row: Any, base: str) -> list[Path]:
    """Returns the local image files a text-rejected row names (for the report's thumbnails; nothing is fetched)."""
    refs = row.get("images") if isinstance(row, dict) else None
    if isinstance(refs, str):
        refs = [refs]
    found = []
    for ref in refs if isinstance(refs, list) else []:
        try:
            src = _sources.resolve(ref, base) if isinstance(ref, str) else None
        except Reject:
            continue
        if src is not None and src.kind == "file" and Path(src.location).is_file():
            found.append(Path(src.location))
    return found
