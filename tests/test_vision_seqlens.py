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


# --- the rest of the tower's grid work from the same host copy (install_grid) ---


def _plain(fn):
    """`fn` without this module's wrappers (the plugin may have installed them in this process)."""
    while getattr(fn, "_vlm_lora_host_grid", False) or getattr(fn, "_vlm_lora_host_seqlens", False):
        fn = fn.__wrapped__
    return fn


GRIDS = [[1, 4, 6], [1, 8, 8], [2, 4, 4], [1, 8, 8], [1, 6, 4]]  # four sizes, one twice


def test_device_parts_compute_once_per_key_and_keep_the_latest():
    from components.train_lora.vision_seqlens import DeviceParts

    parts = DeviceParts(entries=2)
    calls = []

    def compute(value):
        calls.append(value)
        return torch.tensor([value])

    assert parts.get(("a",), "cpu", lambda: compute(1)).tolist() == [1]
    assert parts.get(("a",), "cpu", lambda: compute(9)).tolist() == [1]  # cached: not computed again
    parts.get(("b",), "cpu", lambda: compute(2))
    parts.get(("a",), "cpu", lambda: compute(9))  # a is now the latest
    parts.get(("c",), "cpu", lambda: compute(3))  # evicts b, the least recent
    assert parts.get(("b",), "cpu", lambda: compute(4)).tolist() == [4]
    assert calls == [1, 2, 3, 4] and parts.computed == 4 and len(parts.parts) == 2
    pair = parts.get(("d",), "cpu", lambda: (torch.ones(2), torch.zeros(1)))
    assert isinstance(pair, tuple) and pair[0].tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="entries=0"):
        DeviceParts(entries=0)


@pytest.mark.parametrize(("mode", "align_corners"), [("bilinear", True), ("bilinear", False), ("bicubic", False)])
def test_index_functions_under_a_target_equal_transformers_for_mixed_grids(mode, align_corners):
    from transformers import vision_utils

    from components.train_lora.vision_seqlens import TARGET, DeviceParts, cached_interpolation, cached_position_ids

    grid = torch.tensor(GRIDS)
    interp, position_ids = (
        _plain(vision_utils.get_vision_interpolation_indices_and_weights),
        _plain(vision_utils.get_vision_position_ids),
    )
    want_idx, want_w = interp(grid, num_grid_per_side=6, mode=mode, align_corners=align_corners, spatial_merge_size=2)
    want_pos = position_ids(grid, 2)
    parts = DeviceParts()
    token = TARGET.set(torch.device("cpu"))
    try:
        for _ in range(3):  # the first call computes, the others reuse
            idx, w = cached_interpolation(interp, parts)(
                grid, num_grid_per_side=6, mode=mode, align_corners=align_corners, spatial_merge_size=2, kwargs={}
            )
            forward_kwargs = {"position_ids": None}
            pos = cached_position_ids(position_ids, parts)(grid, 2, kwargs=forward_kwargs)
            assert forward_kwargs == {}  # taken out, as transformers does, so the blocks do not get it
            assert torch.equal(idx, want_idx) and torch.equal(w, want_w) and torch.equal(pos, want_pos)
    finally:
        TARGET.reset(token)
    assert parts.computed == 2 * 4  # four image sizes, two functions, once each


def test_index_functions_run_as_they_are_without_a_target_or_with_precomputed_values():
    from components.train_lora.vision_seqlens import DeviceParts, cached_interpolation, cached_position_ids

    seen = []

    def position_ids(grid_thw, spatial_merge_size, include_temporal=False, kwargs=None):
        seen.append(grid_thw)
        return torch.zeros(1)

    parts = DeviceParts()
    grid = torch.tensor(GRIDS)
    cached_position_ids(position_ids, parts)(grid, 2)  # no forward on a host copy: the whole grid, as it is
    assert seen[-1] is grid and parts.computed == 0

    def interpolation(grid_thw, num_grid_per_side, mode="bilinear", kwargs=None, **options):
        seen.append(kwargs)
        return kwargs.pop("interp_indices"), kwargs.pop("interp_weights")

    given = {"interp_indices": torch.ones(1), "interp_weights": torch.ones(1)}
    from components.train_lora.vision_seqlens import TARGET

    token = TARGET.set(torch.device("cpu"))
    try:
        out = cached_interpolation(interpolation, parts)(grid, num_grid_per_side=6, kwargs=given)
    finally:
        TARGET.reset(token)
    assert seen[-1] is given and len(out) == 2 and parts.computed == 0 and given == {}


def test_host_grid_call_gives_a_host_copy_and_the_device_then_restores(monkeypatch):
    from components.train_lora import vision_seqlens

    seen = []

    def forward(self, hidden, grid_thw=None, **kwargs):
        seen.append((grid_thw, vision_seqlens.TARGET.get()))
        if kwargs.get("fail"):
            raise RuntimeError("inside")
        return hidden

    grid = torch.tensor(GRIDS)
    wrapped = vision_seqlens.host_grid_call(forward, "grid_thw")
    wrapped(None, "h", grid)
    assert seen[-1] == (grid, None)  # a host grid: nothing changes
    monkeypatch.setattr(vision_seqlens, "on_device", lambda g: g is grid)  # stands for a GPU grid
    wrapped(None, "h", grid)
    wrapped(None, "h", grid_thw=grid)
    for copy, target in seen[1:]:
        assert copy is not grid and torch.equal(copy, grid) and target == grid.device
    with pytest.raises(RuntimeError, match="inside"):
        wrapped(None, "h", grid_thw=grid, fail=True)
    assert vision_seqlens.TARGET.get() is None  # reset after an error too


def _qwen3_vl_tower():
    from transformers import Qwen3VLVisionConfig
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    config = Qwen3VLVisionConfig(
        depth=2, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=96, deepstack_visual_indexes=[1]
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return config, modeling_qwen3_vl.Qwen3VLVisionModel(config).eval()


def test_image_features_from_a_host_copy_equal_the_stock_ones(monkeypatch):
    """The real Qwen3-VL tower and get_image_features with the wrappers, the grid taken for a device grid."""
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    from components.train_lora import vision_seqlens

    config, tower = _qwen3_vl_tower()
    grid = torch.tensor(GRIDS)
    patch = config.in_channels * config.temporal_patch_size * config.patch_size**2
    pixels = torch.randn(int(grid.prod(-1).sum()), patch)
    get_image_features = _plain(modeling_qwen3_vl.Qwen3VLModel.get_image_features)
    holder = SimpleNamespace(visual=tower, config=SimpleNamespace(return_dict=True, use_return_dict=True))

    def features():
        with torch.no_grad():
            out = modeling_qwen3_vl.Qwen3VLModel.get_image_features(holder, pixels, grid)
        return out.pooler_output, out.deepstack_features

    for name in ("get_vision_position_ids", "get_vision_interpolation_indices_and_weights"):
        monkeypatch.setattr(modeling_qwen3_vl, name, _plain(getattr(modeling_qwen3_vl, name)))
    monkeypatch.setattr(modeling_qwen3_vl.Qwen3VLVisionModel, "forward", _plain(tower.forward.__func__))
    monkeypatch.setattr(modeling_qwen3_vl.Qwen3VLModel, "get_image_features", get_image_features)
    stock = features()

    parts = vision_seqlens.DeviceParts()
    monkeypatch.setattr(vision_seqlens, "on_device", lambda g: g is grid)
    monkeypatch.setattr(
        modeling_qwen3_vl,
        "get_vision_position_ids",
        vision_seqlens.cached_position_ids(modeling_qwen3_vl.get_vision_position_ids, parts),
    )
    monkeypatch.setattr(
        modeling_qwen3_vl,
        "get_vision_interpolation_indices_and_weights",
        vision_seqlens.cached_interpolation(modeling_qwen3_vl.get_vision_interpolation_indices_and_weights, parts),
    )
    monkeypatch.setattr(
        modeling_qwen3_vl.Qwen3VLModel,
        "get_image_features",
        vision_seqlens.host_grid_call(get_image_features, "image_grid_thw"),
    )
    first, again = features(), features()
    assert parts.computed == 2 * 4  # four image sizes, once each
    for out in (first, again):
        assert all(torch.equal(a, b) for a, b in zip(out[0], stock[0], strict=True))
        for mine, theirs in zip(out[1], stock[1], strict=True):
            assert all(torch.equal(a, b) for a, b in zip(mine, theirs, strict=True))


def test_install_grid_wraps_functions_and_qwen3_vl_calls_once():
    from components.train_lora.vision_seqlens import install_grid

    class Qwen3VLVisionModel:
        def forward(self, hidden, grid_thw=None):
            return grid_thw

    class Qwen3VLModel:
        def get_image_features(self, pixel_values, image_grid_thw=None):
            return image_grid_thw

    module = SimpleNamespace(
        get_vision_position_ids=lambda *a, **k: None,
        get_vision_interpolation_indices_and_weights=lambda *a, **k: None,
        Qwen3VLVisionModel=Qwen3VLVisionModel,
        Qwen3VLModel=Qwen3VLModel,
        Other=type("Other", (), {"forward": lambda self: None}),
    )
    assert install_grid([module]) == {"functions": 2, "calls": 2}
    assert install_grid([module]) == {"functions": 0, "calls": 0}
    assert getattr(Qwen3VLVisionModel.forward, "_vlm_lora_host_grid", False)
    assert not getattr(module.Other.forward, "_vlm_lora_host_grid", False)


def test_the_plugin_installs_the_grid_work_on_qwen3_vl():
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    from components.train_lora import swift_plugin

    assert swift_plugin.HOST_VISION_GRID is not None
    for fn in (
        modeling_qwen3_vl.Qwen3VLVisionModel.forward,
        modeling_qwen3_vl.Qwen3VLModel.get_image_features,
        modeling_qwen3_vl.get_vision_position_ids,
        modeling_qwen3_vl.get_vision_interpolation_indices_and_weights,
    ):
        assert getattr(fn, "_vlm_lora_host_grid", False), fn


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_one_wait_for_the_whole_tower_gpu():
    """On a GPU: get_image_features of a device grid waits for the GPU once with the plugin's wrappers."""
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    from components.train_lora import swift_plugin  # noqa: F401 (installs the wrappers)

    config, tower = _qwen3_vl_tower()
    tower = tower.cuda()
    grid = torch.tensor(GRIDS, device="cuda")
    patch = config.in_channels * config.temporal_patch_size * config.patch_size**2
    pixels = torch.randn(int(grid.prod(-1).sum()), patch, device="cuda")
    holder = SimpleNamespace(visual=tower, config=SimpleNamespace(return_dict=True, use_return_dict=True))

    def run(get_image_features):
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode(1)
            try:
                out = get_image_features(holder, pixels, grid)
            finally:
                torch.cuda.set_sync_debug_mode(0)
        return out.pooler_output, sum("synchroniz" in str(w.message) for w in caught)

    wrapped = modeling_qwen3_vl.Qwen3VLModel.get_image_features
    assert getattr(wrapped, "_vlm_lora_host_grid", False)
    mine, waits = run(wrapped)
    run(wrapped)  # the parts are on the GPU now
    mine, waits_cached = run(wrapped)
    originals = {
        name: _plain(getattr(modeling_qwen3_vl, name))
        for name in ("get_vision_position_ids", "get_vision_interpolation_indices_and_weights")
    }
    saved = {name: getattr(modeling_qwen3_vl, name) for name in originals}
    forward = modeling_qwen3_vl.Qwen3VLVisionModel.forward
    try:
        for name, fn in originals.items():
            setattr(modeling_qwen3_vl, name, fn)
        modeling_qwen3_vl.Qwen3VLVisionModel.forward = _plain(forward)
        stock, stock_waits = run(_plain(wrapped))
    finally:
        for name, fn in saved.items():
            setattr(modeling_qwen3_vl, name, fn)
        modeling_qwen3_vl.Qwen3VLVisionModel.forward = forward
    print(f"host waits: stock {stock_waits}, wrapped {waits} (first) / {waits_cached} (cached)")
    assert waits_cached <= 2 < 10 <= stock_waits
    assert all(torch.equal(a, b) for a, b in zip(mine, stock, strict=True))
