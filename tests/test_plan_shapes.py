"""The memory model on shapes other than the 4B it was fitted on: the 8B and 32B rows one H200 measured
(2026-12-02, benchmarks/README.md "The 8B and the 32B"), and the prediction a re-plan after an out-of-memory carries."""

from __future__ import annotations

import pytest

from benchmarks.qwen3_vl_large import QWEN3_VL_8B_CONFIG, QWEN3_VL_32B_CONFIG
from components.train_lora._plan import (
    ACT_BYTES_FULL,
    ACT_BYTES_FULL_FUSED,
    ACT_BYTES_FULL_NO_DROPOUT,
    GIB,
    act_bytes_full,
    shape_bytes,
)
from components.train_lora._plan_run import plan_for_run, replan_after_oom

QWEN3_VL_4B_TEXT = {
    "num_hidden_layers": 36, "hidden_size": 2560, "intermediate_size": 9728, "vocab_size": 151936,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
}  # fmt: skip
SEED_STATS = {"max_tokens": 1221, "p95_tokens": 1221, "mean_tokens": 1207.0, "rows": 168}
AUTO = {"per_device_train_batch_size": "auto", "gradient_checkpointing": "auto", "use_liger_kernel": True}
# what the plugin applied in these runs (the start-up tables: fused LoRA, Liger's SiLU-multiply, item 19); their
# planner kept the dropout masks ("seeds would not let a faster plan fit")
APPLIED = {"fused_silu_mul": True, "silu_mul_down": True, "partial_checkpointing": True, "seeded_dropout": "off"}
# the frozen bases as the runs' own predictions imply (GiB): the 8B nf4 / bf16, the 32B nf4 (random weights)
BASE = {"8b_nf4": 6.74, "8b_bf16": 16.34, "32b_nf4": 19.00}


def _plan(config: dict, base: str, cap_gib: float, **changes):
    return plan_for_run(
        {**AUTO, **changes}, model_config={"model_type": "qwen3_vl", **config}, weight_bytes=int(BASE[base] * GIB),
        token_stats=SEED_STATS, gpu_bytes=int(cap_gib * GIB), world_size=1, **APPLIED,
    )  # fmt: skip


def test_the_4b_keeps_the_figures_fitted_on_it():
    config = {"model_type": "qwen3_vl", "text_config": QWEN3_VL_4B_TEXT}
    assert shape_bytes(config) == pytest.approx(0.0)
    assert act_bytes_full(0.05, True, config) == pytest.approx(ACT_BYTES_FULL_FUSED)
    assert act_bytes_full(0.05, False, config) == pytest.approx(ACT_BYTES_FULL)
    assert act_bytes_full(0.0, True, config) == pytest.approx(ACT_BYTES_FULL_NO_DROPOUT)
    # a config that does not say its widths: the 4B's figures, as before
    assert act_bytes_full(0.05, True, {"text_config": {"hidden_size": 2560}}) == ACT_BYTES_FULL_FUSED


def test_narrower_and_wider_models_keep_less_and_more_per_hidden():
    assert shape_bytes(QWEN3_VL_8B_CONFIG) == pytest.approx(-10.9)  # MLP 3.0 x hidden, q 1.0 x, k / v 0.25 x
    assert shape_bytes(QWEN3_VL_32B_CONFIG) == pytest.approx(8.4)  # MLP 5.0 x hidden, q 1.6 x, k / v 0.2 x
    assert act_bytes_full(0.05, True, QWEN3_VL_8B_CONFIG) == pytest.approx(ACT_BYTES_FULL_FUSED - 10.9 - 1.4)
    # the MoE's MLPs are its experts, which these widths do not describe: the 4B's figures, as before
    from benchmarks.qwen3_vl_large import QWEN3_VL_30B_A3B_CONFIG

    assert shape_bytes(QWEN3_VL_30B_A3B_CONFIG) == 0.0


@pytest.mark.parametrize(
    ("config", "base", "layers", "measured"),
    [
        (QWEN3_VL_8B_CONFIG, "8b_nf4", 30, 31.75),  # predicted 36.5 with the 4B's figures (+15.0 %)
        (QWEN3_VL_8B_CONFIG, "8b_bf16", 33, 33.39),  # 35.5 (+6.3 %)
    ],
)
def test_the_8b_rows_measured_under_39_4_gib(config, base, layers, measured):
    plan = _plan(config, base, 39.4)
    at_measured = replace_layers(plan, layers).predicted_peak() / GIB
    assert at_measured == pytest.approx(measured, rel=0.05)
    # the plan the corrected model makes checkpoints fewer layers than the runs did, within the same budget
    assert plan.checkpoint_layers < layers and plan.peak_bytes <= plan.budget_bytes


def test_the_32b_plan_that_ran_out_of_memory_at_78_gib_no_longer_fits():
    """53 of 64 layers checkpointed: predicted 74.5 GiB, out of memory above 78.54 GiB in use; every layer
    checkpointed (the re-plan) peaked 42.25 GiB."""
    plan = _plan(QWEN3_VL_32B_CONFIG, "32b_nf4", 78.0)
    assert replace_layers(plan, 53).predicted_peak() > 78.0 * GIB
    assert plan.checkpoint_layers > 53 and plan.micro_batch == 16
    every = replace_layers(plan, None).predicted_peak() / GIB
    assert every == pytest.approx(42.25, rel=0.10)


def test_a_replan_after_out_of_memory_carries_its_predicted_peak():
    plan = _plan(QWEN3_VL_32B_CONFIG, "32b_nf4", 78.0)
    nxt = replan_after_oom(plan, 16)
    assert nxt.checkpoint_layers is None and nxt.peak_bytes == replace_layers(plan, None).predicted_peak() > 0
    assert nxt.metrics()["plan_peak_gib"] == round(nxt.peak_bytes / GIB, 1)
    assert nxt.reasons[-1].endswith(f"(predicted peak {nxt.peak_bytes / GIB:.1f} GiB)")
    smaller = replan_after_oom(nxt, 16)
    assert smaller.micro_batch == 8 and 0 < smaller.peak_bytes < nxt.peak_bytes


def replace_layers(plan, layers):
    from dataclasses import replace

    return replace(plan, checkpoint_layers=layers)
