"""Larger and mixture-of-experts models (issue 17) on a tiny Qwen3-VL-MoE, on the CPU.

The tiny MoE (`pipelines.demo.tiny_moe`) has the 30B-A3B architecture's parts: a router and
the experts as fused 3-D parameters. Adapters here are made with peft directly (what ms-swift
does under `swift sft`) and merged with peft's merge_and_unload (what `swift export
--merge_lora` does), so the checks run in seconds; one test runs the real `swift sft` +
merge-export with LoRA on the experts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from components.common.model_fit import (
    GIB,
    ModelTooLarge,
    check_fits,
    fit,
    known_model_bytes,
    smallest_fitting_profile,
)
from components.merge_export.errors import MergeVerificationError
from components.merge_export.weights import compare_weights
from pipelines.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parent.parent
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
ATTENTION = r"^model\.language_model.*\.(q_proj|k_proj|v_proj|o_proj)$"


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory) -> Path:
    from pipelines.demo.tiny_moe import build_tiny_moe_model

    return build_tiny_moe_model(tmp_path_factory.mktemp("moe") / "base")


def _adapter_and_merge(base: Path, out: Path, experts: bool) -> tuple[Path, Path]:
    """A peft adapter (attention, and the experts when asked) with random B, and its merged model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=ATTENTION, target_parameters=EXPERTS if experts else None
    )
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    peft_model.save_pretrained(out / "adapter")
    peft_model.merge_and_unload().save_pretrained(out / "merged")
    return out / "adapter", out / "merged"


@pytest.fixture(scope="module")
def expert_adapter(tiny_moe, tmp_path_factory) -> tuple[Path, Path]:
    return _adapter_and_merge(tiny_moe, tmp_path_factory.mktemp("experts"), experts=True)


@pytest.fixture(scope="module")
def attention_adapter(tiny_moe, tmp_path_factory) -> tuple[Path, Path]:
    return _adapter_and_merge(tiny_moe, tmp_path_factory.mktemp("attention"), experts=False)


def _rewrite(src: Path, dst: Path, change) -> Path:
    """Copies a model folder, applying change(name, tensor) -> tensor to every tensor of its safetensors."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    for path in dst.glob("*.safetensors"):
        tensors = load_file(str(path))
        save_file({k: change(k, v).contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})
    return dst


def test_weights_check_covers_lora_on_expert_parameters(tiny_moe, expert_adapter):
    adapter, merged = expert_adapter
    keys = json.loads((adapter / "adapter_config.json").read_text())
    assert sorted(keys["target_parameters"]) == sorted(EXPERTS)
    facts = compare_weights(tiny_moe, adapter, merged)
    # 2 layers x (4 attention projections + the 2 expert parameters)
    assert facts["adapted_weights"] == 12
    assert facts["adapted_within_step_min_fraction"] >= 0.999
    assert facts["adapted_changed_fraction"] > 0.5
    assert facts["layout_transposed"] == 0


def test_dropped_expert_update_is_caught(tiny_moe, expert_adapter, tmp_path):
    from safetensors import safe_open

    adapter, merged = expert_adapter
    key = "model.language_model.layers.1.mlp.experts.down_proj"
    with safe_open(str(tiny_moe / "model.safetensors"), "pt") as f:
        base_value = f.get_tensor(key)
    broken = _rewrite(merged, tmp_path / "m", lambda k, v: base_value if k == key else v)
    with pytest.raises(MergeVerificationError, match="experts"):
        compare_weights(tiny_moe, adapter, broken)


def test_update_on_the_wrong_expert_is_caught(tiny_moe, expert_adapter, tmp_path):
    import torch

    adapter, merged = expert_adapter
    key = "model.language_model.layers.0.mlp.experts.gate_up_proj"
    broken = _rewrite(merged, tmp_path / "m", lambda k, v: torch.roll(v, 1, dims=0) if k == key else v)
    with pytest.raises(MergeVerificationError, match="gate_up_proj"):
        compare_weights(tiny_moe, adapter, broken)


def test_base_in_the_released_expert_layout_is_compared_transposed(
    tiny_moe, expert_adapter, attention_adapter, tmp_path
):
    """Released Qwen3-VL-MoE checkpoints store experts (E, in, out); transformers 5 saves (E, out, in)."""
    released = _rewrite(tiny_moe, tmp_path / "released", lambda k, v: v.transpose(1, 2) if ".experts." in k else v)
    adapter, merged = expert_adapter
    facts = compare_weights(released, adapter, merged)
    assert facts["adapted_weights"] == 12 and facts["layout_transposed"] == 4
    adapter, merged = attention_adapter  # experts untouched: still equal to the base, transposed
    facts = compare_weights(released, adapter, merged)
    assert facts["adapted_weights"] == 8 and facts["layout_transposed"] == 4


def test_an_untouched_expert_that_changed_is_caught(tiny_moe, attention_adapter, tmp_path):
    adapter, merged = attention_adapter
    key = "model.language_model.layers.0.mlp.experts.down_proj"
    broken = _rewrite(merged, tmp_path / "m", lambda k, v: v * 1.01 if k == key else v)
    with pytest.raises(MergeVerificationError, match="does not touch differ.*experts.down_proj"):
        compare_weights(tiny_moe, adapter, broken)


# --- sizes and profiles ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "gb"),
    [
        ("hf://Qwen/Qwen3-VL-8B-Instruct", 17.54),
        ("hf://Qwen/Qwen3-VL-30B-A3B-Instruct@0123abc", 62.2),
        ("ms://Qwen/Qwen3-VL-235B-A22B-Thinking", 472.0),
        ("gs://bucket/models/Qwen3-VL-2B-Instruct/", 4.26),
        ("/models/my-own-model", 0.0),
    ],
)
def test_known_model_sizes_from_the_name(source, gb):
    assert known_model_bytes(source) / 1e9 == pytest.approx(gb)


def test_moe_fits_one_h200_but_not_one_h100():
    size = known_model_bytes("Qwen3-VL-30B-A3B-Instruct")
    h200, h100 = int(139.8 * GIB), int(79.2 * GIB)
    assert fit(size, h200, 2).one_gpu  # 2 x H200: replicated, DDP (what train-lora picks)
    eight_h100 = fit(size, h100, 8)
    assert not eight_h100.one_gpu and eight_h100.zero3  # 8 x H100: sharded, ZeRO-3
    with pytest.raises(ModelTooLarge) as err:
        check_fits(size, h100, 1, 1, "30B-A3B on 1 x NVIDIA_H100_80GB")
    text = str(err.value)
    assert "57.9 GiB" in text and "1 GPU(s) of 79.2 GiB" in text
    assert "smallest profile that fits: a2-ultragpu-2g (2 x NVIDIA_A100_80GB each, sharded, ZeRO-3)" in text


def test_a_model_too_large_for_any_single_host_needs_replicas():
    assert smallest_fitting_profile(int(1400e9)).startswith("a3-ultragpu-8g x 2 replicas (resources.replica_count: 2)")


def _moe_config(tmp_path: Path, **overrides) -> Path:
    src = (ROOT / "configs/qwen3_vl_30b_a3b/lora_h200_x8.yaml").read_text()
    path = tmp_path / "cfg.yaml"
    path.write_text(src)
    return path


def test_config_refuses_a_profile_the_model_does_not_fit(tmp_path):
    path = _moe_config(tmp_path)
    overrides = {
        "resources.machine_type": "a3-highgpu-1g",
        "resources.accelerator_type": "NVIDIA_H100_80GB",
        "resources.accelerator_count": 1,
    }
    with pytest.raises(ConfigError) as err:
        load_config(path, overrides)
    text = str(err.value)
    assert "resources.machine_type" in text and "Qwen3-VL-30B-A3B-Instruct on 1 x 1 x NVIDIA_H100_80GB" in text
    assert "even sharded with ZeRO-3" in text and "a2-ultragpu-2g" in text


def test_config_refuses_lora_on_parameters_with_dropout(tmp_path):
    path = _moe_config(tmp_path)
    no_liger = {"swift.use_liger_kernel": False}
    with pytest.raises(ConfigError, match=r"swift.target_parameters.*swift.lora_dropout: 0"):
        load_config(path, {"swift.target_parameters": EXPERTS, **no_liger})
    cfg = load_config(path, {"swift.target_parameters": EXPERTS, "swift.lora_dropout": 0, **no_liger})
    assert cfg.swift["target_parameters"] == EXPERTS


def test_config_refuses_lora_on_parameters_next_to_liger(tmp_path):
    """Seen on an H200: Liger's fused experts read attributes peft's ParamWrapper hides (first step fails)."""
    path = _moe_config(tmp_path)
    with pytest.raises(ConfigError, match=r"swift.target_parameters.*hidden_dim.*swift.use_liger_kernel: false"):
        load_config(path, {"swift.target_parameters": EXPERTS, "swift.lora_dropout": 0})


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs/qwen3_vl_30b_a3b").glob("*.yaml")))
def test_shipped_moe_profiles_load(name):
    cfg = load_config(ROOT / "configs/qwen3_vl_30b_a3b" / name)
    assert cfg.model.source == "hf://Qwen/Qwen3-VL-30B-A3B-Instruct"
    assert cfg.swift["target_modules"] == "all-linear"


def test_a_config_name_shared_by_two_folders_names_both():
    from pipelines.config import resolve_config_path

    with pytest.raises(ConfigError, match=r"qwen3_vl_30b_a3b/lora_h100_x8, qwen3_vl_4b/lora_h100_x8.*folder"):
        resolve_config_path("lora_h100_x8")
    assert resolve_config_path("qwen3_vl_30b_a3b/lora_h100_x8").parent.name == "qwen3_vl_30b_a3b"


# --- train-lora's checks before swift sft --------------------------------------------------


def test_dense_module_names_on_a_moe_model_name_the_expert_parameters(tiny_moe):
    from components.train_lora._input_checks import InputCheckError, check_target_modules

    with pytest.raises(InputCheckError) as err:
        check_target_modules({"target_modules": ["gate_proj", "up_proj", "down_proj"]}, tiny_moe)
    text = str(err.value)
    assert "['gate_proj', 'up_proj', 'down_proj'] match no module" in text
    assert "q_proj" in text and "o_proj" in text  # the Linear candidates
    assert "swift.target_parameters: [mlp.experts.down_proj, mlp.experts.gate_up_proj]" in text
    check_target_modules({"target_modules": ["q_proj", "v_proj"]}, tiny_moe)  # real modules pass
    check_target_modules({"target_parameters": EXPERTS, "target_modules": "all-linear"}, tiny_moe)


def test_target_parameters_that_match_nothing_are_named(tiny_moe):
    from components.train_lora._input_checks import InputCheckError, check_target_modules
    from pipelines.demo.tiny_model import ensure_tiny_model

    with pytest.raises(InputCheckError, match=r"\['mlp.experts.gate_proj'\] match no parameter.*gate_up_proj"):
        check_target_modules({"target_parameters": ["mlp.experts.gate_proj"]}, tiny_moe)
    with pytest.raises(InputCheckError, match="not a mixture-of-experts model"):
        check_target_modules({"target_parameters": EXPERTS}, ensure_tiny_model())


def test_strategy_for_the_moe_base_and_a_base_no_strategy_holds():
    from components.train_lora._launch import ModelTooLargeError, choose_strategy

    size = known_model_bytes("Qwen3-VL-30B-A3B-Instruct")
    assert choose_strategy(size, 2, int(139.8 * GIB), {}).name == "ddp"  # 2 x H200
    assert choose_strategy(size, 8, int(79.2 * GIB), {}).name == "zero3"  # 8 x H100
    assert choose_strategy(size, 1, int(139.8 * GIB), {}).name == "single"  # 1 x H200
    with pytest.raises(
        ModelTooLargeError, match="even sharded with ZeRO-3.*smallest profile that fits: a2-ultragpu-2g"
    ):
        choose_strategy(size, 1, int(79.2 * GIB), {})
    # a DeepSpeed setting of the user's own (e.g. ZeRO-3 with CPU offload) is not second-guessed
    assert choose_strategy(size, 1, int(79.2 * GIB), {"deepspeed": "zero3_offload"}).name == "user"


def test_planner_reads_the_moe_shape_and_its_full_size(tiny_moe):
    from components.train_lora._launch import model_weight_bytes
    from components.train_lora._plan import ModelShape

    config = json.loads((tiny_moe / "config.json").read_text())
    weights = model_weight_bytes(tiny_moe, "bfloat16")
    shape = ModelShape.from_config(config, weights)
    assert (shape.layers, shape.hidden, shape.vocab, shape.vision_hidden) == (2, 128, 151936, 32)
    # every expert is resident (only 2 of 4 are active per token): the frozen size counts them all
    stored = sum(p.stat().st_size for p in tiny_moe.glob("*.safetensors"))
    assert weights == stored // 2  # float32 on disk, bfloat16 in training
    assert shape.known


def test_liger_with_lora_on_parameters_is_refused_before_swift(tiny_moe):
    from components.train_lora._input_checks import InputCheckError, check_target_modules

    with pytest.raises(InputCheckError, match="use_liger_kernel: false"):
        check_target_modules({"target_parameters": EXPERTS, "use_liger_kernel": True}, tiny_moe)


def test_wrapped_expert_bytes_from_the_headers(tiny_moe):
    from components.train_lora._input_checks import wrapped_parameter_bytes
    from pipelines.demo.tiny_moe import EXPERT_WIDTH, NUM_EXPERTS

    per_layer = NUM_EXPERTS * (2 * EXPERT_WIDTH * 128 + 128 * EXPERT_WIDTH)  # gate_up + down
    args = {"target_parameters": EXPERTS, "torch_dtype": "bfloat16"}
    assert wrapped_parameter_bytes(args, tiny_moe) == 2 * per_layer * 2  # 2 layers, bf16
    assert wrapped_parameter_bytes({"target_parameters": EXPERTS}, tiny_moe) == 2 * per_layer * 4  # as stored
    assert wrapped_parameter_bytes({}, tiny_moe) == 0


def test_planner_on_the_recorded_30b_a3b_runs():
    """One H200, Qwen3-VL-30B-A3B, 1,221-token rows (benchmarks/ARCHIVE.md, "Larger models")."""
    from benchmarks.qwen3_vl_large import QWEN3_VL_30B_A3B_CONFIG as config
    from components.train_lora._plan import ModelShape, TokenStats, plan_micro_batch, predict_peak

    weights, gpu = 62_141_618_016, int(139.8 * GIB)
    text = config["text_config"]
    experts = text["num_hidden_layers"] * text["num_experts"] * 3 * text["moe_intermediate_size"] * 2048 * 2
    stats = TokenStats(max_tokens=1221, p95_tokens=1221, mean_tokens=1207.4, rows=64)
    attention = ModelShape.from_config(config, weights)
    plan = plan_micro_batch(attention, stats, gpu, samples_per_step=16, world_size=1, liger=True)
    assert (plan.micro_batch, plan.grad_accum, plan.gradient_checkpointing) == (8, 2, False)
    assert plan.peak_bytes / GIB >= 111.6  # measured 111.6 GiB: the model over-predicts a MoE, never under
    with_experts = ModelShape.from_config(config, weights, wrapped_bytes=experts)
    # measured without Liger: micro-batch 8, 4 and 2 ran out of memory, micro-batch 1 peaked at 128.7 GiB
    budget = plan.budget_bytes
    for batch in (8, 4, 2):
        assert predict_peak(with_experts, batch, 1221, checkpointing=False, liger=False) > budget
    assert predict_peak(with_experts, 1, 1221, checkpointing=False, liger=False) / GIB >= 128.7 * 0.97
    plan = plan_micro_batch(with_experts, stats, gpu, samples_per_step=16, world_size=1, liger=False)
    assert plan.peak_bytes <= budget
    assert plan.micro_batch == 1 or plan.gradient_checkpointing


@pytest.mark.pipeline
def test_swift_trains_and_merges_lora_on_the_experts(tiny_moe, tmp_path):
    """The real `swift sft` (LoRA on attention + experts) and merge-export (both checks) on the tiny MoE, CPU."""
    from components.merge_export.core import merge_export
    from components.train_lora.core import train_lora
    from components.validate_data.core import validate_data
    from pipelines.demo.drawings import generate_dataset

    data = generate_dataset(tmp_path / "raw", n_train=4, n_eval=1, image_size=128, seed=0)
    validate_data(
        [data["train"]],
        str(tmp_path / "train"),
        str(tmp_path / "eval"),
        str(tmp_path / "q.jsonl"),
        eval_files=[data["eval"]],
        model_dir=str(tiny_moe),
        max_length=3000,
    )
    swift = {
        "tuner_type": "lora",
        "lora_rank": 4,
        "lora_alpha": 8,
        "lora_dropout": 0,
        "target_modules": "all-linear",
        "target_parameters": EXPERTS,
        "learning_rate": 1e-3,
        "per_device_train_batch_size": 1,
        "gradient_accumulation_steps": 1,
        "max_steps": 2,
        "save_steps": 2,
        "torch_dtype": "float32",
        "dataloader_num_workers": 0,
        "report_to": "none",
    }
    trained = train_lora(
        str(tiny_moe),
        "qwen3_vl_moe",
        str(tmp_path / "train"),
        "",
        swift,
        str(tmp_path / "adapter"),
        str(tmp_path / "w"),
    )
    assert trained.metrics["steps"] == 2
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert sorted(config["target_parameters"]) == sorted(EXPERTS) and "q_proj" in config["target_modules"]
    merged = merge_export(str(tmp_path / "adapter"), str(tiny_moe), str(tmp_path / "merged"), str(tmp_path / "mw"))
    assert merged.metadata["adapted_weights"] == 12  # 2 layers x (q, k, v, o + the 2 expert parameters)
    assert merged.metadata["adapted_within_step_min_fraction"] >= 0.999
    assert merged.metadata["logits_within_tolerance"]


def test_the_cost_estimate_of_a_moe_counts_active_parameters(tiny_moe):
    from components.common.cluster import LaunchPlan
    from components.common.cost import Profile, Workload, estimate, is_moe_name
    from components.train_lora._facts import RunFacts
    from components.train_lora._fit import _active_billions
    from components.train_lora._launch import Launch

    total = sum(p.stat().st_size for p in tiny_moe.glob("*.safetensors")) / 4 / 1e9  # float32 on disk
    active, moe = _active_billions(RunFacts.gather(str(tiny_moe), {}, Launch(LaunchPlan(), 0, 0)))
    assert moe and active < total  # 2 of 4 experts per token
    assert is_moe_name("hf://Qwen/Qwen3-VL-30B-A3B-Instruct") and not is_moe_name("Qwen3-VL-8B-Instruct")
    rows = Workload(rows=64, mean_tokens=1207, max_steps=12, micro_batch=8, checkpointing=False, liger=True)
    h200 = Profile("", "NVIDIA_H200_141GB", 1)
    moe_est = estimate(h200, Workload(**{**rows.__dict__, "model_b": 3.3, "moe": True}))
    # measured on 2 x H200 at 8 rows per GPU: ~12,500 LM tokens/s per GPU (benchmarks/ARCHIVE.md, "Larger models")
    assert moe_est.tokens_per_s == pytest.approx(12_544, rel=0.05)
    assert any("mixture of experts" in a for a in moe_est.assumptions)
