"""train-lora's speed-ups, loaded into `swift sft` through `--external_plugins` (by path) by the train-lora task.

This file only walks the registry (`registry.py`: one declared record per item, docs/speedups.md): `plugin.install`
runs each item that its switch, its packages' versions and its needs allow, and wraps `Trainer.__init__`, where each
item's check runs and the start-up table is logged (and written by rank 0 where VLM_LORA_SPEEDUPS_TABLE names a
file). `swift sft` puts only this folder on sys.path: the folder holding this package (the repository root, or
site-packages) goes first where `speedups` is not importable, or is another copy than this file's.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def _importable_package() -> None:
    here = Path(__file__).resolve().parent
    root = here.parent
    spec = importlib.util.find_spec("speedups")
    if spec is None or not any(Path(p).resolve() == here for p in spec.submodule_search_locations or ()):
        sys.path.insert(0, str(root))


_importable_package()

from speedups import plugin  # noqa: E402

CONTEXT = plugin.install()
