"""Unsloth on the same rows as `benchmarks/train_throughput.py` (GPU machine, issue 14's peer check).

Trains the same random-weight Qwen3-VL-4B build on the same validated rows (1024×1024
drawings, 16 samples per optimizer step as batch × accumulation, LoRA r8 / alpha 32 on the
language model's attention and MLP projections, the vision tower frozen, lr 1e-4 cosine with
5 % warm-up, bf16, no gradient checkpointing, sdpa) with Unsloth's FastVisionModel and its
vision collator, and reports what `train_throughput` reports: steady s/step between step 2
and the last, samples/s and LM tokens/s without padding (transformers' `non_padding` count), and
the peak memory. Images are kept at their size (`resize="max"`: Unsloth's collator otherwise
shrinks them to the vision config's image_size, 512² for Qwen3-VL), so the comparison is per
LM token at equal image size.

    # on the GPU machine, Unsloth's wheels in /tmp/usite, ms-swift's in /tmp/site
    PYTHONPATH=/tmp/usite:/tmp/site:$PWD HF_HUB_OFFLINE=1 python3 -m benchmarks.unsloth_peer \\
        --model /tmp/tp/model --train /tmp/tp/train-136-1024px-mp1048576 --steps 8 --batch 8 --dropout 0

Prints one `RESULT {json}` line. Not a test: Unsloth needs a GPU to import.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

IMAGE_MARK = "<image>"


def load_rows(train_dir: Path, limit: int) -> list[dict[str, Any]]:
    """The validated rows (ms-swift's messages + images) as Unsloth's conversations with PIL images."""
    from PIL import Image

    rows = []
    with open(train_dir / "data.jsonl", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            images = [Image.open(train_dir / ref).convert("RGB") for ref in row.get("images", [])]
            rows.append({"messages": to_conversation(row["messages"], images)})
            if len(rows) >= limit:
                break
    return rows


def to_conversation(messages: list[dict[str, Any]], images: list[Any]) -> list[dict[str, Any]]:
    """ms-swift's `<image>` markers in the text become image items, in order (pure)."""
    pending = list(images)
    out = []
    for message in messages:
        parts = str(message["content"]).split(IMAGE_MARK)
        content: list[dict[str, Any]] = []
        for i, text in enumerate(parts):
            if i > 0:
                if not pending:
                    raise ValueError(f"more {IMAGE_MARK} markers than images ({len(images)})")
                content.append({"type": "image", "image": pending.pop(0)})
            if text:
                content.append({"type": "text", "text": text})
        out.append({"role": message["role"], "content": content})
    if pending:
        raise ValueError(f"{len(pending)} image(s) without an {IMAGE_MARK} marker")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--train", required=True, help="a validated training folder (data.jsonl + images/)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--samples-per-step", type=int, default=16)
    parser.add_argument("--dropout", type=float, default=0.0, help="lora_dropout (Unsloth's default 0)")
    parser.add_argument("--load-in-4bit", action="store_true", help="QLoRA: Unsloth's 4-bit (bitsandbytes nf4) base")
    parser.add_argument(
        "--gc", choices=("false", "true", "unsloth"), default="false",
        help='use_gradient_checkpointing: off, torch\'s, or "unsloth" (checkpointed inputs offloaded to host memory)',
    )  # fmt: skip
    parser.add_argument("--cap-gib", type=float, default=0.0, help="GPU memory cap, GiB (a smaller card); 0 = none")
    parser.add_argument("--out", default="/tmp/unsloth_peer")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch
    import unsloth  # first of the training libraries: it patches transformers / peft / trl on import
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer
    from unsloth import FastVisionModel
    from unsloth.trainer import UnslothVisionDataCollator

    accum = args.samples_per_step // args.batch
    if args.cap_gib:  # as train-lora's memory cap (speed-up item 11) stands in for a smaller card
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gib * 1024**3 / total), 0)
    gc = {"false": False, "true": True, "unsloth": "unsloth"}[args.gc]
    rows = load_rows(Path(args.train), args.samples_per_step * args.steps)
    start = time.time()
    model, tokenizer = FastVisionModel.from_pretrained(
        args.model, load_in_4bit=args.load_in_4bit, dtype=torch.bfloat16, max_seq_length=3000,
        use_gradient_checkpointing=gc,
    )  # fmt: skip
    model = FastVisionModel.get_peft_model(
        model,
        finetune_vision_layers=False,
        finetune_language_layers=True,
        finetune_attention_modules=True,
        finetune_mlp_modules=True,
        r=8,
        lora_alpha=32,
        lora_dropout=args.dropout,
        bias="none",
        random_state=42,
        use_gradient_checkpointing=gc,
    )
    FastVisionModel.for_training(model)
    load_s = time.time() - start
    collator = UnslothVisionDataCollator(model, tokenizer, resize="max")
    events: list = []
    seen: list[int] = []
    losses: dict[int, float] = {}

    class Clock(TrainerCallback):
        def on_step_end(self, _args, state, control, **kwargs):
            # a CUDA event, not a wait for the GPU: the host may prepare the next step while the GPU works, as in
            # train_throughput's runs (until 2026-11-26 this waited, which left the GPU idle at each step's start)
            events.append(torch.cuda.Event(enable_timing=True))
            events[-1].record()
            seen.append(int(state.num_input_tokens_seen))  # without padding (see the config)

        def on_log(self, _args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                losses[int(state.global_step)] = float(logs["loss"])

    config = SFTConfig(
        output_dir=args.out,
        per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=accum,
        max_steps=args.steps,
        learning_rate=1e-4,
        warmup_ratio=0.05,
        lr_scheduler_type="cosine",
        bf16=True,
        logging_steps=1,
        logging_nan_inf_filter=False,  # as train-lora sets it (a host wait for every backward otherwise)
        optim="adamw_torch",
        seed=42,
        report_to="none",
        save_strategy="no",
        remove_unused_columns=False,
        dataset_text_field="",
        dataset_kwargs={"skip_prepare_dataset": True},
        max_length=3000,
        dataloader_num_workers=4,  # as train_throughput's runs
        include_num_input_tokens_seen="non_padding",
    )
    trainer = SFTTrainer(
        model=model,
        tokenizer=tokenizer,
        data_collator=collator,
        train_dataset=rows,
        args=config,
        callbacks=[Clock()],
    )
    torch.cuda.reset_peak_memory_stats()
    trainer.train()
    torch.cuda.synchronize()
    stamps = [events[0].elapsed_time(e) / 1000 for e in events]  # seconds on the GPU's clock since step 1 ended
    steady = stamps[-1] - stamps[1] if len(stamps) > 2 else 0.0
    steps = len(stamps) - 2
    steady_tokens = seen[-1] - seen[1] if len(seen) > 2 else 0
    seconds_per_step = steady / steps if steps > 0 else 0.0
    result = {
        "peer": "unsloth",
        "versions": {"unsloth": getattr(unsloth, "__version__", "?"), "torch": torch.__version__},
        "batch": args.batch,
        "grad_accum": accum,
        "load_in_4bit": args.load_in_4bit,
        "gradient_checkpointing": args.gc,
        "cap_gib": args.cap_gib or None,
        "lora_dropout": args.dropout,
        "load_s": round(load_s, 1),
        "steps": len(stamps),
        "seconds_per_step": round(seconds_per_step, 3),
        "samples_per_second": round(args.samples_per_step / seconds_per_step, 3) if seconds_per_step else 0.0,
        "tokens_per_second": round(steady_tokens / steady, 1) if steady else 0.0,
        "tokens_per_sample": round(seen[-1] / max(len(seen) * args.samples_per_step, 1), 1) if seen else 0.0,
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 1024**3, 2),
        "losses": losses,
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
