"""The vision tower's sequence boundaries from a host copy of grid_thw (speedups/vision_seqlens.py)."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

from speedups.vision_seqlens import host_seqlens, install


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
    from speedups.vision_seqlens import wants_host_copy

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
    from speedups.vision_seqlens import DeviceParts

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

    from speedups.vision_seqlens import (
        TARGET,
        DeviceParts,
        cached_interpolation,
        cached_position_ids,
    )

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
    from speedups.vision_seqlens import DeviceParts, cached_interpolation, cached_position_ids

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
    from speedups.vision_seqlens import TARGET

    token = TARGET.set(torch.device("cpu"))
    try:
        out = cached_interpolation(interpolation, parts)(grid, num_grid_per_side=6, kwargs=given)
    finally:
        TARGET.reset(token)
    assert seen[-1] is given and len(out) == 2 and parts.computed == 0 and given == {}


def test_host_grid_call_gives_a_host_copy_and_the_device_then_restores(monkeypatch):
    from speedups import vision_seqlens

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

    from speedups import vision_seqlens

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
    from speedups.vision_seqlens import install_grid

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
    assert install_grid([module]) == {"functions": 2, "calls": 2, "facts": 0}  # the fake model has no forward
    assert install_grid([module]) == {"functions": 0, "calls": 0, "facts": 0}
    Qwen3VLModel.forward = lambda self, input_ids=None: input_ids
    Qwen3VLModel.get_placeholder_mask = lambda self, input_ids, inputs_embeds: None
    assert install_grid([module], facts=False)["facts"] == 0
    assert install_grid([module])["facts"] == 2 and install_grid([module])["facts"] == 0
    assert getattr(Qwen3VLVisionModel.forward, "_vlm_lora_host_grid", False)
    assert not getattr(module.Other.forward, "_vlm_lora_host_grid", False)


def test_the_plugin_installs_the_grid_work_on_qwen3_vl():
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    from speedups import swift_plugin

    assert swift_plugin.CONTEXT.state["host_vision"][1]
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

    from speedups import swift_plugin  # noqa: F401 (installs the wrappers)

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


# --- what the model's forward reads from its inputs, copied once at its start (facts_call) ---


class _HostReads(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the operations that make the host read a tensor's values (on a GPU, each a wait for it)."""

    READS = ("_local_scalar_dense", "is_nonzero", "nonzero", "equal")

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in self.READS:
            self.reads.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _qwen3_vl_model():
    from transformers import Qwen3VLConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    text = {
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 80, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]},
    }  # fmt: skip
    vision = {
        "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 4, "out_hidden_size": 32,
        "deepstack_visual_indexes": [0, 1],
    }  # fmt: skip
    config = Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=60, video_token_id=61)
    config._attn_implementation = config.text_config._attn_implementation = "sdpa"
    config.vision_config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen3VLModel(config).train()


def _batch(config, left_padded: bool = False):
    """Two right-padded rows (or left-padded ones), the first with a 4-token image, the second with a 6-token one."""
    grid = torch.tensor([[1, 4, 4], [1, 4, 6]])
    rows = [[5, 6, *[60] * 4, 7, 8], [9, *[60] * 6, 10, 11, 12, 13]]
    length = max(len(r) for r in rows)
    ids = torch.zeros(2, length, dtype=torch.long)
    mask = torch.zeros(2, length, dtype=torch.long)
    for i, row in enumerate(rows):
        at = slice(length - len(row), length) if left_padded else slice(0, len(row))
        ids[i, at], mask[i, at] = torch.tensor(row), 1
    patch = config.vision_config.in_channels * config.vision_config.temporal_patch_size
    pixels = torch.randn(int(grid.prod(-1).sum()), patch * config.vision_config.patch_size**2)
    position_ids = torch.arange(length).expand(3, 2, length)
    return {"input_ids": ids, "attention_mask": mask, "pixel_values": pixels, "image_grid_thw": grid,
            "position_ids": position_ids}  # fmt: skip


def _forward(model, batch, facts: bool, monkeypatch, parts=None):
    """The model's forward and backward stock, or with facts_call and its consumers (the CPU taken for a GPU); the
    hidden states, two gradients and the host reads counted in the forward."""
    from transformers import masking_utils
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    from speedups import deepstack, right_padding, vision_seqlens

    cls = modeling_qwen3_vl.Qwen3VLModel
    plain = {name: _plain(getattr(cls, name)) for name in ("forward", "get_placeholder_mask", "get_image_features")}
    mask_fn = masking_utils._ignore_causal_mask_sdpa
    while hasattr(mask_fn, "_vlm_lora_right_padding"):
        mask_fn = mask_fn.__wrapped__
    text_model = model.language_model
    monkeypatch.setattr(text_model, "_deepstack_process", type(text_model)._deepstack_process.__get__(text_model))
    if facts:
        monkeypatch.setattr(vision_seqlens, "on_device", lambda t: isinstance(t, torch.Tensor))
        monkeypatch.setattr(cls, "forward", vision_seqlens.facts_call(plain["forward"]))
        monkeypatch.setattr(
            cls, "get_placeholder_mask", vision_seqlens.placeholder_from_facts(plain["get_placeholder_mask"])
        )
        monkeypatch.setattr(
            cls, "get_image_features", vision_seqlens.host_grid_call(plain["get_image_features"], "image_grid_thw")
        )
        monkeypatch.setattr(
            masking_utils,
            "_ignore_causal_mask_sdpa",
            right_padding.right_padded_causal_skip(mask_fn, vision_seqlens.known_right_aligned),
        )
        for name, wrap in vision_seqlens.INDEX_FUNCTIONS.items():  # the tower's grid work (item 7) as well
            monkeypatch.setattr(
                modeling_qwen3_vl,
                name,
                wrap(_plain(getattr(modeling_qwen3_vl, name)), parts or vision_seqlens.DeviceParts()),
            )
        tower = modeling_qwen3_vl.Qwen3VLVisionModel
        monkeypatch.setattr(tower, "forward", vision_seqlens.host_grid_call(_plain(tower.forward), "grid_thw"))
        deepstack.install(model)
    else:
        for name, fn in plain.items():
            monkeypatch.setattr(cls, name, fn)
        monkeypatch.setattr(masking_utils, "_ignore_causal_mask_sdpa", right_padding.right_padded_causal_skip(mask_fn))
    model.zero_grad()
    with _HostReads() as counted:
        out = model(**batch).last_hidden_state
    out.square().sum().backward()
    grads = [model.language_model.layers[0].mlp.up_proj.weight.grad.clone(), model.visual.merger.linear_fc2.weight.grad]
    return out.detach(), grads, counted.reads  # fmt: skip


def test_the_forward_reads_its_inputs_once_and_computes_the_same(monkeypatch):
    """The real Qwen3-VL model (tiny, on the CPU taken for a GPU): with the facts copied at the forward's start,
    the placeholder check, the right-padding check and the deepstack positions read nothing more from the device;
    the hidden states and gradients equal the stock forward's."""
    model = _qwen3_vl_model()
    batch = _batch(model.config)
    from speedups import vision_seqlens

    stock, stock_grads, stock_reads = _forward(model, batch, False, monkeypatch)
    parts = vision_seqlens.DeviceParts()
    _forward(model, batch, True, monkeypatch, parts)  # the tower's per-size parts computed (on the host by design)
    mine, grads, reads = _forward(model, batch, True, monkeypatch, parts)
    assert reads == [] and len(stock_reads) >= 3, (reads, stock_reads)
    torch.testing.assert_close(mine, stock)
    for got, want in zip(grads, stock_grads, strict=True):
        assert want is None and got is None or torch.testing.assert_close(got, want) is None
    assert vision_seqlens.FACTS.get() is None  # reset after the forward


def test_facts_keep_the_mask_for_left_padding_and_the_check_for_mismatched_tokens(monkeypatch):
    from speedups import vision_seqlens

    model = _qwen3_vl_model()
    batch = _batch(model.config, left_padded=True)
    stock, _, _ = _forward(model, batch, False, monkeypatch)
    mine, _, _ = _forward(model, batch, True, monkeypatch)
    torch.testing.assert_close(mine, stock)  # the padding mask kept: left padding is not in the future
    facts = vision_seqlens.gather_facts(model.config, batch["input_ids"], batch["attention_mask"], [])
    assert facts.right_aligned is False and facts.tokens == {60: 10, 61: 0} and facts.mask_shape == (2, 11)
    batch["input_ids"][1, 1] = 5  # one image token fewer than the tower's features
    with pytest.raises(ValueError, match="Image features and image tokens do not match, tokens: 9, features: 10"):
        _forward(model, batch, True, monkeypatch)


def test_gathered_facts_hold_the_grids_and_nothing_off_the_device():
    from speedups import vision_seqlens

    config = SimpleNamespace(image_token_id=3, video_token_id=4)
    ids = torch.tensor([[3, 3, 1], [4, 1, 1]])
    assert vision_seqlens.gather_facts(config, ids, None, []) is None  # a host tensor: nothing to gather
    assert vision_seqlens.known_right_aligned(torch.ones(2, 3)) is None  # outside a forward: not known


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_one_wait_for_the_whole_model_forward_gpu(monkeypatch):
    """On a GPU, with the plugin's wrappers: the tiny Qwen3-VL model's training forward waits for the GPU once
    (the facts' copy at its start); transformers' own forward and placeholder mask wait more, the same output."""
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    from speedups import deepstack, swift_plugin  # noqa: F401 (installs the wrappers)
    from speedups.tests.gpu_waits import gpu_waits

    model = _qwen3_vl_model().cuda()
    deepstack.install(model)
    batch = {k: v.cuda() for k, v in _batch(model.config).items()}

    def run():
        out, waits = gpu_waits(lambda: model(**batch).last_hidden_state)
        return out.detach(), len(waits)

    cls = modeling_qwen3_vl.Qwen3VLModel
    assert getattr(cls.forward, "_vlm_lora_host_grid", False)
    run()  # the tower's per-size parts computed
    mine, waits = run()
    for name in ("forward", "get_placeholder_mask"):
        monkeypatch.setattr(cls, name, _plain(getattr(cls, name)))
    stock, stock_waits = run()
    assert waits == 1 and stock_waits > waits, (waits, stock_waits)
    torch.testing.assert_close(mine, stock)
