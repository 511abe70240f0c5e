"""The train-lora plugin (speedups/swift_plugin.py) installs each of its patches when
imported by `swift sft`, and each switch in the job environment turns its own off. Two fresh
interpreters (the plugin patches libraries at import): every switch at its default, then every one
flipped. A stand-in Liger (its call structure, and a distribution record of its version) stands for the
real one, whose kernels need a GPU."""

from __future__ import annotations

import os
import textwrap

import pytest

from speedups.tests.plugin_run import ROOT, last_line

# The same call structure as Liger 0.8.5: LigerForCausalLMLoss shifts and flattens, then looks
# fixed_fused_linear_cross_entropy up in its own module's globals (Liger's kernels need a GPU).
FAKE_LIGER = {
    "liger_kernel/__init__.py": "",
    "liger_kernel/transformers/__init__.py": "",
    "liger_kernel/transformers/model/__init__.py": "",
    "liger_kernel/transformers/model/loss_utils.py": """
        import torch
        import torch.nn.functional as F

        SEEN = []

        def fixed_fused_linear_cross_entropy(hidden_states, lm_head_weight, target, num_items_in_batch=None,
                                             ignore_index=-100, final_logit_softcapping=None, **kwargs):
            SEEN.append(hidden_states.shape[0])
            return F.cross_entropy(hidden_states @ lm_head_weight.t(), target, ignore_index=ignore_index)

        def LigerForCausalLMLoss(hidden_states, lm_head_weight, labels, hidden_size, num_items_in_batch=None,
                                 ignore_index=-100, shift_labels=None, final_logit_softcapping=None, **kwargs):
            if shift_labels is None:
                labels = F.pad(labels, (0, 1), value=ignore_index)
                shift_labels = labels[..., 1:].contiguous()
            return fixed_fused_linear_cross_entropy(hidden_states.view(-1, hidden_size), lm_head_weight,
                                                    shift_labels.view(-1), num_items_in_batch, ignore_index,
                                                    final_logit_softcapping)
    """,
    "liger_kernel/ops/__init__.py": "",
    "liger_kernel/ops/fused_linear_cross_entropy.py": """
        def fused_linear_cross_entropy_forward(_input, weight, target, ignore_index=-100):
            target_mask = target != ignore_index
            total_n_non_ignore = target_mask.sum().item()
            return total_n_non_ignore

        def fused_linear_cross_entropy_backward(grad_output, grad_input, grad_weight, grad_bias):
            return grad_input, grad_weight, grad_bias
    """,
    # a model module binds LigerForCausalLMLoss by name (transformers loads it when training starts)
    "liger_kernel/transformers/model/qwen3_vl.py": "from .loss_utils import LigerForCausalLMLoss\n",
    # what importlib.metadata reads: the version the registry checks against its verified range
    "liger_kernel-0.8.5.dist-info/METADATA": "Metadata-Version: 2.1\nName: liger-kernel\nVersion: 0.8.5\n",
}

CODE = """
import inspect
import torch
import transformers.models.qwen2_5_vl.modeling_qwen2_5_vl  # loaded first, without the function: untouched
from transformers.models.qwen3_vl_moe import modeling_qwen3_vl_moe as before
from speedups import swift_plugin as entry
from speedups import lora_switches, token_count
from transformers.models.qwen3_vl import modeling_qwen3_vl as after
from transformers import Trainer, masking_utils
from liger_kernel.transformers.model import loss_utils, qwen3_vl as liger_qwen3_vl
from liger_kernel.ops import fused_linear_cross_entropy as flce_ops

hidden = torch.randn(2, 8, 4, requires_grad=True)
labels = torch.full((2, 8), -100)
labels[0, 5:7] = 1
labels[1, 7] = 2  # the last position has no next token: 3 labelled rows after the shift
loss = loss_utils.LigerForCausalLMLoss(hidden, torch.randn(5, 4), labels, hidden_size=4)
loss.backward()
flag = lambda f, name: bool(getattr(f, name, False))
ctx = entry.CONTEXT
on = lambda number: not ctx.loaded[number].skipped  # installed when the plugin loaded
seqlens, grid = ctx.state.get("host_vision", (0, {}))
print(
    on(5), loss_utils.SEEN[-1], bool(torch.isfinite(loss)),
    on(6), flag(masking_utils._ignore_causal_mask_sdpa, "_vlm_lora_right_padding"),
    on(7) and seqlens > 0,
    flag(before.get_vision_attention_seqlens, "_vlm_lora_host_seqlens"),
    flag(after.get_vision_attention_seqlens, "_vlm_lora_host_seqlens"),
    on(3), flag(Trainer.__init__, "_vlm_lora_init"),
    "processing_class" in inspect.signature(Trainer.__init__).parameters,  # ms-swift reads it
    lora_switches.LEAN, lora_switches.GROUP, lora_switches.INPLACE, lora_switches.FUSED_BASE,
    token_count.ASYNC_TOKENS, on(9), flag(__import__("transformers.trainer").trainer.apply_liger_kernel, "_vlm_lora_torch_rms_norm"),
    lora_switches.TRITON,
    on(12), flag(Trainer.save_model, "_vlm_lora_adapter_save"),
    lora_switches.SILU_MUL_DOWN, lora_switches.SEEDED,
    on(7) and bool(grid), flag(after.Qwen3VLVisionModel.forward, "_vlm_lora_host_grid"),
    flag(after.get_vision_position_ids, "_vlm_lora_host_grid"), on(14),
    lora_switches.CAST_CACHE, lora_switches.FOLD,
    flag(after.Qwen3VLModel.forward, "_vlm_lora_host_grid"),
    on(16),
    on(18), flag(flce_ops.fused_linear_cross_entropy_forward, "_vlm_lora_count"),
    flag(flce_ops.fused_linear_cross_entropy_backward, "_vlm_lora_scaled"),
    flag(liger_qwen3_vl.LigerForCausalLMLoss, "_vlm_lora_host_rows"),
)
"""

SWITCHES_OFF = {
    "VLM_LORA_LABEL_ROWS_LOSS": "0",
    "VLM_LORA_RIGHT_PAD_CAUSAL": "0",
    "VLM_LORA_HOST_VISION_SEQLENS": "0",
    "VLM_LORA_FUSED_LORA": "0",
    "VLM_LORA_LEAN_LORA": "0",
    "VLM_LORA_GROUP_LORA": "0",
    "VLM_LORA_INPLACE_ADD": "0",
    "VLM_LORA_FUSED_BASE": "0",
    "VLM_LORA_TORCH_RMS_NORM": "1",  # opt-in: on here
    "VLM_LORA_ASYNC_TOKENS": "0",
    "VLM_LORA_TRITON_LORA": "0",
    "VLM_LORA_ADAPTER_ONLY_SAVE": "0",
    "VLM_LORA_SILU_MUL_DOWN": "0",
    "VLM_LORA_SEEDED_DROPOUT": "1",  # opt-in (the planner sets it): on here
    "VLM_LORA_CAST_CACHE": "0",
    "VLM_LORA_FOLD_SCALING": "0",
    "VLM_LORA_FORWARD_FACTS": "0",
    "VLM_LORA_BATCH_FACTS": "0",
    "VLM_LORA_LOSS_NO_WAIT": "0",
}


@pytest.mark.parametrize(
    ("flipped", "expected"),
    [
        (
            False,
            "True 3 True True True True True True True True True True True True True True False False True "
            "True True True False True True True True True True True True True True True True",
        ),
        (
            True,
            "False 16 True False False False False False False True True False False False False False True True False "
            "False False False True False False False True False False False False False False False False",
        ),
    ],
)
def test_each_patch_is_installed_and_its_switch_turns_it_off(tmp_path, flipped, expected):
    env = {k: (v if flipped else "") for k, v in SWITCHES_OFF.items()}
    assert _run_with_fake_liger(tmp_path, **env) == expected


def _run_with_fake_liger(tmp_path, code: str = CODE, version: str = "0.8.5", **env: str) -> str:
    for name, text in FAKE_LIGER.items():
        path = tmp_path / name.replace("0.8.5", version)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).replace("0.8.5", version))
    return last_line(textwrap.dedent(code), PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]), **env)


def test_the_loss_s_waits_have_their_own_switch(tmp_path):
    """Item 18 off, item 5 (the labelled rows) on: Liger's forward, backward and loss are left as they are."""
    fields = _run_with_fake_liger(tmp_path, VLM_LORA_LOSS_NO_WAIT="0").split()
    assert fields[:3] == ["True", "3", "True"] and fields[-4:] == ["False"] * 4


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"WORLD_SIZE": "2"}, "True True"),  # more than one process: torch's RMSNorm by default
        ({"WORLD_SIZE": "2", "VLM_LORA_TORCH_RMS_NORM": "0"}, "False False"),
        ({"WORLD_SIZE": "1"}, "False False"),
        ({"WORLD_SIZE": "2", "VLM_LORA_HOST_VISION_GRID": "0"}, "True True"),
    ],
)
def test_torch_rms_norm_is_on_by_default_with_more_than_one_process(tmp_path, env, expected):
    code = """
import transformers.trainer
from speedups import swift_plugin as plugin
print(not plugin.CONTEXT.loaded[9].skipped,
      bool(getattr(transformers.trainer.apply_liger_kernel, "_vlm_lora_torch_rms_norm", False)))
"""
    assert _run_with_fake_liger(tmp_path, code, **env) == expected


def test_the_grid_switch_leaves_the_boundaries_on_the_host(tmp_path):
    code = """
from speedups import swift_plugin as plugin
from transformers.models.qwen3_vl import modeling_qwen3_vl as m
seqlens, grid = plugin.CONTEXT.state["host_vision"]
print(seqlens > 0, grid, getattr(m.Qwen3VLVisionModel.forward, "_vlm_lora_host_grid", False))
"""
    assert last_line(code, PYTHONPATH=str(ROOT), VLM_LORA_HOST_VISION_GRID="0") == "True {} False"
