"""eval.quantization (issue 45): evaluate loads the reference and the tuned model quantised by bitsandbytes.

The config accepts none / nf4 / int8 and refuses anything else naming the key and the values; the
setting is a key of the pipeline parameter `eval_settings`, which reaches evaluate's `settings` input.
Then real runs: `evaluate` with the real `swift_generate` (ms-swift's TransformersEngine) on the tiny
Qwen3-VL and a generated eval set, nf4 and int8 on the CPU (bitsandbytes 0.50.2 quantises and runs both
there): the engines' models are caught as ms-swift builds them, so the test sees Linear4bit (Linear8bitLt)
layers in the language model and plain linear layers in the vision tower, and the metrics say nf4 (int8);
the tuned folder carries a training args.json whose bnb_4bit_* settings must not leak into the load. With a fake
generator: `none` adds nothing to evaluate's outputs, and a generator that cannot load quantised
models, or one that loaded none, is a named error.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from components.evaluate.core import EvalError, evaluate
from components.evaluate.settings import EvalSettings
from pipelines.compile import compile_pipeline
from pipelines.config import ConfigError, load_config
from pipelines.pipeline import pipeline_arguments
from tests.pipeline_spec import source, tasks
from tests.test_config import MINIMAL

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "local" / "tiny_cpu.yaml"
GOLD = '```json\n[{"label": "hole", "bbox": [10, 10, 30, 30]}]\n```'


def _config(tmp_path: Path, eval_quantization: str | None) -> Path:
    text = MINIMAL
    if eval_quantization is not None:
        text += f"eval:\n  max_samples: 2\n  quantization: {eval_quantization}\n"
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    return path


# --- config and pipeline ---------------------------------------------------------------


@pytest.mark.parametrize("value", ["none", "nf4", "int8"])
def test_config_accepts_each_setting_and_it_becomes_the_run_parameter(tmp_path, value):
    cfg = load_config(_config(tmp_path, value))
    assert cfg.eval.quantization == value
    assert pipeline_arguments(cfg)["eval_settings"]["quantization"] == value
    assert cfg.model.quantization == "none"  # the two settings are independent


def test_config_default_is_none(tmp_path):
    assert load_config(_config(tmp_path, None)).eval.quantization == "none"


@pytest.mark.parametrize("value", ["fp4", "4bit", "NF4"])
def test_config_refuses_another_value_naming_file_line_key_and_values(tmp_path, value):
    path = _config(tmp_path, value)
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "quantization: " + value in text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert f"{path}:{line}" in message
    assert f"'eval.quantization' must be one of none, nf4, int8, got '{value}'" in message


@pytest.mark.parametrize("target", ["vertex", "local"])
def test_eval_quantization_reaches_evaluate_in_the_compiled_pipeline(tmp_path, target):
    roots = {"pipeline.root": "gs://test-bucket/root", "model.cache": "gs://test-bucket/models"}  # Vertex: gs://
    overrides = {"eval.quantization": "nf4", **(roots if target == "vertex" else {})}
    out = compile_pipeline(str(CONFIG), str(tmp_path / f"{target}.yaml"), target, overrides)
    spec = json_format.ParseDict(yaml.safe_load(out.read_text()), pipeline_spec_pb2.PipelineSpec())
    found = source(tasks(spec), "evaluate", "settings")
    assert (found.kind, found.value) == ("pipeline parameter", "eval_settings")
    param = spec.root.input_definitions.parameters["eval_settings"]
    assert json_format.MessageToDict(param.default_value)["quantization"] == "nf4"
    # evaluate is cached by KFP on its inputs: the setting is in one of them, so a change is a new key
    evaluate_inputs = spec.components["comp-evaluate"].input_definitions.parameters
    assert "settings" in evaluate_inputs and "quantization" not in evaluate_inputs


# --- evaluate's core with a fake generator ---------------------------------------------


def _dataset(tmp_path: Path) -> Path:
    ds = tmp_path / "eval"
    ds.mkdir()
    row = {"messages": [{"role": "user", "content": "Find holes"}, {"role": "assistant", "content": GOLD}]}
    (ds / "data.jsonl").write_text(json.dumps(row) + "\n", encoding="utf-8")
    return ds


def _run(tmp_path: Path, generate, quantization: str):
    return evaluate("tuned", "base", "qwen3_vl", str(_dataset(tmp_path)), str(tmp_path / "p.jsonl"),
                    EvalSettings(max_new_tokens=64, batch_size=2, quantization=quantization),
                    generate_fn=generate)  # fmt: skip


def test_none_adds_nothing_to_the_outputs(tmp_path):
    def generate(model_dir, model_type, rows, batch_size, max_new_tokens):
        return [GOLD] * len(rows), 3

    result = _run(tmp_path, generate, "none")
    assert result.quantization == "none"
    assert set(result.tuned) == set(result.reference)
    assert "quantized_layers" not in result.tuned and "quantization" not in result.tuned


def test_a_generator_that_cannot_load_quantised_is_a_named_error(tmp_path):
    pytest.importorskip("bitsandbytes")

    def plain(model_dir, model_type, rows, batch_size, max_new_tokens):
        raise AssertionError("must not be called: it would score bf16 models as nf4")

    with pytest.raises(EvalError, match="eval.quantization nf4: the generator 'plain' cannot load models quantised"):
        _run(tmp_path, plain, "nf4")


def test_a_model_loaded_without_bitsandbytes_layers_is_a_named_error(tmp_path):
    pytest.importorskip("bitsandbytes")

    def unquantised(model_dir, model_type, rows, batch_size, max_new_tokens, timings=None, quantization="none"):
        timings["quantized_layers"] = 0  # what counting a bf16 model's layers gives
        return [GOLD] * len(rows), 3

    with pytest.raises(EvalError, match="the reference model base was loaded without any bitsandbytes layer"):
        _run(tmp_path, unquantised, "int8")


def test_an_unknown_setting_is_refused_before_any_model_is_loaded(tmp_path):
    def never(*args, **kwargs):
        raise AssertionError("no model may be loaded")

    with pytest.raises(EvalError, match="eval.quantization must be one of none, nf4, int8, got 'fp8'"):
        _run(tmp_path, never, "fp8")


def test_bitsandbytes_missing_is_named_before_any_model_is_loaded(tmp_path, monkeypatch):
    import sys

    from components.common.quantization import QuantizationUnavailable

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)

    def never(*args, **kwargs):
        raise AssertionError("no model may be loaded")

    with pytest.raises(QuantizationUnavailable, match="eval.quantization: nf4 needs bitsandbytes"):
        _run(tmp_path, never, "nf4")


# --- the real thing: the tiny Qwen3-VL in nf4 on the CPU ---------------------------------


@pytest.fixture(scope="module")
def tiny_eval(tmp_path_factory):
    from components.validate_data.core import validate_data
    from pipelines.demo.drawings import generate_dataset
    from pipelines.demo.tiny_model import ensure_tiny_model

    tmp = tmp_path_factory.mktemp("evalq")
    raw = generate_dataset(tmp / "raw", n_train=1, n_eval=2, image_size=128)
    validate_data([raw["train"]], str(tmp / "train"), str(tmp / "eval"), str(tmp / "q.jsonl"), eval_files=[raw["eval"]])
    base = ensure_tiny_model()
    tuned = tmp / "tuned"  # another folder, so both models are loaded (a copy stands in for a merged model)
    shutil.copytree(base, tuned)
    # a merged model carries its training's args.json; ms-swift would force its bnb_4bit_* onto the load
    args = {
        "model": str(base),
        "model_type": "qwen3_vl",
        "bnb_4bit_quant_type": "fp4",
        "bnb_4bit_use_double_quant": False,
    }
    (tuned / "args.json").write_text(json.dumps(args), encoding="utf-8")
    return tmp, str(base), str(tuned)


@pytest.mark.parametrize("setting", ["nf4", "int8"])
def test_real_evaluate_loads_both_models_quantised(tiny_eval, monkeypatch, capsys, setting):
    bnb = pytest.importorskip("bitsandbytes")
    import swift.infer_engine
    import torch

    from components.evaluate._report import render_report
    from components.evaluate.core import swift_generate

    tmp, base, tuned = tiny_eval
    engines = []  # (model folder, quantization_config, model) of each engine ms-swift built

    class Seen(swift.infer_engine.TransformersEngine):
        def __init__(self, model, **kwargs):
            super().__init__(model, **kwargs)
            engines.append((model, kwargs.get("quantization_config"), self.model))

    monkeypatch.setattr(swift.infer_engine, "TransformersEngine", Seen)  # swift_generate imports it at call time
    result = evaluate(tuned, base, "qwen3_vl", str(tmp / "eval"), str(tmp / "p.jsonl"),
                      EvalSettings(max_new_tokens=4, batch_size=2, quantization=setting),
                      generate_fn=swift_generate)  # fmt: skip

    assert [folder for folder, _, _ in engines] == [base, tuned]  # the reference first, then the tuned model
    layers = json.loads((Path(base) / "config.json").read_text())["text_config"]["num_hidden_layers"] * 7
    kind = bnb.nn.Linear4bit if setting == "nf4" else bnb.nn.Linear8bitLt
    for _, config, model in engines:
        if setting == "nf4":  # the tuned folder's args.json (fp4, no double quantisation) must not win
            assert config.load_in_4bit and config.bnb_4bit_quant_type == "nf4" and config.bnb_4bit_use_double_quant
        else:
            assert config.load_in_8bit and not config.load_in_4bit
        assert "model.visual" in config.llm_int8_skip_modules  # ms-swift's skip list, as for training
        named = dict(model.named_modules())
        lm = [n for n, m in named.items() if isinstance(m, kind)]
        assert len(lm) == layers and all(n.startswith("model.language_model.layers.") for n in lm)  # q/k/v/o + MLP
        vision = [m for n, m in named.items() if n.startswith("model.visual.") and isinstance(m, torch.nn.Linear)]
        assert vision and not any(isinstance(m, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)) for m in vision)
    assert result.quantization == setting
    assert result.reference["quantized_layers"] == result.tuned["quantized_layers"] == layers
    assert result.tuned["n"] == result.reference["n"] == 2 and "f1" in result.tuned
    err = capsys.readouterr().err
    assert (
        f"both models were loaded in {setting} (bitsandbytes; quantised layers: reference {layers}, tuned {layers})"
        in err
    )
    page = render_report(result.tuned, result.reference, result.samples, quantization=result.quantization)
    assert f"Both models were loaded in <b>{setting}</b>" in page and "bitsandbytes layers" in page
    assert "Both models were loaded in" not in render_report(result.tuned, result.reference, result.samples)


def test_the_component_records_nf4_in_metrics_and_report(tiny_eval):
    pytest.importorskip("bitsandbytes")
    from kfp import dsl

    from components.evaluate.component import evaluate as component

    tmp, base, tuned = tiny_eval
    base_model = dsl.Model(
        uri=base, metadata={"model_type": "qwen3_vl", "architecture": "Qwen3VLForConditionalGeneration"}
    )
    metrics, report = dsl.Metrics(uri=str(tmp / "c-metrics")), dsl.HTML(uri=str(tmp / "c-report.html"))
    passed, reason = component.python_func(
        base_model=base_model, tuned_model=dsl.Model(uri=tuned), eval_dataset=dsl.Dataset(uri=str(tmp / "eval")),
        settings={"max_new_tokens": 4, "batch_size": 2, "quantization": "nf4"}, swift_args={}, metrics=metrics,
        predictions=dsl.Dataset(uri=str(tmp / "c-pred.jsonl")), report=report, box_convention="norm1000",
    )  # fmt: skip
    layers = json.loads((Path(base) / "config.json").read_text())["text_config"]["num_hidden_layers"] * 7
    assert metrics.metadata["quantization"] == "nf4"
    assert metrics.metadata["base_quantized_layers"] == metrics.metadata["tuned_quantized_layers"] == layers
    assert "Both models were loaded in <b>nf4</b>" in Path(report.path).read_text()
    assert isinstance(passed, bool) and reason
