"""QLoRA on the CPU: the tiny Qwen3-VL trained by train-lora's core on an nf4 base (bitsandbytes 0.50
quantises and runs nf4 on a CPU), then merge-export merges the adapter into the stored base (not the 4-bit
weights) with its weight and logits checks. Nothing here is faked; GPU speed and memory are not measured."""

from __future__ import annotations

import json

import pytest

from components.common.quantization import swift_quant_args

pytest.importorskip("bitsandbytes")

from tests.cpu_training import cpu_swift_args

STEPS = 2
SWIFT_ARGS = cpu_swift_args(STEPS, **swift_quant_args("nf4"))  # the nf4 layers compute in bf16


@pytest.fixture(scope="module")
def nf4_adapter(tmp_path_factory):
    from components.train_lora.core import train_lora
    from components.validate_data.core import validate_data
    from pipelines.demo.drawings import generate_dataset
    from pipelines.demo.tiny_model import ensure_tiny_model

    tmp = tmp_path_factory.mktemp("qlora")
    raw = generate_dataset(tmp / "raw", n_train=3, n_eval=1, image_size=128)
    validate_data([raw["train"]], str(tmp / "train"), str(tmp / "eval"), str(tmp / "q.jsonl"), eval_files=[raw["eval"]])
    adapter = tmp / "adapter"
    result = train_lora(
        model_dir=str(ensure_tiny_model()),
        model_type="qwen3_vl",
        train_dir=str(tmp / "train"),
        eval_dir="",
        swift_args=SWIFT_ARGS,
        adapter_out=str(adapter),
        work_dir=str(tmp / "work"),
    )
    return tmp, adapter, result


def test_train_lora_trains_on_an_nf4_base_on_the_cpu(nf4_adapter):
    _, adapter, result = nf4_adapter
    assert result.metrics["steps"] == STEPS
    args = json.loads((adapter / "args.json").read_text())
    assert (args["quant_method"], args["quant_bits"], args["bnb_4bit_quant_type"]) == ("bnb", 4, "nf4")
    losses = [e["loss"] for e in json.loads((adapter / "log_history.json").read_text()) if "loss" in e]
    assert len(losses) == STEPS and all(loss == loss for loss in losses)  # finite, not NaN


def test_merge_export_merges_into_the_stored_base_not_the_4bit_weights(nf4_adapter):
    from components.merge_export.core import merge_export
    from pipelines.demo.tiny_model import ensure_tiny_model

    tmp, adapter, _ = nf4_adapter
    out = tmp / "merged"
    result = merge_export(str(adapter), str(ensure_tiny_model()), str(out), str(tmp / "merge-work"))
    meta = result.metadata
    assert meta["adapted_weights"] > 0 and meta["trained_on_quantization"] == "nf4"
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config  # a plain model, not a bnb one
    from safetensors import safe_open

    for path in out.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            assert not any(k.endswith((".absmax", ".quant_map")) or "quant_state" in k for k in f.keys())
    card = (out / "README.md").read_text()
    assert "trained on a nf4 (bitsandbytes) base" in card and "original bf16 base model" in card
    lineage = json.loads((out / "lineage.json").read_text())
    assert lineage["trained_on"]["swift_args"]["quant_bits"] == 4
    # the disk check's premise: the merged safetensors are as large as the base's (+2 % of headers)
    stored = sum(p.stat().st_size for p in ensure_tiny_model().glob("*.safetensors"))
    merged = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    assert merged <= 1.02 * stored and meta["disk_need_bytes"] >= merged
    assert meta["disk_free_before_bytes"] > 0 and meta["disk_peak_extra_bytes"] >= 0


def test_merge_refuses_a_quantised_base_and_writing_over_the_base(nf4_adapter, tmp_path):
    import shutil

    from components.merge_export.core import merge_export
    from components.merge_export.errors import QuantizedMergeError
    from pipelines.demo.tiny_model import ensure_tiny_model

    tmp, adapter, _ = nf4_adapter
    base = tmp_path / "base4bit"
    shutil.copytree(ensure_tiny_model(), base)
    config = json.loads((base / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (base / "config.json").write_text(json.dumps(config))
    with pytest.raises(QuantizedMergeError, match="never into quantised weights"):
        merge_export(str(adapter), str(base), str(tmp_path / "out"), str(tmp_path / "w"))
    plain = tmp_path / "plain"
    shutil.copytree(ensure_tiny_model(), plain)
    with pytest.raises(QuantizedMergeError, match="never writes over the base"):
        merge_export(str(adapter), str(plain), str(plain), str(tmp_path / "w2"))
    assert not (tmp_path / "out").exists()


def test_bf16_adapter_view_drops_only_the_quant_arguments(tmp_path):
    from components.merge_export.inputs import bf16_adapter_view

    adapter = tmp_path / "a"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "args.json").write_text(json.dumps({"lora_rank": 8, "bnb_4bit_quant_type": "nf4", "quant_method": None}))
    assert bf16_adapter_view(adapter, tmp_path / "w") == (adapter, {})  # ms-swift's defaults: not a quantised base
    (adapter / "args.json").write_text(json.dumps({"lora_rank": 8, **swift_quant_args("nf4")}))
    view, quant = bf16_adapter_view(adapter, tmp_path / "w")
    assert quant == swift_quant_args("nf4")
    assert json.loads((view / "args.json").read_text()) == {"lora_rank": 8}
    assert (view / "adapter_config.json").resolve() == (adapter / "adapter_config.json").resolve()
