"""Training throughput of the train-lora task: the seed settings vs tuned profiles.

Runs on the GPU machine (not a test). Builds the real Qwen3-VL-4B-Instruct architecture
with random bf16 weights and seed-shaped data (1024x1024 synthetic drawings, fenced JSON
answers), validates it with the validate-data core, then runs the train-lora core
(`swift sft`) once per profile for a fixed number of optimizer steps and prints, per
profile: s/step, samples/s, LM tokens/s (text + image tokens, padding excluded, counted by
transformers), MFU and HFU (FLOP formula in benchmarks/throughput.py), peak memory and the
loss at each step.

Images are trained at ms-swift's `max_pixels` (--max-pixels, default 1024x1024 px: the
`swift sft --max_pixels` argument), and the FLOPs are counted from what was trained: the
validate-data check and `sample_stats` (ms-swift's own template encode) take the same
max_pixels. The MIN_PIXELS / MAX_PIXELS / IMAGE_*_TOKEN_NUM environment variables would
resize images behind the count's back, so they are refused.

Every profile trains the same thing as the seed: the seed config's `swift` section
(configs/qwen3_vl_4b/lora_seed.yaml: LoRA r8/a32, lr 1e-4, bf16, max_length 3000) with
the same samples per optimizer step (--samples-per-step, default 16 = what ms-swift's
default gradient accumulation gives the seed's batch 1 on one GPU) and the same seed, so
the same samples go into each step; only how they are computed changes. Gradient
accumulation is derived: samples per step / (per-device batch x GPUs).

    python -m benchmarks.train_throughput --out DIR [--steps 8] [--profiles seed,b16_gc_novitgc,...]
        [--max-pixels 1048576] [--image-size 1024] [--warmup-steps 0]
    CUDA_VISIBLE_DEVICES=0 python -m benchmarks.train_throughput ...   # one GPU of a larger host

Prints `RESULT {...}` per profile (`WARMUP {...}` for the unreported warm-up run) and a final table;
writes DIR/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.throughput import (
    ArchShape,
    SampleStats,
    flops_per_sample,
    losses_at,
    peak_flops_for,
    steady_state,
    utilisation,
)

PROFILE_PLUGIN = str(Path(__file__).with_name("profile_plugin.py"))
SEED_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "qwen3_vl_4b" / "lora_seed.yaml"


# One change at a time on top of the seed settings. `batch` is the per-device batch;
# everything else is an ms-swift argument.
def nogc_liger(batch: int, **settings: Any) -> dict[str, Any]:
    """A profile with `batch` rows per micro-batch, no checkpointing and Liger, plus `settings`."""
    return {"batch": batch, "gradient_checkpointing": False, "use_liger_kernel": True, **settings}


def auto_liger(**settings: Any) -> dict[str, Any]:
    """A profile that leaves micro-batch and checkpointing to the planner, with Liger, plus `settings`."""
    return {"batch": "auto", "gradient_checkpointing": "auto", "use_liger_kernel": True, **settings}


PROFILES: dict[str, dict[str, Any]] = {
    "seed": {"batch": 1},
    # the seed's multi-GPU default (DESIGN: ZeRO-3 when more than one GPU)
    "seed_zero3": {"batch": 1, "deepspeed": "zero3"},
    # the frozen ViT gets no gradients (ms-swift otherwise checkpoints it and back-propagates
    # through all 24 blocks because vit_gradient_checkpointing follows gradient_checkpointing)
    "seed_novitgc": {"batch": 1, "vit_gradient_checkpointing": False},
    "b4_gc": {"batch": 4, "vit_gradient_checkpointing": False},
    "b16_gc": {"batch": 16, "vit_gradient_checkpointing": False},
    "b16_gc_liger": {"batch": 16, "vit_gradient_checkpointing": False, "use_liger_kernel": True},
    "b4_nogc_liger": nogc_liger(4),
    "b8_nogc_liger": nogc_liger(8),
    # the planner (swift.per_device_train_batch_size / gradient_checkpointing: auto, issue 14)
    "auto_liger": auto_liger(),
    # across GPUs: ZeRO-2 set by the config (the strategy rule picked it until 2026-11-26), plain DDP (picks it now)
    "auto_liger_zero2": auto_liger(deepspeed="zero2"),
    "auto_liger_ddp": auto_liger(deepspeed="none"),
    # DDP without the search for unused parameters (transformers asks DDP for it whenever the model is not a bare
    # PreTrainedModel, as peft's wrapper is not: a walk of the autograd graph after every forward)
    "auto_liger_nounused": auto_liger(ddp_find_unused_parameters=False),
    # without LoRA dropout (Unsloth's default), to compare with benchmarks/unsloth_peer.py at the same plan
    "auto_liger_nodrop": auto_liger(lora_dropout=0.0),
    # the MLP's SiLU-multiply product kept for the down projection's LoRA backward (the plugin computes it again
    # there from gate and up, VLM_LORA_SILU_MUL_DOWN): the planner's per-token figure then has the product in it
    "auto_liger_nodrop_keepprod": auto_liger(lora_dropout=0.0, env={"VLM_LORA_SILU_MUL_DOWN": "0"}),
    "b8_nogc_liger_keepprod": nogc_liger(8, env={"VLM_LORA_SILU_MUL_DOWN": "0"}),
    "b8_nogc_liger_nodrop_keepprod": nogc_liger(8, lora_dropout=0.0, env={"VLM_LORA_SILU_MUL_DOWN": "0"}),
    # LoRA's dropout masks by PyTorch's kernel, kept for the backward, forced (the planner asks the plugin for masks
    # from seeds, VLM_LORA_SEEDED_DROPOUT=1, where they let a faster plan fit) / seeds forced at a fixed plan
    "b8_nogc_liger_seeded": nogc_liger(8, env={"VLM_LORA_SEEDED_DROPOUT": "1"}),
    "auto_liger_storedmask": auto_liger(env={"VLM_LORA_SEEDED_DROPOUT": "0"}),
    "auto_liger_seeded": auto_liger(env={"VLM_LORA_SEEDED_DROPOUT": "1"}),
    "b8_nogc_liger_storedmask": nogc_liger(8, env={"VLM_LORA_SEEDED_DROPOUT": "0"}),
    # the vision tower as transformers runs it (Conv3d patch embedding, float32 rotary and norms under autocast):
    # the plugin's fewer-kernel forward off (VLM_LORA_FAST_VISION=0)
    "auto_liger_slowvis": auto_liger(env={"VLM_LORA_FAST_VISION": "0"}),
    "auto_liger_nodrop_slowvis": auto_liger(lora_dropout=0.0, env={"VLM_LORA_FAST_VISION": "0"}),
    # the loss logged every 2nd step (the configs log every 5th): a logging step makes the host wait for the GPU
    # (`.item()`) before it prepares the next step
    "auto_liger_log2": auto_liger(logging_steps=2),
    "auto_liger_nodrop_log2": auto_liger(lora_dropout=0.0, logging_steps=2),
    # transformers' NaN / Inf filter of the logged loss, which train-lora turns off since 2026-11-26 (benchmarks/
    # README.md, "Seeded dropout on its own tiles, no wait for every backward"): it makes the host wait for each
    # micro-step's backward (`torch.isnan(loss)` in a Python `if`)
    # DDP's communication (2026-11-26, "Where two GPUs lose their time, and DDP's gradients in one bucket"): without
    # the per-forward broadcast of buffers (Qwen-VL's only buffers are rotary tables that training never changes),
    # and with one bucket for all LoRA gradients (one all-reduce after the backward, no NCCL kernel waiting on the
    # other rank beside the backward's). Measured as profiles before the train-lora plugin made both its default
    # (ddp_comm.py); `_ddpdefault` is transformers' defaults since then
    "auto_liger_nobcast": auto_liger(ddp_broadcast_buffers=False),
    "auto_liger_onebucket": auto_liger(ddp_broadcast_buffers=False, ddp_bucket_cap_mb=256),
    "auto_liger_ddpdefault": auto_liger(env={"VLM_LORA_DDP_COMM": "0"}),
    # the loss logged every 5th step as the configs do (the benchmark logs every step by default, a host wait for the
    # GPU at each step's end). The garbage-collection profiles (autogc) went with item 15, the compiled-layer ones
    # (compile, cc, cvis) with item 4, both deleted 2026-11-28
    "auto_liger_log5": auto_liger(logging_steps=5),
    # where an 8-row micro-step's host falls behind its GPU (2026-11-26, "The host behind an 8-row micro-step"):
    # PyTorch's fused RMSNorm instead of Liger's (item 9: one dispatcher call, 18 % less host time per layer) and
    # ms-swift's `logits_to_keep` off (its `.item()` at each micro-step's start makes the host wait for the token
    # count's all-gather, that is for the other rank)
    "auto_liger_log5_torchnorm": auto_liger(logging_steps=5, env={"VLM_LORA_TORCH_RMS_NORM": "1"}),
    "auto_liger_log5_nokeep": auto_liger(logging_steps=5, use_logits_to_keep=False),
    "auto_liger_log5_nokeep_torchnorm": auto_liger(
        logging_steps=5, use_logits_to_keep=False, env={"VLM_LORA_TORCH_RMS_NORM": "1"}
    ),
    # Liger's RMSNorm under several processes (the plugin uses torch's there since 2026-11-26, "The host behind an
    # 8-row micro-step") / the vision tower's index work on the GPU from the device grid (before the plugin computed
    # it from the host copy, same section)
    "auto_liger_log5_ligernorm": auto_liger(logging_steps=5, env={"VLM_LORA_TORCH_RMS_NORM": "0"}),
    "auto_liger_log5_nogrid": auto_liger(logging_steps=5, env={"VLM_LORA_HOST_VISION_GRID": "0"}),
    # the LoRA functions casting the adapters in every forward and scaling in kernels of their own in the backward
    # (before the plugin kept the casts between forwards and folded the scaling, 2026-11-26, "Fewer launches per LoRA
    # layer")
    "auto_liger_log5_nocast": auto_liger(
        logging_steps=5, env={"VLM_LORA_CAST_CACHE": "0", "VLM_LORA_FOLD_SCALING": "0"}
    ),
    # the model's forward reading its token counts, padding and deepstack positions from the GPU where it needs
    # them (before the plugin copied them to the host once at the forward's start, 2026-11-26, same section)
    "auto_liger_log5_nofacts": auto_liger(logging_steps=5, env={"VLM_LORA_FORWARD_FACTS": "0"}),
    # all three changes of "Fewer launches per LoRA layer" (2026-11-26) off: the final two-GPU configuration of
    # "The host behind an 8-row micro-step"
    "auto_liger_log5_before19": auto_liger(
        logging_steps=5,
        env={"VLM_LORA_CAST_CACHE": "0", "VLM_LORA_FOLD_SCALING": "0", "VLM_LORA_FORWARD_FACTS": "0"},
    ),
    # each step's batch copied to the GPU with a wait, and ms-swift's logits_to_keep and the forward's facts read from
    # the GPU (before the plugin read them from the batch's host copies and queued the copy without waiting,
    # 2026-11-26, "The step boundary: ms-swift's waits for the GPU between steps")
    "auto_liger_log5_nobatchfacts": auto_liger(logging_steps=5, env={"VLM_LORA_BATCH_FACTS": "0"}),
    # ms-swift's NaN check of the gradient norm read on the host at every optimizer step (before the plugin decided
    # it on the GPU, same section), and both of that section's changes off
    "auto_liger_log5_nangrad": auto_liger(logging_steps=5, env={"VLM_LORA_GRAD_NAN_ON_GPU": "0"}),
    "auto_liger_log5_before20": auto_liger(
        logging_steps=5, env={"VLM_LORA_GRAD_NAN_ON_GPU": "0", "VLM_LORA_BATCH_FACTS": "0"}
    ),
    # the loss reading the GPU three times per micro-step: the labelled rows, Liger's count of them and its check of
    # the loss's gradient (before the plugin took them from the labels' host copy, 2026-11-27, "The step boundary and
    # the loss without waits")
    "auto_liger_log5_losswait": auto_liger(logging_steps=5, env={"VLM_LORA_LOSS_NO_WAIT": "0"}),
    # Liger's loss over every position (item 5 off, and with it item 18, which hands item 5 its rows): issue 42
    "auto_liger_log5_nolabelrows": auto_liger(logging_steps=5, env={"VLM_LORA_LABEL_ROWS_LOSS": "0"}),
    # the plugin items whose gain the records put inside the spread, all off together (issue 42, 2026-11-28): the LM
    # head on labelled rows and the loss without waits (items 5, 18), the vision grid and the forward's facts on the
    # host (item 7's second part), torch's RMSNorm (item 9: on with several processes; item 15 was deleted),
    # the cast cache and the folded scaling (item 3's launches): what the layer is without them
    "auto_liger_log5_lean": auto_liger(
        logging_steps=5,
        env={
            "VLM_LORA_LABEL_ROWS_LOSS": "0",
            "VLM_LORA_LOSS_NO_WAIT": "0",
            "VLM_LORA_HOST_VISION_GRID": "0",
            "VLM_LORA_FORWARD_FACTS": "0",
            "VLM_LORA_TORCH_RMS_NORM": "0",
            "VLM_LORA_CAST_CACHE": "0",
            "VLM_LORA_FOLD_SCALING": "0",
        },
    ),
    # DDP copying each gradient into its bucket and back (before the plugin made them views of the bucket)
    "auto_liger_log5_noview": auto_liger(logging_steps=5, env={"VLM_LORA_DDP_BUCKET_VIEW": "0"}),
    # each batch's copy to the GPU without waiting (accelerate's non_blocking, from pinned memory): the host no longer
    # waits at each step's start for the GPU to finish the step before
    "b8_nogc_liger_nonblock": nogc_liger(8, accelerator_config={"dispatch_batches": False, "non_blocking": True}),
    "auto_liger_nonblock": auto_liger(accelerator_config={"dispatch_batches": False, "non_blocking": True}),
    "auto_liger_nanfilter": auto_liger(logging_nan_inf_filter=True),
    "auto_liger_nodrop_nanfilter": auto_liger(lora_dropout=0.0, logging_nan_inf_filter=True),
    # attention kernels (issue 14: no config set attn_impl; flash-attn is not on the GPU machine):
    # transformers' default for Qwen3-VL is sdpa; eager and flex_attention are torch's others
    # ms-swift's padding-free batches (rows concatenated, no pad tokens) without the flash-attn
    # package: transformers 5 builds packed-sequence masks for sdpa from the position ids
    "b8_nogc_liger_padfree": nogc_liger(8, padding_free=True),
    # length grouping (ms-swift's group_by_length: batches of similar lengths, less padding)
    "auto_liger_grouped": auto_liger(group_by_length=True),
    "b4_nogc_liger_eager": nogc_liger(4, attn_impl="eager"),
    "b4_nogc_liger_sdpa": nogc_liger(4, attn_impl="sdpa"),
    "b4_nogc_liger_flex": nogc_liger(4, attn_impl="flex_attention"),
    "b8_nogc_liger_flex": nogc_liger(8, attn_impl="flex_attention"),
    # a 40 GB card (the seed's A100 40GB) stood in for by a memory cap on a larger GPU
    "auto_liger_40g": auto_liger(env={"VLM_LORA_GPU_MEMORY_GIB": "39.4"}),
    "seed_40g": {"batch": 1, "env": {"VLM_LORA_GPU_MEMORY_GIB": "39.4"}},
    "b4_nogc_liger_40g": nogc_liger(4, env={"VLM_LORA_GPU_MEMORY_GIB": "39.4"}),
    "b16_gc_liger_w8": {
        "batch": 16,
        "vit_gradient_checkpointing": False,
        "use_liger_kernel": True,
        "dataloader_num_workers": 8,
        "dataloader_prefetch_factor": 4,
    },
    "b16_gc_liger_fusedadam": {
        "batch": 16,
        "vit_gradient_checkpointing": False,
        "use_liger_kernel": True,
        "optim": "adamw_torch_fused",
    },
    "b8_nogc_liger_nodrop": nogc_liger(8, lora_dropout=0.0),
    # ms-swift's logits_to_keep off (its `.item()` at every micro-step's start; with Liger the train-lora plugin
    # hands the loss the labelled rows anyway) / each micro-step's token count read at once (transformers' way)
    "b8_nogc_liger_nokeep": nogc_liger(8, use_logits_to_keep=False),
    "b8_nogc_liger_nodrop_nokeep": nogc_liger(8, lora_dropout=0.0, use_logits_to_keep=False),
    "b8_nogc_liger_syncount": nogc_liger(8, env={"VLM_LORA_ASYNC_TOKENS": "0"}),
    # Qwen3-VL's deepstack additions by boolean mask, as transformers / ms-swift do them (the plugin adds by position)
    "b8_nogc_liger_maskdeep": nogc_liger(8, env={"VLM_LORA_INDEX_DEEPSTACK": "0"}),
    "b8_nogc_liger_nodrop_maskdeep": nogc_liger(8, lora_dropout=0.0, env={"VLM_LORA_INDEX_DEEPSTACK": "0"}),
    "b8_nogc_liger_nodrop_syncount": nogc_liger(8, lora_dropout=0.0, env={"VLM_LORA_ASYNC_TOKENS": "0"}),
    # torch's fused RMSNorm in place of Liger's (train-lora plugin, VLM_LORA_TORCH_RMS_NORM=1: with one process)
    "b8_nogc_liger_torchnorm": nogc_liger(8, env={"VLM_LORA_TORCH_RMS_NORM": "1"}),
    "b8_nogc_liger_nodrop_torchnorm": nogc_liger(8, lora_dropout=0.0, env={"VLM_LORA_TORCH_RMS_NORM": "1"}),
    # without dropout, the plugin's LoRA function instead of its lean path (autograd's own nodes)
    "b8_nogc_liger_nodrop_nolean": nogc_liger(8, lora_dropout=0.0, env={"VLM_LORA_LEAN_LORA": "0"}),
    # without dropout, one rank-r matmul per LoRA layer (the plugin groups q/k/v and gate/up by their shared input)
    "b8_nogc_liger_nodrop_nogroup": nogc_liger(8, lora_dropout=0.0, env={"VLM_LORA_GROUP_LORA": "0"}),
    # the LoRA product added out of place (a copy of each adapted layer's output first; the plugin adds in place)
    "b8_nogc_liger_copyadd": nogc_liger(8, env={"VLM_LORA_INPLACE_ADD": "0"}),
    "b8_nogc_liger_nodrop_copyadd": nogc_liger(8, lora_dropout=0.0, env={"VLM_LORA_INPLACE_ADD": "0"}),
    # the frozen layer before the LoRA function instead of inside it (two input gradients added by autograd)
    "b8_nogc_liger_apart": nogc_liger(8, env={"VLM_LORA_FUSED_BASE": "0"}),
    # LoRA's backward with dropout by PyTorch's kernels (the plugin's Triton kernels turned off)
    "b8_nogc_liger_notriton": nogc_liger(8, env={"VLM_LORA_TRITON_LORA": "0"}),
    "b8_nogc_liger_w8": nogc_liger(8, dataloader_num_workers=8, dataloader_prefetch_factor=4),
    # the same with the caching allocator's expandable segments (less fragmentation: headroom)
    "b8_nogc_liger_exp": nogc_liger(8, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    # peft's own LoRA forward (the train-lora plugin's fused LoRA branch turned off)
    "b8_nogc_liger_peftfwd": nogc_liger(8, env={"VLM_LORA_FUSED_LORA": "0"}),
    "auto_liger_peftfwd": auto_liger(env={"VLM_LORA_FUSED_LORA": "0"}),
    # peft's float32 input casts restored (the train-lora plugin skips them under autocast); on peft's
    # own forward, since the fused LoRA branch never makes those casts
    "b8_nogc_liger_peftcast": nogc_liger(8, env={"VLM_LORA_PEFT_INPUT_CAST": "1", "VLM_LORA_FUSED_LORA": "0"}),
    "b16_gc_liger_peftcast": {
        "batch": 16,
        "vit_gradient_checkpointing": False,
        "use_liger_kernel": True,
        "env": {"VLM_LORA_PEFT_INPUT_CAST": "1", "VLM_LORA_FUSED_LORA": "0"},
    },
    # transformers' padding mask kept for right-padded batches (the train-lora plugin uses the causal flag)
    "b8_nogc_liger_padmask": nogc_liger(8, env={"VLM_LORA_RIGHT_PAD_CAUSAL": "0"}),
    # PyTorch's SiLU and multiply in the MLPs (the train-lora plugin gives them Liger's fused kernel)
    "b8_nogc_liger_noswiglu": nogc_liger(8, env={"VLM_LORA_LIGER_SWIGLU": "0"}),
    # Liger's fused loss over every position (the train-lora plugin hands it the labelled rows only)
    "b8_nogc_liger_allrows": nogc_liger(8, env={"VLM_LORA_LABEL_ROWS_LOSS": "0"}),
    "b8_nogc_liger_ddp": nogc_liger(8, deepspeed="none"),
    # the seed and the best H100 profile under torch.profiler (a window of micro-steps)
    "seed_prof": {
        "batch": 1,
        "external_plugins": ["PROFILE_PLUGIN"],
        "env": {"VLM_LORA_PROFILE_START": "20", "VLM_LORA_PROFILE_STEPS": "8"},
    },
    "b8_nogc_liger_compile": nogc_liger(8, torch_compile=True),
    "b16_gc_liger_nodrop": {
        "batch": 16,
        "vit_gradient_checkpointing": False,
        "use_liger_kernel": True,
        "lora_dropout": 0.0,
    },
    # the leanest plans (issue 53: the smallest card): one or two rows per micro-step, every layer checkpointed
    "b1_gc_liger": {"batch": 1, "vit_gradient_checkpointing": False, "use_liger_kernel": True, "logging_steps": 5},
    "b2_gc_liger": {"batch": 2, "vit_gradient_checkpointing": False, "use_liger_kernel": True, "logging_steps": 5},
    # the same with the checkpointed layers' inputs in pinned host memory (item 19's offload)
    "b1_gc_liger_offload": {
        "batch": 1, "vit_gradient_checkpointing": False, "use_liger_kernel": True, "logging_steps": 5,
        "env": {"VLM_LORA_CHECKPOINT_LAYERS": "99", "VLM_LORA_CHECKPOINT_OFFLOAD": "1"},
    },
    "b16_gc_liger_log5": {"batch": 16, "vit_gradient_checkpointing": False, "use_liger_kernel": True, "logging_steps": 5},
    "b16_nogc_liger_log5": nogc_liger(16, logging_steps=5),
}  # fmt: skip

# `<profile>@nf4` / `@int8`: the same on a bitsandbytes base (the config's `model.quantization`, as swift arguments);
# `<profile>@capX`: under a memory cap of X GiB (VLM_LORA_GPU_MEMORY_GIB: a card of that size stood in for)
SUFFIX = "@"


PROFILED_SUFFIX = "_prof"
PROFILE_WINDOW = {"VLM_LORA_PROFILE_START": "4", "VLM_LORA_PROFILE_STEPS": "4"}
# `<profile>_profstack`: the same with Python stacks, so that the profile names the code before each long GPU wait
STACK_SUFFIX = "_profstack"


def profile_settings(name: str) -> dict[str, Any]:
    """A profile's settings; `<profile>_prof` is that profile under torch.profiler (micro-steps 4-7); `@nf4`, `@int8`
    and `@capX` suffixes as `SUFFIX` says."""
    if SUFFIX in name:
        from components.common.quantization import swift_quant_args

        base, *tags = name.split(SUFFIX)
        settings = dict(profile_settings(base))
        env = dict(settings.get("env", {}))
        for tag in tags:
            if tag in ("nf4", "int8"):
                settings.update(swift_quant_args(tag))
            elif tag.startswith("cap") and tag[3:].replace(".", "", 1).isdigit():
                env["VLM_LORA_GPU_MEMORY_GIB"] = tag[3:]
            else:
                raise SystemExit(f"profile {name}: unknown suffix {SUFFIX}{tag} (nf4, int8, capX)")
        return {**settings, "env": env} if env else settings
    if name in PROFILES:
        return PROFILES[name]
    stack = name.endswith(STACK_SUFFIX)
    suffix = STACK_SUFFIX if stack else PROFILED_SUFFIX
    base = name[: -len(suffix)] if name.endswith(suffix) else ""
    if base not in PROFILES:
        raise SystemExit(
            f"unknown profile {name!r}; known: {', '.join(PROFILES)} (and any of them + {PROFILED_SUFFIX!r})"
        )
    settings = dict(PROFILES[base])
    settings["external_plugins"] = [*settings.get("external_plugins", []), "PROFILE_PLUGIN"]
    settings["env"] = {
        **settings.get("env", {}),
        **PROFILE_WINDOW,
        **({"VLM_LORA_PROFILE_STACK": "1"} if stack else {}),
    }
    return settings


DEFAULT_MAX_PIXELS = 1024 * 1024
# environment variables through which ms-swift's qwen_vl_utils would resize images (swift/model/models/qwen.py)
RESIZE_ENV = ("MAX_PIXELS", "MIN_PIXELS", "IMAGE_MAX_TOKEN_NUM", "IMAGE_MIN_TOKEN_NUM", "SPATIAL_MERGE_SIZE")


def seed_swift_args(max_pixels: int = 0) -> dict[str, Any]:
    """The seed config's `swift` section (the one users run), with ms-swift's `max_pixels`.

    Args:
        max_pixels: ms-swift's `max_pixels` argument, px (images of a larger area are scaled
            down to it); 0 = the section's own (none in the seed). Default 0.

    Returns:
        The `swift sft` arguments.
    """
    from pipelines.config import load_config

    args = dict(load_config(SEED_CONFIG).swift)
    if max_pixels:
        args["max_pixels"] = max_pixels
    return args


def check_resize_env(environ: dict[str, str] | None = None) -> None:
    """Refuses resize settings in the environment, which training would see and the token count not.

    Args:
        environ: Environment to check. Default os.environ.

    Raises:
        SystemExit: One of RESIZE_ENV is set; the message names it and the fix.
    """
    found = [k for k in RESIZE_ENV if k in (os.environ if environ is None else environ)]
    if found:
        raise SystemExit(
            f"{', '.join(found)} set in the environment: ms-swift would resize the images with it but the FLOP "
            "count would not; unset it and pass --max-pixels N (ms-swift's max_pixels argument) instead"
        )


def profile_args(
    name: str, overrides: dict[str, Any], samples_per_step: int, gpus: int, steps: int, base: dict[str, Any]
) -> dict[str, Any]:
    """The swift arguments of one profile run."""
    if overrides.get("batch") == "auto":  # the planner splits what batch 1 would do: samples_per_step / GPUs each
        args = {**base, **{k: v for k, v in overrides.items() if k not in ("batch", "env")}}
        args.update(
            per_device_train_batch_size="auto",
            gradient_accumulation_steps=samples_per_step // gpus,
            max_steps=steps, save_steps=steps, logging_steps=overrides.get("logging_steps", 1), save_only_model=True,
            report_to="none", eval_strategy="no",
        )  # fmt: skip
        for key in ("eval_steps", "save_total_limit", "num_train_epochs"):
            args.pop(key, None)
        return args
    batch = int(overrides.get("batch", 1))
    if samples_per_step % (batch * gpus):
        raise SystemExit(
            f"profile {name}: {samples_per_step} samples per step do not split into batch {batch} x {gpus} GPU(s)"
        )
    args = {**base, **{k: v for k, v in overrides.items() if k not in ("batch", "env")}}
    args.update(
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=samples_per_step // (batch * gpus),
        max_steps=steps,
        save_steps=steps,
        logging_steps=overrides.get("logging_steps", 1),
        save_only_model=True,
        report_to="none",
        eval_strategy="no",
    )
    for key in ("eval_steps", "save_total_limit", "num_train_epochs"):
        args.pop(key, None)
    return args


def sample_stats(
    dataset_dir: Path, model_dir: Path, limit: int = 0, max_pixels: int = 0
) -> tuple[SampleStats, dict[str, float]]:
    """Per-sample tokens, label tokens and ViT patches of what training encodes.

    Each row goes through ms-swift's own Qwen3-VL template (`Template.encode` in train
    mode), so the counts are the trained ones: images resized as ms-swift resizes them.

    Args:
        dataset_dir: A dataset folder (data.jsonl + images/).
        model_dir: The model folder (its tokenizer and processor).
        limit: Rows to count; 0 = all. Default 0.
        max_pixels: ms-swift's `max_pixels` argument that training gets, px; 0 = none.
            Default 0.

    Returns:
        (SampleStats, summary: samples, tokens_mean/median/min/max, labels_mean,
        patches_mean, max_pixels).
    """
    from swift.model import get_processor
    from swift.template import get_template

    processor = get_processor(str(model_dir), model_type="qwen3_vl")
    template = get_template(processor, max_pixels=max_pixels or None)
    template.set_mode("train")
    rows = [json.loads(x) for x in (dataset_dir / "data.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    if limit:
        rows = rows[:limit]
    samples = []
    for row in rows:
        images = [str(dataset_dir / p) for p in row.get("images", [])]
        enc = template.encode({"messages": row["messages"], "images": images})
        labels = sum(1 for label in enc["labels"] if label != -100)
        grid = enc["image_grid_thw"].tolist() if images else []
        samples.append((len(enc["input_ids"]), labels, [int(t * h * w) for t, h, w in grid]))
    stats = SampleStats.from_samples(samples)
    tokens = sorted(t for t, _, _ in samples)
    return stats, {
        "samples": len(samples),
        "tokens_mean": stats.tokens,
        "tokens_median": tokens[len(tokens) // 2],
        "tokens_min": tokens[0],
        "tokens_max": tokens[-1],
        "labels_mean": stats.labels,
        "patches_mean": stats.patches,
        "max_pixels": max_pixels,
    }


def run_profile(
    name: str,
    args: dict[str, Any],
    model_dir: Path,
    train_dir: Path,
    out: Path,
    gpus: int,
    arch: ArchShape,
    stats: SampleStats,
    peak: float,
    samples_per_step: int,
) -> dict[str, Any]:
    """Trains one profile with the train-lora core and measures it."""
    import torch

    from components.train_lora.core import TrainError, train_lora

    visible = torch.cuda.device_count()
    torch.cuda.empty_cache()
    start = time.time()
    row: dict[str, Any] = {
        "profile": name,
        "gpus": gpus,
        "batch": args["per_device_train_batch_size"],
        "grad_accum": args["gradient_accumulation_steps"],
        "samples_per_step": samples_per_step,
        "settings": {k: v for k, v in args.items() if k in PROFILE_KEYS},
    }
    env = dict(profile_settings(name).get("env", {}))
    if "external_plugins" in args:
        args["external_plugins"] = [PROFILE_PLUGIN if p == "PROFILE_PLUGIN" else p for p in args["external_plugins"]]
        env["VLM_LORA_PROFILE_OUT"] = str(out / f"{name}.profile.json")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    if env:
        row["env"] = env
    try:
        result = train_lora(
            str(model_dir),
            "qwen3_vl",
            str(train_dir),
            "",
            args,
            str(out / name / "adapter"),
            str(out / name / "work"),
            expected_gpus=gpus if visible else 0,
        )
    except TrainError as exc:
        row.update(error=str(exc)[:300], wall_s=round(time.time() - start, 1))
        return row
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if "plan_micro_batch" in result.metrics:  # what the planner chose
        row.update(batch=result.metrics["plan_micro_batch"], grad_accum=result.metrics["plan_grad_accum"])
        row["plan"] = {k: v for k, v in result.metrics.items() if k.startswith("plan_") or k == "oom_replans"}
        args = {**args, "gradient_checkpointing": bool(result.metrics["plan_gradient_checkpointing"])}
    steady = steady_state(result.log_history, skip_steps=SKIP_STEPS)
    sps = samples_per_step / steady["seconds_per_step"] if steady else 0.0
    gc_on = bool(args.get("gradient_checkpointing", True))
    vit_gc = args.get("vit_gradient_checkpointing")
    vit_gc = gc_on if vit_gc is None else bool(vit_gc)
    flops = flops_per_sample(
        arch, stats, int(args.get("lora_rank", 8)), lm_recompute=gc_on, vit_backward=vit_gc, vit_recompute=vit_gc
    )
    util = utilisation(flops, sps, gpus, peak)
    m = result.metrics
    row.update(
        strategy=result.strategy,
        wall_s=round(time.time() - start, 1),
        seconds_per_step=round(steady.get("seconds_per_step", 0.0), 3),
        median_seconds_per_step=round(steady.get("median_seconds_per_step", 0.0), 3),
        samples_per_second=round(sps, 3),
        tokens_per_second=round(steady.get("tokens_per_second", 0.0), 1),
        mfu=round(util["mfu"], 4),
        hfu=round(util["hfu"], 4),
        model_tflops_per_gpu=round(util["model_tflops_per_gpu"], 1),
        peak_memory_gib=m.get("peak_memory_gib"),
        trainer_samples_per_second=m.get("samples_per_second"),
        steady_steps=steady.get("steps"),
        single_steps=[round(x, 3) for x in steady.get("single_steps", [])],
        losses=losses_at(result.log_history, range(1, int(args["max_steps"]) + 1)),
    )
    row["speedups"] = {k: v for k, v in m.items() if k.startswith("speedup")}
    if "VLM_LORA_PROFILE_OUT" in env:
        row.update(rank_profiles(Path(env["VLM_LORA_PROFILE_OUT"]), gpus))
    return row


def rank_profiles(path: Path, gpus: int) -> dict[str, Any]:
    """The profile plugin's summaries: rank 0's as `torch_profile`, the other ranks' (`<path>.rank<R>`) as
    `torch_profile_ranks` {R: summary}, and `nccl_s_by_rank` (each rank's NCCL kernel time in the profiled
    window: the longer, the longer that rank waited for the others at the collectives)."""
    from benchmarks.profile_plugin import rank_path

    found: dict[int, dict[str, Any]] = {}
    for rank in range(max(gpus, 1)):
        p = Path(rank_path(str(path), rank))
        if p.is_file():
            found[rank] = json.loads(p.read_text())
    out: dict[str, Any] = {}
    if 0 in found:
        out["torch_profile"] = found[0]
    if len(found) > 1:
        out["torch_profile_ranks"] = {r: s for r, s in found.items() if r}
        out["nccl_s_by_rank"] = {r: round(s.get("by_category_s", {}).get("nccl", 0.0), 4) for r, s in found.items()}
    return out


PROFILE_KEYS = (
    "liger_kernel_config",
    "attn_impl",
    "padding_free",
    "group_by_length",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "gradient_checkpointing",
    "vit_gradient_checkpointing",
    "use_liger_kernel",
    "dataloader_num_workers",
    "optim",
    "lora_dropout",
    "attn_impl",
    "deepspeed",
    "torch_compile",
    "group_by_length",
    "padding_free",
)


def print_table(rows: list[dict[str, Any]], baseline: str = "seed") -> None:
    base = next((r for r in rows if r["profile"] == baseline and "error" not in r), None)
    print(
        f"\n{'profile':28} {'gpus':>4} {'b x ga':>7} {'s/step':>7} {'median':>7} {'samp/s':>7} {'tok/s':>8} {'MFU':>6} "
        f"{'HFU':>6} {'peak GiB':>8} {'x seed':>6}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['profile']:28} {r['gpus']:>4} {r['batch']:>3}x{r['grad_accum']:<3} {r['error'][:70]}")
            continue
        ratio = r["tokens_per_second"] / base["tokens_per_second"] if base and base["tokens_per_second"] else 0.0
        print(
            f"{r['profile']:28} {r['gpus']:>4} {r['batch']:>3}x{r['grad_accum']:<3} {r['seconds_per_step']:>7.3f} "
            f"{r.get('median_seconds_per_step', 0.0):>7.3f} "
            f"{r['samples_per_second']:>7.2f} {r['tokens_per_second']:>8.0f} {r['mfu']:>6.1%} {r['hfu']:>6.1%} "
            f"{(r['peak_memory_gib'] or 0):>8.2f} {ratio:>6.2f}"
        )


def validated_data(
    out: Path, n_train: int, model_dir: Path, swift_args: dict[str, Any], image_size: int | list[int]
) -> Path:
    """Generates the synthetic drawings once and validates them as the pipeline would.

    Args:
        out: The benchmark's output folder.
        n_train: Training rows to generate.
        model_dir: The model folder (its tokenizer counts tokens).
        swift_args: The `swift sft` arguments: their max_length and max_pixels are checked
            against, as training applies them.
        image_size: Side of the square drawings, px; a list = as many rows of each size
            (mixed lengths: what length grouping is for).

    Returns:
        The clean training set's folder (reused when it exists).
    """
    from components.validate_data.core import validate_data
    from pipelines.demo.drawings import generate_dataset

    max_pixels = int(swift_args.get("max_pixels", 0) or 0)
    sizes = image_size if isinstance(image_size, list) else [image_size]
    label = "+".join(map(str, sizes))
    train_dir = out / f"train-{n_train}-{label}px-mp{max_pixels}"
    if not (train_dir / "data.jsonl").is_file():
        files = []
        for i, size in enumerate(sizes):
            rows = n_train // len(sizes) + (1 if i < n_train % len(sizes) else 0)
            data = generate_dataset(out / f"raw-{rows}-{size}px", n_train=rows, n_eval=0, image_size=size, seed=i)
            files.append(data["train"])
        # the held-out rows are unused; validate-data wants a held-out set (an eval_fraction of 0 is refused)
        held_out = generate_dataset(out / f"raw-eval-{sizes[0]}px", n_train=1, n_eval=2, image_size=sizes[0], seed=99)
        validate_data(
            files,
            str(train_dir),
            str(out / "eval-unused"),
            str(out / "q.jsonl"),
            model_dir=str(model_dir),
            max_length=int(swift_args.get("max_length", 0) or 0),
            max_pixels=max_pixels,
            task="detection",
            eval_files=[held_out["eval"]],
        )
    return train_dir


SKIP_STEPS = 2  # steps before the measured window (`steady_state`)


def logged_in_window(logging_steps: int, steps: int, skip_steps: int = SKIP_STEPS) -> list[int]:
    """The logged optimizer steps (every `logging_steps`-th) at or after `skip_steps`."""
    return [k for k in range(logging_steps, steps + 1, logging_steps) if k >= skip_steps]


def profile_runs(
    names: list[str], steps: int, seed_steps: int = 0, warmup_steps: int = 0
) -> list[tuple[str, int, bool]]:
    """(profile, optimizer steps, reported) in the order they run: with `warmup_steps`, the first profile once
    unreported first; seed profiles for `seed_steps` where given.

    Raises:
        SystemExit: A negative --warmup-steps, or a profile whose logging interval leaves fewer than two logged
            steps in the measured window (its figures would all be 0.0).
    """
    if warmup_steps < 0:
        raise SystemExit(f"--warmup-steps {warmup_steps}: give 0 (none) or more steps")
    runs = [(names[0], warmup_steps, False)] if warmup_steps and names else []
    for name in names:
        runs.append((name, seed_steps if (seed_steps and name.startswith("seed")) else steps, True))
    for name, n, reported in runs:
        every = int(profile_settings(name).get("logging_steps", 1))
        if reported and len(logged_in_window(every, n)) < 2:
            raise SystemExit(
                f"profile {name}: it logs every {every} step(s), so {n} steps leave "
                f"{len(logged_in_window(every, n))} logged step(s) from step {SKIP_STEPS} on and no measured window; "
                f"give --steps {max(2 * every, SKIP_STEPS + every)} or more"
            )
    return runs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per profile")
    parser.add_argument("--seed-steps", type=int, default=0, help="steps for the seed profiles (default --steps)")
    parser.add_argument("--samples-per-step", type=int, default=16)
    parser.add_argument("--profiles", default="seed,b16_gc_liger")
    parser.add_argument(
        "--warmup-steps", type=int, default=0,
        help="first run the first profile for this many steps, unreported (a fresh GPU machine's first minutes "
        "run host-bound profiles slower: benchmarks/README.md, \"The host behind an 8-row micro-step\", 2026-11-26); "
        "0 = none",
    )  # fmt: skip
    parser.add_argument("--n-train", type=int, default=0, help="training samples (default: enough for the steps)")
    parser.add_argument("--model", default="", help="an existing model folder (default: build the 4B one in --out)")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny model, 256 px images")
    parser.add_argument("--image-size", type=int, default=0, help="side of the drawings, px (1024; --tiny 256)")
    parser.add_argument(
        "--mixed-sizes", default="", help="comma-separated sides, as many rows of each (e.g. 384,1024): mixed lengths"
    )
    parser.add_argument(
        "--max-pixels", type=int, default=DEFAULT_MAX_PIXELS,
        help=f"ms-swift's max_pixels for training and the token count ({DEFAULT_MAX_PIXELS}; 0 = none)",
    )  # fmt: skip
    args = parser.parse_args()
    check_resize_env()
    import torch

    from benchmarks.qwen3_vl_4b import bench_model

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpus = torch.cuda.device_count()
    device = torch.cuda.get_device_name(0) if gpus else "cpu"
    peak = peak_flops_for(device) if gpus else 1e12
    t = time.time()
    model_dir = bench_model(out, tiny=args.tiny, existing=args.model)
    build_s = time.time() - t
    n_train = args.n_train or args.samples_per_step * max(args.steps, args.seed_steps) + 8
    base = seed_swift_args(args.max_pixels)
    max_pixels = int(base.get("max_pixels", 0) or 0)  # what training gets, and so what the count uses
    train_dir = validated_data(
        out,
        n_train,
        model_dir,
        base,
        image_size=[int(x) for x in args.mixed_sizes.split(",")]
        if args.mixed_sizes
        else args.image_size or (256 if args.tiny else 1024),
    )
    arch = ArchShape.from_config(json.loads((model_dir / "config.json").read_text()))
    stats, stats_summary = sample_stats(train_dir, model_dir, max_pixels=max_pixels)
    if not gpus:
        base.update(torch_dtype="float32", gradient_checkpointing=False, dataloader_num_workers=0)
    header = {
        "device": device,
        "gpus": gpus,
        "torch": torch.__version__,
        "peak_flops": peak,
        "build_model_s": round(build_s, 1),
        "data": stats_summary,
        "flops_per_sample": flops_per_sample(arch, stats, int(base.get("lora_rank", 8))),
    }
    try:
        import swift
        import transformers

        header["versions"] = {"ms-swift": swift.__version__, "transformers": transformers.__version__}
    except Exception:  # noqa: BLE001 - versions are informative only
        pass
    print("HEADER " + json.dumps(header, default=str), flush=True)
    rows = []
    names = [p.strip() for p in args.profiles.split(",") if p.strip()]
    for name, steps, reported in profile_runs(names, args.steps, args.seed_steps, args.warmup_steps):
        swift_args = profile_args(name, profile_settings(name), args.samples_per_step, max(gpus, 1), steps, base)
        row = run_profile(
            name, swift_args, model_dir, train_dir, out, max(gpus, 1), arch, stats, peak, args.samples_per_step
        )
        if not reported:
            print("WARMUP " + json.dumps(row, default=str), flush=True)
            continue
        rows.append(row)
        print("RESULT " + json.dumps(row, default=str), flush=True)
        (out / "results.json").write_text(json.dumps({"header": header, "rows": rows}, indent=1, default=str))
    print_table(rows)


if __name__ == "__main__":
    main()
