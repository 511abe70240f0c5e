"""The run's facts derived once (`_facts.RunFacts`) and the `swift sft` arguments built in ordered layers
(`_layers`, `_swift_args`): which layer set each key, the overrides, the table in the log, the metrics and the
adapter folder, and config.json read once in a whole `train_lora` run (swift itself faked)."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

from components.common import cluster
from components.common.quantization import swift_quant_args
from components.train_lora import _facts, _launch, _layers, _plan, _swift_args, core

GIB = 1024**3
DENSE = {"model_type": "qwen3_vl", "torch_dtype": "float32", "text_config": {"hidden_size": 64}}


def _model(tmp_path, config=DENSE, nbytes=4000):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    (model / "model.safetensors").write_bytes(b"\0" * nbytes)
    return str(model)


def test_merge_lets_a_later_layer_win_records_the_override_and_drops_keys():
    layered = _layers.merge(
        [
            _layers.Layer("a", {"x": 1, "y": "keep", "z": 3}, "first"),
            _layers.Layer("b", {"x": 2, "z": _layers.DROPPED}, "second"),
        ]
    )
    assert layered.final == {"x": 2, "y": "keep"} and list(layered.final) == ["x", "y"]
    assert layered.source == {"x": "b", "y": "a", "z": "b"}
    assert [(o.key, o.layer, o.over, o.old, o.new) for o in layered.overrides] == [
        ("x", "b", "a", 1, 2),
        ("z", "b", "a", 3, _layers.DROPPED),
    ]
    assert layered.log_lines() == [
        "train-lora: args: a: x=1 y=keep z=3 (first)",
        "train-lora: args: b: x=2 z=<dropped> (second)",
        "train-lora: args: override: x=2 (b) over 1 (a)",
        "train-lora: args: override: z=<dropped> (b) over 3 (a)",
    ]
    assert layered.metrics() == {"args_layer_a_keys": 3.0, "args_layer_b_keys": 2.0, "args_overrides": 2.0}


def test_each_key_names_the_layer_that_set_it_and_overrides_are_recorded(tmp_path):
    model = _model(tmp_path)
    swift = {
        "lora_rank": 8,
        "check_model": True,
        "deepspeed": "none",
        "save_only_model": True,
        "per_device_train_batch_size": "auto",
        **swift_quant_args("nf4"),
    }
    launch = _launch.Launch(cluster.launch_plan({}, 2), 2, 80 * GIB)
    facts = _facts.RunFacts.gather(model, swift, launch)
    tb = {"AIP_TENSORBOARD_LOG_DIR": "gs://b/tb", "CLOUD_ML_JOB_ID": "7"}
    layers = _swift_args.task_layers(
        swift, facts, ddp_timeout_s=600, environ=tb, checkpoint_dir=str(tmp_path / "ck"), job_env={}
    )
    plan = _plan.Plan(4, 4, False, 0, 0, ("micro-batch 4 fits",))
    resume = str(tmp_path / "ck" / "checkpoint-2")
    run = _swift_args.inputs_layer(_swift_args.planner_args(layers), model, "qwen3_vl", "/t.jsonl", "", "/o", resume)
    layered = _layers.merge([*layers, _swift_args.batch_plan_layer(plan), run])
    names = [la.name for la in layered.layers]
    assert names == [
        "defaults", "user", "quantisation", "strategy", "distributed", "tracking", "checkpoints", "batch_plan",
        "inputs",
    ]  # fmt: skip
    src = layered.source
    assert src["lora_rank"] == "user" and src["quant_method"] == "quantisation" and src["bnb_4bit_quant_type"]
    assert src["bnb_4bit_quant_type"] == "quantisation" and src["tuner_type"] == "defaults"
    assert src["deepspeed"] == "strategy" and "deepspeed" not in layered.final  # "none": no DeepSpeed config
    assert src["ddp_timeout"] == "distributed" and layered.final["ddp_timeout"] == 600
    assert src["report_to"] == src["logging_dir"] == "tracking" and layered.final["logging_dir"] == "gs://b/tb/7"
    assert src["save_only_model"] == "checkpoints" and layered.final["save_only_model"] is False
    assert src["per_device_train_batch_size"] == "batch_plan" and layered.final["per_device_train_batch_size"] == 4
    assert src["model"] == src["resume_from_checkpoint"] == "inputs"
    overridden = {o.key: (o.layer, o.over, o.old, o.new) for o in layered.overrides}
    assert overridden == {
        "check_model": ("user", "defaults", False, True),
        "deepspeed": ("strategy", "user", "none", _layers.DROPPED),
        "save_only_model": ("checkpoints", "user", True, False),
        "per_device_train_batch_size": ("batch_plan", "user", "auto", 4),
    }
    lines = layered.log_lines()
    assert (
        "train-lora: args: checkpoints: save_only_model=False (checkpoint_dir set: optimizer state saved to resume)"
        in lines
    )
    assert "train-lora: args: override: save_only_model=False (checkpoints) over True (user)" in lines
    assert any(line.startswith("train-lora: args: quantisation: quant_method=bnb quant_bits=4") for line in lines)
    metrics = layered.metrics()
    assert metrics["args_layer_quantisation_keys"] == 5 and metrics["args_layer_user_keys"] == 5
    assert metrics["args_overrides"] == 4 and all(isinstance(v, float) for v in metrics.values())
    # the command line is the merged arguments, the inputs first and the resume point last
    cmd = _swift_args.command(layered)
    assert cmd[:4] == ["swift", "sft", "--model", model] and cmd[-2:] == ["--resume_from_checkpoint", resume]
    assert "--deepspeed" not in cmd and cmd[cmd.index("--save_only_model") + 1] == "false"


def test_the_layer_table_is_written_whole_beside_the_adapter(tmp_path):
    layered = _layers.merge(
        [_layers.Layer("user", {"lora_rank": 8, "target_modules": ["q", "v"]}, "the config"),
         _layers.Layer("strategy", {"deepspeed": _layers.DROPPED}, "ddp")]
    )  # fmt: skip
    path = _layers.write_record(layered, tmp_path)
    assert path == tmp_path / _layers.ARGS_LAYERS and [p.name for p in tmp_path.iterdir()] == [_layers.ARGS_LAYERS]
    record = json.loads(path.read_text())
    assert record["source"] == {"lora_rank": "user", "target_modules": "user", "deepspeed": "strategy"}
    assert record["layers"][0] == {
        "name": "user",
        "reason": "the config",
        "keys": {"lora_rank": 8, "target_modules": ["q", "v"]},
    }
    assert record["layers"][1]["keys"] == {"deepspeed": "<dropped>"} and record["overrides"] == []


def test_run_facts_derive_the_size_quantisation_and_strategy_once(tmp_path):
    model = _model(tmp_path, nbytes=4000)  # float32 on disk
    two = _launch.Launch(cluster.launch_plan({}, 2), 2, 80 * GIB)
    facts = _facts.RunFacts.gather(model, {"torch_dtype": "bfloat16"}, two)
    assert facts.config == DENSE and facts.stored_bytes == 4000 and facts.weight_bytes == 2000
    assert facts.weight_bytes == _launch.model_weight_bytes(model, "bfloat16")  # the same figure as before
    assert facts.quantization == "none" and facts.strategy.name == "ddp"
    assert (facts.world_size, facts.nnodes, facts.gpus, facts.token_stats) == (2, 1, 2, None)
    assert facts.weight_bytes_in("bfloat16") == 2000
    with pytest.raises(AttributeError):
        facts.weight_bytes = 1  # frozen: every step reads the same facts
    nf4 = _facts.RunFacts.gather(model, swift_quant_args("nf4"), two)
    assert nf4.quantization == "nf4" and nf4.weight_bytes == _launch.model_weight_bytes(model, None, "nf4")
    user = _facts.RunFacts.gather(model, {"deepspeed": "zero2"}, two)
    assert user.strategy.name == "user"


FAKE_SWIFT = """#!{python}
import json, os, sys
out = sys.argv[sys.argv.index("--output_dir") + 1]
ckpt = os.path.join(out, "checkpoint-1")
os.makedirs(ckpt)
for name in ("adapter_model.safetensors", "adapter_config.json"):
    with open(os.path.join(ckpt, name), "w") as f:
        f.write("{{}}")
with open(os.path.join(out, "logging.jsonl"), "w") as f:
    f.write(json.dumps({{"loss": 1.5, "global_step/max_steps": "1/1"}}) + "\\n")
with open(os.path.join(out, "..", "argv.json"), "w") as f:
    json.dump(sys.argv[1:], f)
"""


def test_a_run_reads_config_json_once_and_records_its_layers(tmp_path, monkeypatch, capsys):
    """A whole `train_lora` on one (declared) GPU with the planner on: config.json is opened once, the command swift
    gets is the layers merged, and the table is logged, counted in the metrics and kept beside the adapter."""
    from pipelines.demo.tiny_model import ensure_tiny_model

    model = str(ensure_tiny_model())
    ds = tmp_path / "ds"
    ds.mkdir()
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}
    (ds / "data.jsonl").write_text(json.dumps(row) + "\n")
    (ds / "token_stats.json").write_text(json.dumps({"max_tokens": 64, "p95_tokens": 60, "mean_tokens": 50.0}))
    fake = tmp_path / "swift"
    fake.write_text(FAKE_SWIFT.format(python=sys.executable))
    fake.chmod(0o755)
    monkeypatch.setattr(core, "swift_executable", lambda: str(fake))
    reads = []
    read_text, real_open = pathlib.Path.read_text, open

    def counting_read_text(self, *a, **k):
        if self.name == "config.json":
            reads.append(str(self))
        return read_text(self, *a, **k)

    def counting_open(file, *a, **k):
        if isinstance(file, str | pathlib.Path) and pathlib.Path(file).name == "config.json":
            reads.append(str(file))
        return real_open(file, *a, **k)

    monkeypatch.setattr(pathlib.Path, "read_text", counting_read_text)
    monkeypatch.setattr("builtins.open", counting_open)
    swift = {"per_device_train_batch_size": "auto", "max_length": 64, "lora_rank": 4}
    result = core.train_lora(
        model, "qwen3_vl", str(ds), "", swift, str(tmp_path / "adapter"), str(tmp_path / "work"),
        gpus=(1, 80 * GIB), environ={}, preflight="off",
    )  # fmt: skip
    monkeypatch.undo()
    assert reads == [str(pathlib.Path(model) / "config.json")]  # once: RunFacts carries it to every step
    out = capsys.readouterr().out
    assert "train-lora: args: user: per_device_train_batch_size=auto max_length=64 lora_rank=4" in out
    assert "train-lora: args: override: per_device_train_batch_size=" in out
    assert result.metrics["args_layer_user_keys"] == 3 and result.metrics["args_layer_batch_plan_keys"] == 3
    record = json.loads((tmp_path / "adapter" / _layers.ARGS_LAYERS).read_text())
    argv = json.loads((tmp_path / "work" / "argv.json").read_text())
    flags = {a[2:] for a in argv if a.startswith("--")}
    assert flags == set(record["source"]) and record["source"]["per_device_train_batch_size"] == "batch_plan"
    assert argv[argv.index("--per_device_train_batch_size") + 1] == str(result.metrics["plan_micro_batch"])
