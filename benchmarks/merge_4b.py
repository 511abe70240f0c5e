"""Merge-export core on the 4B-shaped model: time and the bf16 logits check (GPU machine).

    python -m benchmarks.merge_4b --adapter ADAPTER_DIR --model MODEL_DIR --out DIR

The adapter is any LoRA adapter trained on MODEL_DIR by the train-lora core (e.g. one that
benchmarks/train_throughput.py left in DIR/<profile>/adapter). Prints `MERGE {...}`: the
export, check and total seconds, merged size, and the logits check's figures (max |diff|
between the merged model and base + adapter, the tolerance, the adapter's own effect).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--adapter", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import torch

    from components.merge_export.core import merge_export

    out = Path(args.out)
    start = time.time()
    result = merge_export(args.adapter, args.model, str(out / "merged"), str(out / "merge-work"))
    total = time.time() - start
    size = sum(p.stat().st_size for p in (out / "merged").glob("*.safetensors"))
    meta = result.metadata if hasattr(result, "metadata") else {}
    summary = {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "total_s": round(total, 1),
        "merged_safetensors_bytes": size,
        **{k: v for k, v in meta.items() if not isinstance(v, (dict, list)) or k in ("timings", "check")},
    }
    print("MERGE " + json.dumps(summary, default=str), flush=True)


if __name__ == "__main__":
    main()
