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


def _helpers():
    from transformers import vision_utils

    unwrap = lambda f: getattr(f, "__wrapped__", f)  # noqa: E731
    return (
        unwrap(vision_utils.get_vision_position_ids),
        unwrap(vision_utils.get_vision_interpolation_indices_and_weights),
    )


GRID = [[1, 8, 8], [1, 8, 12], [2, 4, 6]]


def _as_device(monkeypatch):
    """CPU tensors stand for device ones (the wrappers then compute from a host copy and send results back)."""
    from components.train_lora import vision_seqlens

    monkeypatch.setattr(vision_seqlens, "device_grid", lambda grid: isinstance(grid, torch.Tensor))
    monkeypatch.setattr(vision_seqlens, "_last_copy", [None, -1, None])
    return vision_seqlens


def test_position_ids_and_interpolation_from_one_host_copy_equal_the_originals(monkeypatch):
    vision_seqlens = _as_device(monkeypatch)
    position_ids, interpolation = _helpers()
    seen = []

    def spy(fn):
        def inner(grid, *args, **kwargs):
            seen.append(grid)
            return fn(grid, *args, **kwargs)

        return inner

    grid = torch.tensor(GRID)
    wrapped_ids = vision_seqlens.host_position_ids(spy(position_ids))
    wrapped_interp = vision_seqlens.host_interpolation(spy(interpolation))
    ids = wrapped_ids(grid, 2, kwargs={})
    indices, weights = wrapped_interp(
        grid, num_grid_per_side=48, mode="bilinear", align_corners=True, spatial_merge_size=2, kwargs={}
    )
    assert torch.equal(ids, position_ids(grid, 2))
    ref_indices, ref_weights = interpolation(grid, 48, mode="bilinear", align_corners=True, spatial_merge_size=2)
    assert torch.equal(indices, ref_indices) and torch.equal(weights, ref_weights)
    assert ids.shape == (8 * 8 + 8 * 12 + 2 * 4 * 6, 2) and weights.shape == (ids.shape[0], 4)
    # both computed from one host copy of the grid, not the grid itself
    assert len(seen) == 2 and seen[0] is seen[1] and seen[0] is not grid and torch.equal(seen[0], grid)
    grid[0, 1] = 4  # changed in place: copied again
    wrapped_ids(grid, 2, kwargs={})
    assert seen[-1] is not seen[0] and seen[-1][0, 1] == 4


def test_precomputed_results_and_per_image_merge_sizes_go_to_the_original(monkeypatch):
    vision_seqlens = _as_device(monkeypatch)
    position_ids, interpolation = _helpers()
    grid = torch.tensor(GRID)
    given = torch.zeros(3, 2, dtype=torch.long)
    kwargs = {"position_ids": given}
    assert vision_seqlens.host_position_ids(position_ids)(grid, 2, kwargs=kwargs) is given
    assert kwargs == {}  # popped by the original, as without the wrapper
    merge = torch.tensor([2, 2, 2])  # a tensor argument: computed where it lives, by the original
    assert torch.equal(vision_seqlens.host_position_ids(position_ids)(grid, merge), position_ids(grid, merge))
    indices, weights = torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 4)
    kwargs = {"interp_indices": indices, "interp_weights": weights}
    out = vision_seqlens.host_interpolation(interpolation)(grid, 48, spatial_merge_size=2, kwargs=kwargs)
    assert out[0] is indices and out[1] is weights and kwargs == {}


def test_install_wraps_the_index_helpers_once_by_name():
    from components.train_lora import vision_seqlens

    position_ids, interpolation = _helpers()
    module = SimpleNamespace(
        get_vision_position_ids=position_ids, get_vision_interpolation_indices_and_weights=interpolation
    )
    names = ("get_vision_position_ids", "get_vision_interpolation_indices_and_weights")
    assert vision_seqlens.install([module], names) == 2
    assert module.get_vision_position_ids.__wrapped__ is position_ids
    assert vision_seqlens.install([module], names) == 0
    assert vision_seqlens.install([module]) == 0  # the boundaries' helper: absent here


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_the_tower_waits_once_and_computes_the_same_gpu():
    from transformers import Qwen3VLVisionConfig
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    from components.train_lora import vision_seqlens

    config = Qwen3VLVisionConfig(
        depth=4, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=96, deepstack_visual_indexes=[1]
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    tower = modeling_qwen3_vl.Qwen3VLVisionModel(config).cuda().eval()
    grid = torch.tensor(GRID, device="cuda")
    patch = config.in_channels * config.temporal_patch_size * config.patch_size**2
    pixels = torch.randn(int(grid.prod(-1).sum()), patch, device="cuda")
    names = tuple(vision_seqlens.WRAPPERS)
    originals = {n: getattr(getattr(modeling_qwen3_vl, n), "__wrapped__", getattr(modeling_qwen3_vl, n)) for n in names}

    def run(wrap: bool):
        for name, fn in originals.items():
            setattr(modeling_qwen3_vl, name, vision_seqlens.WRAPPERS[name][0](fn) if wrap else fn)
        vision_seqlens._last_copy[:] = [None, -1, None]
        try:
            with warnings.catch_warnings(record=True) as caught, torch.no_grad():
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode(1)
                try:
                    out = tower(pixels, grid_thw=grid).pooler_output
                finally:
                    torch.cuda.set_sync_debug_mode(0)
        finally:
            for name, fn in originals.items():
                setattr(modeling_qwen3_vl, name, fn)
        waits = [w for w in caught if "synchroniz" in str(w.message) and "vision_utils.py" in w.filename]
        return out, len(waits), sum("synchroniz" in str(w.message) for w in caught)

    out_gpu, helper_waits_gpu, all_gpu = run(False)
    out_host, helper_waits_host, all_host = run(True)
    assert helper_waits_gpu >= 10 and helper_waits_host == 0
    assert all_host <= all_gpu - 10  # the helpers' 10 waits: one host copy of the grid instead
    assert torch.equal(out_host, out_gpu)
    position_ids, interpolation = _helpers()
    host_ids = vision_seqlens.host_position_ids(position_ids)(grid, 2)
    assert host_ids.is_cuda and torch.equal(host_ids, position_ids(grid, 2))
    args = {"num_grid_per_side": 48, "mode": "bilinear", "align_corners": True, "spatial_merge_size": 2}
    for got, want in zip(vision_seqlens.host_interpolation(interpolation)(grid, **args), interpolation(grid, **args)):
        assert got.is_cuda and torch.equal(got, want)
