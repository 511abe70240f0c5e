"""The speed-up registry: the one module train-lora, the job-environment check and the items' code read.

The parts, each in a module of its own (none imports an item's code, so this module stays standard-library only
and the planner reads it without torch):

* `items.py`: every item as a declared record (what it patches, the versions it was measured on, its switches, its
  memory effect, the quantised bases it serves, where its code is): the page to read first;
* `versions.py`: the library ranges the package supports and how an installed version is read;
* `outcome.py`: what became of an item (applied, pending, skipped with a kind);
* `gate.py`: what decides whether an item applies, before its code runs (`gate`) and in the planner's view
  (`planned`);
* `table.py`: the start-up table the plugin logs and writes, and train-lora reads back.

The plugin's walk (`plugin.py`) adds what only the running process can know (a target renamed, nothing found in
the model, an exception) and writes the table. See docs/speedups.md.
"""

from __future__ import annotations

from speedups.gate import (
    REQUIREMENTS,
    Planned,
    gate,
    option_on,
    planned,
    quantization_problem,
    switches_off,
    version_problem,
    world_size,
)
from speedups.items import BY_NUMBER, ITEMS, LIGER_FLCE, QWEN3_VL, QWEN3_VL_MOE, REMOVED_SWITCHES, SWITCHES, item
from speedups.outcome import (
    ERROR,
    KINDS,
    NOT_APPLICABLE,
    NOTHING,
    SWITCH_OFF,
    TARGET,
    VERSION,
    Outcome,
    applied,
    error,
    found_nothing,
    not_applicable,
    pending,
    skipped,
    target_missing,
)
from speedups.patching import loaded_modules
from speedups.records import PACKAGE, QUANTIZED, Item, Switch, Target
from speedups.table import TABLE_ENV, TABLE_VERSION, Table, disagreements, read_table, versions_in_use
from speedups.versions import (
    ACCELERATE,
    GPU_SUPPORTED,
    LIGER,
    MS_SWIFT,
    PEFT,
    SUPPORTED,
    TORCH,
    TRANSFORMERS,
    TRITON,
    __version__,
    in_range,
    installed_version,
)

__all__ = [
    "ACCELERATE", "BY_NUMBER", "ERROR", "GPU_SUPPORTED", "ITEMS", "KINDS", "LIGER", "LIGER_FLCE", "MS_SWIFT",
    "NOTHING", "NOT_APPLICABLE", "PACKAGE", "PEFT", "QUANTIZED", "QWEN3_VL", "QWEN3_VL_MOE", "REMOVED_SWITCHES",
    "REQUIREMENTS", "SUPPORTED", "SWITCHES", "SWITCH_OFF", "TABLE_ENV", "TABLE_VERSION", "TARGET", "TORCH",
    "TRANSFORMERS", "TRITON", "VERSION", "Item", "Outcome", "Planned", "Switch", "Table", "Target", "__version__",
    "applied", "disagreements", "error", "found_nothing", "gate", "in_range", "installed_version", "item",
    "loaded_modules", "not_applicable", "option_on", "pending", "planned", "quantization_problem", "read_table",
    "skipped", "switches_off", "target_missing", "version_problem", "versions_in_use", "world_size",
]  # fmt: skip
