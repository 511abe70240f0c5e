"""Merge a LoRA adapter into its base model with `swift export --merge_lora true`.

The merged folder is verified before it counts:

* before merging, the adapter must belong to the staged base model and the merge must go
  into the original bf16 weights (`inputs`: `check_adapter_base`, `check_bf16_target`);
* the merged folder must hold a config, safetensors weights and the processor/tokenizer
  files, and it must load and run a forward pass (`logits.verify_merged`);
* its weights must be the base weights plus the adapter's update (`weights.compare_weights`);
* its logits must match those of the base model with the adapter applied by peft on a few
  probe inputs (`logits.compare_logits`).

The merged folder also gets `lineage.json` (`lineage`) and a model card (`README.md`,
`card`) naming the base model and revision, the adapter, the run, the library versions and
the training figures.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.common.adapter import BASE_MODEL_REF
from components.common.manifest import ManifestError, verify_if_marked, write_manifest
from components.common.swift import run_command, swift_executable, to_cli
from components.merge_export._disk import DiskPeak, plan_disk
from components.merge_export._disk import MergeDiskError as MergeDiskError  # raised by merge_export
from components.merge_export._json import read_json
from components.merge_export.card import model_card
from components.merge_export.errors import MergeError
from components.merge_export.inputs import bf16_adapter_view, check_adapter_base, check_bf16_target, quant_label
from components.merge_export.lineage import build_lineage
from components.merge_export.logits import compare_logits, verify_merged
from components.merge_export.weights import compare_weights


@dataclass
class MergeResult:
    """What merging produced.

    Attributes:
        merged_dir: The merged model folder.
        metadata: merge_seconds, total_bytes, num_files, library versions
            (transformers, peft, ms_swift, torch), logit check figures (logits_max_abs_diff,
            logits_tolerance, adapter_effect_max_abs, probe_inputs), base model revision, and the
            disk: disk_need_bytes and disk_free_before_bytes (the check before the export),
            disk_peak_extra_bytes (the most the work folder's file system held above the start).
    """

    merged_dir: str
    metadata: dict[str, Any]


def build_export_command(
    adapter_dir: str, base_model_dir: str, output_dir: str, extra: dict[str, Any] | None = None
) -> list[str]:
    """Builds the `swift export --merge_lora true` command line (pure).

    Args:
        adapter_dir: Adapter folder (adapter weights + config + args.json).
        base_model_dir: The staged base model (overrides the path recorded in args.json,
            which may not exist on this machine).
        output_dir: Where the merged model goes (must not exist yet).
        extra: More `swift export` arguments. Default None.

    Returns:
        The argv list, starting with "swift", "export".
    """
    args = {"adapters": adapter_dir, "model": base_model_dir, "merge_lora": True, "output_dir": output_dir}
    args.update(extra or {})
    return ["swift", "export", *to_cli(args)]


def merge_export(
    adapter_dir: str,
    base_model_dir: str,
    merged_out: str,
    work_dir: str,
    run_id: str = "",
    metrics: dict[str, Any] | None = None,
    verify_logits: bool = True,
    adapter_marker: str = "",
) -> MergeResult:
    """Merges the adapter into the base model and verifies the result.

    Args:
        adapter_dir: Adapter folder from train-lora.
        base_model_dir: Staged base model folder.
        merged_out: Output folder for the merged model.
        work_dir: Scratch folder.
        run_id: Pipeline run that produced the adapter, for the lineage. Default "".
        metrics: Metrics for the model card (e.g. training figures). Default None.
        verify_logits: Compare merged logits with base + adapter (peft). Default True.
        adapter_marker: The sha256 of the adapter's completion marker as train-lora recorded it
            (its `manifest_sha256`). Default "": checked when the folder has a marker.

    Returns:
        The MergeResult; its folder holds a completion marker (`components.common.manifest`)
        written last, whose sha256 is `metadata["manifest_sha256"]`.

    Raises:
        MergeError: The adapter's files differ from its completion marker (naming the file), the
            adapter is not one, `swift export` failed, or the result does not verify.
        AdapterBaseMismatch: The adapter was trained on another base model.
        MergeVerificationError: The merged logits differ from base + adapter.
        MergeDiskError: The work folder (or the output's file system) has less free space than the
            merged model needs (`_disk.plan_disk`), checked before `swift export` starts.
    """
    adapter = Path(adapter_dir)
    try:  # the adapter as train-lora wrote it, never a truncated or edited copy
        verify_if_marked(adapter, expected_sha256=adapter_marker, fix="train the adapter again (--no-cache)")
    except ManifestError as exc:
        raise MergeError(str(exc)) from None
    staged = check_adapter_base(adapter, base_model_dir)
    check_bf16_target(base_model_dir, merged_out)
    disk = plan_disk(base_model_dir, work_dir, merged_out)
    print(
        f"merge-export: disk: needs {disk.need_work_bytes / 1e9:.2f} GB in {work_dir} "
        f"(merged model ~{disk.weights_bytes / 1e9:.2f} GB), {disk.free_work_bytes / 1e9:.2f} GB free",
        flush=True,
    )
    tmp_out = Path(work_dir) / "merged"
    if tmp_out.exists():
        shutil.rmtree(tmp_out)
    with DiskPeak(work_dir) as peak:
        seconds, quant = _export(adapter, base_model_dir, tmp_out, Path(work_dir))
        facts = verify_merged(tmp_out)
        check = _check(base_model_dir, adapter, tmp_out, verify_logits)
        out = _move(tmp_out, Path(merged_out))
    print(
        f"merge-export: disk: peak {peak.peak_bytes / 1e9:.2f} GB above the start in {work_dir} "
        f"(sampled every 0.5 s; the merged model {facts.get('total_bytes', 0) / 1e9:.2f} GB)",
        flush=True,
    )
    lineage = build_lineage(adapter, base_model_dir, staged, out, run_id, check, quant)
    (out / "lineage.json").write_text(json.dumps(lineage, indent=2, sort_keys=True), encoding="utf-8")
    (out / "README.md").write_text(model_card(lineage, metrics), encoding="utf-8")
    metadata = {
        "manifest_sha256": write_manifest(out, producer="merge-export"),  # last: a reuse checks the files
        "merge_seconds": round(seconds, 2),
        **lineage["versions"],
        **facts,
        **{k: v for k, v in check.items() if isinstance(v, (int, float, str))},
        **disk.metadata(),
        "disk_peak_extra_bytes": peak.peak_bytes,
        "base_revision": lineage["base_model"].get("revision", ""),
        "trained_on_quantization": quant_label(quant) if quant else "none",
    }
    if run_id:
        metadata["run_id"] = run_id
    if lineage["data"]:
        metadata.update({"data_snapshot": lineage["data"]["snapshot"], "training_key": lineage["data"]["training_key"]})
    return MergeResult(str(out), metadata)


def _export(adapter: Path, base_model_dir: str, tmp_out: Path, work_dir: Path) -> tuple[float, dict[str, Any]]:
    """Runs `swift export --merge_lora true` into tmp_out.

    Returns:
        (seconds it took, the adapter's quant arguments: {} when trained on a bf16 base).

    Raises:
        MergeError: swift export exited non-zero (its last line in the message).
    """
    export_adapter, quant = bf16_adapter_view(adapter, work_dir)
    if quant:
        print(f"merge-export: adapter trained on a {quant_label(quant)} base; merging into the bf16 base", flush=True)
    recorded = read_json(adapter / BASE_MODEL_REF)
    # ms-swift's model_type (recorded by train-lora; args.json has it too): without it
    # swift cannot tell qwen3_vl from qwen3_vl_emb / qwen3_vl_reranker for an adapter without args.json.
    extra = {"model_type": recorded["model_type"]} if recorded.get("model_type") else None
    cmd = build_export_command(str(export_adapter), base_model_dir, str(tmp_out), extra)
    cmd[0] = swift_executable()
    print("merge-export:", " ".join(cmd), flush=True)
    start = time.time()
    code, tail = run_command(cmd)
    if code != 0:
        last = [line for line in tail.splitlines() if line.strip()][-1:] or ["(no output)"]
        raise MergeError(f"swift export exited with code {code}; last line: {last[0]}")
    return time.time() - start, quant


def _check(base_model_dir: str, adapter: Path, merged: Path, verify_logits: bool) -> dict[str, Any]:
    """The weight check, then (verify_logits) the logits check; their figures, logged."""
    check: dict[str, Any] = compare_weights(base_model_dir, adapter, merged)
    print(
        f"merge-export: {check['adapted_weights']} adapted weights are base + update (worst "
        f"{check['adapted_within_step_min_fraction']:.4%} within one rounding step), the other "
        f"{check['weights_checked'] - check['adapted_weights']} tensors match the base",
        flush=True,
    )
    if verify_logits:
        start_check = time.time()
        check.update(compare_logits(base_model_dir, adapter, merged))
        check["verify_seconds"] = round(time.time() - start_check, 2)
        relation = (
            "<="
            if check["logits_within_tolerance"]
            else "> (rounding of the merged weights; accepted: "
            "the weights check passed and the merged model is closer to base + adapter than the base is)"
        )
        print(
            f"merge-export: logits vs base + adapter: max |diff| {check['logits_max_abs_diff']:.3g} {relation} "
            f"tolerance {check['logits_tolerance']:.3g} (adapter effect {check['adapter_effect_max_abs']:.3g})",
            flush=True,
        )
    return check


def _move(tmp_out: Path, out: Path) -> Path:
    """Moves the checked files into the output folder one by one (renamed on the same file system)."""
    out.mkdir(parents=True, exist_ok=True)
    for path in tmp_out.iterdir():  # moved, not copied: a second copy of tens of GB may not fit the disk
        dst = out / path.name
        if dst.is_dir():
            shutil.rmtree(dst)
        shutil.move(str(path), str(dst))
    return out
