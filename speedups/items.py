"""Every speed-up item, as data: the page a newcomer reads first (docs/speedups.md is generated from it).

Each `Item` says what it patches (module and attribute names, as data), the library versions it was measured on
(PEP 440 ranges, `versions.py`), its switches (`VLM_LORA_*` environment variables), its effect on the micro-batch
planner's memory model (a named planner flag, or None), the bitsandbytes bases it serves, and where its code is:
an `install` function run when `swift sft` loads the plugin (None: nothing to do then) and a `check` function run
once a trainer has been built, which finishes what needs the model and says whether the item took hold (both in
the item's module in this package, by name, so that this module stays standard-library only: the job-environment
check and the planner read it without torch). What decides whether an item applies is in `gate.py`; the start-up
table in `table.py`.
"""

from __future__ import annotations

from speedups.records import Item, Switch, Target
from speedups.versions import ACCELERATE, LIGER, MS_SWIFT, PEFT, TORCH, TRANSFORMERS, TRITON

QWEN3_VL = "transformers.models.qwen3_vl.modeling_qwen3_vl"
QWEN3_VL_MOE = "transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe"
LIGER_FLCE = "liger_kernel.ops.fused_linear_cross_entropy"

ITEMS: tuple[Item, ...] = (
    Item(
        1, "token_count", "token count without padding (num_input_tokens_seen), read without waiting for the GPU",
        patches=(
            Target("transformers.trainer", "Trainer._track_num_input_tokens"),
            Target("transformers.trainer", "Trainer.log"),
            Target("transformers.trainer", "Trainer._save_checkpoint"),
        ),
        verified={"transformers": TRANSFORMERS},
        switches=(),
        options=(
            Switch("VLM_LORA_ASYNC_TOKENS", "0 (each micro-step's token count read at once) or 1 (read without "
                   "waiting, the default)"),
        ),
        module="token_count", install="install", check="check",
    ),
    Item(
        2, "autocast_input", "no float32 copy of each LoRA input under bf16 autocast (peft's input cast skipped)",
        patches=(Target("peft.tuners.tuners_utils", "BaseTunerLayer._cast_input_dtype"),),
        verified={"peft": PEFT},
        switches=(Switch("VLM_LORA_PEFT_INPUT_CAST", "1 (peft's float32 input casts) or 0 (the default)",
                         default="0", off="1"),),
        module="autocast_input", install="install", check="check",
    ),
    Item(
        3, "fused_lora", "each plain LoRA layer as one autograd function (peft's lora.Linear.forward)",
        patches=(
            Target("peft.tuners.lora.layer", "Linear.forward"),
            # where bitsandbytes is installed: LoRA over its layers, the weight dequantised per use (quantized_lora.py)
            Target("peft.tuners.lora.bnb", "Linear4bit.forward"),
            Target("peft.tuners.lora.bnb", "Linear8bitLt.forward"),
        ),
        verified={"peft": PEFT},
        gpu_verified={"torch": TORCH, "triton": TRITON},
        switches=(Switch("VLM_LORA_FUSED_LORA", "0 (peft's own LoRA forward) or 1 (the fused branch, the default)"),),
        options=(
            Switch("VLM_LORA_LEAN_LORA", "0 (the LoRA function without dropout too) or 1 (autograd's own nodes "
                   "there, the default)"),
            Switch("VLM_LORA_GROUP_LORA", "0 (one rank-r matmul per LoRA layer) or 1 (one per group that reads one "
                   "input, the default)"),
            Switch("VLM_LORA_INPLACE_ADD", "0 (LoRA's product added out of place where the layer runs outside the "
                   "LoRA function) or 1 (into the layer's output in place, the default)"),
            Switch("VLM_LORA_FUSED_BASE", "0 (the frozen layer before the LoRA function) or 1 (inside it, one input "
                   "gradient, the default)"),
            Switch("VLM_LORA_TRITON_LORA", "0 (PyTorch's kernels for LoRA's backward with dropout) or 1 (Triton's, "
                   "on a GPU, the default)"),
            Switch("VLM_LORA_SEEDED_DROPOUT", "1 (LoRA's dropout masks computed from seeds in the Triton kernels on a "
                   "GPU, none kept) or 0 (PyTorch's dropout kernel, a mask kept per adapted layer); unset: the planner "
                   "decides with auto, else 0", default="0"),
            Switch("VLM_LORA_CAST_CACHE", "0 (the adapters cast to the compute dtype in every forward) or 1 (their "
                   "copies kept and refreshed together after each optimizer step, the default)"),
            Switch("VLM_LORA_FOLD_SCALING", "0 (LoRA's scaling as kernels of its own in the backward) or 1 (in the "
                   "kernels that already scale, B's float32 gradient from one matmul, on a GPU, the default)"),
        ),
        memory="fused_lora",
        module="fused_lora", install="install", check="check",
    ),
    Item(
        5, "label_rows", "Liger's fused loss on the labelled rows only",
        patches=(Target("liger_kernel.transformers.model.loss_utils", "fixed_fused_linear_cross_entropy"),),
        verified={"liger-kernel": LIGER},
        switches=(Switch("VLM_LORA_LABEL_ROWS_LOSS", "0 (Liger's loss over every position) or 1 (labelled positions "
                         "only, the default)"),),
        requires=("liger",),
        module="label_rows", install="install", check="check",
    ),
    Item(
        6, "right_padding", "sdpa's causal flag instead of a padding mask for right-padded training batches",
        patches=(Target("transformers.masking_utils", "_ignore_causal_mask_sdpa"),),
        verified={"transformers": TRANSFORMERS},
        switches=(Switch("VLM_LORA_RIGHT_PAD_CAUSAL", "0 (transformers' padding mask) or 1 (causal flag for right "
                         "padding, the default)"),),
        memory="padding_mask",
        requires=("sdpa",),
        module="right_padding", install="install", check="check",
    ),
    Item(
        7, "host_vision", "the vision tower's grid work and the forward's facts from host copies",
        patches=(
            Target("transformers.vision_utils", "get_vision_attention_seqlens"),
            Target("transformers.models.*", "get_vision_attention_seqlens", scope="loaded"),
            *(
                Target(m, a)
                for m in (QWEN3_VL, QWEN3_VL_MOE)
                for a in ("get_vision_position_ids", "get_vision_interpolation_indices_and_weights")
            ),
            Target(QWEN3_VL, "Qwen3VLVisionModel.forward"),
            Target(QWEN3_VL, "Qwen3VLModel.get_image_features"),
            Target(QWEN3_VL, "Qwen3VLModel.get_video_features"),
            Target(QWEN3_VL, "Qwen3VLModel.forward"),
            Target(QWEN3_VL, "Qwen3VLModel.get_placeholder_mask"),
        ),
        verified={"transformers": TRANSFORMERS},
        switches=(Switch("VLM_LORA_HOST_VISION_SEQLENS", "0 (the vision tower's grid work on the GPU: boundaries, "
                         "indices, position ids) or 1 (on the host, the default)"),),
        options=(
            Switch("VLM_LORA_HOST_VISION_GRID", "0 (only the vision boundaries on the host) or 1 (the interpolation "
                   "indices and position ids too, cached per image size on the GPU, the default)"),
            Switch("VLM_LORA_FORWARD_FACTS", "0 (the forward reads its token counts, padding and deepstack positions "
                   "from the GPU where it needs them) or 1 (copied to the host once at its start, the default)"),
        ),
        module="vision_seqlens", install="install_item", check="check",
    ),
    Item(
        8, "liger_swiglu", "Liger's fused SiLU-multiply in Qwen3-VL's MLPs",
        patches=(Target(QWEN3_VL, "Qwen3VLTextMLP.forward", scope="instances"),),
        verified={"transformers": TRANSFORMERS, "liger-kernel": LIGER},
        switches=(Switch("VLM_LORA_LIGER_SWIGLU", "0 (PyTorch's SiLU and multiply) or 1 (Liger's fused kernel with "
                         "Liger on, the default)"),),
        options=(
            Switch("VLM_LORA_SILU_MUL_DOWN", "0 (the MLP's SiLU-multiply output kept for the down projection's LoRA "
                   "backward) or 1 (computed again there from gate and up, the default)"),
        ),
        memory="fused_silu_mul",
        requires=("liger", "qwen3_vl_mlp"),
        module="swiglu", check="check",
    ),
    Item(
        9, "torch_rms_norm", "torch's fused RMSNorm in place of Liger's (CUDA)",
        patches=(Target("transformers.trainer", "apply_liger_kernel"),),
        verified={"transformers": TRANSFORMERS, "liger-kernel": LIGER},
        gpu_verified={"torch": TORCH},
        switches=(Switch("VLM_LORA_TORCH_RMS_NORM", "1 (torch's fused RMSNorm in place of Liger's, on CUDA) or 0 "
                         "(Liger's); unset: torch's with more than one process", default="0",
                         multi_process_default="1"),),
        requires=("liger", "gpu"),
        module="rms_norm", install="install", check="check",
    ),
    Item(
        10, "deepstack", "Qwen3-VL's deepstack additions by position instead of by boolean mask",
        patches=(
            Target(QWEN3_VL, "Qwen3VLTextModel._deepstack_process", scope="instances"),
            Target(QWEN3_VL_MOE, "Qwen3VLMoeTextModel._deepstack_process", scope="instances"),
        ),
        verified={"transformers": TRANSFORMERS},
        switches=(Switch("VLM_LORA_INDEX_DEEPSTACK", "0 (deepstack additions by boolean mask) or 1 (by position, the "
                         "default)"),),
        module="deepstack", check="check",
    ),
    Item(
        11, "memory_cap", "each process's GPU memory capped at VLM_LORA_GPU_MEMORY_GIB",
        patches=(),  # torch.cuda.set_per_process_memory_fraction
        verified={},
        switches=(Switch("VLM_LORA_GPU_MEMORY_GIB", "GiB per GPU, a positive number (e.g. 39.4 for a 40 GB card)",
                         default="", flag=False),),
        requires=("gpu",),
        module="memory_cap", install="install", check="check",
    ),
    Item(
        12, "adapter_save", "ZeRO-1/2 checkpoint saves without a host copy of the frozen base",
        patches=(
            Target("transformers.trainer", "Trainer.save_model"),
            Target("accelerate.accelerator", "Accelerator.get_state_dict"),
        ),
        verified={"transformers": TRANSFORMERS, "accelerate": ACCELERATE, "peft": PEFT},
        switches=(Switch("VLM_LORA_ADAPTER_ONLY_SAVE", "0 (ZeRO-1/2 saves copy the whole model to host memory) or 1 "
                         "(only what the adapter save keeps, the default)"),),
        requires=("zero12",),
        module="adapter_save", install="install", check="check",
    ),
    Item(
        13, "fast_vision", "the frozen vision tower in fewer kernels (matmul patch embedding, Triton rotary, 16-bit "
        "norms)",
        patches=(
            Target(QWEN3_VL, "Qwen3VLVisionPatchEmbed.forward", scope="instances"),
            Target(QWEN3_VL, "Qwen3VLVisionBlock.norm1.forward", scope="instances"),
            Target(QWEN3_VL, "Qwen3VLVisionBlock.norm2.forward", scope="instances"),
            Target(QWEN3_VL, "Qwen3VLVisionPatchMerger.norm.forward", scope="instances"),
            Target("transformers.models.qwen3_vl*", "apply_rotary_pos_emb_vision", scope="loaded"),
        ),
        verified={"transformers": TRANSFORMERS},
        gpu_verified={"torch": TORCH, "triton": TRITON},
        switches=(Switch("VLM_LORA_FAST_VISION", "0 (the vision tower's own Conv3d patch embedding, float32 rotary and "
                         "norms) or 1 (one matmul, one Triton rotary kernel, 16-bit norms: the same values, the "
                         "default)"),),
        module="vision_tower", check="check",
    ),
    Item(
        14, "ddp_comm", "DDP for LoRA: one gradient bucket, no buffer broadcast, gradients as views of the bucket",
        patches=(Target("transformers.trainer", "Trainer._build_accelerator_args"),),
        verified={"transformers": TRANSFORMERS, "accelerate": ACCELERATE},
        switches=(Switch("VLM_LORA_DDP_COMM", "0 (transformers' DDP defaults: 25 MB gradient buckets, buffers "
                         "broadcast every forward, each gradient copied into its bucket and back) or 1 (one bucket for "
                         "the trainable gradients, no broadcast of non-persistent buffers, the gradients views of the "
                         "bucket, the default)"),),
        options=(
            Switch("VLM_LORA_DDP_BUCKET_VIEW", "0 (DDP copies each gradient into its bucket and back) or 1 (the "
                   "gradients are views of the bucket, the default)"),
        ),
        requires=("ddp",),
        module="ddp_comm", install="install", check="check",
    ),
    Item(
        16, "batch_facts", "batch copies queued without waiting; logits_to_keep and the forward's facts from host "
        "copies",
        patches=(
            Target("swift.dataloader.shard", "to_device", scope="loaded"),
            Target("swift.dataloader.dispatcher", "to_device", scope="loaded"),
            Target("swift.trainers.mixin", "SwiftMixin.prepare_logits_to_keep", scope="loaded"),
        ),
        verified={"ms-swift": MS_SWIFT},
        switches=(Switch("VLM_LORA_BATCH_FACTS", "0 (each batch's copy to the GPU waits, and logits_to_keep and the "
                         "forward's facts are read from the GPU) or 1 (read from the batch's host copies, the copies "
                         "queued without waiting, the default)"),),
        module="batch_facts", install="install", check="check",
    ),
    Item(
        17, "grad_nan", "ms-swift's NaN-gradient skip decided on the GPU (fused Adam's found_inf)",
        patches=(Target("swift.trainers.mixin", "SwiftMixin._fix_grad_norm_nan", scope="loaded"),),
        verified={"ms-swift": MS_SWIFT, "accelerate": ACCELERATE},
        gpu_verified={"torch": TORCH},
        switches=(Switch("VLM_LORA_GRAD_NAN_ON_GPU", "0 (ms-swift reads the gradient norm on the host at every "
                         "optimizer step) or 1 (a NaN norm skips the fused optimizer's step on the GPU, the default)"),),
        module="grad_nan", check="check",
    ),
    Item(
        18, "loss_no_wait", "the loss without waiting for the GPU (labelled rows from the host, Liger's count and "
        "gradient check)",
        patches=(
            Target(LIGER_FLCE, "fused_linear_cross_entropy_forward"),
            Target(LIGER_FLCE, "fused_linear_cross_entropy_backward"),
            Target("liger_kernel.transformers.model.loss_utils", "LigerForCausalLMLoss"),
            Target("liger_kernel.transformers.model.*", "LigerForCausalLMLoss", scope="loaded"),
        ),
        verified={"liger-kernel": LIGER},
        switches=(Switch("VLM_LORA_LOSS_NO_WAIT", "0 (the loss reads the GPU: the labelled rows, Liger's count of them "
                         "and its gradient check) or 1 (from the labels' host copy, without waiting, the default)"),),
        needs=(5,),
        requires=("liger",),
        module="liger_waits", install="install", check="check",
    ),
    Item(
        19, "checkpoint_layers", "gradient checkpointing of the first k decoder layers only (the planner's k), the "
        "checkpointed inputs in pinned host memory on request",
        patches=(Target("transformers.modeling_utils", "PreTrainedModel.gradient_checkpointing_enable"),),
        verified={"transformers": TRANSFORMERS},
        switches=(Switch("VLM_LORA_CHECKPOINT_LAYERS", "k, the decoder layers checkpointed from the first (the "
                         "planner sets it with gradient_checkpointing auto); unset: every layer", default="",
                         flag=False),),
        options=(Switch("VLM_LORA_CHECKPOINT_OFFLOAD", "1 (the checkpointed layers' inputs in pinned host memory, "
                        "transformers' offload) or 0 (on the GPU, the default)", default="0"),),
        module="checkpoint_layers", install="install", check="check",
    ),
)  # fmt: skip

BY_NUMBER: dict[int, Item] = {item.number: item for item in ITEMS}
SWITCHES: dict[str, Switch] = {s.name: s for item in ITEMS for s in (*item.switches, *item.options)}
# Switches of deleted items: refused by name with why (a config written for an older release says what to remove).
REMOVED_SWITCHES: dict[str, str] = {
    name: f"item {why}; remove it from the environment section"
    for why, names in (
        (
            "15 (garbage collection at step ends) was deleted on 2026-11-28: no gain beyond the spread on two GPUs",
            ("VLM_LORA_ALIGNED_GC",),
        ),
        (
            "4 (regional torch.compile of the layers) was deleted on 2026-11-28: with the other items on it gained "
            "nothing beyond the spread on two GPUs and ran 3 % slower on one H200",
            ("VLM_LORA_COMPILE_LAYERS", "VLM_LORA_COMPILE_VISION"),
        ),
    )
    for name in names
}


def item(number: int) -> Item:
    return BY_NUMBER[number]
