"""Checkpointing only as many decoder layers as the card needs: the planner's choice (`_plan`, `partial`) and
speed-up item 19 (`speedups/checkpoint_layers.py`) that applies it, on the tiny Qwen3-VL text model on a CPU."""

from __future__ import annotations

import pytest
import torch

from components.train_lora import _plan, _plan_run
from components.train_lora._plan import GIB, ModelShape, TokenStats, plan_micro_batch, predict_peak
from speedups import checkpoint_layers, plugin, registry
from speedups.tests.isolation import restored_speedups  # noqa: F401 (autouse: no plugin left behind)

# Qwen3-VL-4B in bf16 with the fused branch, Liger, seeded masks and the SiLU product not kept: 51.0 - 2 x 7.6
QWEN3_VL_4B = ModelShape(36, 2560, 151936, 1024, weight_bytes=8_880_000_000, act_full=35.8)
ROWS = TokenStats(max_tokens=1221, p95_tokens=1221, mean_tokens=1207.0, rows=136)


def test_the_peak_falls_with_each_layer_checkpointed_and_meets_both_ends():
    full = predict_peak(QWEN3_VL_4B, 16, 1221, checkpointing=False, liger=True)
    every = predict_peak(QWEN3_VL_4B, 16, 1221, checkpointing=True, liger=True)
    assert predict_peak(QWEN3_VL_4B, 16, 1221, checkpointing=True, liger=True, layers=36) == every
    peaks = [predict_peak(QWEN3_VL_4B, 16, 1221, checkpointing=True, liger=True, layers=k) for k in range(1, 36)]
    assert all(a > b for a, b in zip(peaks, peaks[1:]))
    # one layer checkpointed: its input instead of its activations
    per_layer = 16 * 1221 * 2560 * (35.8 - 2.0)
    assert full - peaks[0] == pytest.approx(per_layer, rel=1e-6)


@pytest.mark.parametrize("cap", [39.4, 22.0])
def test_under_a_cap_the_planner_checkpoints_the_fewest_layers_that_fit(cap):
    budget = int(cap * GIB)
    every = plan_micro_batch(QWEN3_VL_4B, ROWS, budget, liger=True)
    partial = plan_micro_batch(QWEN3_VL_4B, ROWS, budget, liger=True, partial=True)
    assert every.gradient_checkpointing and every.checkpoint_layers is None
    assert partial.gradient_checkpointing and 0 < partial.checkpoint_layers < 36
    assert partial.peak_bytes <= partial.budget_bytes
    k = partial.checkpoint_layers
    one_fewer = predict_peak(QWEN3_VL_4B, partial.micro_batch, 1221, checkpointing=True, liger=True, layers=k - 1)
    assert one_fewer > partial.budget_bytes  # the fewest: one layer fewer would not fit
    t_every = _plan.relative_time(every.micro_batch, 1221, True)
    t_partial = _plan.relative_time(partial.micro_batch, 1221, True, k / 36)
    assert t_partial < t_every
    assert partial.job_env() == {"VLM_LORA_CHECKPOINT_LAYERS": str(k)}
    assert partial.metrics()["plan_checkpoint_layers"] == k
    assert f"on for {k} of 36 decoder layers" in partial.reasons[-1]


def test_without_a_cap_nothing_is_checkpointed_and_a_fixed_setting_is_kept():
    big = plan_micro_batch(QWEN3_VL_4B, ROWS, int(139 * GIB), liger=True, partial=True)
    assert not big.gradient_checkpointing and big.job_env() == {}
    fixed = plan_micro_batch(QWEN3_VL_4B, ROWS, int(22 * GIB), liger=True, partial=True, checkpointing=True)
    assert fixed.checkpoint_layers is None  # the config said every layer


def test_an_out_of_memory_with_some_layers_checkpointed_checkpoints_them_all_first():
    plan = plan_micro_batch(QWEN3_VL_4B, ROWS, int(39.4 * GIB), liger=True, partial=True)
    nxt = _plan_run.replan_after_oom(plan, 16)
    assert nxt.micro_batch == plan.micro_batch and nxt.gradient_checkpointing and nxt.checkpoint_layers is None
    assert "every layer checkpointed" in nxt.reasons[-1]


def test_the_planner_knows_item_19_can_run_where_its_versions_hold():
    planned = registry.planned({}, 1, {"gradient_checkpointing": "auto"}, {}, gpu=True)
    assert planned.memory_flags()["partial_checkpointing"] == (
        registry.version_problem(registry.item(19), True) is None
    )


def _tiny(layers: int = 4):
    from speedups.tests.tiny_text import qwen3_vl_text_model

    model = qwen3_vl_text_model(layers)
    model.train()
    return model


def test_item_19_checkpoints_the_first_k_layers_when_checkpointing_is_enabled():
    ctx = plugin.Context({"VLM_LORA_CHECKPOINT_LAYERS": "2"}, gpu=False)
    assert plugin._attempt(registry.item(19), ctx, "install").state == "pending"
    model = _tiny(4)
    model.gradient_checkpointing_enable()
    flags = [layer.gradient_checkpointing for layer in checkpoint_layers.decoder_layers(model)]
    assert flags == [True, True, False, False]
    # the checkpointed layers recompute, the others keep their activations: fewer tensors saved than none
    ids = torch.randint(0, 64, (2, 16))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        model(input_ids=ids).last_hidden_state.float().sum().backward()
    partial = sum(saved)
    model.gradient_checkpointing_disable()
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        model(input_ids=ids).last_hidden_state.float().sum().backward()
    assert partial < sum(saved)


def test_item_19_without_its_switch_leaves_checkpointing_as_it_is():
    ctx = plugin.Context({}, gpu=False)
    outcome = plugin._attempt(registry.item(19), ctx, "install")
    assert outcome.skipped and "unset" in outcome.detail
    model = _tiny(3)
    model.gradient_checkpointing_enable()
    assert all(layer.gradient_checkpointing for layer in checkpoint_layers.decoder_layers(model))


def test_item_19_leaves_the_vision_towers_own_checkpointing_alone():
    """ms-swift enables the vision tower's checkpointing with its own call: k counts the language model's layers."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextModel

    class TinyVisionModel(Qwen3VLTextModel):  # a model whose class says it is a vision tower
        pass

    ctx = plugin.Context({"VLM_LORA_CHECKPOINT_LAYERS": "1"}, gpu=False)
    assert plugin._attempt(registry.item(19), ctx, "install").state == "pending"
    tower = TinyVisionModel(_tiny(3).config)
    tower.gradient_checkpointing_enable()
    assert all(layer.gradient_checkpointing for layer in checkpoint_layers.decoder_layers(tower))


def test_a_cap_smaller_than_any_plan_names_the_base_at_its_precision_and_what_fits():
    from tests.test_train_plan import AUTO_ARGS, QWEN3_VL_4B_CONFIG, SEED_STATS

    def refuse(args):
        with pytest.raises(_plan.PlanError) as err:
            _plan_run.plan_for_run(
                args, model_config=QWEN3_VL_4B_CONFIG, weight_bytes=8_880_000_000, token_stats=SEED_STATS,
                gpu_bytes=int(8 * GIB), world_size=1, partial_checkpointing=True,
            )  # fmt: skip
        return str(err.value)

    bf16 = refuse(AUTO_ARGS)
    assert "does not fit the 7.7 GiB budget" in bf16 and "a card of at least" in bf16
    assert "the base is 8.3 GiB in bf16; model.quantization: nf4" in bf16
    nf4 = refuse({**AUTO_ARGS, "quant_method": "bnb", "quant_bits": 4})
    assert "in nf4 (model.quantization)" in nf4 and "model.quantization: nf4 stores" not in nf4


def test_the_leanest_plan_is_predicted_as_measured_and_a_cap_just_above_it_plans():
    """One H200, 2026-12-02 (benchmarks/results/2026-12-02_project_b1_gc_liger.json): 1 x 16 with every layer
    checkpointed peaked 9.90 GiB in bf16; `auto` under 10.7 GiB (6 % + 0.2 above it) was refused while the memory
    model counted 3.2 GiB of fixed memory whatever the micro-batch (11.8 GiB predicted)."""
    from tests.test_train_plan import AUTO_ARGS, QWEN3_VL_4B_CONFIG, SEED_STATS

    def plan(gib):
        return _plan_run.plan_for_run(
            AUTO_ARGS, model_config=QWEN3_VL_4B_CONFIG, weight_bytes=8_880_000_000, token_stats=SEED_STATS,
            gpu_bytes=int(gib * GIB), world_size=1, partial_checkpointing=True,
        )  # fmt: skip

    lean = predict_peak(QWEN3_VL_4B, 1, 1221, checkpointing=True, liger=True) / GIB
    assert lean == pytest.approx(9.90, rel=0.03)
    at_cap = plan(10.7)
    assert at_cap.micro_batch == 1 and at_cap.gradient_checkpointing
    assert at_cap.peak_bytes <= at_cap.budget_bytes
    # 16 rows of 1,221 tokens keep the 3.2 GiB they were fitted with (what every 16 x 1 prediction rests on)
    rows16 = _plan.FIXED_BYTES + 16 * 1221 * _plan.ROW_TOKEN_BYTES
    assert rows16 / GIB == pytest.approx(3.2, abs=0.01)


def test_plans_the_speed_model_cannot_tell_apart_go_to_the_larger_micro_batch():
    """Under 39.4 GiB (an A100 40GB) the model puts bf16 8 x 2 with 4 layers checkpointed 0.3 % ahead of 16 x 1 with
    22, and nf4 8 x 2 without checkpointing 1.5 % ahead of 16 x 1 with 19: inside `TIME_RESOLUTION`, so 16 x 1
    (bf16 16 x 1 with 22 measured 1.093 and 1.090 s/step in two calls; nf4 8 x 2 1.046 and 1.189)."""
    budget = int(39.4 * GIB)
    for weights, layers in ((8_880_000_000, 22), (3_480_000_000, 19)):
        model = ModelShape(36, 2560, 151936, 1024, weight_bytes=weights, act_full=35.8)
        plan = plan_micro_batch(model, ROWS, budget, liger=True, partial=True)
        assert (plan.micro_batch, plan.grad_accum, plan.checkpoint_layers) == (16, 1, layers)
        chosen = _plan.relative_time(16, 1221, True, layers / 36)
        fits_without = predict_peak(model, 8, 1221, checkpointing=False, liger=True) <= plan.budget_bytes
        k8 = _plan._fewest_checkpointed(model, 8, 1221, plan.budget_bytes, liger=True, shards=1)
        t8 = _plan.relative_time(8, 1221, False) if fits_without else _plan.relative_time(8, 1221, True, k8 / 36)
        assert t8 < chosen <= t8 * (1 + _plan.TIME_RESOLUTION)  # 8 rows modelled faster, inside the resolution
