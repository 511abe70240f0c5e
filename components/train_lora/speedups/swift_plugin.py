"""Loaded into `swift sft` through `--external_plugins` by the train-lora task.

1. Token count without padding. transformers counts the tokens a model saw
(`num_input_tokens_seen`, and from it `train_tokens_per_second`) either with padding or
without, but its command-line parser only accepts true/false for `include_num_input_tokens_seen`, and true counts padding. With
batches of more than one sample that inflates tokens/s by the padding. This plugin makes
the count exclude padding whenever the batch has an attention mask: the task's tokens/s
is then the language-model tokens (text + image tokens) actually trained on. Each micro-step's
count reaches the state without making the host wait for the GPU (`PendingCounts`); logging and
checkpoints wait for the counts still in flight, so what they record is complete.
VLM_LORA_ASYNC_TOKENS=0 reads each count at once (transformers' way).

2. No float32 copies of activations in the LoRA branches under bf16 autocast. peft casts
each LoRA layer's input to the adapter weights' dtype (float32 master weights) before
dropout and lora_A; under autocast, F.linear then casts it straight back to bf16. On the
4B model that is two full activation copies plus a float32 dropout for each of the 7
adapted linear layers of every decoder layer: 0.6 s of a 3.6 s window of GPU time on an
H100 (benchmarks/README.md). With autocast on, the cast is skipped: the bf16 value that
reaches the matmul is the same (bf16 -> fp32 is exact, autocast rounds back), dropout
runs in bf16 (same scale, its own random stream), and the adapter's master weights and
optimizer state stay float32. Without autocast nothing changes. VLM_LORA_PEFT_INPUT_CAST=1
restores peft's behaviour.

3. One autograd function per LoRA branch (`fused_lora.py`, next to this file): the same
arithmetic as peft's plain LoRA (the same dropout kernel and masks on a GPU) with the
scaling and the add in the second matmul and without a dropped-out copy of the input kept
for every adapted layer. Anything else (DoRA, LoRA bias, ZeRO-3-partitioned adapters, …)
stays on peft's forward. VLM_LORA_FUSED_LORA=0 restores peft's forward everywhere.
Over a frozen plain Linear the function runs the layer's own matmul too (`_LoraLinear`: one input
gradient buffer instead of two added by autograd; VLM_LORA_FUSED_BASE=0 keeps the layer outside),
and LoRA's product is added into the layer's output in place (where the layer runs outside the
function, VLM_LORA_INPLACE_ADD=0 adds it out of place).
With dropout on a GPU the masks may come from seeds: the Triton kernels compute them where the forward and
the backward need them (`lora_triton.py`), so no mask is kept per adapted layer (10.4 bytes per token ×
layer × hidden less for the 4B) with VLM_LORA_SEEDED_DROPOUT=1, which the task's planner sets only where
it lets a faster plan fit (at the same plan the seeds measured −2.7 to +3.4 % per step); unset or 0: PyTorch's masks.
Without dropout the branch is autograd's own nodes (VLM_LORA_LEAN_LORA=0 keeps the function),
and LoRA layers that read one input (q / k / v, gate / up) compute their rank-r projections in
one matmul (`SharedInput`; VLM_LORA_GROUP_LORA=0 keeps one per layer; not with compiled layers).
Fewer kernel launches per adapted layer, where an 8-row micro-step's host launches them more slowly than the
GPU runs them: the adapters' compute-dtype copies kept between forwards and refreshed together after each
optimizer step (`CastCache`: 504 cast kernels per forward of the 4B fewer; VLM_LORA_CAST_CACHE=0 casts in every
forward), and in the backward with dropout on a GPU LoRA's scaling folded into the kernels that already scale
and B's float32 gradient from one matmul (252 multiplies and 252 casts fewer; VLM_LORA_FOLD_SCALING=0).

4. Regional compilation, opt-in (VLM_LORA_COMPILE_LAYERS=1): `torch.compile` on each of the
language model's decoder layers once the trainer holds the model (one region per layer, the
same graph for all of them), so that inductor fuses the normalisation, rotary embedding, MLP
and LoRA elementwise work; the vision tower, the LM head and its loss stay as they are. Liger's
kernels inside the layers (RMSNorm, rotary) are not traceable: with `use_liger_kernel` only its
fused loss is applied then. Measured on an H100 (benchmarks/README.md): once compiled a step is 9 %
faster and the peak 15.5 GiB lower, the losses the same; the first step compiles for 30-40 s and
the first batch of another padded length recompiles once (10-19 s). Only short runs were
measured, so no profile turns it on yet. VLM_LORA_COMPILE_VISION=1 compiles the vision tower's
blocks the same way (forward only: the tower is frozen).

5. The LM head and its loss on the label positions only (`label_rows.py`, next to this file),
with Liger's fused loss (`use_liger_kernel`): Liger multiplies every position by the
vocabulary matrix, the prompt's and the image's too, whose loss is ignored; the plugin hands
it the labelled rows only. Same loss and gradients (the mean over the labelled rows either
way). VLM_LORA_LABEL_ROWS_LOSS=0 turns it off.

6. Causal attention without a mask for right-padded training batches (`right_padding.py`,
next to this file): ms-swift pads on the right, so the padding lies in every real token's
future and the causal flag alone hides it; transformers otherwise builds a padding mask, which
keeps sdpa off its causal kernels and expands the grouped k / v heads. Same loss and gradients.
VLM_LORA_RIGHT_PAD_CAUSAL=0 turns it off.

7. The vision tower's sequence boundaries on the host (`vision_seqlens.py`, next to this file):
without flash-attn each vision block reads them with `.tolist()`, 72 waits for the GPU per forward
of the 4B; computed from a host copy of the image grid they cost one. Same values. And the rest of
the tower's grid work from that copy: the position embedding's interpolation indices and weights
and the rotary position ids (10 more waits per forward, and `get_image_features`' split one more)
computed on the host once per image size and kept on the GPU, so that the host queues the whole
tower without waiting for it. And what the model's forward reads from its inputs after the tower is queued
(the image token count for transformers' check, the right padding of item 6, the deepstack positions of item 10)
copied to the host with the grid, in one copy at the forward's start, so that the host queues the tower and the
language model's forward without waiting until the loss (VLM_LORA_FORWARD_FACTS=0 turns this part off).
VLM_LORA_HOST_VISION_GRID=0 turns the grid and facts parts off, VLM_LORA_HOST_VISION_SEQLENS=0 all of item 7.

8. Liger's fused SiLU-multiply in Qwen3-VL's MLPs (`swiglu.py`, next to this file), with
`use_liger_kernel` (Liger has no SwiGLU patch for Qwen3-VL): one kernel instead of three each way
and no SiLU output kept per layer. VLM_LORA_LIGER_SWIGLU=0 turns it off; not with compiled layers
(inductor fuses them there). A down projection with plain LoRA then computes the product itself and
keeps only gate and up for its backward, which computes the product again (`fused_lora.silu_mul_lora`):
2 bytes x intermediate per token and layer less. VLM_LORA_SILU_MUL_DOWN=0 keeps the product.

9. PyTorch's fused RMSNorm in place of Liger's (`rms_norm.py`, next to this file), with `use_liger_kernel`,
on CUDA: the same normalisation with one dispatcher call instead of Liger's Triton launch. It cuts a 4B
decoder layer's host time by 18 % (8.2 -> 6.7 ms per forward and backward) but did not change the training
step measurably on one H100, where the layer is GPU-bound (benchmarks/README.md); it rounds once where
Liger rounds twice. On with more than one process (each GPU's micro-step holds half the rows and the host
falls behind), opt-in with one (VLM_LORA_TORCH_RMS_NORM=1; =0 turns it off). Applied right after
transformers applies Liger (when training starts).

10. Qwen3-VL's deepstack additions by position instead of by boolean mask (`deepstack.py`, next to
this file): the same values without the ~15 waits for the GPU per micro-batch that boolean indexing
makes in the first three layers' forward and backward. VLM_LORA_INDEX_DEEPSTACK=0 turns it off.

11. A memory cap: with VLM_LORA_GPU_MEMORY_GIB set (the train-lora task sets it when the
job's environment asks for a cap, e.g. to stand in for a 40 GB card on a larger one), each
training process may allocate at most that much of its GPU
(`torch.cuda.set_per_process_memory_fraction`): the planner and the run see the same card.

12. Checkpoint saves under DeepSpeed ZeRO-1/2 (a `swift.deepspeed` of the user's: the task itself
picks DDP or ZeRO-3) without a host copy of the frozen base (`adapter_save.py`, next to this file):
transformers' save clones every tensor of the model to host memory, then keeps the adapter; the plugin
hands it only the tensors peft's adapter save keeps (the same adapter file). 42 s per save of the
30B-A3B on 2 x H200 before. VLM_LORA_ADAPTER_ONLY_SAVE=0 turns it off.

13. The frozen vision tower's forward in fewer kernels (`vision_tower.py` and `vision_triton.py`, next to
this file): the patch embedding's Conv3d as one matmul, the rotary embedding's eleven float32 elementwise
kernels per block as one Triton kernel (on a GPU), and its LayerNorms in 16 bits with autocast off instead
of float32 copies (each feeds a linear layer, which would round to 16 bits anyway). The rotary and the
norms compute the same numbers; the patch embedding sums the same products in another order. 249 -> 161 ms
per forward of 16 drawings of 1024² on an H100, -7.3 % per training step (benchmarks/README.md).
VLM_LORA_FAST_VISION=0 turns it off.

14. DDP's communication for LoRA (`ddp_comm.py`, next to this file), with more than one process and no
DeepSpeed: all trainable gradients in one bucket (`ddp_bucket_cap_mb` sized to them), reduced in one
all-reduce after the backward instead of three whose NCCL kernels wait beside it for the other rank; and no
broadcast of buffers before each forward when every buffer is non-persistent (derived from the config on
each rank); and the gradients as views of that bucket (`gradient_as_bucket_view`), so that DDP does not copy
each one into the bucket and back (VLM_LORA_DDP_BUCKET_VIEW=0 keeps the copies). Set on the DDP arguments
transformers builds for accelerate (`Trainer._build_accelerator_args`); a value the config sets is kept. Two
H200s, same call: one bucket 0.574 / 0.581 s per step against 0.601 (benchmarks/README.md).
VLM_LORA_DDP_COMM=0 turns it off.

15. Python's garbage collection at step ends (`gc_align.py`, next to this file): with more than one process the
automatic collector is off during training and every rank collects at the end of each optimizer step (the young
generations, also after each micro-step that accumulates and each evaluation batch; all of them every 50
steps), after freezing what exists at the start, so that no rank pauses in the middle of a forward while the
others wait for it at the all-reduce (Megatron-LM's `--manual-gc`); data-loader workers forked meanwhile keep
automatic collection. Every rank logs its collections and pauses at the end of training, with or without it.
Two H200s with the 4B: automatic collection paused each rank 39-59 ms over 30 steps (longest 6.4 ms), at step
ends 4-5 ms; step time 1.6-3 % lower in the same call, within the run-to-run spread (benchmarks/README.md).
VLM_LORA_ALIGNED_GC=0 turns it off, =1 turns it on for one process too.

16. The step boundary without waiting for the GPU (`batch_facts.py`, next to this file): at each step's start the
host waited for the GPU to finish the step before (ms-swift's data loader copies each batch with a blocking copy per
tensor, ms-swift's `logits_to_keep` `.item()`, the forward's facts of item 7), so the GPU ran dry while the host
prepared the next step: a fixed cost per optimizer step, which weighs most with few rows per GPU. The plugin wraps
the `to_device` of ms-swift's data loaders: the copies are queued without waiting (from the pinned memory the
loaders use) and the host copies of each batch's small integer tensors are kept; ms-swift's
`prepare_logits_to_keep` and the forward's facts read those instead of the GPU (the same integers). A host copy is
used only for the very device tensor made from it, unchanged since. Each rank logs at the end of training how many
copies were kept and found. VLM_LORA_BATCH_FACTS=0 turns it off.

17. ms-swift's skip of an optimizer step whose gradient norm is NaN, decided on the GPU (`grad_nan.py`, next to this
file): ms-swift reads `grad_norm.isnan().item()` after clipping, so the host waited at every optimizer step for the
backward and the all-reduce before it could queue the step. With fused torch Adam / AdamW and no gradient scaler the
optimizers get the NaN flag as `found_inf` (GradScaler's mechanism: their kernel then changes nothing, the same as
ms-swift's skip); otherwise ms-swift's check runs. VLM_LORA_GRAD_NAN_ON_GPU=0 turns it off.

18. The loss without waiting for the GPU (`label_rows.py`, `liger_waits.py`, next to this file): the loss read the
GPU three times at every micro-step, each a wait for the whole forward: item 5's `nonzero` finding the labelled rows,
Liger's count of them (`.item()`) and Liger's backward asking whether the loss's gradient is one (`torch.equal`). The
labelled rows now come from the labels' host copy (item 16) through Liger's `LigerForCausalLMLoss`, which builds the
shifted target from them; Liger's forward counts the rows item 5 passes by their length (its own source with that
one line changed); its backward multiplies by the gradient without asking (in float32, as Liger's kernel). On an
H200 the loss then waits for nothing, with Liger's loss and gradient bitwise; with items 16-18 two H200s trained at
1.87-1.88x one (benchmarks/README.md, session 21). VLM_LORA_LOSS_NO_WAIT=0 turns it off.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import importlib.util
import os
import sys
from pathlib import Path

PACKAGE = "components.train_lora.speedups"


def _importable_package() -> None:
    """Puts the repository root (the folder holding `components/`) first on sys.path when `components` is not
    importable or is another copy: `swift sft` loads this file by path, with only this folder on sys.path."""
    root = Path(__file__).resolve().parents[3]
    spec = importlib.util.find_spec("components")
    here = root / "components"
    if spec is None or not any(Path(p).resolve() == here for p in spec.submodule_search_locations or ()):
        sys.path.insert(0, str(root))


_importable_package()

ASYNC_TOKENS = os.environ.get("VLM_LORA_ASYNC_TOKENS", "1") != "0"


def _install() -> bool:
    try:
        import torch
        from transformers import Trainer
    except ImportError:
        return False
    original = getattr(Trainer, "_track_num_input_tokens", None)
    if original is None or getattr(original, "_vlm_lora_non_padding", False):
        return original is not None

    def _track_num_input_tokens(self, inputs):
        mask = inputs.get("attention_mask") if hasattr(inputs, "get") else None
        if self.args.include_num_input_tokens_seen == "no" or mask is None or mask.dim() != 2:
            return original(self, inputs)
        count = torch.as_tensor(mask.sum(), device=self.args.device, dtype=torch.int64)
        count = self.accelerator.gather(count).sum()
        if count.is_cuda and ASYNC_TOKENS:  # read later, not making the host wait for this micro-step's backward
            pending = self.__dict__.get("_vlm_lora_tokens")
            if pending is None:
                pending = self._vlm_lora_tokens = PendingCounts(torch)
            pending.add(count)
            pending.drain(self.state, wait=False)
        else:
            self.state.num_input_tokens_seen += int(count)
        return None

    _track_num_input_tokens._vlm_lora_non_padding = True
    Trainer._track_num_input_tokens = _track_num_input_tokens
    # the count is read when logging and when a checkpoint saves the trainer state: complete it there
    for name in ("log", "_save_checkpoint"):
        _wrap_once(Trainer, name, _counts_drained, "_vlm_lora_counts_drained")
    return True


def _counts_drained(method):
    """`method`, after the token counts still in flight have reached the trainer's state."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        pending = self.__dict__.get("_vlm_lora_tokens")
        if pending is not None:
            pending.drain(self.state, wait=True)
        return method(self, *args, **kwargs)

    wrapper._vlm_lora_counts_drained = True
    return wrapper


class PendingCounts:
    """Token counts on the GPU, copied to pinned host memory without waiting; added to the state once there.

    transformers adds each micro-step's count with `.item()`, which makes the host wait for the GPU to
    finish that micro-step's backward before it prepares the next one: the GPU then idles while the
    host works. Here the copy is queued behind the backward and read when done (`drain(wait=False)`
    at the next micro-steps) or, where the count is read (logging, checkpoints), after waiting for it.
    """

    def __init__(self, torch_module):
        self.torch = torch_module
        self.queue: list = []

    def add(self, count) -> None:
        host = self.torch.empty((), dtype=count.dtype, pin_memory=True)
        host.copy_(count, non_blocking=True)
        event = self.torch.cuda.Event()
        event.record()
        self.queue.append((event, host))

    def drain(self, state, wait: bool) -> None:
        while self.queue:
            event, host = self.queue[0]
            if not wait and not event.query():
                return
            event.synchronize()
            state.num_input_tokens_seen += int(host.item())
            self.queue.pop(0)


def _install_autocast_input() -> bool:
    if os.environ.get("VLM_LORA_PEFT_INPUT_CAST") == "1":
        return False
    try:
        import torch
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:
        return False
    original = getattr(BaseTunerLayer, "_cast_input_dtype", None)
    if original is None or getattr(original, "_vlm_lora_autocast", False):
        return original is not None

    def _cast_input_dtype(self, x, dtype):
        if (
            isinstance(x, torch.Tensor)
            and x.is_floating_point()
            and dtype == torch.float32
            and x.dtype in (torch.bfloat16, torch.float16)
            and torch.is_autocast_enabled(x.device.type)
        ):
            return x
        return original(self, x, dtype)

    _cast_input_dtype._vlm_lora_autocast = True
    BaseTunerLayer._cast_input_dtype = _cast_input_dtype
    return True


def _install_memory_cap() -> float:
    """Caps this process's GPU memory at VLM_LORA_GPU_MEMORY_GIB; returns the fraction set (0 = none)."""
    text = os.environ.get("VLM_LORA_GPU_MEMORY_GIB", "")
    if not text:
        return 0.0
    try:
        import torch
    except ImportError:
        return 0.0
    if not torch.cuda.is_available():
        return 0.0
    device = int(os.environ.get("LOCAL_RANK", "0") or 0)
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = min(1.0, float(text) * 1024**3 / total)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction


def _load_sibling(stem: str):
    """The package's module `<stem>` (`components.train_lora.speedups.<stem>`), one copy per process."""
    return importlib.import_module(f"{PACKAGE}.{stem}")


def _install_fused_lora() -> bool:
    if os.environ.get("VLM_LORA_FUSED_LORA") == "0":
        return False
    try:
        from peft.tuners.lora.layer import Linear
    except ImportError:
        return False
    original = Linear.forward
    if getattr(original, "_vlm_lora_fused", False):
        return True
    fused_forward = _load_sibling("fused_lora").fused_forward

    def forward(self, x, *args, **kwargs):
        out = fused_forward(self, x, *args, **kwargs)
        return original(self, x, *args, **kwargs) if out is None else out

    forward._vlm_lora_fused = True
    forward._vlm_lora_original = original
    Linear.forward = forward
    return True


def _wrap_once(owner, name: str, wrap, marker: str) -> bool:
    """Replaces `owner.<name>` by `wrap(original)` unless already wrapped (`marker` set); False if absent."""
    original = getattr(owner, name, None)
    if original is None:
        return False
    if not getattr(original, marker, False):
        setattr(owner, name, wrap(original))
    return True


def _install_label_rows_loss() -> bool:
    if os.environ.get("VLM_LORA_LABEL_ROWS_LOSS") == "0":
        return False
    try:
        from liger_kernel.transformers.model import loss_utils
    except ImportError:  # no Liger (CPU installs): transformers' own loss runs
        return False
    wrap = _load_sibling("label_rows").label_rows_only
    return _wrap_once(loss_utils, "fixed_fused_linear_cross_entropy", wrap, "_vlm_lora_label_rows")


LIGER_MODELS = "liger_kernel.transformers.model."


def _install_loss_no_wait() -> bool:
    """Item 18: Liger's forward counts and its backward scales without reading the GPU (`liger_waits.py`), and its
    `LigerForCausalLMLoss` hands item 5 the labelled rows from the labels' host copy (`label_rows.py`)."""
    if os.environ.get("VLM_LORA_LOSS_NO_WAIT") == "0" or not LABEL_ROWS_LOSS:
        return False
    rows, waits = _load_sibling("label_rows"), _load_sibling("liger_waits")
    try:
        ops = importlib.import_module("liger_kernel.ops.fused_linear_cross_entropy")
    except ImportError:  # a Liger laid out otherwise: its count and check read the GPU
        ops = None
    if ops is not None:
        _wrap_once(ops, waits.BACKWARD, waits.scaled_without_wait, "_vlm_lora_scaled")
    if ops is None or not waits.count_without_wait(ops, rows.selected_target):
        print("train-lora plugin: Liger's forward is not the one item 18 knows; its count reads the GPU", flush=True)
    if not BATCH_FACTS:  # no host copies kept: the labelled rows come from the GPU
        return ops is not None
    host_of = _load_sibling("batch_facts").COPIES.host_of

    def wrap(loss_fn):
        return rows.host_rows_for_loss(loss_fn, host_of)

    # loss_utils first: the model modules Liger loads later bind its wrapped function
    modules = [sys.modules[LIGER_MODELS + "loss_utils"]]
    modules += [m for name, m in list(sys.modules.items()) if name.startswith(LIGER_MODELS) and m not in modules]
    wrapped = sum(_wrap_once(m, "LigerForCausalLMLoss", wrap, "_vlm_lora_host_rows") for m in modules if m)
    return ops is not None or wrapped > 0


def _install_right_padding_causal() -> bool:
    if os.environ.get("VLM_LORA_RIGHT_PAD_CAUSAL") == "0":
        return False
    try:
        from transformers import masking_utils
    except ImportError:
        return False
    skip = _load_sibling("right_padding").right_padded_causal_skip
    known = _load_sibling("vision_seqlens").known_right_aligned  # the forward's facts (item 7), where gathered

    def wrap(original):
        return skip(original, known)

    return _wrap_once(masking_utils, "_ignore_causal_mask_sdpa", wrap, "_vlm_lora_right_padding")


def _after_liger(original):
    """transformers' `apply_liger_kernel` (called when training starts), then torch's fused RMSNorm."""
    rms_norm = _load_sibling("rms_norm")

    @functools.wraps(original)
    def apply_liger_kernel(model, kernel_config=None, *args, **kwargs):
        out = original(model, kernel_config, *args, **kwargs)
        first = next(model.parameters(), None)
        if first is not None and first.is_cuda and rms_norm.fused_op_on(first.device):
            count = rms_norm.use_torch_rms_norm(model)
            print(f"train-lora plugin: torch's fused RMSNorm in {count} of Liger's norms", flush=True)
        return out

    apply_liger_kernel._vlm_lora_torch_rms_norm = True
    return apply_liger_kernel


def _install_torch_rms_norm(environ=os.environ) -> bool:
    if not multi_process_switch(environ, "VLM_LORA_TORCH_RMS_NORM", _world_size(environ)):
        return False
    try:
        from transformers import trainer
    except ImportError:
        return False
    return _wrap_once(trainer, "apply_liger_kernel", _after_liger, "_vlm_lora_torch_rms_norm")


QWEN3_VL_MODELING = (
    "transformers.models.qwen3_vl.modeling_qwen3_vl",
    "transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe",
)


def _install_batch_facts() -> bool:
    """Item 16 (`batch_facts.py`): ms-swift's data loaders keep their batches' host copies and queue the copies
    without waiting, and ms-swift's `logits_to_keep` reads the labels' copy; the forward's facts read theirs
    (`_install_host_vision`). Wrapped once ms-swift's modules are loaded (`_install_swift_readers`)."""
    if os.environ.get("VLM_LORA_BATCH_FACTS") == "0":
        return False
    _install_swift_readers()
    return True


SWIFT_LOADERS = ("swift.dataloader.shard", "swift.dataloader.dispatcher")


def _swift_mixin():
    """ms-swift's `SwiftMixin` where its trainers are loaded already (None otherwise: the plugin does not load them,
    as they replace transformers' default callbacks)."""
    return getattr(sys.modules.get("swift.trainers.mixin"), "SwiftMixin", None)


def _install_swift_readers() -> int:
    """Item 16's wrappers in ms-swift (the loaders' `to_device`, `SwiftMixin.prepare_logits_to_keep`) where its
    modules are loaded: the plugin does not load them itself (ms-swift's trainers replace transformers' default
    callbacks), so a trainer's creation tries again; how many are wrapped."""
    helpers = _load_sibling("batch_facts")
    marker = "_vlm_lora_batch_facts"
    wrapped = sum(
        _wrap_once(sys.modules[name], "to_device", helpers.remembering, marker)
        for name in SWIFT_LOADERS
        if name in sys.modules
    )
    mixin = _swift_mixin()
    if mixin is not None:
        wrapped += _wrap_once(mixin, "prepare_logits_to_keep", helpers.logits_to_keep_from_host, marker)
    return wrapped


def _install_grad_nan() -> bool:
    """Item 17: ms-swift's NaN-gradient skip decided on the GPU (`grad_nan.py`), once ms-swift's trainers are loaded
    (as item 16's reader)."""
    cls = _swift_mixin()
    original = getattr(cls, "__dict__", {}).get("_fix_grad_norm_nan")
    if os.environ.get("VLM_LORA_GRAD_NAN_ON_GPU") == "0" or not isinstance(original, staticmethod):
        return False
    if not getattr(original.__func__, "_vlm_lora_grad_nan", False):
        cls._fix_grad_norm_nan = staticmethod(_load_sibling("grad_nan").device_nan_skip(original.__func__))
    return True


def _install_host_vision(batch_facts: bool = False) -> tuple[int, dict[str, int]]:
    """Item 7: the vision boundaries from a host copy of the grid (modules wrapped) and, unless
    VLM_LORA_HOST_VISION_GRID=0, the rest of the tower's grid work from that copy (what was wrapped)."""
    if os.environ.get("VLM_LORA_HOST_VISION_SEQLENS") == "0":
        return 0, {}
    try:
        from transformers import vision_utils
    except ImportError:
        return 0, {}
    helpers = _load_sibling("vision_seqlens")
    loaded = [m for name, m in list(sys.modules.items()) if name.startswith("transformers.models.") and m is not None]
    seqlens = helpers.install([vision_utils, *loaded])
    if os.environ.get("VLM_LORA_HOST_VISION_GRID") == "0":
        return seqlens, {}
    qwen3_vl = []
    for name in QWEN3_VL_MODELING:
        try:
            qwen3_vl.append(importlib.import_module(name))
        except ImportError:  # an older transformers without it
            continue
    facts = os.environ.get("VLM_LORA_FORWARD_FACTS") != "0"
    host_of = _load_sibling("batch_facts").COPIES.host_of if batch_facts else None
    return seqlens, helpers.install_grid([vision_utils, *qwen3_vl], facts=facts, host_of=host_of)


def compile_decoder_layers(model, language: bool = True, vision: bool = False) -> int:
    """torch.compile (in place) the language model's decoder layers and/or the vision tower's blocks; how many."""
    import torch

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    count = 0
    for module in model.modules():
        name = type(module).__name__
        is_vision = "Vision" in name
        if (language and name.endswith("DecoderLayer") and not is_vision) or (
            vision and is_vision and name.endswith(("VisionBlock", "VisionLayer"))
        ):
            module.compile()
            count += 1
    return count


def keep_liger_out_of_layers(training_args) -> None:
    """With Liger on, keeps only its fused loss: its RMSNorm / rotary kernels inside the layers cannot be traced.

    transformers applies Liger when training starts, from `liger_kernel_config` (ms-swift's
    command line cannot pass that dict), so it is set on the training arguments here.
    """
    if training_args is None or not getattr(training_args, "use_liger_kernel", False):
        return
    config = dict(getattr(training_args, "liger_kernel_config", None) or {})
    config.update(rope=False, rms_norm=False, swiglu=False)
    training_args.liger_kernel_config = config


class _LigerSiluMul:
    """Liger's SiLU-multiply kernels as `forward(gate, up) -> c` and `backward(gate, up, dc) -> (dgate, dup)`
    (the backward writes into gate and up), for the down projection that keeps no product."""

    def __init__(self, ops) -> None:
        self._ops = ops

    def forward(self, gate, up):
        return self._ops.swiglu_forward(gate, up)[2]

    def backward(self, gate, up, grad_c):
        return self._ops.swiglu_backward(gate, up, grad_c)


def _liger_silu_mul():
    """Liger's fused SiLU-multiply as f(gate, up) and its kernels (`_LigerSiluMul`), or None without Liger."""
    try:
        from liger_kernel.ops import LigerSiLUMulFunction
        from liger_kernel.ops import swiglu as ops
    except ImportError:
        return None
    return (lambda gate, up: LigerSiLUMulFunction.apply(gate, up)), _LigerSiluMul(ops)


def wants_liger_swiglu(training_args, compile_language: bool) -> bool:
    """Liger on, its SwiGLU not turned off in `liger_kernel_config`, the layers not compiled, the switch not 0."""
    if training_args is None or not getattr(training_args, "use_liger_kernel", False) or compile_language:
        return False
    if os.environ.get("VLM_LORA_LIGER_SWIGLU") == "0":
        return False
    return (getattr(training_args, "liger_kernel_config", None) or {}).get("swiglu", True) is not False


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def fast_vision(model) -> dict[str, int]:
    """Item 13 of the module docstring on `model` (the rotary kernel only with Triton and a GPU)."""
    kernels = None
    if _cuda():
        try:
            kernels = _load_sibling("vision_triton")
        except ImportError:
            kernels = None
    modeling = [
        m for name, m in list(sys.modules.items()) if name.startswith("transformers.models.qwen3_vl") and m is not None
    ]
    return _load_sibling("vision_tower").install(model, modeling, kernels)


def patch_model(model, training_args, language: bool = False, vision: bool = False) -> dict[str, int]:
    """What the plugin changes on the model the trainer holds; how many modules each change reached."""
    counts: dict[str, int] = {}
    if os.environ.get("VLM_LORA_FAST_VISION") != "0":
        fast = fast_vision(model)
        counts.update({f"vision_{k}": v for k, v in fast.items()})
        if fast:
            done = ", ".join(f"{k} {v}" for k, v in fast.items())
            print(f"train-lora plugin: vision tower in fewer kernels ({done}; rotary = modeling files)", flush=True)
    if language or vision:
        counts["compiled"] = compile_decoder_layers(model, language=language, vision=vision)
        what = " and ".join(w for w, on in (("decoder layers", language), ("vision blocks", vision)) if on)
        print(f"train-lora plugin: torch.compile on {counts['compiled']} {what}", flush=True)
    if os.environ.get("VLM_LORA_INDEX_DEEPSTACK") != "0":  # in the text model, outside compiled layers
        counts["deepstack"] = _load_sibling("deepstack").install(model)
        if counts["deepstack"]:
            print(
                f"train-lora plugin: index-based deepstack additions in {counts['deepstack']} text model(s)", flush=True
            )
    fused = _load_sibling("fused_lora")
    if FUSED_LORA and fused.GROUP and fused.LEAN and not language:  # compiled layers: no Python state in them
        groups = fused.group_shared_inputs(model)
        if groups:
            counts["shared_input"] = groups
            print(
                f"train-lora plugin: one rank-r matmul for each of {groups} groups of LoRA layers "
                "that read one input (q/k/v, gate/up; without dropout)",
                flush=True,
            )
    if FUSED_LORA and fused.TRITON and fused.SEEDED and not language and _cuda():
        print(
            "train-lora plugin: LoRA's dropout masks from seeds in the Triton kernels, none kept for the backward "
            "(VLM_LORA_SEEDED_DROPOUT=1)",
            flush=True,
        )
    liger = _liger_silu_mul() if wants_liger_swiglu(training_args, language) else None
    if liger is not None:
        silu_mul, kernels = liger
        down = functools.partial(fused.silu_mul_lora, silu_mul=kernels) if FUSED_LORA and fused.SILU_MUL_DOWN else None
        counts["silu_mul"] = _load_sibling("swiglu").fuse_silu_mul(model, silu_mul, down)
        kept = "; down projections with LoRA keep no product for the backward" if down else ""
        print(f"train-lora plugin: Liger's fused SiLU-multiply in {counts['silu_mul']} MLPs{kept}", flush=True)
    return counts


def _world_size(environ) -> int:
    """Training processes in all, as torchrun sets WORLD_SIZE (1 without it)."""
    return int(environ.get("WORLD_SIZE", "1") or 1)


def multi_process_switch(environ, name: str, world_size: int) -> bool:
    """A lever that helps where each GPU's micro-step is small (items 9 and 15): on with more than one process
    unless `name` is 0; `name`=1 turns it on for one process too."""
    value = environ.get(name, "")
    if value == "0":
        return False
    return value == "1" or world_size > 1


def _with_ddp_comm(original, environ=os.environ):
    """transformers' `Trainer._build_accelerator_args`, then item 14's settings on the DDP arguments it built
    (`ddp_comm.py`): one bucket, no broadcast of derived buffers, the gradients as views of the bucket."""

    @functools.wraps(original)
    def _build_accelerator_args(self, **kwargs):
        built = original(self, **kwargs)
        training_args = getattr(self, "args", None)
        model = getattr(self, "model", None)
        if environ.get("VLM_LORA_DDP_COMM") == "0" or model is None or training_args is None:
            return built
        helpers = _load_sibling("ddp_comm")
        settings, lines = helpers.ddp_settings(
            model,
            world_size=_world_size(environ),
            deepspeed=getattr(training_args, "deepspeed", None),
            bucket_cap_mb=getattr(training_args, "ddp_bucket_cap_mb", None),
            broadcast_buffers=getattr(training_args, "ddp_broadcast_buffers", None),
            bucket_view=environ.get("VLM_LORA_DDP_BUCKET_VIEW") != "0",
        )
        if helpers.apply(built.get("kwargs_handlers") or [], settings):
            for line in lines:
                print(f"train-lora plugin: {line}", flush=True)
        return built

    _build_accelerator_args._vlm_lora_ddp_comm = True
    return _build_accelerator_args


def _install_ddp_comm() -> bool:
    try:
        from transformers import Trainer
    except ImportError:
        return False
    return _wrap_once(Trainer, "_build_accelerator_args", _with_ddp_comm, "_vlm_lora_ddp_comm")


def gc_callback(environ=os.environ):
    """Item 15: a TrainerCallback that counts garbage collections during training and, with more than one process
    (or VLM_LORA_ALIGNED_GC=1), runs them at step ends only (`gc_align.py`)."""
    from transformers import TrainerCallback

    helpers = _load_sibling("gc_align")
    aligned = multi_process_switch(environ, "VLM_LORA_ALIGNED_GC", _world_size(environ))

    class GcCallback(TrainerCallback):
        def __init__(self) -> None:
            self.census = helpers.GcCensus()
            self.aligner = helpers.AlignedGc() if aligned else None

        def on_train_begin(self, args, state, control, **kwargs):
            if self.aligner is not None:
                self.aligner.start()
                print(
                    "train-lora plugin: garbage collection at step ends on every rank (automatic collection off; "
                    f"all generations every {self.aligner.full_every} steps)",
                    flush=True,
                )
            self.census.attach()

        def on_step_end(self, args, state, control, **kwargs):
            if self.aligner is not None:
                self.aligner.step_end(state.global_step)

        def on_substep_end(self, args, state, control, **kwargs):  # a micro-step that accumulates
            if self.aligner is not None:
                self.aligner.young()

        on_prediction_step = on_substep_end  # an evaluation batch: the same

        def on_train_end(self, args, state, control, **kwargs):
            if BATCH_FACTS:  # item 16's lookups, on every rank (one line)
                copies = _load_sibling("batch_facts").COPIES
                print(
                    f"train-lora plugin: rank {environ.get('RANK', '0')}, batch facts: {copies.summary()}", flush=True
                )
            self.census.detach()
            if self.aligner is not None:
                self.aligner.stop()
            how = "at step ends" if self.aligner is not None else "automatic"
            rank = environ.get("RANK", "0")
            print(f"train-lora plugin: rank {rank}, collection {how}: {self.census.summary()}", flush=True)

    return GcCallback()


def _install_trainer_init() -> tuple[bool, bool]:
    """Wraps Trainer.__init__ for what needs the model: compilation (opt-in), deepstack
    by position, grouped LoRA projections, Liger's SiLU-multiply."""
    language = os.environ.get("VLM_LORA_COMPILE_LAYERS") == "1"
    vision = os.environ.get("VLM_LORA_COMPILE_VISION") == "1"
    try:
        from transformers import Trainer
    except ImportError:
        return False, False
    original = Trainer.__init__
    if getattr(original, "_vlm_lora_init", False):
        return language or vision, True

    @functools.wraps(original)  # ms-swift reads the signature (tokenizer vs processing_class)
    def __init__(self, *args, **kwargs):
        training_args = kwargs.get("args", args[1] if len(args) > 1 else None)
        if language:
            keep_liger_out_of_layers(training_args)
        original(self, *args, **kwargs)
        if BATCH_FACTS:  # ms-swift's modules are loaded by now where this is ms-swift's trainer
            _install_swift_readers()
        _install_grad_nan()
        patch_model(self.model, training_args, language=language, vision=vision)
        self.add_callback(gc_callback())

    __init__._vlm_lora_init = True
    Trainer.__init__ = __init__
    return language or vision, True


# True while a trainer's save_model saves a LoRA adapter.
_SAVING_ADAPTER: contextvars.ContextVar = contextvars.ContextVar("vlm_lora_saving_adapter", default=False)


def _install_adapter_only_save() -> bool:
    """Wraps Trainer.save_model and Accelerator.get_state_dict (item 12 of the module docstring)."""
    if os.environ.get("VLM_LORA_ADAPTER_ONLY_SAVE") == "0":
        return False
    try:
        from accelerate import Accelerator
        from transformers import Trainer
    except ImportError:
        return False
    if getattr(Trainer.save_model, "_vlm_lora_adapter_save", False):
        return True
    helpers = _load_sibling("adapter_save")
    original_save, original_state = Trainer.save_model, Accelerator.get_state_dict

    @functools.wraps(original_save)
    def save_model(self, *args, **kwargs):
        token = _SAVING_ADAPTER.set(helpers.saves_lora_only(self))
        try:
            return original_save(self, *args, **kwargs)
        finally:
            _SAVING_ADAPTER.reset(token)

    @functools.wraps(original_state)
    def get_state_dict(self, model, unwrap=True):
        if _SAVING_ADAPTER.get() and helpers.zero_below_3(self):
            inner = self.unwrap_model(model)
            kept = helpers.adapter_entries(inner)
            if kept is not None:
                from deepspeed.checkpoint.utils import clone_tensors_for_torch_save

                total = len(inner.state_dict())
                print(f"train-lora plugin: save under ZeRO-1/2: {len(kept)} of {total} tensors copied (adapter)")
                return clone_tensors_for_torch_save(kept)
        return original_state(self, model, unwrap=unwrap)

    save_model._vlm_lora_adapter_save = True
    Trainer.save_model = save_model
    Accelerator.get_state_dict = get_state_dict
    return True


INSTALLED = _install()
MEMORY_FRACTION = _install_memory_cap()
AUTOCAST_INPUT = _install_autocast_input()
FUSED_LORA = _install_fused_lora()
COMPILE_LAYERS, TRAINER_INIT = _install_trainer_init()
LABEL_ROWS_LOSS = _install_label_rows_loss()
RIGHT_PAD_CAUSAL = _install_right_padding_causal()
BATCH_FACTS = _install_batch_facts()
LOSS_NO_WAIT = _install_loss_no_wait()
GRAD_NAN_ON_GPU = _install_grad_nan()  # False until ms-swift's trainers are loaded (then at a trainer's creation)
HOST_VISION_SEQLENS, HOST_VISION_GRID = _install_host_vision(BATCH_FACTS)
TORCH_RMS_NORM = _install_torch_rms_norm()
ADAPTER_ONLY_SAVE = _install_adapter_only_save()
DDP_COMM = _install_ddp_comm()
