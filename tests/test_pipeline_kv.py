"""End-to-end: the whole DAG under kfp.local on the key_value task (tiny model, demo documents).

Marked `pipeline`; CI runs it. Training quality does not matter here, so the run trains a
few steps and evaluates a few samples (about 2 minutes on 2 cores): it proves that the
second task goes through the same seam as detection, validation, training, scoring, gate
and report included. The full demo (`configs/local/tiny_cpu_kv.yaml`) is the one that
beats the base model.
"""

import dataclasses
import json
from pathlib import Path

import pytest

from components.common.tasks import get_task
from pipelines.config import CONFIG_DIR, load_config
from pipelines.local_run import run_local
from pipelines.pipeline import TASK_ORDER

pytestmark = pytest.mark.pipeline

KV_CONFIG = CONFIG_DIR / "local" / "tiny_cpu_kv.yaml"


def test_key_value_dag_runs_scores_fields_and_gates(tmp_path):
    cfg = load_config(KV_CONFIG)
    assert cfg.data.task == "key_value" and cfg.eval.metric == "f1"
    cfg = dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, cache=str(tmp_path / "model-cache")),
        swift={**cfg.swift, "max_steps": 8, "logging_steps": 4},
        eval=dataclasses.replace(cfg.eval, max_samples=4, max_new_tokens=64, batch_size=4),
    )
    result = run_local(cfg, root=str(tmp_path / "runs"), enable_caching=False)

    assert set(result["tasks"]) == set(TASK_ORDER)
    m = result["metrics"]
    assert m["tuned_n"] == m["base_n"] == 4
    for prefix in ("base", "tuned"):
        for key in ("f1", "precision", "recall", "exact_match_rate", "json_valid_rate"):
            assert 0.0 <= m[f"{prefix}_{key}"] <= 1.0, (prefix, key, m)
    assert isinstance(result["passed"], bool) and m["passed"] == float(result["passed"])

    run_dir = Path(result["run_dir"])
    rows = [json.loads(line) for line in (run_dir / "evaluate" / "predictions").read_text().splitlines()]
    assert len(rows) == 4
    kv = get_task("key_value")
    for row in rows:  # scored field by field: n_gold is the gold answer's number of fields
        assert row["tuned_score"]["n_gold"] == len(kv.parse(row["gold"])[0]) >= 4
    report = (run_dir / "evaluate" / "report").read_text()
    assert 'class="metrics fields"' in report and "Boxes:" not in report
