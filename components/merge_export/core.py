"""Merge a LoRA adapter into its base model with `swift export --merge_lora true`.

The merged folder is verified before it counts: it must hold a config, safetensors
weights and the processor/tokenizer files, and it must load and run one forward pass.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.train_lora.core import BASE_MODEL_REF, run_command, swift_executable, to_cli

REQUIRED_FILES = ("config.json", "tokenizer_config.json", "preprocessor_config.json")


class MergeError(RuntimeError):
    """Merging failed or the merged model does not verify; the message says why."""


@dataclass
class MergeResult:
    """What merging produced.

    Attributes:
        merged_dir: The merged model folder.
        metadata: merge_seconds, total_bytes, num_files, transformers version, base model ref.
    """

    merged_dir: str
    metadata: dict[str, Any]


def build_export_command(adapter_dir: str, base_model_dir: str, output_dir: str, extra: dict[str, Any] | None = None) -> list[str]:
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


def verify_merged(merged_dir: str | Path) -> dict[str, Any]:
    """Checks a merged folder's files and that it loads and runs a forward pass.

    Returns:
        {"num_files", "total_bytes", "num_parameters"}.

    Raises:
        MergeError: Files missing, or the model does not load / run.
    """
    folder = Path(merged_dir)
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if missing:
        raise MergeError(f"{folder}: merged model lacks {', '.join(missing)}")
    if not list(folder.glob("*.safetensors")):
        raise MergeError(f"{folder}: merged model has no *.safetensors weights")
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    try:
        config = AutoConfig.from_pretrained(folder)
        model = AutoModelForImageTextToText.from_pretrained(folder, torch_dtype="auto")
        with torch.no_grad():
            ids = torch.tensor([[1, 2, 3, 4]])
            logits = model(input_ids=ids).logits
    except Exception as exc:  # any load failure means the merge is unusable
        raise MergeError(f"{folder}: merged model does not load or run: {type(exc).__name__}: {exc}") from None
    vocab = getattr(getattr(config, "text_config", config), "vocab_size", logits.shape[-1])
    if logits.shape[-1] != vocab or not torch.isfinite(logits).all():
        raise MergeError(f"{folder}: merged model gives bad logits (shape {tuple(logits.shape)}, vocab {vocab})")
    files = [p for p in folder.rglob("*") if p.is_file()]
    return {
        "num_files": len(files),
        "total_bytes": sum(p.stat().st_size for p in files),
        "num_parameters": sum(p.numel() for p in model.parameters()),
    }


def merge_export(adapter_dir: str, base_model_dir: str, merged_out: str, work_dir: str) -> MergeResult:
    """Merges the adapter into the base model and verifies the result.

    Args:
        adapter_dir: Adapter folder from train-lora.
        base_model_dir: Staged base model folder.
        merged_out: Output folder for the merged model.
        work_dir: Scratch folder.

    Returns:
        The MergeResult.

    Raises:
        MergeError: The adapter is not one, `swift export` failed, or the result does not verify.
    """
    import transformers

    adapter = Path(adapter_dir)
    if not (adapter / "adapter_config.json").is_file():
        raise MergeError(f"{adapter}: no adapter_config.json; this is not a LoRA adapter folder")
    tmp_out = Path(work_dir) / "merged"
    if tmp_out.exists():
        shutil.rmtree(tmp_out)
    cmd = build_export_command(str(adapter), base_model_dir, str(tmp_out))
    cmd[0] = swift_executable()
    print("merge-export:", " ".join(cmd), flush=True)
    start = time.time()
    code, tail = run_command(cmd)
    seconds = time.time() - start
    if code != 0:
        last = [line for line in tail.splitlines() if line.strip()][-1:] or ["(no output)"]
        raise MergeError(f"swift export exited with code {code}; last line: {last[0]}")
    facts = verify_merged(tmp_out)
    out = Path(merged_out)
    out.mkdir(parents=True, exist_ok=True)
    for path in tmp_out.iterdir():
        dst = out / path.name
        if path.is_dir():
            shutil.copytree(path, dst, dirs_exist_ok=True)
        else:
            shutil.copyfile(path, dst)
    ref_path = adapter / BASE_MODEL_REF
    base_ref = json.loads(ref_path.read_text(encoding="utf-8")) if ref_path.is_file() else {}
    lineage = {"base_model": base_ref, "adapter": str(adapter), "transformers": transformers.__version__}
    (out / "lineage.json").write_text(json.dumps(lineage, indent=2, sort_keys=True), encoding="utf-8")
    metadata = {"merge_seconds": round(seconds, 2), "transformers": transformers.__version__, **facts}
    return MergeResult(str(out), metadata)
