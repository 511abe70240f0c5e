"""The cost estimate (#14): the tables and arithmetic of `components.common.cost`, the config's price
override, what `pipelines.run` prints before it submits or runs locally, and train-lora's log line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.common import cluster, cost
from components.common.cost import CostError, Profile, Workload, estimate
from pipelines.config import ConfigError, load_config, parse_overrides
from pipelines.estimate import config_estimate, data_figures, estimate_lines
from tests import test_vertex_submit as vertex

ROOT = Path(__file__).resolve().parent.parent
H100_SPOT = Profile("a3-highgpu-1g", "NVIDIA_H100_80GB", 1, scheduling="spot")
TUNED = dict(micro_batch=8, checkpointing=False, liger=True, model_b=4)
api = vertex.api  # the recording Vertex server of the submit tests


# --- the estimate on recorded figures -------------------------------------------------


@pytest.mark.parametrize(
    ("plan", "measured"),
    [
        (dict(micro_batch=8, checkpointing=False, liger=True), 15_668),  # b8_nogc_liger, run B of 2026-11-25
        (dict(micro_batch=16, checkpointing=True, liger=True), 12_696),  # b16_gc_liger, the same run
        (dict(micro_batch=1, checkpointing=True, liger=False), 2_310),  # seed settings, run C (tuned 15,690 there)
    ],
)
def test_h100_throughput_reproduces_the_recorded_runs(plan, measured):
    per_gpu, _ = cost.gpu_tokens_per_s(Workload(rows=1, mean_tokens=1207, **plan), "NVIDIA_H100_80GB")
    assert per_gpu == pytest.approx(measured, rel=0.02)


def test_h200_throughput_reproduces_its_recorded_plan():
    # auto_liger on one H200, planned 16 x 1 without checkpointing: 19,911 LM tokens/s (2026-11-26, run A)
    work = Workload(rows=1, mean_tokens=1207, micro_batch=16, checkpointing=False, liger=True)
    assert cost.gpu_tokens_per_s(work, "NVIDIA_H200_141GB")[0] == pytest.approx(19_911, rel=0.02)


def test_time_gpu_hours_and_cost_follow_from_tokens_throughput_and_price():
    work = Workload(rows=10_000, mean_tokens=1207, epochs=2, **TUNED)
    est = estimate(H100_SPOT, work)
    tokens = 10_000 * 1207 * 2
    assert est.train_tokens == tokens
    assert est.hours == pytest.approx(tokens / cost.REF_TOKENS_PER_S / 3600, rel=1e-3)
    assert est.gpu_hours == pytest.approx(est.hours)
    assert est.cost_usd == pytest.approx(est.hours * cost.PRICES["a3-highgpu-1g"][1])
    assert est.hours_high == pytest.approx(est.hours / cost.SPREAD)
    assert est.usd_per_million_tokens == pytest.approx(
        cost.PRICES["a3-highgpu-1g"][1] / (15_668 * 3600) * 1e6, rel=1e-3
    )
    head = est.lines()[0]
    assert "~26 min of training (up to 36 min)" in head and "0.43 GPU-hours" in head
    assert "Spot list price us-central1" in head and cost.PRICE_TABLE_DATE in head
    assert any("10,000 rows x 1,207 tokens x 2 epochs" in a for a in est.assumptions)


def test_other_gpus_models_and_shapes_are_scaled_and_said_so():
    work = Workload(rows=1000, mean_tokens=1207, epochs=1, micro_batch=1, checkpointing=True, model_b=8)
    a100 = estimate(Profile("a2-highgpu-1g", "NVIDIA_TESLA_A100", 1), work)
    h100 = estimate(Profile("a3-highgpu-1g", "NVIDIA_H100_80GB", 1, scheduling="spot"), work)
    assert a100.tokens_per_s < h100.tokens_per_s
    assert h100.tokens_per_s == pytest.approx(
        cost.gpu_tokens_per_s(Workload(1, 1207, micro_batch=1), "NVIDIA_H100_80GB")[0] / 2
    )
    text = "\n".join(a100.assumptions)
    assert "NVIDIA_TESLA_A100: its compute x0.4 of an H100's (estimate" in text
    assert "8B model: x0.50 (tokens/s scaled by parameter count" in text
    two_nodes = estimate(Profile("a3-highgpu-8g", "NVIDIA_H100_80GB", 8, replica_count=2, scheduling="spot"), work)
    assert two_nodes.price_usd_per_hour == pytest.approx(2 * cost.PRICES["a3-highgpu-8g"][1])
    assert two_nodes.gpu_hours == pytest.approx(two_nodes.hours * 16)
    assert "2 nodes: x0.9 (estimate, not measured)" in "\n".join(two_nodes.assumptions)


def test_unknown_rows_give_per_hour_and_per_million_tokens_only():
    est = estimate(H100_SPOT, Workload(rows=0, mean_tokens=0, **TUNED))
    assert est.hours is est.cost_usd is est.gpu_hours is None
    assert est.lines()[0].startswith("cost estimate: rows unknown before validate-data; $0.13 per 1M training tokens")
    rows_only = estimate(H100_SPOT, Workload(rows=500, mean_tokens=0, **TUNED))
    assert "500 rows, tokens per row unknown before validate-data" in rows_only.lines()[0]


def test_unknown_machine_type_or_gpu_is_named_not_a_crash():
    with pytest.raises(
        CostError, match=r"no list price for machine type 'n1-standard-8'.*resources.price_usd_per_hour"
    ):
        estimate(Profile("n1-standard-8", "NVIDIA_TESLA_T4", 1), Workload(1, 1))
    with pytest.raises(CostError, match=r"no throughput figure for accelerator 'NVIDIA_TESLA_T4'"):
        estimate(Profile("n1-standard-8", "NVIDIA_TESLA_T4", 1, price_usd_per_hour=0.5), Workload(1, 1))
    cfg = load_config(
        "lora_seed",
        parse_overrides(["resources.machine_type=n1-standard-8", "resources.accelerator_type=NVIDIA_TESLA_T4"]),
    )
    lines = estimate_lines(cfg)
    assert lines[1].startswith("cost estimate: none: no list price for machine type 'n1-standard-8'")


def test_model_size_from_the_name_and_gpu_kind_from_the_device_name():
    assert cost.model_size_b("hf://Qwen/Qwen3-VL-4B-Instruct") == 4
    assert cost.model_size_b("hf://Qwen/Qwen3-VL-30B-A3B-Instruct") == 3  # active parameters of the MoE
    assert cost.model_size_b("/models/tiny") == 0
    assert cost.accelerator_of_gpu_name("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB"
    assert cost.accelerator_of_gpu_name("NVIDIA A100-SXM4-40GB") == "NVIDIA_TESLA_A100"
    assert cost.accelerator_of_gpu_name("NVIDIA A100-SXM4-80GB") == "NVIDIA_A100_80GB"
    assert cost.accelerator_of_gpu_name("NVIDIA L4") == "NVIDIA_L4"
    assert cost.accelerator_of_gpu_name("Tesla T4") == ""


def test_the_speed_model_is_the_planners():
    from components.train_lora import _plan

    assert (cost.PLAN_T_REF, cost.GC_SLOWDOWN, cost.MICRO_STEP_COST) == (
        _plan.T_REF,
        _plan.GC_SLOWDOWN,
        _plan.MICRO_STEP_COST,
    )


def test_every_priced_machine_is_a_known_shape_with_a_throughput_figure():
    from pipelines import shapes

    for machine, (on_demand, spot) in cost.PRICES.items():
        gpu, count = shapes.FIXED_GPU_MACHINES[machine]
        assert gpu in cost.GPU_RATIO, machine
        assert 0 < spot < on_demand, machine


# --- the config's price override ------------------------------------------------------


def test_price_override_is_used_and_named_with_its_date():
    cfg = load_config(
        "lora_seed", parse_overrides(["resources.price_usd_per_hour=3.5", "resources.price_date=2026-11-01"])
    )
    assert cfg.resources.price_date == "2026-11-01"  # an unquoted date reads as text
    est = config_estimate(cfg, (1000, 1207.0, "test"))
    assert est.price_usd_per_hour == 3.5
    assert "$3.5/h (your price of 2026-11-01, resources.price_usd_per_hour)" in est.lines()[0]


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("resources.price_usd_per_hour=-1", "resources.price_usd_per_hour"),
        ("resources.price_usd_per_hour=cheap", "resources.price_usd_per_hour"),
        ("resources.price_date=yesterday", "resources.price_date"),
        ("resources.price_date=2026-13-01", "resources.price_date"),
    ],
)
def test_bad_price_overrides_are_refused_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config("lora_seed", parse_overrides([override]))


# --- what is known before a run: the data -----------------------------------------------


def _write_rows(folder: Path, n: int, side: int = 512) -> Path:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (side, side)).save(folder / "a.png")
    row = {"messages": [{"role": "user", "content": "<image>Find the boxes."}, {"role": "assistant", "content": "[]"}]}
    path = folder / "train.jsonl"
    path.write_text("".join(json.dumps({**row, "images": ["a.png"]}) + "\n" for _ in range(n)) + "\n")
    return path


def test_local_data_rows_are_counted_and_tokens_approximated(tmp_path):
    path = _write_rows(tmp_path / "d", 40)
    cfg = load_config("local/tiny_cpu", parse_overrides([f"data.train={path}", f"data.eval={path}"]))
    rows, mean, source = data_figures(cfg)
    assert rows == 40
    assert 256 + 2 < mean < 256 + 2 + 40  # 512² px = 16 x 16 blocks of 32 px, the wrappers, a few text tokens
    assert "rows counted, tokens approximated on 40 of them" in source
    split = load_config("local/tiny_cpu", parse_overrides([f"data.train={path}", "data.eval=''"]))
    assert data_figures(split)[0] == 36  # eval_fraction 0.1 held out


def test_a_validated_folder_gives_its_token_stats(tmp_path):
    folder = tmp_path / "clean"
    folder.mkdir()
    (folder / "data.jsonl").write_text("{}\n")
    (folder / "token_stats.json").write_text(json.dumps({"rows": 1234, "max_tokens": 1500, "mean_tokens": 1100.5}))
    cfg = load_config("lora_seed", parse_overrides([f"data.train={folder}", f"data.eval={folder}"]))
    assert data_figures(cfg) == (1234, 1100.5, "token_stats.json")
    head = config_estimate(cfg).lines()[0]
    assert "of training (up to" in head and "$" in head


def test_data_on_gcs_is_not_read_before_the_run():
    cfg = load_config("lora_seed")
    rows, mean, source = data_figures(cfg)
    assert (rows, mean) == (0, 0.0) and "gs://" in source


# --- printed before a run -----------------------------------------------------------------


def test_run_prints_the_estimate_before_submitting(api, tmp_path):
    result, out = vertex._submit(vertex.write_config(tmp_path), api)
    estimate_at = out.index("cost estimate: rows unknown before validate-data")
    assert estimate_at < out.index("submitted ")
    assert "training profile a2-highgpu-1g (1 x NVIDIA_TESLA_A100, standard)" in out
    assert f"on-demand list price us-central1, table of {cost.PRICE_TABLE_DATE}" in out


def test_local_run_prints_no_vertex_estimate_and_the_dry_run_does(tmp_path, monkeypatch, capsys):
    from kfp import local

    from pipelines import local_run, run

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(local, "init", stop)
    path = _write_rows(tmp_path / "d", 8)
    model = tmp_path / "model"
    model.mkdir()
    cfg = load_config(
        "local/tiny_cpu", parse_overrides([f"data.train={path}", f"data.eval={path}", f"model.source={model}"])
    )
    with pytest.raises(Stop):
        local_run.run_local(cfg, root=str(tmp_path / "runs"))
    out = capsys.readouterr().out
    assert "cost: none, a local run on this machine" in out
    assert "cost estimate" not in out and "training profile" not in out  # not the A100's price for a CPU run
    assert run.main(["--dry-run", "--local", "--config", "local/tiny_cpu", f"data.train={path}", f"data.eval={path}",
                     f"model.source={model}"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "on Vertex; this local run uses no cloud GPU" in out and "cost estimate: ~" in out


# --- train-lora's log line ------------------------------------------------------------


def test_train_lora_logs_time_and_gpu_hours_from_its_plan():
    stats = {"rows": 10_000, "mean_tokens": 1207, "max_tokens": 1221}
    args = {"num_train_epochs": 2, "use_liger_kernel": True, "gradient_accumulation_steps": 2}
    line = cost.training_log_line(
        args, stats, micro_batch=8, checkpointing=False, gpus=1, nodes=1, gpu_name="NVIDIA H100 80GB HBM3",
        model_source="hf://Qwen/Qwen3-VL-4B-Instruct",
    )  # fmt: skip
    assert line.startswith("expected ~26 min of training (up to 36 min), 0.43 GPU-hours on 1 x NVIDIA_H100_80GB")
    assert (
        cost.training_log_line(args, None, micro_batch=8, checkpointing=False, gpus=1, nodes=1, gpu_name="H100") == ""
    )
    assert cost.training_log_line(args, stats, micro_batch=8, checkpointing=False, gpus=1, nodes=1, gpu_name="T4") == ""


def test_readme_gives_the_price_table_date_and_the_override():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## What a run will cost") :]
    assert cost.PRICE_TABLE_DATE in section and "resources.price_usd_per_hour" in section
    table = readme[readme.index("## Config reference") : readme.index("Seed default (")]
    assert "`resources.price_usd_per_hour`" in table and "`price_date`" in table


def test_train_lora_records_gpu_hours_of_its_wall_time(tmp_path, monkeypatch, capsys):
    """gpu_hours = the task's wall time x GPUs, whatever ran inside (swift itself is faked here)."""
    import types

    from components.train_lora import _data, _fit, _launch, core

    clock = iter([1000.0, 1000.0 + 1800.0])  # the task starts, then ends half an hour later
    monkeypatch.setattr(core, "time", types.SimpleNamespace(time=lambda: next(clock)))
    launch = _launch.Launch(cluster.launch_plan({}, 2), 2, 80 * 1024**3)
    monkeypatch.setattr(core, "_plan_launch", lambda *a, **k: launch)
    monkeypatch.setattr(core, "run_node_preflight", lambda *a, **k: {})
    monkeypatch.setattr(_data, "materialize_inputs", lambda *a, **k: None)
    monkeypatch.setattr(_fit, "micro_batch_plan", lambda *a, **k: None)
    monkeypatch.setattr(core, "_train_until_it_fits", lambda *a, **k: core._Run(wall=1700.0, resume=None, plan=None))
    (tmp_path / "out").mkdir()  # what the faked _collect_outputs would have written the adapter into

    monkeypatch.setattr(core, "_collect_outputs", lambda *a, **k: core.TrainResult("a", "c", {"wall_s": 1700.0}))
    result = core.train_lora(
        str(tmp_path), "qwen3_vl", str(tmp_path), "", {}, str(tmp_path / "out"), str(tmp_path), preflight="off"
    )
    assert result.metrics["gpu_hours"] == pytest.approx(1.0)  # 0.5 h x 2 GPUs
