"""Unit tests of the train-lora core: command builder, datasets, checkpoints, logs."""

import json
from pathlib import Path

import pytest
import yaml

from components.common.adapter import summarize_log
from components.common.swift import to_cli
from components.train_lora import _data, _run_swift, _swift_args, core
from components.train_lora._data import find_checkpoints, materialize_dataset
from components.train_lora._swift_args import build_sft_command, check_swift_args
from components.train_lora.core import TrainError
from speedups.tests.isolation import restored_speedups  # noqa: F401 (autouse: no plugin left behind)

ROOT = Path(__file__).resolve().parent.parent


def test_to_cli_formats_bools_lists_and_numbers():
    assert to_cli({"a": True, "b": False, "c": [1, "x"], "d": 1e-4, "e": {"k": 1}}) == [
        "--a",
        "true",
        "--b",
        "false",
        "--c",
        "1",
        "x",
        "--d",
        "0.0001",
        "--e",
        '{"k": 1}',
    ]


def test_to_cli_turns_whole_floats_from_kfp_structs_into_ints():
    assert to_cli({"gradient_accumulation_steps": 1.0, "lr": 0.5, "ids": [2.0, 3.5]}) == [
        "--gradient_accumulation_steps",
        "1",
        "--lr",
        "0.5",
        "--ids",
        "2",
        "3.5",
    ]


def test_build_sft_command_passes_swift_args_through_and_sets_inputs():
    cmd = build_sft_command(
        {"lora_rank": 8, "learning_rate": 1e-4, "gradient_checkpointing": True, "target_modules": ["q_proj", "v_proj"]},
        "/m",
        "qwen3_vl",
        "/w/train.jsonl",
        "/w/eval.jsonl",
        "/w/out",
    )
    assert cmd[:2] == ["swift", "sft"]
    args = cmd[2:]
    pairs = dict(zip(args[::2], args[1::2]))
    assert pairs["--model"] == "/m" and pairs["--model_type"] == "qwen3_vl"
    assert pairs["--dataset"] == "/w/train.jsonl" and pairs["--val_dataset"] == "/w/eval.jsonl"
    assert pairs["--output_dir"] == "/w/out" and pairs["--add_version"] == "false"
    assert pairs["--tuner_type"] == "lora" and pairs["--lora_rank"] == "8"
    assert pairs["--gradient_checkpointing"] == "true"
    i = args.index("--target_modules")
    assert args[i + 1 : i + 3] == ["q_proj", "v_proj"]
    assert "--resume_from_checkpoint" not in args
    assert pairs["--include_num_input_tokens_seen"] == "true"
    assert pairs["--logging_nan_inf_filter"] == "false"  # no host wait for every backward (a config may set it)
    assert pairs["--external_plugins"] == _swift_args.PLUGIN and Path(_swift_args.PLUGIN).is_file()


def test_token_counting_can_be_turned_off_and_user_plugins_are_kept():
    cmd = build_sft_command(
        {"include_num_input_tokens_seen": False, "external_plugins": "/my/plugin.py"},
        "/m",
        "qwen3_vl",
        "/t.jsonl",
        "",
        "/o",
    )
    assert cmd[cmd.index("--include_num_input_tokens_seen") + 1] == "false"
    assert cmd.count("--include_num_input_tokens_seen") == 1
    kept = build_sft_command({"logging_nan_inf_filter": True}, "/m", "qwen3_vl", "/t.jsonl", "", "/o")
    assert kept[kept.index("--logging_nan_inf_filter") + 1] == "true" and kept.count("--logging_nan_inf_filter") == 1
    i = cmd.index("--external_plugins")
    assert cmd[i + 1 : i + 3] == [_swift_args.PLUGIN, "/my/plugin.py"]


def test_plugin_counts_tokens_without_padding():
    from types import SimpleNamespace

    import torch
    from transformers import Trainer

    from speedups import swift_plugin

    assert swift_plugin.CONTEXT.loaded[1].state == "pending"  # installed; decided when a trainer is built
    fake = SimpleNamespace(
        args=SimpleNamespace(include_num_input_tokens_seen="all", device="cpu"),
        state=SimpleNamespace(num_input_tokens_seen=0),
        accelerator=SimpleNamespace(gather=lambda t: t),
        model=SimpleNamespace(main_input_name="input_ids"),
    )
    batch = {
        "input_ids": torch.zeros(2, 5, dtype=torch.long),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]),
    }
    Trainer._track_num_input_tokens(fake, batch)
    assert fake.state.num_input_tokens_seen == 7  # not 10: padding excluded
    fake.args.include_num_input_tokens_seen = "no"
    Trainer._track_num_input_tokens(fake, batch)
    assert fake.state.num_input_tokens_seen == 7


def test_plugin_token_counts_on_the_gpu_are_read_without_waiting_and_completed_where_read():
    from types import SimpleNamespace

    import torch
    from transformers import Trainer

    from speedups import swift_plugin, token_count

    class Event:  # a CUDA event: done once the GPU reaches it
        def __init__(self):
            self.done = False
            events.append(self)

        def record(self):
            pass

        def query(self):
            return self.done

        def synchronize(self):
            self.done = True

    events: list = []
    fake_torch = SimpleNamespace(
        empty=lambda shape, dtype, pin_memory: torch.empty(shape, dtype=dtype),
        cuda=SimpleNamespace(Event=Event),
    )
    pending = token_count.PendingCounts(fake_torch)
    state = SimpleNamespace(num_input_tokens_seen=0)
    for n in (7, 5, 9):
        pending.add(torch.tensor(n))
    events[0].done = True
    pending.drain(state, wait=False)  # the first is on the host, the second not yet: stop there, in order
    assert state.num_input_tokens_seen == 7 and len(pending.queue) == 2
    events[2].done = True
    pending.drain(state, wait=False)
    assert state.num_input_tokens_seen == 7  # the third waits behind the second
    pending.drain(state, wait=True)
    assert state.num_input_tokens_seen == 21 and not pending.queue
    # logging and checkpoints complete the count first
    assert swift_plugin.CONTEXT.loaded[1].state == "pending"
    for name in ("log", "_save_checkpoint"):
        assert getattr(getattr(Trainer, name), "_vlm_lora_counts_drained", False), name


def test_summarize_log_reports_tokens_per_second():
    log = [
        {"loss": 3.0, "step": 5, "num_input_tokens_seen": 6000, "train_tokens_per_second": 1500.0},
        {"loss": 2.0, "step": 10, "num_input_tokens_seen": 12000, "train_tokens_per_second": 1600.0},
        {"train_runtime": 8.0, "train_samples_per_second": 1.25, "num_input_tokens_seen": 12000, "step": 10},
    ]
    m = summarize_log(log)
    assert m["tokens_seen"] == 12000.0 and m["tokens_per_second"] == 1600.0
    # no per-step rate logged: tokens seen / runtime
    m = summarize_log([log[2]])
    assert m["tokens_per_second"] == 1500.0


def test_build_sft_command_without_eval_and_with_resume():
    cmd = build_sft_command({}, "/m", "qwen3_vl", "/t.jsonl", "", "/o", resume_from="/o/checkpoint-10")
    assert "--val_dataset" not in cmd
    assert cmd[cmd.index("--resume_from_checkpoint") + 1] == "/o/checkpoint-10"


@pytest.mark.parametrize("key", ["model", "dataset", "output_dir", "val_dataset"])
def test_reserved_keys_are_refused(key):
    with pytest.raises(TrainError, match=f"swift.{key}"):
        build_sft_command({key: "x"}, "/m", "qwen3_vl", "/t", "", "/o")


def test_check_swift_args_names_the_unknown_key():
    known = {"lora_rank", "tuner_type", "learning_rate"}
    check_swift_args({"lora_rank": 8}, known)
    with pytest.raises(TrainError, match=r"'swift.train_type'.*did you mean tuner_type"):
        check_swift_args({"train_type": "lora"}, known, where="cfg.yaml")
    with pytest.raises(TrainError, match="set by the pipeline"):
        check_swift_args({"model": "x"}, known)


def test_every_config_uses_real_ms_swift_argument_names():
    """Checks each config's swift section against the installed ms-swift (names change between versions)."""
    known = _swift_args.swift_arg_names()
    assert "tuner_type" in known and "train_type" not in known
    configs = sorted(ROOT.glob("configs/**/*.yaml"))
    assert configs
    for path in configs:
        check_swift_args(yaml.safe_load(path.read_text()).get("swift", {}), known, where=str(path))


def _dataset(tmp_path: Path) -> Path:
    ds = tmp_path / "ds"
    (ds / "images").mkdir(parents=True)
    (ds / "images" / "a.png").write_bytes(b"png")
    rows = [
        {
            "messages": [{"role": "user", "content": "<image>hi"}, {"role": "assistant", "content": "[]"}],
            "images": ["images/a.png"],
        },
        {"messages": [{"role": "user", "content": "text only"}, {"role": "assistant", "content": "ok"}]},
    ]
    (ds / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ds


def test_materialize_dataset_makes_image_paths_absolute(tmp_path):
    ds = _dataset(tmp_path)
    out = tmp_path / "train.jsonl"
    assert materialize_dataset(ds, out) == 2
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["images"] == [str((ds / "images" / "a.png").resolve())]
    assert rows[0]["messages"][0]["content"] == "<image>hi"
    assert "images" not in rows[1]


def test_materialize_dataset_errors(tmp_path):
    with pytest.raises(TrainError, match="no data.jsonl"):
        materialize_dataset(tmp_path, tmp_path / "o.jsonl")
    ds = _dataset(tmp_path)
    (ds / "images" / "a.png").unlink()
    with pytest.raises(TrainError, match=r"data.jsonl:1: image 'images/a.png' not found"):
        materialize_dataset(ds, tmp_path / "o.jsonl")


def test_an_earlier_runs_local_output_is_not_read_as_this_runs(tmp_path, capsys):
    # swift appends to logging.jsonl, and a longer earlier run's checkpoint would be the newest
    ds = _dataset(tmp_path)
    work = tmp_path / "work"
    stale = work / "output" / "checkpoint-16"
    stale.mkdir(parents=True)
    (stale / "adapter_model.safetensors").write_bytes(b"old")
    (stale / "adapter_config.json").write_text("{}")
    (work / "output" / "logging.jsonl").write_text(json.dumps({"loss": 9.0, "memory(GiB)": 102.7}) + "\n")
    inputs = _data.materialize_inputs(str(work), str(ds), "")
    assert inputs.n_train == 2 and inputs.train_jsonl.is_file()
    assert not inputs.output_dir.exists() and find_checkpoints(inputs.output_dir) == []
    assert _data.read_trainer_log(inputs.output_dir) == []
    assert f"removing {work / 'output'}" in capsys.readouterr().out
    _data.materialize_inputs(str(work), str(ds), "")  # a fresh work folder: nothing to remove, no message
    assert "removing" not in capsys.readouterr().out


def test_find_checkpoints_orders_by_step_and_skips_incomplete(tmp_path):
    for step, complete in ((10, True), (2, True), (30, False)):
        ck = tmp_path / f"checkpoint-{step}"
        ck.mkdir()
        if complete:
            (ck / "adapter_model.safetensors").write_bytes(b"x")
            (ck / "adapter_config.json").write_text("{}")
    (tmp_path / "checkpoint-x").mkdir()
    assert [p.name for p in find_checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-10"]


def test_summarize_log():
    log = [
        {"loss": 3.0, "step": 5},
        {"loss": 1.5, "step": 10},
        {"eval_loss": 1.7, "step": 10},
        {"train_loss": 2.2, "train_runtime": 12.5, "train_samples_per_second": 8.0, "step": 10},
    ]
    m = summarize_log(log)
    assert m == {
        "first_loss": 3.0,
        "final_loss": 1.5,
        "eval_loss": 1.7,
        "train_loss": 2.2,
        "train_runtime_s": 12.5,
        "samples_per_second": 8.0,
        "steps": 10.0,
    }


def test_summarize_ms_swift_logging_jsonl(tmp_path):
    """The shape ms-swift writes to <output_dir>/logging.jsonl (strings and the final summary)."""
    lines = [
        {"loss": 3.0, "memory(GiB)": 20.5, "global_step/max_steps": "5/10", "train_speed(s/it)": 0.9},
        {"eval_loss": 2.5, "memory(GiB)": 31.25, "global_step/max_steps": "10/10"},
        {
            "train_runtime": 9.0,
            "train_samples_per_second": 1.1,
            "train_loss": 2.7,
            "global_step/max_steps": "10/10",
            "train_speed(s/it)": 0.8,
        },
        {"model_parameter_info": "PeftModel: 4B"},
    ]
    (tmp_path / "logging.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n")
    log = _data.read_trainer_log(tmp_path)
    assert len(log) == 3
    m = summarize_log(log)
    assert m["peak_memory_gib"] == 31.25 and m["steps"] == 10.0 and m["seconds_per_step"] == 0.8
    assert m["train_runtime_s"] == 9.0 and m["eval_loss"] == 2.5 and m["final_loss"] == 3.0


def test_read_trainer_log_falls_back_to_the_checkpoint_state(tmp_path):
    ck = tmp_path / "checkpoint-4"
    ck.mkdir()
    (ck / "trainer_state.json").write_text(json.dumps({"log_history": [{"loss": 1.0, "step": 4}]}))
    assert _data.read_trainer_log(tmp_path, ck) == [{"loss": 1.0, "step": 4}]


def test_tensorboard_args_follow_vertex_and_yield_to_the_config():
    env = {"AIP_TENSORBOARD_LOG_DIR": "gs://b/tb/logs"}
    assert _swift_args.tensorboard_args({}, env) == {"report_to": "tensorboard", "logging_dir": "gs://b/tb/logs"}
    assert _swift_args.tensorboard_args({"report_to": "none"}, env) == {}
    assert _swift_args.tensorboard_args({}, {}) == {}


def _swift_log(steps: int = 20) -> list[dict]:
    """A log history as ms-swift writes it: train entries, then one eval pass."""
    log = [
        {
            "loss": 2.5 * 0.9**i, "grad_norm": 4.0 / (i + 1), "learning_rate": 1e-4 * (1 - i / steps),
            "token_acc": 0.3 + 0.02 * i, "epoch": 2 * (i + 1) / steps, "global_step/max_steps": f"{i + 1}/{steps}",
        }
        for i in range(steps)
    ]  # fmt: skip
    log.append({"eval_loss": 1.1, "eval_token_acc": 0.6, "epoch": 2.0, "global_step/max_steps": f"{steps}/{steps}"})
    return log


def _svg_texts(page: str) -> list[str]:
    import re

    return re.findall(r"<text[^>]*>([^<]*)</text>", page)


def test_loss_curve_html_draws_every_logged_quantity():
    import re

    page = core.loss_curve_html(_swift_log())
    texts = _svg_texts(page)
    for title in ("loss", "learning rate", "grad norm", "token accuracy"):  # one panel each
        assert title in texts
    assert texts.count("optimizer step") == 4 and "loss (log scale)" in texts
    assert "token accuracy (fraction of answer tokens)" in texts
    # log-scale loss ticks as plain numbers (0.5 1 2 ...), not 10^k
    loss_ticks = texts[texts.index("optimizer step") + 1 : texts.index("loss (log scale)")]
    assert "1" in loss_ticks and "2" in loss_ticks
    # the single eval pass is drawn: one marker in the eval_loss group
    group = re.search(r'<g id="eval_loss">(.*?)</g>', page, re.S).group(1)
    assert group.count("<use ") == 1
    assert re.search(r'<g id="loss">', page) and "eval loss (last 1.1)" in texts
    assert "<td><code>eval_loss</code></td>" in page and "epoch 2.00" in page and "step 20/20" in page
    assert "<script" not in page and not re.search(r'(src|href)="(https?:)?//', page)


def test_loss_curve_html_with_only_a_loss_or_nothing():
    page = core.loss_curve_html([{"loss": 3.0, "step": 1}, {"loss": 1.0, "step": 2}])
    texts = _svg_texts(page)
    assert "loss" in texts and "learning rate" not in texts and "grad norm" not in texts
    assert "No loss was logged" in core.loss_curve_html([])
    assert "No loss was logged" in core.loss_curve_html([{"train_runtime": 3.0}])


def test_loss_curve_renders_in_chromium(tmp_path):
    from tests.browser import assert_not_blank, pixels_near, screenshot

    page = tmp_path / "loss_curve.html"
    page.write_text(core.loss_curve_html(_swift_log()), encoding="utf-8")
    img = screenshot(page, tmp_path / "train_lora_loss_curve.png", (1200, 900))
    assert pixels_near(img, (0x1A, 0x73, 0xE8), 40) > 200  # the blue train loss / token accuracy lines
    assert pixels_near(img, (0xE8, 0x71, 0x0A), 40) > 40  # the orange eval points
    assert_not_blank(img)


def test_explain_failure_points_at_the_knob():
    assert "per_device_train_batch_size" in _run_swift._explain_failure(
        "torch.OutOfMemoryError: CUDA out of memory.", 1
    )
    assert "last line: boom" in _run_swift._explain_failure("a\nboom\n", 3)


def test_cpu_speed_env_only_without_gpu_and_never_overrides():
    assert _run_swift.cpu_speed_env(True, {}) == {}
    env = _run_swift.cpu_speed_env(False, {})
    assert env == _run_swift.CPU_SPEED_ENV and env["OMP_NUM_THREADS"] == "1"
    kept = _run_swift.cpu_speed_env(False, {"OMP_NUM_THREADS": "8"})
    assert "OMP_NUM_THREADS" not in kept and "MALLOC_TRIM_THRESHOLD_" in kept


def test_plugin_skips_peft_float32_input_copies_only_under_autocast():
    import torch
    from peft import LoraConfig, get_peft_model

    from speedups import swift_plugin

    assert not swift_plugin.CONTEXT.loaded[2].skipped
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(16, 8)).to(torch.bfloat16)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["0"], lora_dropout=0.0))
    layer = model.base_model.model[0]
    for p in layer.lora_A.parameters():
        p.data = p.data.float()  # master weights in float32, as in mixed-precision training
    for p in layer.lora_B.parameters():
        p.data = torch.randn_like(p.data, dtype=torch.float32)
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    assert layer._cast_input_dtype(x, torch.float32).dtype == torch.float32  # no autocast: peft's cast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer._cast_input_dtype(x, torch.float32) is x  # autocast casts at the matmul anyway
        fast = layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        slow = (
            layer.base_layer(x) + layer.lora_B["default"](layer.lora_A["default"](x.float())) * layer.scaling["default"]
        )
    assert fast.dtype == torch.bfloat16
    assert torch.allclose(fast.float(), slow.float(), atol=1e-2, rtol=1e-2)


def test_progress_bars_refresh_at_most_every_30_s_in_logs_unless_set():
    assert _run_swift.log_progress_env({}) == {"TQDM_MININTERVAL": "30"}
    assert _run_swift.log_progress_env({"TQDM_MININTERVAL": "1"}) == {}
