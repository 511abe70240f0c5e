"""Bootstrap intervals over rows (components.evaluate._interval) and `eval.gate_on`.

On the demo's own eval set (16 generated drawings, `pipelines.demo.drawings`), through the evaluate
core with a fake generator: the tuned model answers most rows right, the base model (random, as the
demo's tiny model) none. The intervals bracket the point figures, the margin's too, and
`gate_on: lower_bound` refuses a margin that the point value passes but the rows cannot support.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from components.evaluate import _interval
from components.evaluate._report import render_report
from components.evaluate.core import evaluate
from components.evaluate.metrics import aggregate, gate
from components.evaluate.settings import EvalSettings
from pipelines.demo.drawings import generate_dataset


@pytest.fixture(scope="module")
def demo_eval(tmp_path_factory):
    """The demo's 16-row eval set, as the demo config generates it (data.jsonl for the evaluate core)."""
    folder = tmp_path_factory.mktemp("demo")
    generate_dataset(folder, n_train=0, n_eval=16)
    (folder / "eval.jsonl").rename(folder / "data.jsonl")
    return folder


def _answers(folder):
    golds = [json.loads(line)["messages"][-1]["content"] for line in (folder / "data.jsonl").open()]
    tuned = []
    for i, gold in enumerate(golds):
        findings = json.loads(gold.removeprefix("```json\n").removesuffix("\n```"))
        if i % 4 == 3:  # every fourth row: one box missed
            findings = findings[1:]
        tuned.append("no idea" if i in (5, 11) else "```json\n" + json.dumps(findings) + "\n```")
    return {"tuned": tuned, "base": ["\ufffd\ufffd garbage"] * len(golds)}


def _gen(answers):
    return lambda model_dir, model_type, rows, batch_size, max_new_tokens: (answers[model_dir], 5 * len(rows))


def test_demo_f1_and_margin_carry_intervals(demo_eval, tmp_path, capsys):
    result = evaluate("tuned", "base", "qwen3_vl", str(demo_eval), str(tmp_path / "p.jsonl"),
                      generate_fn=_gen(_answers(demo_eval)))  # fmt: skip
    ci, f1 = result.intervals, result.tuned["f1"]
    low, high = ci["tuned"]["f1"]
    m_low, m_high = ci["margin"]["f1"]
    margin = f1 - result.reference["f1"]
    with capsys.disabled():
        print(f"\ndemo eval (16 rows): tuned f1 {f1:.3f} [{low:.3f}, {high:.3f}], margin {margin:+.3f} "
              f"[{m_low:+.3f}, {m_high:+.3f}] ({ci['draws']} draws, 95 %)")  # fmt: skip
    assert ci["n"] == 16 and low < f1 < high and m_low < margin < m_high
    assert high - low > 0.05  # 16 rows: wide, as it should be
    assert ci["reference"]["f1"] == [0.0, 0.0]  # the base never parses: no spread to draw
    assert result.passed and "CI" not in result.reason  # gate_on point: the decision and its reason as before
    again = evaluate("tuned", "base", "qwen3_vl", str(demo_eval), str(tmp_path / "q.jsonl"),
                     generate_fn=_gen(_answers(demo_eval)))  # fmt: skip
    assert again.intervals == ci  # a fixed seed: the same scores, the same interval

    strict = (m_low + margin) / 2  # between the margin's lower bound and its point value
    point = evaluate("tuned", "base", "qwen3_vl", str(demo_eval), str(tmp_path / "r.jsonl"),
                     EvalSettings(min_margin=strict), generate_fn=_gen(_answers(demo_eval)))  # fmt: skip
    bound = evaluate("tuned", "base", "qwen3_vl", str(demo_eval), str(tmp_path / "s.jsonl"),
                     EvalSettings(min_margin=strict, gate_on="lower_bound"),
                     generate_fn=_gen(_answers(demo_eval)))  # fmt: skip
    assert point.passed and not bound.passed
    assert bound.reason.startswith("FAIL: margin 95% CI [") and "lower bound < min_margin" in bound.reason

    page = render_report(result.tuned, result.reference, result.samples, intervals=ci, task="detection")
    assert f"[{low:.3f}, {high:.3f}]" in page and f"[{m_low:+.3f}, {m_high:+.3f}]" in page
    assert "95 % bootstrap intervals over the 16 held-out rows" in page


def test_vectorised_figures_equal_aggregate_on_a_resample():
    rng = random.Random(3)
    scores = [{"tp": rng.randint(0, 3), "fp": rng.randint(0, 2), "fn": rng.randint(0, 2),
               "json_valid": rng.random() > 0.2, "exact_match": rng.random() > 0.6} for _ in range(30)]  # fmt: skip
    picks = [rng.randrange(30) for _ in range(30)]
    want = aggregate([scores[i] for i in picks])
    weights = np.bincount(picks, minlength=30).astype(float)[None, :]
    got = _interval._figures(weights @ _interval._counts(scores), 30)
    for figure in _interval.FIGURES:
        assert got[figure][0] == pytest.approx(want[figure])
    nothing = _interval._figures(np.zeros((1, 5)), 4)
    assert nothing["f1"][0] == 1.0 == aggregate([{"tp": 0, "fp": 0, "fn": 0, "json_valid": 1, "exact_match": 1}])["f1"]


def test_gate_on_is_checked():
    with pytest.raises(ValueError, match="gate_on 'mean' is not point or lower_bound"):
        gate({"f1": 1.0}, None, gate_on="mean")
    with pytest.raises(ValueError, match="needs a bootstrap interval"):
        gate({"f1": 1.0}, None, gate_on="lower_bound", ci={})
    with pytest.raises(ValueError, match="score the same rows"):
        _interval.intervals([{"tp": 1}], [])


def test_config_takes_gate_on_point_or_lower_bound():
    from pipelines.config import ConfigError, load_config, parse_overrides

    assert load_config("local/tiny_cpu").eval.gate_on == "point"  # the default: the decision as before
    assert load_config("local/tiny_cpu", parse_overrides(["eval.gate_on=lower_bound"])).eval.gate_on == "lower_bound"
    with pytest.raises(ConfigError, match="eval.gate_on"):
        load_config("local/tiny_cpu", parse_overrides(["eval.gate_on=mean"]))
