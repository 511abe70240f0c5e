"""The conversion step: rows in the forms users already have, read as this project's messages rows.

validate-data reads every input through `Conversion` (one call, in `_read.parse_file`), which
names the form of each row and rewrites it as an ms-swift messages row before any check:

- `messages`: this project's (and ms-swift's) own form, `{"messages": [{role, content}], "images": [...]}`;
  passed through byte for byte.
- `sharegpt`: `{"conversations": [{"from": "human"|"gpt"|"system"|..., "value": ...}], "images": [...],
  "system": ...}` (ShareGPT; LLaMA-Factory's sharegpt form with its default tags).
- `llava`: sharegpt with LLaVA's single `"image": "path"` (and its `id`).
- `query_response`: ms-swift's `{"query", "response", "history": [[q, r], ...], "system", "images"}`.
- `llamafactory`: LLaMA-Factory sharegpt under a dataset_info.json entry's `columns` / `tags` (`ColumnMap`).

A conversion never drops or invents a field: a key or turn field it has no place for, a role tag it
does not know, a non-string value, is `E_CONVERT`, named per row (the row is quarantined). A row's
`id` is kept as its origin's `record` (`components.common.provenance`).

Containers: a JSONL file is read line by line; a `.json` file holding a list (LLaMA-Factory's data
files), a `.parquet` file and a Hugging Face `save_to_disk` folder are read record by record (numbered
from 1, as lines are), image bytes (the `datasets` Image feature's `{"bytes", "path"}`) written to
files in the run's staging folder.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.common.provenance import ORIGIN_KEY, make_origin
from components.validate_data import _rows

FORMS = ("messages", "sharegpt", "llava", "query_response", "llamafactory")
CODE = "E_CONVERT"
DESCRIPTION = "row in another form (ShareGPT / LLaVA / query-response / column map) that cannot convert whole"
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "observation": "tool", "tool": "tool"}  # fmt: skip
_CONTAINERS = (".json", ".parquet")


class ConvertReject(Exception):
    """A row cannot be converted whole; `message` names the field."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = CODE
        self.message = message


class FormatError(ValueError):
    """An input container or a column map cannot be read; the message names the file and the fix."""


@dataclass(frozen=True)
class ColumnMap:
    """A LLaMA-Factory sharegpt dataset_info.json entry: which column and tag holds what.

    Attributes:
        messages: Column of the turns. Default "conversations".
        images: Column of the image list. Default "images".
        system: Column of the system prompt. Default "system".
        roles: Role tag value -> this project's role.
        role_tag: Turn key of the speaker. Default "from".
        content_tag: Turn key of the text. Default "value".
    """

    messages: str = "conversations"
    images: str = "images"
    system: str = "system"
    roles: dict[str, str] = field(default_factory=lambda: dict(SHAREGPT_ROLES))
    role_tag: str = "from"
    content_tag: str = "value"


_TAG_ROLES = {"user_tag": "user", "assistant_tag": "assistant", "system_tag": "system", "observation_tag": "tool"}


def load_column_map(spec: str) -> ColumnMap:
    """Reads a LLaMA-Factory dataset_info.json entry: `FILE` (one entry) or `FILE:NAME`.

    Raises:
        FormatError: The file is missing or not JSON, the entry is missing, its formatting is not
            sharegpt, or it maps a column this project has no place for (tools, videos, audios,
            kto_tag, ranking).
    """
    path, _, name = spec.partition(":") if not Path(spec).is_file() else (spec, "", "")
    try:
        info = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FormatError(f"{path}: not a readable dataset_info.json ({exc}); pass FILE or FILE:NAME") from None
    if not isinstance(info, dict) or not info:
        raise FormatError(f"{path}: not a dataset_info.json (an object of named entries)")
    if not name and len(info) != 1:
        raise FormatError(f"{path}: {len(info)} entries ({', '.join(sorted(info))}); pass {path}:NAME")
    entry = info.get(name or next(iter(info)))
    if not isinstance(entry, dict):
        raise FormatError(f"{path}: no entry {name!r} (entries: {', '.join(sorted(info))})")
    if entry.get("formatting", "alpaca") != "sharegpt":
        raise FormatError(
            f"{path}: entry {name or next(iter(info))!r} has formatting {entry.get('formatting', 'alpaca')!r}; "
            "only sharegpt (a list of turns) converts to messages rows"
        )
    columns, tags = entry.get("columns") or {}, entry.get("tags") or {}
    unplaced = sorted(set(columns) - {"messages", "images", "system"})
    if unplaced:
        raise FormatError(f"{path}: columns {unplaced} have no place in a messages row; remove them from the entry")
    default = ColumnMap()
    roles = {tags.get(key, default_tag): role for key, role in _TAG_ROLES.items()
             for default_tag in [{"user_tag": "human", "assistant_tag": "gpt", "system_tag": "system",
                                  "observation_tag": "observation"}[key]]}  # fmt: skip
    return ColumnMap(
        messages=columns.get("messages", default.messages), images=columns.get("images", default.images),
        system=columns.get("system", default.system), roles=roles, role_tag=tags.get("role_tag", "from"),
        content_tag=tags.get("content_tag", "value"),
    )  # fmt: skip


_SHAREGPT = ColumnMap()
_KEPT = {"id", ORIGIN_KEY}  # carried: id as the origin's record


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ConvertReject(f"{where} is {type(value).__name__}, not a string: it has no faithful text form")
    return value


def _leftover(row: dict[str, Any], consumed: set[str], form: str) -> None:
    extra = sorted(set(row) - consumed - _KEPT)
    if extra:
        raise ConvertReject(
            f"{form} row: field(s) {', '.join(map(repr, extra))} have no place in a messages row and would be "
            "dropped; remove them (or move their text into a turn)"
        )


def _images(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise ConvertReject(f"{where} is {type(value).__name__}: give a path or a list of paths")
    return value


def _from_turns(row: dict[str, Any], cmap: ColumnMap, form: str) -> dict[str, Any]:
    """Returns a sharegpt / llava / column-mapped row as a messages row; raises ConvertReject."""
    turns = row[cmap.messages]
    if not isinstance(turns, list):
        raise ConvertReject(f"field {cmap.messages!r} is {type(turns).__name__}, not a list of turns")
    messages = []
    if row.get(cmap.system) is not None:
        messages.append({"role": "system", "content": _string(row[cmap.system], f"field {cmap.system!r}")})
    for i, turn in enumerate(turns):
        where = f"{cmap.messages}[{i}]"
        if not isinstance(turn, dict):
            raise ConvertReject(f"{where} is {type(turn).__name__}, not a turn object")
        extra = sorted(set(turn) - {cmap.role_tag, cmap.content_tag})
        if extra:
            raise ConvertReject(f"{where}: field(s) {', '.join(map(repr, extra))} would be dropped; remove them")
        tag = turn.get(cmap.role_tag)
        if tag not in cmap.roles:
            raise ConvertReject(
                f"{where}.{cmap.role_tag} {tag!r} is not one of {', '.join(map(repr, cmap.roles))}; "
                "map it with a dataset_info.json entry's tags (--columns)"
            )
        messages.append({"role": cmap.roles[tag], "content": _string(turn.get(cmap.content_tag), f"{where}.value")})
    key = "image" if form == "llava" else cmap.images
    out: dict[str, Any] = {"messages": messages}
    if images := _images(row.get(key), f"field {key!r}"):
        out["images"] = images
    _leftover(row, {cmap.messages, cmap.system, key}, form)
    return out


def _from_query(row: dict[str, Any]) -> dict[str, Any]:
    """Returns an ms-swift query / response row as a messages row; raises ConvertReject."""
    if "query" not in row or "response" not in row:
        raise ConvertReject(f"query_response row without {'query' if 'query' not in row else 'response'!r}")
    messages = []
    if row.get("system") is not None:
        messages.append({"role": "system", "content": _string(row["system"], "field 'system'")})
    history = row.get("history") or []
    if not isinstance(history, list):
        raise ConvertReject(f"field 'history' is {type(history).__name__}, not a list of [query, response] pairs")
    for i, pair in enumerate(history):
        if not isinstance(pair, list) or len(pair) != 2:
            raise ConvertReject(f"history[{i}] is not a [query, response] pair")
        messages += [{"role": "user", "content": _string(pair[0], f"history[{i}][0]")},
                     {"role": "assistant", "content": _string(pair[1], f"history[{i}][1]")}]  # fmt: skip
    messages += [{"role": "user", "content": _string(row["query"], "field 'query'")},
                 {"role": "assistant", "content": _string(row["response"], "field 'response'")}]  # fmt: skip
    out: dict[str, Any] = {"messages": messages}
    if images := _images(row.get("images"), "field 'images'"):
        out["images"] = images
    _leftover(row, {"query", "response", "history", "system", "images"}, "query_response")
    return out


def convert_row(row: Any, columns: ColumnMap | None = None) -> tuple[Any, str]:
    """Returns (the row as a messages row, the form it was read in); raises ConvertReject.

    A row in no known form comes back unchanged as "messages", for the core's schema check to name.
    """
    if not isinstance(row, dict):
        return row, "messages"
    if columns is not None and columns.messages in row:
        return _from_turns(row, columns, "llamafactory"), "llamafactory"
    if "messages" in row:
        return row, "messages"
    if "conversations" in row:
        form = "llava" if "image" in row and "images" not in row else "sharegpt"
        return _from_turns(row, _SHAREGPT, form), form
    if "query" in row or "response" in row:
        return _from_query(row), "query_response"
    return row, "messages"


def is_container(path: Path) -> bool:
    """Whether `path` is read record by record: a JSON list, a parquet file or a `save_to_disk` folder."""
    return path.suffix.lower() in _CONTAINERS or (
        path.is_dir() and any((path / name).is_file() for name in ("dataset_info.json", "dataset_dict.json"))
    )


def _records(path: Path) -> list[dict[str, Any]]:
    """Returns the records of a container file or folder; raises FormatError."""
    if path.suffix.lower() == ".json" and path.is_file():
        try:
            records = json.loads(path.read_text(encoding="utf-8-sig"))
        except (OSError, ValueError) as exc:
            raise FormatError(f"{path}: not a JSON file holding a list of rows ({exc})") from None
        if not isinstance(records, list):
            raise FormatError(f"{path}: JSON file holds {type(records).__name__}, not a list of rows")
        return records
    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except (OSError, ValueError) as exc:
            raise FormatError(f"{path}: not a readable parquet file ({exc})") from None
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except (OSError, ValueError, FileNotFoundError) as exc:
        raise FormatError(f"{path}: not a Hugging Face save_to_disk folder ({exc})") from None
    if isinstance(loaded, datasets.DatasetDict):
        raise FormatError(f"{path}: holds splits {', '.join(loaded)}; pass one split's folder ({path}/SPLIT)")
    return loaded.data.table.to_pylist()  # raw values: an Image feature as {"bytes", "path"}, not decoded


def _plain(value: Any, images: Path, record: int, counter: list[int]) -> Any:
    """Returns a record's value in JSON form; an image's bytes are written to a file, named by its path."""
    if isinstance(value, dict) and set(value) == {"bytes", "path"}:
        if value["bytes"] is None:
            return value["path"]
        counter[0] += 1
        name = Path(value["path"] or "").name or f"image{counter[0]}.png"
        out = images / f"{record}_{counter[0]}_{name}"
        images.mkdir(parents=True, exist_ok=True)
        out.write_bytes(value["bytes"])
        return str(out)
    if isinstance(value, (bytes, bytearray)):
        raise ConvertReject(f"record {record} holds raw bytes outside an image column; they have no JSON form")
    if isinstance(value, dict):
        return {k: _plain(v, images, record, counter) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, images, record, counter) for v in value]
    return value


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("a key appears twice")  # left for the core's E_DUPLICATE_KEY to name
    return obj


@dataclass
class Conversion:
    """One input read through the conversion step.

    Attributes:
        path: The local input: a JSONL file or a container.
        staging: Folder for this input's extracted images.
        columns: A LLaMA-Factory column map, or None (forms recognised by their keys).
        counts: Rows read per form (FORMS), conversion failures under CODE.
    """

    name: str
    path: Path
    staging: Path
    columns: ColumnMap | None = None
    counts: Counter = field(default_factory=Counter)
    _unreadable: dict[int, str] = field(default_factory=dict)
    _made_origin: set[int] = field(default_factory=set)  # rows converted here: any origin in them is ours

    def made_origin(self, number: int) -> bool:
        """Whether row `number` was converted from another form here (its raw row carried no origin record, so
        an origin in the converted row is the one this step wrote from the file's own name and line)."""
        return number in self._made_origin

    def lines(self, read_jsonl: Callable[[Path], Iterator[tuple[int, bytes, int]]]) -> Iterator[tuple[int, bytes, int]]:
        """Yields (number, raw bytes, length) of each row: a JSONL file's lines, a container's records as JSON."""
        if not is_container(self.path):
            yield from read_jsonl(self.path)
            return
        for number, record in enumerate(_records(self.path), start=1):
            try:
                raw = json.dumps(_plain(record, self.staging, number, [0]), ensure_ascii=False).encode("utf-8")
            except ConvertReject as rej:
                self._unreadable[number] = rej.message
                raw = b"{}"
            yield number, raw, len(raw)

    def convert(self, number: int, raw: bytes) -> bytes:
        """Returns line (or record) `number` as a messages row (unchanged when it already is one, or is not JSON).

        Raises:
            ConvertReject: The row is in another form and would lose or gain a field.
            Reject: The row is in another form and carries a reserved or unsupported key (`_rows.check_keys`:
                E_RESERVED_KEY, E_MEDIA_KEY).
        """
        if number in self._unreadable:
            self.counts[CODE] += 1
            raise ConvertReject(self._unreadable[number])
        try:
            row = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_repeats)
        except (UnicodeDecodeError, ValueError, RecursionError):
            return raw  # not JSON, or a key twice: the core's own checks name it (E_ENCODING, E_JSON, ...)
        try:
            converted, form = convert_row(row, self.columns)
        except ConvertReject:
            self.counts[CODE] += 1
            raise
        self.counts[form] += 1
        if form == "messages":
            return raw  # the core checks its keys (E_RESERVED_KEY unless a clean set or import output)
        _rows.check_keys(row, origin_ok=False)  # another form is never a clean set: an origin in it is forged
        self._made_origin.add(number)
        if ORIGIN_KEY not in converted and isinstance(row.get("id"), (str, int)) and not isinstance(row["id"], bool):
            converted[ORIGIN_KEY] = {
                **make_origin(self.name, number, converted.get("images", [])),
                "record": str(row["id"]),
            }
        return json.dumps(converted, ensure_ascii=False).encode("utf-8")
