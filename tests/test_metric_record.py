"""The one metric record (`components.common.metrics`): every reader takes its figures from it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from components.common import metrics as record
from components.common.metrics import GATE_METRICS, METRICS, Metric
from components.common.tasks import TASKS, Task, score_text
from components.evaluate import _interval
from components.evaluate import metrics as eval_metrics

ROOT = Path(__file__).resolve().parents[1]


def test_every_gateable_figure_has_a_formula():
    values = eval_metrics.figures(3, 1, 2, 4, 1, 5)
    assert set(GATE_METRICS) <= set(values)
    assert values["f1"] == pytest.approx(2 * 3 / (2 * 3 + 1 + 2))


def test_readers_are_the_record():
    assert eval_metrics.GATE_METRICS == GATE_METRICS == _interval.FIGURES
    assert eval_metrics.GATE_METRIC_RANGES == {m.name: m.range for m in METRICS if m.gateable}
    assert record.SUMMARY_METRICS == ("json_valid_rate", "precision", "recall", "f1", "exact_match_rate")
    assert record.REGISTRY_LABELS == ("tuned_f1", "tuned_json_valid_rate", "base_f1")
    for task in TASKS.values():
        assert set(task.metrics) <= set(record.BY_NAME)


def test_a_gateable_figure_must_be_higher_is_better_with_a_range():
    with pytest.raises(ValueError, match="higher-is-better"):
        Metric("cer", "CER", higher_is_better=False, range=(0.0, 1.0), gateable=True)
    with pytest.raises(ValueError, match="registry sides"):
        Metric("f1", "F1", registry=("champion",))
    with pytest.raises(ValueError, match="unknown metric 'nope'"):
        record.get_metric("nope")


def test_a_task_naming_an_unknown_metric_is_refused():
    with pytest.raises(ValueError, match="not in components.common.metrics.METRICS"):
        Task("t", "", ("f1", "bleu"), lambda t: (t, None), lambda t: "", score_text, lambda t, g: [])


# A figure added to the record alone, in a fresh interpreter: the gate, the config check, the
# report's rows, the summary, the registry labels and the intervals' figures all show it.
_ADDED = """
import inspect, json, sys
import components.common.metrics as m
src = inspect.getsource(m).replace(
    "METRICS: tuple[Metric, ...] = (\\n",
    "METRICS: tuple[Metric, ...] = (\\n    Metric('f9', 'F9', range=RATE, gateable=True, summary=6, registry=('tuned',)),\\n",
)
exec(compile(src, m.__file__, "exec"), m.__dict__)
from components.evaluate import metrics, _interval, _report
from components.register.core import LABEL_METRICS
from pipelines.config import ConfigError, load_config
from pipelines.local_console import format_summary
passed, reason = metrics.gate({"f9": 0.7}, {"f9": 0.5}, "f9", 0.6, 0.1)
try:
    cfg_metric = load_config(sys.argv[1], {"eval.metric": "f9"}).eval.metric
except ConfigError as exc:
    cfg_metric = str(exc)
rows = [r["label"] for r in _report._metric_rows({"f9": 0.7}, {"f9": 0.5})]
summary = format_summary({"run_dir": "r", "wall_s": 1.0, "tasks": {}, "passed": passed,
                          "metrics": {"base_f9": 0.5, "tuned_f9": 0.75}})
print(json.dumps({"gate": [passed, reason], "config": cfg_metric, "rows": rows, "summary": summary,
                  "labels": list(LABEL_METRICS), "figures": list(_interval.FIGURES)}))
"""


def test_a_figure_added_to_the_record_reaches_every_reader():
    config = ROOT / "configs" / "local" / "tiny_cpu.yaml"
    done = subprocess.run([sys.executable, "-c", _ADDED, str(config)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["gate"][0] is True and out["gate"][1].startswith("PASS: f9 0.7000")
    assert out["config"] == "f9"
    assert out["rows"] == ["F9"]
    assert "  f9                      0.500      0.750" in out["summary"]
    assert out["labels"][0] == "tuned_f9" and out["labels"][-1] == "passed"
    assert out["figures"][0] == "f9"
