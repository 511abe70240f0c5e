"""speedups/benchmarks/speedups_versions.py's planner side (issue 42) for the installed packages: each item's expected outcome
is applied or a named skip, a version skip names the package outside its range, the memory flags follow the
outcomes, and the 4B plan fits an H100; and what fails a call. No training, no weights (the 4B is counted on the meta
device)."""

from __future__ import annotations

import pytest

from speedups import registry, versions
from speedups.benchmarks import speedups_versions as sv

INSTALLED_VERSION = registry.installed_version  # as imported, before any planner call


@pytest.fixture(scope="module")
def side():
    return sv.planner()


def _outside(item: registry.Item, pins: dict[str, str]) -> list[str]:
    """The packages of `item` (GPU-gated ones at `pins` where given) outside their verified range."""
    ranges = {**item.verified, **item.gpu_verified}
    found = {name: pins.get(name) or registry.installed_version(name) for name in ranges}
    return [name for name, spec in ranges.items() if found[name] and not registry.in_range(found[name], spec)]


def test_each_item_is_applied_or_a_named_skip_and_a_version_skip_names_the_package(side):
    assert side["weight_bytes"] == 2 * 4_437_815_808  # Qwen3-VL-4B's parameters, tied embeddings once
    assert side["lock_torch"]["pins"].keys() == {"torch", "triton"}
    for view in ("installed", "lock_torch"):
        expected, pins = side[view]["expected"], side[view]["pins"]
        assert list(expected) == [str(it.number) for it in registry.ITEMS]
        for it in registry.ITEMS:
            line, outside = expected[str(it.number)], _outside(it, pins)
            assert line == "applied" or any(line.startswith(f"skipped: {kind}") for kind in registry.KINDS), line
            if outside and not line.startswith(f"skipped: {registry.SWITCH_OFF}"):
                assert line.startswith(f"skipped: {registry.VERSION} ({outside[0]} "), (view, it.number, line)
            elif not outside:
                assert registry.VERSION not in line, (view, it.number, line)
    assert versions.installed_version is INSTALLED_VERSION  # the lock's torch: only inside the planner's call
    for number in (3, 13, 17):  # gated on torch where a GPU runs them: the lock's torch is in their range
        assert "(torch " not in side["lock_torch"]["expected"][str(number)]


def test_the_memory_flags_follow_the_outcomes_and_the_plan_fits(side):
    for view in ("installed", "lock_torch"):
        expected, flags, plan = side[view]["expected"], side[view]["memory_flags"], side[view]["plan"]
        assert flags["fused_lora"] == (expected["3"] == "applied")
        assert flags["padding_mask"] == (expected["6"] != "applied")  # sdpa: the causal flag, else a mask
        assert flags["fused_silu_mul"] == (expected["8"] == "applied")
        assert plan["plan_micro_batch"] * plan["plan_grad_accum"] == 16  # the seed's samples per step
        assert 0 < plan["plan_peak_gib"] <= plan["plan_budget_gib"] < sv.H100_GIB, plan
    if side["installed"]["memory_flags"] == side["lock_torch"]["memory_flags"]:
        assert side["installed"]["plan"] == side["lock_torch"]["plan"]
    elif side["lock_torch"]["memory_flags"]["fused_lora"] and not side["installed"]["memory_flags"]["fused_lora"]:
        # the fused LoRA branch keeps less: the same plan predicts less memory, or a larger one fits
        here, lock = side["installed"]["plan"], side["lock_torch"]["plan"]
        assert (lock["plan_micro_batch"], -lock["plan_peak_gib"]) > (here["plan_micro_batch"], -here["plan_peak_gib"])


def test_a_raised_item_a_disagreement_or_another_transformers_in_swift_fails_the_call():
    here = registry.installed_version("transformers")
    table = registry.Table({3: registry.applied(), 6: registry.applied()}, {"transformers": here})
    planned = registry.Planned({3: registry.applied(), 6: registry.applied()})  # what the planner assumed
    assert sv.problems({"speedups_unplanned": 0}, table, registry.disagreements(planned, table)) == []
    table.outcomes[6] = registry.error(RuntimeError("boom"))
    table.versions["transformers"] = other = "5.16.1" if here != "5.16.1" else "5.17.0"
    found = sv.problems({"speedups_unplanned": 1}, table, registry.disagreements(planned, table))
    assert found[0] == "item 6: skipped: error while installing (RuntimeError: boom)"
    assert found[1].startswith("item 6 (right_padding, planner flag padding_mask): the plan assumed it applies")
    assert found[2:] == [
        "train-lora's speedups_unplanned is 1",
        f"swift sft ran transformers {other}, this process {here}: PYTHONPATH did not reach it",
    ]
    assert sv.problems({"error": "swift sft exited 1"}, None, []) == ["no start-up table: swift sft exited 1"]
