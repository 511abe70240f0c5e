"""The speed-ups' registry (speedups/registry.py) and the plugin's walk over it (plugin.py):
each item declared once; a version outside its verified range, a target renamed or missing, nothing found in the
model and an exception each skip the item with a line, never a crash; the start-up table reaches train-lora's
Metrics; the planner's view follows the same records; the lock's versions lie inside every item's ranges."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest
import torch

from speedups import patching, plugin, registry, versions
from speedups.registry import ITEMS, Outcome, Table

ROOT = Path(__file__).resolve().parents[2]
PLANNER_FLAGS = {"fused_lora", "padding_mask", "fused_silu_mul"}  # _plan_run.plan_for_run's arguments items decide


def test_every_item_is_declared_once_with_its_code_beside_it():
    assert [it.number for it in ITEMS] == [n for n in range(1, 20) if n not in (4, 15)]  # 4, 15 deleted (2026-11-28)
    assert len({it.name for it in ITEMS}) == len(ITEMS)
    for it in ITEMS:
        module = importlib.import_module(f"{registry.PACKAGE}.{it.module}")
        for which in ("install", "check"):
            name = getattr(it, which)
            assert name is None or callable(getattr(module, name)), (it.number, which)
        assert it.memory is None or it.memory in PLANNER_FLAGS
        assert all(s.name.startswith("VLM_LORA_") for s in (*it.switches, *it.options))
        assert set(it.requires) <= set(registry.REQUIREMENTS), it.number
        for spec in (*it.verified.values(), *it.gpu_verified.values()):
            assert re.fullmatch(r"(>=|==)[\d.]+(,<[\d.]+)?", spec), spec
    switches = [s.name for it in ITEMS for s in (*it.switches, *it.options)]
    assert (
        len(switches) == len(set(switches)) == 30
    )  # every switch of the plugin, each under one item (31 before items 15 and 4 went)


def test_a_switch_reads_its_default_and_the_multi_process_default():
    rms = registry.SWITCHES["VLM_LORA_TORCH_RMS_NORM"]
    assert not rms.on({}, 1) and rms.on({}, 2) and rms.on({"VLM_LORA_TORCH_RMS_NORM": "1"}, 1)
    assert rms.said({}, 1) == "VLM_LORA_TORCH_RMS_NORM unset: default 0 with one process"
    cast = registry.SWITCHES["VLM_LORA_PEFT_INPUT_CAST"]  # 1 turns item 2 off
    assert cast.on({}, 1) and not cast.on({"VLM_LORA_PEFT_INPUT_CAST": "1"}, 1)
    cap = registry.SWITCHES["VLM_LORA_GPU_MEMORY_GIB"]  # a size: on when set
    assert not cap.on({}, 1) and cap.on({"VLM_LORA_GPU_MEMORY_GIB": "39.4"}, 1)


def test_a_version_outside_the_range_skips_the_item_with_package_version_and_range(monkeypatch):
    real = registry.installed_version
    monkeypatch.setattr(versions, "installed_version", lambda d: "5.21.0" if d == "transformers" else real(d))
    outcome = registry.version_problem(registry.item(6), gpu=False)
    assert outcome.line() == "skipped: version outside the verified range (transformers 5.21.0, verified >=5.17,<5.20)"
    assert registry.version_problem(registry.item(2), gpu=False) is None  # peft only
    monkeypatch.setattr(versions, "installed_version", lambda d: "2.14.1+cu130" if d == "torch" else real(d))
    assert registry.version_problem(registry.item(3), gpu=False) is None  # torch gates the GPU kernels only
    assert "torch 2.14.1+cu130, verified >=2.11,<2.12" in registry.version_problem(registry.item(3), gpu=True).detail
    monkeypatch.setattr(versions, "installed_version", lambda d: None if d == "liger-kernel" else real(d))
    assert registry.version_problem(registry.item(5), gpu=False).line() == (
        "skipped: not applicable (liger-kernel not installed)"
    )


def test_the_plugin_skips_items_outside_their_range_and_patches_nothing_of_theirs(monkeypatch, capsys):
    from transformers import Trainer, masking_utils

    real = registry.installed_version
    monkeypatch.setattr(versions, "installed_version", lambda d: "5.21.0" if d == "transformers" else real(d))
    ctx = plugin.install()
    for number in (1, 6, 7, 14):
        assert ctx.loaded[number].kind == registry.VERSION, number
    assert not patching.ours(Trainer._track_num_input_tokens)
    assert not patching.ours(masking_utils._ignore_causal_mask_sdpa)
    assert not ctx.loaded[2].skipped and patching.ours(_peft_cast())  # peft in its range: item 2 applies
    outcomes = plugin.check_model(torch.nn.Linear(2, 2))
    assert outcomes[10].line() == (
        "skipped: version outside the verified range (transformers 5.21.0, verified >=5.17,<5.20)"
    )
    out = capsys.readouterr().out
    assert (
        "train-lora plugin:  6 right_padding   skipped: version outside the verified range (transformers 5.21.0" in out
    )


def _peft_cast():
    from peft.tuners.tuners_utils import BaseTunerLayer

    return BaseTunerLayer._cast_input_dtype


def test_a_target_renamed_or_missing_is_skipped_with_its_name_and_nothing_crashes(monkeypatch):
    from transformers import Trainer, masking_utils

    monkeypatch.delattr(masking_utils, "_ignore_causal_mask_sdpa")
    monkeypatch.delattr(Trainer, "_track_num_input_tokens")
    ctx = plugin.install()
    assert ctx.loaded[6].kind == registry.TARGET
    assert ctx.loaded[6].detail.startswith("transformers.masking_utils._ignore_causal_mask_sdpa; transformers 5.")
    assert (
        ctx.loaded[1]
        .line()
        .startswith("skipped: target missing or changed (transformers.Trainer._track_num_input_tokens; transformers 5.")
    )
    assert not hasattr(masking_utils, "_ignore_causal_mask_sdpa")  # nothing half-installed in its place
    assert not ctx.loaded[2].skipped  # the others go on


def test_a_target_replaced_after_the_plugin_loaded_is_said_at_the_trainer(monkeypatch):
    from transformers import masking_utils

    plugin.install()
    monkeypatch.setattr(masking_utils, "_ignore_causal_mask_sdpa", lambda *a, **k: False)  # another library's patch
    outcome = plugin.check_model(torch.nn.Linear(2, 2))[6]
    assert outcome.kind == registry.TARGET and "transformers.masking_utils._ignore_causal_mask_sdpa" in outcome.detail


def test_an_exception_while_installing_skips_the_item_and_puts_back_what_it_replaced(monkeypatch):
    from peft.tuners.tuners_utils import BaseTunerLayer

    from speedups import autocast_input

    own = BaseTunerLayer._cast_input_dtype

    def broken(ctx):
        BaseTunerLayer._cast_input_dtype = lambda *a: None  # half done, then a failure
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(autocast_input, "install", broken)
    ctx = plugin.install()
    assert ctx.loaded[2].line() == "skipped: error while installing (RuntimeError: boom)"
    assert BaseTunerLayer._cast_input_dtype is own


def _tiny_lora_model():
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    from pipelines.demo.tiny_model import ensure_tiny_model

    base = AutoModelForImageTextToText.from_pretrained(ensure_tiny_model(), dtype=torch.float32)
    return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0))


def test_the_walk_on_the_tiny_qwen3_vl_model_applies_the_model_items(capsys):
    model = _tiny_lora_model()
    outcomes = plugin.check_model(model)
    for number in (1, 2, 3, 6, 7, 10, 13):
        assert outcomes[number].applied, (number, outcomes[number].line())
    assert re.fullmatch(r"\d+ LoRA layers, \d+ groups of one input", outcomes[3].detail)
    assert outcomes[10].detail == "1 text model(s)"
    assert outcomes[9].kind == registry.SWITCH_OFF and outcomes[11].kind == registry.SWITCH_OFF  # opt-in, one process
    assert 4 not in outcomes and 15 not in outcomes  # deleted: no gain beyond the spread (docs/speedups.md)
    swift_loaded = "swift.trainers.mixin" in sys.modules  # where another test of this process imported them
    for number in (16, 17):  # ms-swift's readers and NaN check: only where its trainers are loaded
        assert outcomes[number].applied == swift_loaded, outcomes[number].line()
    out = capsys.readouterr().out
    assert "train-lora plugin: speed-ups: " in out and "train-lora plugin: 18 loss_no_wait " in out
    x = torch.ones(1, 3, dtype=torch.long)
    model(input_ids=x, labels=x).loss.backward()  # it trains


def test_a_lora_layer_without_what_the_fused_forward_reads_gets_peft_s_forward_back():
    """Item 3 used to crash at the first forward when peft renamed an attribute: now it checks at the trainer."""
    from peft.tuners.lora.layer import Linear

    model = _tiny_lora_model()
    plugin.install()
    layer = next(m for m in model.modules() if isinstance(m, Linear))
    del layer.lora_variant  # as a peft that renamed it
    outcome = plugin.check_model(model)[3]
    assert outcome.line().startswith(
        "skipped: target missing or changed (peft.tuners.lora.layer.Linear.lora_variant; peft 0."
    )
    assert not patching.ours(Linear.forward)  # peft's own forward again
    assert plugin.context().loaded[3].skipped  # and for the trainers after this one


def test_the_table_is_written_whole_and_read_back(tmp_path):
    outcomes = {it.number: registry.applied() for it in ITEMS}
    outcomes[6] = registry.skipped(registry.SWITCH_OFF, "VLM_LORA_RIGHT_PAD_CAUSAL=0")
    table = Table(outcomes, {"transformers": "5.19.0"})
    table.write(tmp_path / "t" / "speedups.json")
    assert [p.name for p in (tmp_path / "t").iterdir()] == ["speedups.json"]  # no temporary file left
    back = registry.read_table(tmp_path / "t" / "speedups.json")
    assert back.outcomes == outcomes and back.versions == {"transformers": "5.19.0"}
    metrics = back.metrics()
    assert metrics["speedups_applied"] == len(ITEMS) - 1 and metrics["speedups_skipped"] == 1
    assert metrics["speedup_06_right_padding"] == 0 and metrics["speedup_03_fused_lora"] == 1
    assert registry.read_table(tmp_path / "missing.json") is None
    (tmp_path / "other.json").write_text('{"version": 99}')
    assert registry.read_table(tmp_path / "other.json") is None


def test_rank_0_writes_the_table_where_the_task_says(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(registry.TABLE_ENV, str(tmp_path / "speedups.json"))
    monkeypatch.setenv("RANK", "1")
    plugin.check_model(torch.nn.Linear(2, 2))
    assert not (tmp_path / "speedups.json").exists()  # not rank 0
    out = capsys.readouterr().out
    assert "train-lora plugin: rank 1, speed-ups: " in out and "token_count" not in out  # the header only
    monkeypatch.setenv("RANK", "0")
    plugin.check_model(torch.nn.Linear(2, 2))
    table = registry.read_table(tmp_path / "speedups.json")
    assert table.outcomes[10].kind == registry.NOTHING and table.versions["transformers"]


def test_the_planner_s_view_follows_the_records():
    qwen3_vl = {"model_type": "qwen3_vl", "text_config": {"model_type": "qwen3_vl_text"}}
    liger = {"use_liger_kernel": True}
    plan = registry.planned({}, 1, liger, qwen3_vl, gpu=False)
    assert plan.applies(3) and plan.applies(6) and not plan.applies(14)
    plan = registry.planned({"VLM_LORA_RIGHT_PAD_CAUSAL": "0", "VLM_LORA_FUSED_LORA": "0"}, 1, {}, qwen3_vl)
    assert plan.memory_flags()["padding_mask"] and not plan.memory_flags()["fused_lora"]
    assert plan.outcomes[6].line() == "skipped: switch off (VLM_LORA_RIGHT_PAD_CAUSAL=0)"
    eager = registry.planned({}, 1, {"attn_impl": "eager"}, qwen3_vl)
    assert eager.memory_flags()["padding_mask"] and eager.outcomes[6].kind == registry.NOT_APPLICABLE
    assert registry.planned({}, 2, {}, qwen3_vl).applies(14)  # DDP
    assert not registry.planned({}, 2, {"deepspeed": "zero2"}, qwen3_vl).applies(14)


def test_a_planned_item_the_run_did_not_apply_is_named():
    plan = registry.planned({}, 1, {}, {"model_type": "qwen3_vl"}, gpu=False)
    run = {it.number: plan.outcomes[it.number] for it in ITEMS}
    assert registry.disagreements(plan, Table(run)) == []
    run[3] = registry.found_nothing("no peft LoRA Linear layer")
    (line,) = registry.disagreements(plan, Table(run))
    assert line.startswith("item 3 (fused_lora, planner flag fused_lora): the plan assumed it applies, the run says")


def _lock_versions() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)", line.strip())
        if m:
            pins[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
    return pins


@pytest.mark.parametrize(
    "distribution", ["transformers", "peft", "ms-swift", "liger-kernel", "accelerate", "torch", "triton"]
)
def test_the_lock_pins_versions_inside_every_item_s_verified_range(distribution):
    """Shipped = measured: the training image installs the lock, so a lock outside an item's range would ship
    something the GPU figures were not measured on (and the plugin would skip the item at start-up)."""
    pinned = _lock_versions().get(distribution)
    assert pinned, f"requirements.lock pins no {distribution}"
    outside = [
        f"item {it.number} ({it.name}) verified {spec}"
        for it in ITEMS
        for name, spec in (*it.verified.items(), *it.gpu_verified.items())
        if name == distribution and not registry.in_range(pinned, spec)
    ]
    assert not outside, f"requirements.lock pins {distribution} {pinned}, outside " + "; ".join(outside)


def test_a_liger_outside_its_range_is_skipped_with_the_line_in_a_fresh_plugin(tmp_path):
    from speedups.tests.test_plugin_switches import _run_with_fake_liger

    code = """
from speedups import swift_plugin as entry
from liger_kernel.transformers.model import loss_utils
loaded = entry.CONTEXT.loaded
print(loaded[5].line(), "|", loaded[18].line(), "|", hasattr(loss_utils.fixed_fused_linear_cross_entropy, "_vlm_lora_label_rows"))
"""
    out = _run_with_fake_liger(tmp_path, code, version="0.9.0")
    assert out == (
        "skipped: version outside the verified range (liger-kernel 0.9.0, verified >=0.8.5,<0.9) | "
        "skipped: not applicable (needs item 5, skipped: version outside the verified range (liger-kernel 0.9.0, "
        "verified >=0.8.5,<0.9)) | False"
    )


def test_the_outcome_words_name_their_kind():
    assert Outcome("applied", detail="3 MLPs").line() == "applied: 3 MLPs"
    assert registry.not_applicable("one process").line() == "skipped: not applicable (one process)"
    with pytest.raises(AssertionError):
        registry.skipped("because")


def test_train_lora_reads_the_start_up_table_into_its_metrics(tmp_path, capsys):
    """The real `swift sft` on the tiny model (CPU, two steps): the plugin's table reaches the task's Metrics, its
    summary line and the curves page."""
    from components.train_lora.core import loss_curve_html, train_lora
    from components.validate_data.core import validate_data
    from pipelines.demo.drawings import generate_dataset
    from pipelines.demo.tiny_model import ensure_tiny_model

    raw = generate_dataset(tmp_path / "raw", n_train=4, n_eval=2, image_size=128)
    validate_data(
        [raw["train"]], str(tmp_path / "train"), str(tmp_path / "eval"), str(tmp_path / "q.jsonl"),
        eval_files=[raw["eval"]],
    )  # fmt: skip
    swift_args = {
        "lora_rank": 4, "lora_alpha": 8, "target_modules": "all-linear", "freeze_vit": True, "max_steps": 2,
        "per_device_train_batch_size": 1, "max_length": 512, "torch_dtype": "float32", "save_steps": 2,
        "save_only_model": True, "logging_steps": 1, "dataloader_num_workers": 0, "report_to": "none", "seed": 42,
    }  # fmt: skip
    result = train_lora(
        model_dir=str(ensure_tiny_model()),
        model_type="qwen3_vl",
        train_dir=str(tmp_path / "train"),
        eval_dir="",
        swift_args=swift_args,
        adapter_out=str(tmp_path / "adapter"),
        work_dir=str(tmp_path / "work"),
    )
    table = registry.read_table(tmp_path / "work" / "speedups.json")
    assert table is not None and table.metrics() == {k: result.metrics[k] for k in table.metrics()}
    assert result.metrics["speedups_applied"] + result.metrics["speedups_skipped"] == len(ITEMS)
    for number in (1, 3, 6, 7, 10, 13, 16, 17):  # ms-swift's own trainer on the tiny Qwen3-VL
        assert table.outcomes[number].applied, (number, table.outcomes[number].line())
    assert result.metrics["speedup_03_fused_lora"] == 1 and result.metrics["speedup_09_torch_rms_norm"] == 0
    out = capsys.readouterr().out
    assert re.search(r"train-lora: speed-ups: \d+ of 17 applied; skipped: .*9 torch_rms_norm \(switch off\)", out)
    page = loss_curve_html(result.log_history, speedups=result.speedups)
    assert "speed-ups at start-up" in page and "fused_lora" in page


def test_the_planner_s_memory_flags_come_from_the_items_it_expects(monkeypatch, tmp_path, capsys):
    """train-lora's planner reads the registry's view (switch, versions, targets, run), not the environment: item 6
    outside its range means a padding mask in the memory model, whatever the switch says; a memory-relevant item the
    run's table has otherwise is named after the run."""
    from components.common import cluster
    from components.train_lora import _facts, _fit, _launch, _plan, _plan_run
    from pipelines.demo.tiny_model import ensure_tiny_model

    model = str(ensure_tiny_model())
    launch = _launch.Launch(cluster.LaunchPlan(), 1, 80 * 1024**3)
    seen = {}

    def plan_for_run(args, **kwargs):
        seen.update(kwargs)
        return _plan.Plan(1, 16, False, 0, 0)

    monkeypatch.setattr(_plan_run, "plan_for_run", plan_for_run)
    args = {"per_device_train_batch_size": "auto"}
    facts = _facts.RunFacts.gather(model, args, launch, str(tmp_path))
    _fit.micro_batch_plan(args, facts, {})
    assert seen["padding_mask"] is False
    real = registry.installed_version
    monkeypatch.setattr(versions, "installed_version", lambda d: "5.21.0" if d == "transformers" else real(d))
    expected = _fit.planned_speedups(args, facts, {})
    _fit.micro_batch_plan(args, facts, {}, expected)
    assert seen["padding_mask"] is True and expected.outcomes[6].kind == registry.VERSION
    ran = Table({it.number: expected.outcomes[it.number] for it in ITEMS})
    ran.outcomes[6] = registry.applied()
    assert len(_fit.unplanned(expected, ran)) == 1
    assert (
        "train-lora: speed-ups: item 6 (right_padding, planner flag padding_mask): the plan assumed it does not "
        in (capsys.readouterr().out)
    )


@pytest.mark.parametrize("name", ["VLM_LORA_COMPILE_LAYERS", "VLM_LORA_COMPILE_VISION"])
def test_item_4_is_gone_and_its_switches_are_refused_with_why(name):
    """Regional compilation gained nothing beyond the spread with the other items on (benchmarks/ARCHIVE.md,
    "Garbage collection at step ends, the loss logged every 5th step, compiled layers under DDP"): deleted."""
    from components.train_lora.job_env import JobEnvError, check_job_env

    assert 4 not in {it.number for it in registry.ITEMS} and name not in registry.SWITCHES
    with pytest.raises(
        JobEnvError,
        match=rf"job_env\.{name}: '{name}': the train-lora plugin's item 4 \(regional "
        r"torch.compile of the layers\) was deleted on 2026-11-28: .*; remove it from the environment",
    ):
        check_job_env({name: "1"})


@pytest.mark.parametrize(("deepspeed", "applies"), [(None, False), ("zero2", True), ("zero1", True), ("zero3", False)])
def test_the_planner_expects_item_12_only_under_zero_1_or_2(deepspeed, applies):
    """The job skips item 12 without DeepSpeed ZeRO-1/2 (adapter_save.check); the planner's view says the same."""
    args = {"deepspeed": deepspeed} if deepspeed else {}
    outcome = registry.planned({}, 2, args, {"model_type": "qwen3_vl"}, gpu=False).outcomes[12]
    assert outcome.applied is applies, outcome.line()
    if not applies:
        assert outcome.line() == "skipped: not applicable (no DeepSpeed ZeRO-1/2)"


def test_the_package_declares_its_version_and_the_union_of_its_items_ranges():
    import speedups

    assert speedups.__version__ == versions.__version__ and speedups.__version__.count(".") == 2
    cpu = {d: s for it in ITEMS for d, s in it.verified.items()}
    gpu = {d: s for it in ITEMS for d, s in it.gpu_verified.items()}
    assert speedups.SUPPORTED == cpu and speedups.GPU_SUPPORTED == gpu  # one range per package, all declared
    assert all(it.verified[d] == cpu[d] for it in ITEMS for d in it.verified)


def test_the_package_s_imports_form_no_circle():
    """Every import between the package's modules, those inside functions included, goes one way."""
    import ast
    from pathlib import Path

    root = Path(registry.__file__).parent
    edges = {}
    for path in root.glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "speedups":
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("speedups."):
                found.add(node.module.split(".")[1])
        edges[path.stem] = found - {path.stem}

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, (*seen, n))) for n in edges.get(start, ()))

    assert not [m for m in edges if reaches(m, m)]
