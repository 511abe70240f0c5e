"""train-lora's speed-ups, loaded into `swift sft` through `--external_plugins` (by path) by the train-lora task.

This file only walks the registry (`registry.py`: one declared record per item, docs/speedups.md): `plugin.install`
runs each item that its switch, its packages' versions and its needs allow, and wraps `Trainer.__init__`, where each
item's check runs and the start-up table is logged (and written by rank 0 where VLM_LORA_SPEEDUPS_TABLE names a
file). `swift sft` puts only this folder on sys.path: the repository root (the folder holding `components/`) goes
first where `components` is not importable, or is another copy than this file's.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def _importable_package() -> None:
    root = Path(__file__).resolve().parents[3]
    spec = importlib.util.find_spec("components")
    here = root / "components"
    if spec is None or not any(Path(p).resolve() == here for p in spec.submodule_search_locations or ()):
        sys.path.insert(0, str(root))


_importable_package()

from components.train_lora.speedups import plugin  # noqa: E402

CONTEXT = plugin.install()
