"""GPU benchmark of the training, merge and evaluate tasks' cores on a 4B-shaped Qwen3-VL.

Runs on the GPU machine (not a test). Builds the real Qwen3-VL-4B-Instruct architecture
with random bf16 weights (benchmarks/qwen3_vl_4b.py), seed-shaped data (1024x1024
synthetic engineering drawings with JSON-list answers), then:

1. validate-data core (clean train/eval datasets),
2. train-lora core (`swift sft`) with the seed settings for a fixed number of steps:
   s/step, samples/s, LM tokens/s, peak GPU memory,
3. merge-export core (`swift export --merge_lora true`, verified by loading): seconds,
4. evaluate: the task's batched generation vs a naive one-sample-at-a-time
   `model.generate` loop on the same samples: samples/s and generated tokens/s.

    python -m benchmarks.gpu_tasks_4b --out DIR [--steps 30] [--eval-samples 32] [--max-new-tokens 128]

Prints one JSON summary line at the end (also written to DIR/summary.json).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

SEED_SWIFT = {
    "tuner_type": "lora",
    "lora_rank": 8,
    "lora_alpha": 32,
    "target_modules": "all-linear",
    "freeze_vit": True,
    "learning_rate": 1e-4,
    "per_device_train_batch_size": 1,
    "gradient_accumulation_steps": 1,
    "max_length": 3000,
    "torch_dtype": "bfloat16",
    "gradient_checkpointing": True,
    "logging_steps": 5,
    "save_only_model": True,
    "dataloader_num_workers": 4,
    "report_to": "none",
    "seed": 42,
}


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def naive_generate(model_dir: str, rows: list[dict], max_new_tokens: int) -> tuple[list[str], int, float]:
    """One sample at a time through transformers' generate (the seed's eval.py way)."""
    import torch
    from PIL import Image
    from transformers import AutoProcessor, Qwen3VLForConditionalGeneration

    processor = AutoProcessor.from_pretrained(model_dir)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = Qwen3VLForConditionalGeneration.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    answers, generated = [], 0
    _sync()
    start = time.time()
    for row in rows:
        text_msgs = []
        for m in row["messages"]:
            parts = m["content"].split("<image>")
            content = []
            for i, part in enumerate(parts):
                if i:
                    content.append({"type": "image"})
                if part:
                    content.append({"type": "text", "text": part})
            text_msgs.append({"role": m["role"], "content": content})
        prompt = processor.apply_chat_template(text_msgs, tokenize=False, add_generation_prompt=True)
        images = [Image.open(p).convert("RGB") for p in row["images"]]
        inputs = processor(text=[prompt], images=images, return_tensors="pt").to(device)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        new = out[0, inputs["input_ids"].shape[1] :]
        generated += int(new.numel())
        answers.append(processor.decode(new, skip_special_tokens=True))
    _sync()
    seconds = time.time() - start
    del model
    _sync()
    return answers, generated, seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--n-train", type=int, default=64)
    parser.add_argument("--eval-samples", type=int, default=32)
    parser.add_argument("--eval-batch", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--skip-naive", action="store_true")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny model, 256 px images")
    args = parser.parse_args()
    os.environ.setdefault("MAX_PIXELS", str(1024 * 1024))
    import torch

    from benchmarks.qwen3_vl_4b import bench_model
    from components.evaluate.core import load_eval_rows, swift_generate
    from components.merge_export.core import merge_export
    from components.train_lora.core import train_lora
    from components.validate_data.core import validate_data
    from pipelines.demo.drawings import generate_dataset

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.is_available()
    summary: dict = {"gpu": torch.cuda.get_device_name(0) if gpu else "cpu", "torch": torch.__version__}
    t = time.time()
    model_dir = bench_model(out, tiny=args.tiny, reuse=False)
    summary["build_model_s"] = round(time.time() - t, 1)

    t = time.time()
    data = generate_dataset(
        out / "raw", n_train=args.n_train, n_eval=args.eval_samples, image_size=256 if args.tiny else 1024, seed=0
    )
    result = validate_data(
        [data["train"]],
        str(out / "train"),
        str(out / "eval"),
        str(out / "q.jsonl"),
        eval_files=[data["eval"]],
        model_dir=str(model_dir),
        max_length=3000,
        task="detection",
    )
    summary["validate_s"] = round(time.time() - t, 1)
    tokens = sorted((result.stats or {}).get("token_counts") or [0])
    summary["tokens_median"] = tokens[len(tokens) // 2]

    swift = {**SEED_SWIFT, "max_steps": args.steps, "save_steps": args.steps}
    if not gpu:
        swift.update(torch_dtype="float32", gradient_checkpointing=False, dataloader_num_workers=0)
    _sync()
    t = time.time()
    trained = train_lora(
        str(model_dir), "qwen3_vl", str(out / "train"), "", swift, str(out / "adapter"), str(out / "train-work")
    )
    summary["train_wall_s"] = round(time.time() - t, 1)
    summary["train_metrics"] = trained.metrics
    sps = trained.metrics.get("samples_per_second", 0.0)
    summary["lm_tokens_per_s_est"] = round(sps * summary["tokens_median"], 1)

    t = time.time()
    merged = merge_export(str(out / "adapter"), str(model_dir), str(out / "merged"), str(out / "merge-work"))
    summary["merge_wall_s"] = round(time.time() - t, 1)
    summary["merge"] = merged.metadata

    rows = load_eval_rows(out / "eval", args.eval_samples)
    timings: dict = {}
    answers, generated = swift_generate(
        str(out / "merged"), "qwen3_vl", rows, args.eval_batch, args.max_new_tokens, timings
    )
    sec = timings["generate_s"]
    summary["eval_batched"] = {
        "batch": args.eval_batch,
        "samples": len(rows),
        "seconds": round(sec, 2),
        "samples_per_s": round(len(rows) / sec, 3),
        "gen_tokens_per_s": round(generated / sec, 1),
        "generated_tokens": generated,
        "load_s": round(timings["load_s"], 1),
    }
    if not args.skip_naive:
        _, gen_naive, sec_naive = naive_generate(str(out / "merged"), rows, args.max_new_tokens)
        summary["eval_naive"] = {
            "samples": len(rows),
            "seconds": round(sec_naive, 2),
            "samples_per_s": round(len(rows) / sec_naive, 3),
            "gen_tokens_per_s": round(gen_naive / sec_naive, 1),
            "generated_tokens": gen_naive,
        }
        summary["eval_speedup_samples"] = round(
            summary["eval_batched"]["samples_per_s"] / summary["eval_naive"]["samples_per_s"], 2
        )
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print("SUMMARY " + json.dumps(summary, default=str))


if __name__ == "__main__":
    main()
