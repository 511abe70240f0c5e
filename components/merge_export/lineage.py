"""What `lineage.json` beside the merged model records: base, adapter, data, run, versions, checks."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from components.common.adapter import BASE_MODEL_REF
from components.common.snapshot import LINEAGE_FILE
from components.merge_export._json import read_json
from components.merge_export.card import training_summary
from components.merge_export.inputs import quant_label


def library_versions() -> dict[str, str]:
    """Returns the versions of the libraries that merge and load models ("" if absent)."""
    from importlib import metadata

    out = {}
    for key, dist in (("transformers", "transformers"), ("peft", "peft"), ("ms_swift", "ms-swift"), ("torch", "torch")):
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[key] = ""
    return out


def build_lineage(
    adapter: Path,
    base_model_dir: str,
    staged: dict[str, Any],
    out: Path,
    run_id: str,
    check: dict[str, Any],
    quant: dict[str, Any],
) -> dict[str, Any]:
    """lineage.json's content: base and revision, adapter, data, run, versions, checks, training."""
    versions = library_versions()
    base_ref = {
        "model_dir": str(base_model_dir),
        **{k: v for k, v in staged.items() if v not in (None, "")},
        **read_json(adapter / BASE_MODEL_REF),
    }
    lineage = {
        "base_model": base_ref,
        "adapter": str(adapter),
        "data": data_lineage(adapter, out),
        "run_id": run_id,
        "transformers": versions["transformers"],
        "versions": versions,
        "verification": check,
        "training": training_summary(adapter),
    }
    if quant:
        lineage["trained_on"] = {"quantization": quant_label(quant), "swift_args": quant, "merged_into": "bf16 base"}
    return lineage


def data_lineage(adapter: Path, out: Path) -> dict[str, Any]:
    """Copies the adapter's data lineage (validate-data's snapshot file) beside the merged model.

    Returns:
        {"snapshot": fingerprint, "training_key", "files", "rows", "train_rows", "eval_rows"}
        for lineage.json and the card; {} when the adapter has none (trained without a snapshot).
    """
    src = adapter / LINEAGE_FILE
    if not src.is_file():
        return {}
    shutil.copyfile(src, out / LINEAGE_FILE)
    full = read_json(src)
    return {
        "snapshot": full.get("snapshot", {}).get("fingerprint", ""),
        "training_key": full.get("training_key", ""),
        "files": len(full.get("files", {})),
        "rows": full.get("n_rows"),
        "train_rows": full.get("n_train"),
        "eval_rows": full.get("n_eval"),
        "task": full.get("task", ""),  # what validate-data checked the rows for ("" = free text)
    }
