"""Local folders a run creates and writes (pipeline root, model cache): not under a file, and writable."""

from __future__ import annotations

import os
from pathlib import Path

from pipelines.config._errors import ConfigError
from pipelines.config._schema import Config
from pipelines.config._yaml import where_in


def local_dir_problem(path: str, writable: bool = True) -> str | None:
    """Checks a local folder a task will create and write (pipeline root, model cache).

    Args:
        path: The folder; a URI (`gs://...`) is not local and never a problem.
        writable: Also check the nearest existing folder on its path can be written (and
            so the folder created) by this user. Default true.

    Returns:
        None when fine, else what is wrong and how to fix it.
    """
    if not path or "://" in path:
        return None
    folder = Path(path).expanduser()
    for candidate in (folder, *folder.parents):
        try:
            if not candidate.exists():
                continue
            if not candidate.is_dir():
                return (
                    f"{path!r} is inside {str(candidate)!r}, which is a file, not a folder; "
                    "name a folder (it is created if missing) or a gs:// URI"
                )
            if writable and not os.access(candidate, os.W_OK | os.X_OK):
                return (
                    f"{path!r} cannot be created or written: {str(candidate)!r} is not writable by this user; "
                    "name a folder you can write to (e.g. runs) or a gs:// URI"
                )
        except OSError as exc:
            return f"{path!r} cannot be checked: {exc.strerror or exc}; name a folder you can read and write"
        return None
    return None


def check_local_dirs(cfg: Config, root_from: str = "") -> None:
    """Checks a local run can create and write its pipeline root and model cache.

    `load_config` checks neither is under a file; this also checks they can be written,
    which only matters on the machine that runs the pipeline (`pipelines.run --local`,
    `pipelines.compile --target local`).

    Args:
        cfg: The loaded config.
        root_from: Where the root came from when not the config, e.g. "--root". Default "".

    Raises:
        ConfigError: The root or the cache is under a file or cannot be written.
    """
    for key, value in (("pipeline.root", cfg.pipeline.root), ("model.cache", cfg.model.cache)):
        problem = local_dir_problem(value)
        if problem:
            if key == "pipeline.root" and root_from:
                raise ConfigError(f"{root_from} {problem}")
            raise ConfigError(f"{where_in(cfg.path, key)}: '{key}' {problem}")
