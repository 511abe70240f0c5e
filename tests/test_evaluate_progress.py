"""evaluate logs its progress: rows done / total, rows/s, ETA, rate-limited (components.common.progress)."""

from __future__ import annotations

import sys
import types

from components.evaluate import core
from tests.test_evaluate_core import GOLD, _dataset


def test_a_generator_without_progress_gets_a_start_and_an_end_line(tmp_path, capsys):
    def generate(model_dir, model_type, rows, batch_size, max_new_tokens):
        return list(GOLD), 3

    core.evaluate("tuned", "base", "qwen3_vl", str(_dataset(tmp_path)), str(tmp_path / "p.jsonl"), generate_fn=generate)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "evaluate: reference model: 0 / 2 rows (0 %)"
    assert lines[1].startswith("evaluate: reference model: 2 / 2 rows (100 %), ") and "done in" in lines[1]
    assert lines[2] == "evaluate: tuned model: 0 / 2 rows (0 %)"
    assert len(lines) == 4


def test_a_generator_that_takes_a_label_reports_itself(tmp_path, capsys):
    labels = []

    def generate(model_dir, model_type, rows, batch_size, max_new_tokens, progress_label=""):
        labels.append(progress_label)
        return list(GOLD), 3

    core.evaluate("tuned", "base", "qwen3_vl", str(_dataset(tmp_path)), str(tmp_path / "p.jsonl"), generate_fn=generate)
    assert labels == ["evaluate: reference model", "evaluate: tuned model"]
    assert capsys.readouterr().err == ""  # nothing on its behalf


class _Engine:
    """Stands in for ms-swift's TransformersEngine: records the batches it is given."""

    batches: list[int] = []

    def __init__(self, model_dir, model_type=None, torch_dtype=None, max_batch_size=1):
        self.template = types.SimpleNamespace(max_pixels=None)

    def infer(self, requests, config, use_tqdm=True):
        assert use_tqdm is False
        _Engine.batches.append(len(requests))
        usage = types.SimpleNamespace(completion_tokens=2)
        return [
            types.SimpleNamespace(
                choices=[types.SimpleNamespace(message=types.SimpleNamespace(content=r))], usage=usage
            )
            for r in requests
        ]


def test_swift_generate_runs_batch_by_batch_and_logs_rows(monkeypatch, capsys):
    fake = types.ModuleType("swift.infer_engine")
    fake.InferRequest = lambda messages, images: messages[0]["content"]
    fake.RequestConfig = lambda **kw: kw
    fake.TransformersEngine = _Engine
    monkeypatch.setitem(sys.modules, "swift.infer_engine", fake)
    _Engine.batches = []
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}], "images": []} for i in range(10)]

    answers, tokens = core.swift_generate("m", "qwen3_vl", rows, 4, 16, progress_label="evaluate: tuned model")

    assert answers == [f"q{i}" for i in range(10)] and tokens == 20  # in row order
    assert _Engine.batches == [4, 4, 2]
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("evaluate: tuned model: loaded in ")
    assert lines[1] == "evaluate: tuned model: 0 / 10 rows (0 %)"
    assert lines[-1].startswith("evaluate: tuned model: 10 / 10 rows (100 %), ")

    _Engine.batches = []
    core.swift_generate("m", "qwen3_vl", rows, 4, 16)  # no label: silent
    assert capsys.readouterr().err == "" and _Engine.batches == [4, 4, 2]
