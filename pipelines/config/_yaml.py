"""The bounded YAML reader: a config file into data and its node tree, refused with file:line:column.

A config is a few KB of a few dozen keys: anything far beyond is a mistake or an attack,
refused before it can take minutes or gigabytes: a file over 1 MiB, YAML that anchors and
aliases expand past a small bound (a "billion laughs" bomb), nesting deeper than a config
needs, a duplicate key at any depth (never "last one wins"), and a form YAML 1.1 reads
differently from what it shows (`pipelines._yaml_forms`).
"""

from __future__ import annotations

import collections
import stat
from pathlib import Path
from typing import Any

import yaml

from pipelines._yaml_forms import ambiguous_form
from pipelines.config._errors import ConfigError

# A config is a few KB of a few dozen keys: anything far beyond is a mistake or an attack,
# refused before it can take minutes or gigabytes.
MAX_CONFIG_BYTES = 1 << 20  # refused before parsing
MAX_YAML_NODES = 10_000  # values after aliases are expanded
MAX_YAML_ALIASES = 100
MAX_YAML_DEPTH = 32  # nesting of mappings and lists


def line_map(node: yaml.Node, prefix: str = "") -> dict[str, int]:
    """Maps dotted key paths to 1-based line numbers in the YAML source."""
    lines: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = f"{prefix}{key_node.value}"
            lines.setdefault(key, key_node.start_mark.line + 1)
            for sub, line in line_map(value_node, key + ".").items():
                lines.setdefault(sub, line)
    return lines


class _YamlTooBig(Exception):
    """The YAML would expand past `MAX_YAML_NODES` / `MAX_YAML_ALIASES` / `MAX_YAML_DEPTH`."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line


class _BoundedLoader(yaml.SafeLoader):
    """A SafeLoader that counts values while composing, aliases expanded, and stops early.

    PyYAML shares an aliased node instead of copying it, so a "billion laughs" file loads
    fast and small; it explodes later, in whatever walks or serialises the data (the line
    map, `dataclasses.asdict`, the pipeline compiler). Counting the expanded size here
    bounds every later step.
    """

    def __init__(self, stream: str):
        super().__init__(stream)
        self._sizes: dict[int, int] = {}  # id(node) -> values in it, aliases expanded
        self._expanded = 0
        self.aliases = 0  # alias references read so far
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            self.aliases += 1
            target = self.anchors.get(event.anchor)
            if target is not None:
                size = self._sizes.get(id(target))
                if size is None:
                    raise _YamlTooBig(line, f"alias *{event.anchor} is inside its own anchor (a recursive structure)")
                self._count(line, size)
            if self.aliases > MAX_YAML_ALIASES:
                raise _YamlTooBig(line, f"the YAML uses more than {MAX_YAML_ALIASES} aliases (*name)")
            return super().compose_node(parent, index)
        self._count(line, 1)
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            raise _YamlTooBig(line, f"the YAML nests more than {MAX_YAML_DEPTH} levels deep")
        node = super().compose_node(parent, index)
        self._depth -= 1
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        self._sizes[id(node)] = 1 + sum(self._sizes[id(c)] for c in children)
        return node

    def _count(self, line: int, size: int) -> None:
        self._expanded += size
        if self._expanded > MAX_YAML_NODES:
            how = " once its aliases (*name) are expanded" if self.aliases else ""
            raise _YamlTooBig(line, f"the YAML has more than {MAX_YAML_NODES} values{how}")


def _duplicate_key(loader: yaml.SafeLoader, node: yaml.Node) -> tuple[str, int, str] | None:
    """Returns (dotted key, line, where the first is) of the first key repeated in one mapping, or None.

    Keys are compared as loaded, so `on:` and `true:` or `1:` and `0x1:` are the same key;
    the keys a merge (`<<: *base`) brings in may be overridden, as YAML intends.
    """
    stack, seen_nodes = collections.deque([(node, "")]), set()
    while stack:
        current, prefix = stack.popleft()
        if id(current) in seen_nodes:
            continue
        seen_nodes.add(id(current))
        if isinstance(current, yaml.SequenceNode):
            stack.extend((child, f"{prefix}[{i}].") for i, child in enumerate(current.value))
            continue
        if not isinstance(current, yaml.MappingNode):
            continue
        first: dict[Any, yaml.Node] = {}
        for key_node, value_node in current.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue  # a mapping or list as a key is refused when the document is constructed
            key = loader.construct_object(key_node)
            dotted = f"{prefix}{key}"
            if key in first:
                earlier = first[key]
                spelled = f" as '{earlier.value}'" if earlier.value != key_node.value else ""
                first_at = f"line {earlier.start_mark.line + 1}{spelled}"
                return dotted.replace(".[", "["), key_node.start_mark.line + 1, first_at
            first[key] = key_node
            stack.append((value_node, dotted + "."))
    return None


def read_yaml(path: Path) -> tuple[Any, yaml.Node | None]:
    """Reads, size-checks and parses a config file into (data, its YAML node tree).

    Raises:
        ConfigError: Missing, not a regular file, over `MAX_CONFIG_BYTES`, not UTF-8, not
            YAML, a duplicate key, or past the node / alias / depth bounds.
    """
    loader = _loader(path, _read_text(path))
    try:
        raw, node, duplicate, form = _compose(path, loader)
    finally:
        loader.dispose()
    if duplicate is not None:
        key, line, first = duplicate
        raise ConfigError(f"{path}:{line}: duplicate key '{key}' (first at {first}); keep one")
    if form is not None:
        line, key, written, problem = form
        raise ConfigError(f"{path}:{line}: '{key}: {written}' is {problem}")
    return raw, node


def _read_text(path: Path) -> str:
    """The file's text: a regular file of at most `MAX_CONFIG_BYTES`, in UTF-8.

    Raises:
        ConfigError: Missing, a folder or another non-regular file, too large, unreadable or not UTF-8.
    """
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise ConfigError(
            f"{path}: is a folder, not a config file; pass a .yaml file (e.g. configs/local/tiny_cpu.yaml)"
        )
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{path}: cannot read config: not a regular file (a config is a .yaml file on disk)")
    too_big = (
        f"{path}: config is larger than {MAX_CONFIG_BYTES // (1 << 20)} MiB; a config is a few KB of settings: "
        "keep data, prompts and file lists in their own files and name them (data.train)"
    )
    if info.st_size > MAX_CONFIG_BYTES:
        raise ConfigError(too_big)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:  # grew since stat, or a file that reports no size
            raise ConfigError(too_big)
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from None


def _loader(path: Path, text: str) -> _BoundedLoader:
    """A bounded loader over `text`; a control character (a NUL byte) is refused with its line."""
    try:
        return _BoundedLoader(text)  # the reader refuses control characters (a NUL byte) here
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        code = exc.character if isinstance(exc.character, int) else -1
        what = "a NUL byte" if code == 0 else f"the control character #x{code:04x}" if code >= 0 else "a byte"
        raise ConfigError(
            f"{path}:{line}: not valid YAML: {what} is not allowed in a config; remove it (a binary file, or a "
            "copy-paste accident?)"
        ) from None


def _compose(path: Path, loader: _BoundedLoader) -> tuple[Any, yaml.Node | None, Any, Any]:
    """(data, node tree, duplicate key, ambiguous form); data is None when either of the last two is found.

    Raises:
        ConfigError: Past the bounds, not YAML (file:line:column, no snippet), or a value Python refuses.
    """
    raw = None
    try:
        node = loader.get_single_node()
        form = ambiguous_form(node)
        duplicate = _duplicate_key(loader, node) if node is not None else None
        if duplicate is None and form is None:
            raw = loader.construct_document(node) if node is not None else None
    except _YamlTooBig as exc:
        fix = (
            "a config needs no anchors (&name) or aliases (*name): write each value out once"
            if loader.aliases
            else "a config is a few dozen values, a few levels deep"
        )
        raise ConfigError(f"{path}:{exc.line}: {exc}; {fix}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        what = "; ".join(filter(None, (exc.context, exc.problem)))  # no snippet: the line may hold a secret
        raise ConfigError(f"{where}: not valid YAML: {what}") from None
    except ValueError as exc:  # Python refuses to convert integers of more than 4300 digits
        what = "a number is too long" if "digits" in str(exc) else "a value YAML reads as a date is not one"
        raise ConfigError(f"{path}: not valid YAML: {what} ({str(exc).split(';')[0]})") from None
    except yaml.YAMLError as exc:  # e.g. a control character (ReaderError)
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return raw, node, duplicate, form


def where_in(path: str, key: str) -> str:
    """`file:line` of `key` (or of its section) in a config that already loaded; `file` if not found."""
    try:
        lines = line_map(read_yaml(Path(path))[1])
    except ConfigError:  # changed or removed since it loaded
        return path
    line = lines.get(key) or lines.get(key.split(".")[0])
    return f"{path}:{line}" if line else path
