"""The files `swift sft` reads and writes in the work folder: the datasets' rows with absolute image
paths, its checkpoint-N folders and its training log."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.common.dataset import checked_rows_file
from components.common.errors import TrainError
from components.common.manifest import ManifestError
from components.common.provenance import strip_origin
from components.train_lora import _checkpoints


@dataclass(frozen=True)
class Inputs:
    """The datasets as `swift sft` reads them, in the work folder."""

    work: Path
    train_jsonl: Path
    eval_jsonl: str  # "" = no eval during training
    n_train: int

    @property
    def output_dir(self) -> Path:
        """swift's output_dir (local checkpoints and logging.jsonl)."""
        return self.work / "output"


def materialize_dataset(dataset_dir: str | Path, out_jsonl: str | Path, expected_marker: str = "") -> int:
    """Writes a dataset folder's rows with absolute image paths (what `swift sft` reads).

    Each row's provenance key (`components.common.provenance.ORIGIN_KEY`) is left out: ms-swift
    would drop it anyway (`remove_unused_columns`), and this way no setting can pass it on.

    Args:
        dataset_dir: A validated dataset folder (data.jsonl + images/).
        out_jsonl: The JSONL to write.
        expected_marker: The sha256 of its completion marker as validate-data recorded it (the
            artifact's `manifest_sha256`): a marker removed or edited since is caught too.
            Default "" (checked when the folder has a marker).

    Returns:
        Number of rows.

    Raises:
        TrainError: The folder has no data.jsonl, its files differ from its completion marker
            (`components.common.manifest`), or a referenced image is missing.
    """
    base = Path(dataset_dir)
    try:
        src = checked_rows_file(base, expected_marker)
    except ManifestError as exc:
        raise TrainError(str(exc)) from None
    n = 0
    with open(src, encoding="utf-8") as fin, open(out_jsonl, "w", encoding="utf-8") as fout:
        for number, line in enumerate(fin, start=1):
            row = json.loads(line)
            images = []
            for ref in row.get("images", []):
                path = (base / ref).resolve()
                if not path.is_file():
                    raise TrainError(f"{src}:{number}: image {ref!r} not found in the dataset folder")
                images.append(str(path))
            if "images" in row:
                row["images"] = images
            row = strip_origin(row)  # validate-data's provenance is for reports, never for the model
            fout.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def find_checkpoints(output_dir: str | Path) -> list[Path]:
    """Returns swift's checkpoint-N folders holding an adapter, oldest step first."""
    return [
        p
        for p in _checkpoints.checkpoint_folders(output_dir)
        if (p / "adapter_model.safetensors").is_file() and (p / "adapter_config.json").is_file()
    ]


def read_trainer_log(output_dir: Path, checkpoint: Path | None = None) -> list[dict[str, Any]]:
    """Returns the training log entries (loss, eval_loss, speed, memory per logging step).

    ms-swift appends every log entry, the final summary (train_runtime, samples/s)
    included, to `<output_dir>/logging.jsonl`; a checkpoint's trainer_state.json holds only
    the entries up to that checkpoint. The first is read when present.
    """
    log = Path(output_dir) / "logging.jsonl"
    entries: list[dict[str, Any]] = []
    if log.is_file():
        for line in log.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(entry, dict) and ("loss" in entry or "eval_loss" in entry or "train_runtime" in entry):
                entries.append(entry)
    if entries or checkpoint is None:
        return entries
    state = checkpoint / "trainer_state.json"
    if not state.is_file():
        return []
    return json.loads(state.read_text(encoding="utf-8")).get("log_history", [])


def materialize_inputs(work_dir: str, train_dir: str, eval_dir: str, markers: dict[str, str] | None = None) -> Inputs:
    """Writes the datasets' rows with absolute image paths into the work folder.

    swift's local output folder of an earlier call with the same work folder is removed first:
    swift appends to its `logging.jsonl` (the metrics would mix both runs) and a stale
    `checkpoint-N` of a longer run would be taken for this run's adapter. Resuming reads the
    durable folder only, never this one.
    """
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    stale = work / "output"
    if stale.exists():
        print(f"train-lora: removing {stale} (the local output of an earlier run in this work folder)", flush=True)
        shutil.rmtree(stale)
    train_jsonl = work / "train.jsonl"
    markers = markers or {}
    n_train = materialize_dataset(train_dir, train_jsonl, markers.get(train_dir, ""))
    eval_jsonl = ""
    if eval_dir:
        eval_jsonl = str(work / "eval.jsonl")
        materialize_dataset(eval_dir, eval_jsonl, markers.get(eval_dir, ""))
    return Inputs(work, train_jsonl, eval_jsonl, n_train)
