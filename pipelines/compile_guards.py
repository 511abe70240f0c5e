"""What `pipelines.compile` refuses before it writes a pipeline YAML (pure checks, no kfp).

* A Vertex compile of a config whose pipeline root or model cache is a local folder (e.g.
  `configs/local/*`): on Vertex that folder would be inside a container, so checkpoints, the
  adapter and the staged model would vanish with it.
* A compile to the default output `build/<pipeline name>.yaml` that another config wrote:
  two configs with one `pipeline.name` would silently replace each other's pipeline. Each
  default output gets a sidecar `build/<name>.yaml.source` naming the config it came from.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pipelines.config import ConfigError, where_in

SOURCE_SUFFIX = ".source"


def check_vertex_roots(cfg: Any) -> None:
    """Refuses a Vertex compile whose `pipeline.root` or `model.cache` is not a gs:// URI.

    Raises:
        ConfigError: Names the key's file:line, the value and the two fixes.
    """
    for key, value in (("pipeline.root", cfg.pipeline.root), ("model.cache", cfg.model.cache)):
        if not value.startswith("gs://"):
            raise ConfigError(
                f"{where_in(cfg.path, key)}: '{key}' {value!r} is a local folder: a Vertex pipeline writes it "
                f"inside a container, where it is lost; set {key} to a gs:// URI (or an override "
                f"{key}=gs://BUCKET/...), or compile with --target local"
            )


def _digest(config_path: str) -> str:
    try:
        return hashlib.sha256(Path(config_path).read_bytes()).hexdigest()
    except OSError:
        return ""


def _source_of(out: Path) -> tuple[str, str] | None:
    """(config path, sha256 of its text) from `out`'s sidecar; None without one."""
    note = out.with_name(out.name + SOURCE_SUFFIX)
    try:
        lines = note.read_text().splitlines()
    except OSError:
        return None
    return (lines[0], lines[1] if len(lines) > 1 else "") if lines and lines[0] else None


def check_not_another_configs(out: Path, config_path: str) -> None:
    """Refuses to replace a default output compiled from another config.

    The same config is the same file or the same text (a copy, an installed package's copy);
    overrides are not compared (`section.key=value` on the same config is a re-compile).

    Args:
        out: The default output, `build/<pipeline name>[-local].yaml`.
        config_path: The config being compiled (as `load_config` resolved it).

    Raises:
        ConfigError: `out` exists and its sidecar names another config, with other text.
    """
    source = _source_of(out)
    if not out.exists() or source is None:
        return
    path, digest = source
    if Path(path).resolve() == Path(config_path).resolve() or digest == _digest(config_path):
        return
    raise ConfigError(
        f"{out} was compiled from {path}, not {config_path} (both have this pipeline.name): "
        f"give {config_path} its own pipeline.name, or pass --output FILE"
    )


def write_source_note(out: Path, config_path: str) -> None:
    """Writes the sidecar that names the config `out` was compiled from (its path and sha256)."""
    note = out.with_name(out.name + SOURCE_SUFFIX)
    tmp = note.with_name(note.name + ".tmp")
    tmp.write_text(f"{Path(config_path).resolve()}\n{_digest(config_path)}\n")
    tmp.replace(note)
