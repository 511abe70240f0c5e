"""Tests of the merge-export core: adapter/base check, logits verification, model card.

The fast tests build a LoRA adapter directly with peft on the tiny model (random non-zero
lora_B, no training) and merge it with peft; the test that runs the real
`swift export --merge_lora true` is marked `pipeline` (about a minute on 2 cores).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from components.merge_export import core, lineage
from components.merge_export.card import model_card, training_summary
from components.merge_export.core import build_export_command
from components.merge_export.errors import AdapterBaseMismatch, MergeError, MergeVerificationError
from components.merge_export.inputs import check_adapter_base
from components.merge_export.logits import compare_logits
from components.merge_export.weights import compare_weights

ARCH = "Qwen3VLForConditionalGeneration"


@pytest.fixture(scope="module")
def tiny_base() -> Path:
    from pipelines.demo.tiny_model import ensure_tiny_model

    return ensure_tiny_model()


def _make_adapter(base_dir: Path, out: Path, seed: int = 0) -> Path:
    """A LoRA adapter on q_proj/v_proj of the language model with random non-zero lora_B."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=r".*language_model.*\.(q_proj|v_proj)")
    peft_model = get_peft_model(model, config)
    gen = torch.Generator().manual_seed(seed)
    for name, param in peft_model.named_parameters():
        if "lora_B" in name:
            param.data = torch.randn(param.shape, generator=gen) * 0.05
    peft_model.save_pretrained(out)
    (out / "base_model.json").write_text(json.dumps({"model_type": "qwen3_vl", "architecture": ARCH}))
    return out


def _peft_merge(base_dir: Path, adapter_dir: Path, out: Path) -> Path:
    """Merges with peft (merge_and_unload) into a folder that looks like swift export's."""
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    shutil.copytree(base_dir, out, ignore=shutil.ignore_patterns("*.safetensors", "manifest.json"))
    base = AutoModelForImageTextToText.from_pretrained(base_dir, dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def adapter_and_merged(tiny_base, tmp_path_factory):
    root = tmp_path_factory.mktemp("merge")
    adapter = _make_adapter(tiny_base, root / "adapter")
    merged = _peft_merge(tiny_base, adapter, root / "merged")
    return adapter, merged


def _scale_tensor(path: Path, match: str, factor: float) -> str:
    """Multiplies the first tensor of a safetensors file whose name contains `match`."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    name = next(k for k in sorted(tensors) if match in k)
    tensors[name] = tensors[name] * factor
    save_file(tensors, str(path), metadata={"format": "pt"})
    return name


# ------------------------------------------------------------------ logits check


def test_good_merge_matches_base_plus_adapter(tiny_base, adapter_and_merged):
    adapter, merged = adapter_and_merged
    facts = compare_logits(tiny_base, adapter, merged)
    assert facts["merged_dtype"] == "float32"
    assert facts["probe_inputs"] == 3  # two text prompts + one image prompt
    assert facts["logits_max_abs_diff"] <= facts["logits_tolerance"]
    assert facts["logits_max_abs_diff"] < 1e-3
    # the adapter really changes the model, so a missing / wrong merge would be visible
    assert facts["adapter_effect_max_abs"] > 100 * facts["logits_tolerance"]


def test_adapter_tampered_after_merge_is_detected(tiny_base, adapter_and_merged, tmp_path):
    adapter, merged = adapter_and_merged
    tampered = Path(shutil.copytree(adapter, tmp_path / "adapter"))
    _scale_tensor(tampered / "adapter_model.safetensors", "lora_B", 3.0)
    with pytest.raises(MergeVerificationError, match=r"max \|diff\| [0-9.e+-]+ > tolerance"):
        compare_logits(tiny_base, tampered, merged)


def test_altered_merged_weights_are_detected(tiny_base, adapter_and_merged, tmp_path):
    adapter, merged = adapter_and_merged
    altered = Path(shutil.copytree(merged, tmp_path / "merged"))
    # not q_proj/k_proj: Qwen3 normalises q and k per head, so scaling them changes nothing
    _scale_tensor(altered / "model.safetensors", "layers.1.self_attn.v_proj.weight", 1.5)
    with pytest.raises(MergeVerificationError) as info:
        compare_logits(tiny_base, adapter, altered)
    assert "merged logits differ from base model + adapter" in str(info.value)
    assert isinstance(info.value, MergeError)  # the component turns every MergeError into a clear exit


def test_unmerged_copy_of_base_is_detected(tiny_base, adapter_and_merged, tmp_path):
    """A 'merged' folder that is just the base model (adapter silently dropped) fails."""
    adapter, _ = adapter_and_merged
    with pytest.raises(MergeVerificationError):
        compare_logits(tiny_base, adapter, tiny_base)


# ------------------------------------------------------------------ weights check


def test_good_merge_weights_are_base_plus_update(tiny_base, adapter_and_merged):
    adapter, merged = adapter_and_merged
    facts = compare_weights(tiny_base, adapter, merged)
    assert facts["adapted_weights"] == 8  # q_proj + v_proj of 4 text layers
    assert facts["weights_checked"] > facts["adapted_weights"]
    assert facts["adapted_within_step_min_fraction"] >= 0.999
    assert facts["adapted_changed_fraction"] > 0.9


def test_weights_check_names_an_altered_adapted_weight(tiny_base, adapter_and_merged, tmp_path):
    adapter, merged = adapter_and_merged
    altered = Path(shutil.copytree(merged, tmp_path / "merged"))
    name = _scale_tensor(altered / "model.safetensors", "layers.2.self_attn.q_proj.weight", 1.01)
    with pytest.raises(MergeVerificationError, match=name.replace(".", r"\.")):
        compare_weights(tiny_base, adapter, altered)


def test_weights_check_rejects_the_unmerged_base(tiny_base, adapter_and_merged):
    adapter, _ = adapter_and_merged
    with pytest.raises(MergeVerificationError, match="base \\+ adapter update for only"):
        compare_weights(tiny_base, adapter, tiny_base)


def test_weights_check_rejects_a_changed_untouched_tensor(tiny_base, adapter_and_merged, tmp_path):
    adapter, merged = adapter_and_merged
    altered = Path(shutil.copytree(merged, tmp_path / "merged"))
    _scale_tensor(altered / "model.safetensors", "layers.1.mlp.down_proj.weight", 1.001)
    with pytest.raises(MergeVerificationError, match="does not touch differ"):
        compare_weights(tiny_base, adapter, altered)


def test_bf16_merge_passes_the_weights_check(tiny_base, adapter_and_merged, tmp_path):
    """A merge into a bf16 base (peft, as swift export does) rounds every merged weight: accepted."""
    from peft import PeftModel
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForImageTextToText

    adapter, _ = adapter_and_merged
    base_bf16 = Path(shutil.copytree(tiny_base, tmp_path / "base"))
    for f in base_bf16.glob("*.safetensors"):
        save_file({k: v.to(torch.bfloat16) for k, v in load_file(str(f)).items()}, str(f), metadata={"format": "pt"})
    merged_bf16 = tmp_path / "merged"
    shutil.copytree(base_bf16, merged_bf16, ignore=shutil.ignore_patterns("*.safetensors", "manifest.json"))
    model = AutoModelForImageTextToText.from_pretrained(base_bf16, dtype=torch.bfloat16)
    PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().save_pretrained(merged_bf16)
    facts = compare_weights(base_bf16, adapter, merged_bf16)
    assert facts["adapted_within_step_min_fraction"] >= 0.999
    assert 0 < facts["adapted_changed_fraction"] <= 1
    # the base itself (update dropped) fails in bf16 too
    with pytest.raises(MergeVerificationError):
        compare_weights(base_bf16, adapter, base_bf16)


# ------------------------------------------------------------------ adapter vs base


def test_adapter_of_staged_base_is_accepted(tiny_base, adapter_and_merged):
    adapter, _ = adapter_and_merged
    facts = check_adapter_base(adapter, tiny_base)
    assert facts["architecture"] == ARCH and facts["hidden_size"] == 128


def test_adapter_recorded_for_other_architecture_is_refused(tiny_base, adapter_and_merged, tmp_path):
    adapter, _ = adapter_and_merged
    other = Path(shutil.copytree(adapter, tmp_path / "adapter"))
    (other / "base_model.json").write_text(json.dumps({"architecture": "Qwen2_5_VLForConditionalGeneration"}))
    with pytest.raises(AdapterBaseMismatch, match="architecture='Qwen2_5_VLForConditionalGeneration'"):
        check_adapter_base(other, tiny_base)


def test_revision_mismatch_is_refused_when_both_known(tiny_base, adapter_and_merged, tmp_path):
    adapter, _ = adapter_and_merged
    staged = tmp_path / "staged"
    staged.mkdir()
    for name in ("config.json", "model.safetensors"):
        (staged / name).symlink_to(tiny_base / name)
    (staged / "manifest.json").write_text(json.dumps({"revision": "abc123"}))
    other = Path(shutil.copytree(adapter, tmp_path / "adapter"))
    (other / "base_model.json").write_text(json.dumps({"architecture": ARCH, "revision": "def456"}))
    with pytest.raises(AdapterBaseMismatch, match="revision='def456'.*revision='abc123'"):
        check_adapter_base(other, staged)
    (other / "base_model.json").write_text(json.dumps({"architecture": ARCH, "revision": "abc123"}))
    assert check_adapter_base(other, staged)["revision"] == "abc123"
    (other / "base_model.json").write_text(json.dumps({"architecture": ARCH}))  # unknown: not refused
    check_adapter_base(other, staged)


def test_adapter_config_base_folder_with_other_sizes_is_refused(tiny_base, adapter_and_merged, tmp_path):
    adapter, _ = adapter_and_merged
    origin = tmp_path / "origin"
    origin.mkdir()
    config = json.loads((tiny_base / "config.json").read_text())
    config["text_config"]["hidden_size"] = 2560
    (origin / "config.json").write_text(json.dumps(config))
    other = Path(shutil.copytree(adapter, tmp_path / "adapter"))
    cfg = json.loads((other / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(origin)
    (other / "adapter_config.json").write_text(json.dumps(cfg))
    (other / "base_model.json").unlink()
    with pytest.raises(AdapterBaseMismatch, match="hidden_size=2560"):
        check_adapter_base(other, tiny_base)


def test_adapter_weight_shapes_must_fit_base(tiny_base, adapter_and_merged, tmp_path):
    from safetensors.torch import load_file, save_file

    adapter, _ = adapter_and_merged
    other = Path(shutil.copytree(adapter, tmp_path / "adapter"))
    (other / "base_model.json").unlink()
    path = other / "adapter_model.safetensors"
    tensors = load_file(str(path))
    tensors = {k: torch.zeros(v.shape[0], 256) if ".lora_A." in k else v for k, v in tensors.items()}
    save_file(tensors, str(path))
    with pytest.raises(AdapterBaseMismatch, match="does not fit the staged model"):
        check_adapter_base(other, tiny_base)
    renamed = {
        k.replace("language_model", "text_model"): v
        for k, v in load_file(str(adapter / "adapter_model.safetensors")).items()
    }
    save_file(renamed, str(path))
    with pytest.raises(AdapterBaseMismatch, match="none of its 8 LoRA modules exists"):
        check_adapter_base(other, tiny_base)


def test_not_an_adapter_folder(tmp_path, tiny_base):
    with pytest.raises(MergeError, match="no adapter_config.json"):
        core.merge_export(str(tmp_path), str(tiny_base), str(tmp_path / "out"), str(tmp_path / "w"))


# ------------------------------------------------------------------ pure parts


def test_build_export_command():
    cmd = build_export_command("/a", "/m", "/o", {"model_type": "qwen3_vl"})
    assert cmd[:2] == ["swift", "export"]
    assert cmd[cmd.index("--merge_lora") + 1] == "true"
    assert cmd[cmd.index("--model_type") + 1] == "qwen3_vl"


def test_data_lineage_carries_the_task_for_serve(tmp_path):
    adapter, out = tmp_path / "adapter", tmp_path / "merged"
    adapter.mkdir(), out.mkdir()
    (adapter / "data_snapshot.json").write_text(json.dumps({"task": "key_value", "n_rows": 8, "files": {}}))
    data = lineage.data_lineage(adapter, out)
    assert (data["task"], data["rows"]) == ("key_value", 8) and (out / "data_snapshot.json").is_file()


def test_model_card_names_lineage_and_metrics():
    lineage = {
        "base_model": {
            "source": "hf://Qwen/Qwen3-VL-4B-Instruct",
            "revision": "abc123",
            "architecture": ARCH,
            "model_type": "qwen3_vl",
        },
        "adapter": "gs://b/run/adapter",
        "run_id": "run-42",
        "versions": {"transformers": "5.19.0", "peft": "0.20.0", "ms_swift": "4.6.0"},
        "verification": {"logits_max_abs_diff": 1.2e-5},
    }
    card = model_card(lineage, {"train_loss": 0.25})
    assert card.startswith("---\nbase_model: hf://Qwen/Qwen3-VL-4B-Instruct\n")
    for text in (
        "`abc123`",
        "gs://b/run/adapter",
        "run-42",
        "| peft | 0.20.0 |",
        "| ms_swift | 4.6.0 |",
        "| train_loss | 0.25 |",
        "1.2e-05",
    ):
        assert text in card


LOG_HISTORY = [
    {"loss": 2.5, "global_step/max_steps": "5/20", "train_speed(s/it)": 1.2},
    {"loss": 0.75, "global_step/max_steps": "20/20", "num_input_tokens_seen": 40000},
    {"eval_loss": 0.9, "global_step/max_steps": "20/20"},
    {
        "train_runtime": 100.0,
        "train_samples_per_second": 3.5,
        "train_loss": 1.25,
        "global_step/max_steps": "20/20",
        "num_input_tokens_seen": 40000,
    },
]
ARGS = {
    "lora_rank": 8,
    "lora_alpha": 32.0,
    "lora_dropout": 0.05,
    "target_modules": ["all-linear"],
    "learning_rate": 1e-4,
    "num_train_epochs": 2.0,
    "max_steps": -1,
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 4,
    "global_world_size": 8,
    "max_length": 3000,
    "torch_dtype": "bfloat16",
    "seed": 42,
    "output_dir": "/tmp/x",
}


def _card_row(card: str, label: str) -> str:
    [row] = [line for line in card.splitlines() if line.startswith(f"| {label} ")]
    return row


def test_training_summary_reads_log_history_and_args(tmp_path):
    (tmp_path / "log_history.json").write_text(json.dumps(LOG_HISTORY))
    (tmp_path / "args.json").write_text(json.dumps(ARGS))
    summary = training_summary(tmp_path)
    m = summary["metrics"]
    assert m["final_loss"] == 0.75 and m["train_loss"] == 1.25 and m["eval_loss"] == 0.9
    assert m["steps"] == 20 and m["samples_per_second"] == 3.5 and m["tokens_per_second"] == 400.0
    h = summary["hyperparameters"]
    assert (h["lora_rank"], h["lora_alpha"], h["learning_rate"], h["num_train_epochs"]) == (8, 32.0, 1e-4, 2.0)
    assert h["per_device_train_batch_size"] == 2 and h["gradient_accumulation_steps"] == 4
    assert h["effective_batch_size"] == 2 * 4 * 8 and "output_dir" not in h
    assert summary["missing"] == []

    card = model_card({"base_model": {"source": "hf://Qwen/Qwen3-VL-4B-Instruct"}, "training": summary})
    assert "## Training" in card and "### LoRA hyper-parameters" in card
    assert _card_row(card, "train loss (last logged step)") == "| train loss (last logged step) | 0.75 |"
    assert _card_row(card, "train loss (mean over the run)").endswith("| 1.25 |")
    assert _card_row(card, "eval loss (last evaluation)").endswith("| 0.9 |")
    assert _card_row(card, "optimizer steps").endswith("| 20 |")
    assert _card_row(card, "train samples/s").endswith("| 3.5 |")
    assert _card_row(card, "train tokens/s").endswith("| 400 |")
    assert _card_row(card, "LoRA rank").endswith("| 8 |")
    assert _card_row(card, "LoRA alpha").endswith("| 32 |")
    assert _card_row(card, "learning rate").endswith("| 0.0001 |")
    assert _card_row(card, "epochs").endswith("| 2 |")
    assert _card_row(card, "per-device batch size").endswith("| 2 |")
    assert _card_row(card, "gradient accumulation steps").endswith("| 4 |")
    assert _card_row(card, "target modules").endswith("| all-linear |")
    assert _card_row(card, "effective batch size").endswith("| 64 |")
    assert "not recorded" not in card


def test_training_summary_without_files_says_not_recorded(tmp_path):
    summary = training_summary(tmp_path)
    assert summary == {"metrics": {}, "hyperparameters": {}, "missing": ["log_history.json", "args.json"]}
    card = model_card({"base_model": {}, "training": summary})
    assert "no readable log_history.json or args.json" in card
    for label in (
        "train loss (last logged step)",
        "eval loss (last evaluation)",
        "train tokens/s",
        "LoRA rank",
        "learning rate",
        "effective batch size",
    ):
        assert _card_row(card, label).endswith("| not recorded |"), label


def test_training_summary_with_partial_and_broken_files(tmp_path):
    (tmp_path / "log_history.json").write_text(json.dumps([{"loss": 1.5, "step": 3}]))  # no eval, no summary
    (tmp_path / "args.json").write_text("{not json")
    summary = training_summary(tmp_path)
    assert summary["missing"] == ["args.json"]
    card = model_card({"base_model": {}, "training": summary})
    assert _card_row(card, "train loss (last logged step)").endswith("| 1.5 |")
    assert _card_row(card, "optimizer steps").endswith("| 3 |")
    assert _card_row(card, "eval loss (last evaluation)").endswith("| not recorded |")
    assert _card_row(card, "train tokens/s").endswith("| not recorded |")
    assert _card_row(card, "LoRA rank").endswith("| not recorded |")
    (tmp_path / "log_history.json").write_text(json.dumps({"not": "a list"}))
    assert training_summary(tmp_path)["missing"] == ["log_history.json", "args.json"]


def test_library_versions():
    versions = lineage.library_versions()
    assert set(versions) == {"transformers", "peft", "ms_swift", "torch"}
    assert versions["transformers"] and versions["peft"]


# ------------------------------------------------------------------ real swift export


@pytest.mark.pipeline
def test_swift_export_merge_verifies_and_detects_tampering(tiny_base, adapter_and_merged, tmp_path, monkeypatch):
    adapter, _ = adapter_and_merged
    result = core.merge_export(
        str(adapter),
        str(tiny_base),
        str(tmp_path / "out"),
        str(tmp_path / "work"),
        run_id="run-7",
        metrics={"train_loss": 1.5},
    )
    meta = result.metadata
    assert meta["logits_max_abs_diff"] <= meta["logits_tolerance"]
    assert meta["peft"] and meta["ms_swift"] and meta["transformers"] and meta["run_id"] == "run-7"
    lineage = json.loads((tmp_path / "out" / "lineage.json").read_text())
    assert lineage["versions"]["ms_swift"] == meta["ms_swift"] and lineage["run_id"] == "run-7"
    assert lineage["base_model"]["architecture"] == ARCH
    card = (tmp_path / "out" / "README.md").read_text()
    assert "run-7" in card and "| train_loss | 1.5 |" in card
    # the peft-made adapter has no log_history.json / args.json: the card says so instead of failing
    assert (
        lineage["training"]["missing"] == ["log_history.json", "args.json"]
        and "| LoRA rank (`lora_rank`) | not recorded |" in card
    )

    real_run = core.run_command

    def export_then_alter(cmd, *args, **kwargs):
        code, tail = real_run(cmd, *args, **kwargs)
        out = Path(cmd[cmd.index("--output_dir") + 1])
        _scale_tensor(out / "model.safetensors", "layers.0.self_attn.v_proj.weight", 0.0)
        return code, tail

    monkeypatch.setattr(core, "run_command", export_then_alter)
    with pytest.raises(MergeVerificationError):
        core.merge_export(str(adapter), str(tiny_base), str(tmp_path / "bad"), str(tmp_path / "work2"))
    assert not (tmp_path / "bad").exists()
