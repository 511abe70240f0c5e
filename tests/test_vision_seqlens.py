"""The vision tower's sequence boundaries from a host copy of grid_thw (components/train_lora/vision_seqlens.py)."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

from components.train_lora.vision_seqlens import host_seqlens, install


def _recorder():
    seen = []

    def get_vision_attention_seqlens(grid_thw, config, merge_temporal=False, kwargs=None):
        seen.append(grid_thw)
        seqlens = torch.repeat_interleave(grid_thw[:, 1] * grid_thw[:, 2], grid_thw[:, 0])
        return torch.nn.functional.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0)), None

    return get_vision_attention_seqlens, seen


def test_host_grids_and_flash_attention_go_through_unchanged():
    fn, seen = _recorder()
    grid = torch.tensor([[1, 4, 6], [2, 2, 2]])
    cu, _ = host_seqlens(fn)(grid, SimpleNamespace(_attn_implementation="sdpa"))
    assert seen[-1] is grid  # already on the host: not copied
    assert cu.tolist() == [0, 24, 28, 32]
    host_seqlens(fn)(grid, SimpleNamespace(_attn_implementation="flash_attention_2"), kwargs={})
    assert seen[-1] is grid


def test_a_device_grid_is_copied_to_the_host_only_for_sdpa_and_eager():
    from components.train_lora.vision_seqlens import wants_host_copy

    on_device = torch.empty(2, 3, dtype=torch.long, device="meta")  # stands for a GPU tensor
    assert wants_host_copy(on_device, SimpleNamespace(_attn_implementation="sdpa"))
    assert wants_host_copy(on_device, SimpleNamespace(_attn_implementation="eager"))
    assert not wants_host_copy(on_device, SimpleNamespace(_attn_implementation="flash_attention_2"))
    assert not wants_host_copy(torch.ones(2, 3, dtype=torch.long), SimpleNamespace(_attn_implementation="sdpa"))
    assert not wants_host_copy([[1, 2, 2]], SimpleNamespace(_attn_implementation="sdpa"))


def test_install_wraps_each_module_once():
    fn, _ = _recorder()
    modules = [SimpleNamespace(get_vision_attention_seqlens=fn), SimpleNamespace(other=1)]
    assert install(modules) == 1
    wrapped = modules[0].get_vision_attention_seqlens
    assert wrapped.__wrapped__ is fn
    assert install(modules) == 0 and modules[0].get_vision_attention_seqlens is wrapped


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_one_wait_for_the_gpu_instead_of_three_per_block_gpu():
    from transformers import Qwen3VLVisionConfig
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    config = Qwen3VLVisionConfig(
        depth=6, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=96, deepstack_visual_indexes=[1]
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    tower = modeling_qwen3_vl.Qwen3VLVisionModel(config).cuda().eval()
    grid = torch.tensor([[1, 8, 8], [1, 8, 12]], device="cuda")
    patch = config.in_channels * config.temporal_patch_size * config.patch_size**2
    pixels = torch.randn(int(grid.prod(-1).sum()), patch, device="cuda")

    def run(fn):
        original = modeling_qwen3_vl.get_vision_attention_seqlens
        modeling_qwen3_vl.get_vision_attention_seqlens = fn
        try:
            with warnings.catch_warnings(record=True) as caught, torch.no_grad():
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode(1)
                try:
                    out = tower(pixels, grid_thw=grid).pooler_output
                finally:
                    torch.cuda.set_sync_debug_mode(0)
        finally:
            modeling_qwen3_vl.get_vision_attention_seqlens = original
        in_attention = [
            w for w in caught if w.filename.endswith("modeling_qwen3_vl.py") and "synchroniz" in str(w.message)
        ]
        return out, len(in_attention)

    original = getattr(
        modeling_qwen3_vl.get_vision_attention_seqlens,
        "__wrapped__",
        modeling_qwen3_vl.get_vision_attention_seqlens,
    )
    out_gpu, waits_gpu = run(original)
    out_host, waits_host = run(host_seqlens(original))
    assert waits_gpu >= 3 * config.depth  # q, k and v split in every block
    assert waits_host < waits_gpu - 3 * config.depth + 3
    assert torch.equal(out_host, out_gpu)
