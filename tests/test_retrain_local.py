"""Retraining that sees new data (#13), end to end under kfp.local with caching on.

Marked `pipeline` (a few minutes on 2 cores); CI runs it. The scenario of
`benchmarks/retrain_local.py` at its smallest: the demo training rows in a folder of two
shards (`data.train` is the folder), the tiny model, 1 training step, 1 evaluation
sample of at most 8 new tokens, four runs on one pipeline root:
(a) first run, (b) unchanged, (c) 8 rows appended to a shard, (d) a shard overwritten in
place with other bytes under the same name.
"""

import json
from pathlib import Path

import pytest

from benchmarks.retrain_local import N_EXTRA, SHARDS, check, retrain_config, run_scenarios
from pipelines.pipeline import REGRESSION_TASK, TASK_ORDER

pytestmark = pytest.mark.pipeline

TRAINING = ("validate-data", "train-lora", "merge-export", "evaluate")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("retrain")
    cfg, extra = retrain_config(work, max_steps=1, epochs=1, eval_samples=1, max_new_tokens=8)
    return {r["scenario"]: r for r in run_scenarios(work, cfg, extra)}


def _executor_output(run_dir: str, task: str) -> dict:
    return json.loads((Path(run_dir) / task / "executor_output.json").read_text())


def _lineage(row: dict) -> dict:
    """The merged model's lineage.json `data` section, read where run_local found it."""
    path = Path(row["result"]["data"]["from"])
    assert path.name == "lineage.json" and path.parent.name == "merged_model"
    return json.loads(path.read_text())["data"]


def test_first_run_runs_every_task(runs):
    a = runs["a"]
    assert set(a["ran"]) == {*TASK_ORDER, REGRESSION_TASK} and a["cached"] == []  # the demo config's regression set
    assert a["rows"] == 64 + 16 and a["train_rows"] == 64  # the demo's rows, in two shards
    assert _lineage(a)["snapshot"] == a["fingerprint"] and _lineage(a)["files"] == len(SHARDS) + 1


def test_unchanged_data_is_a_cache_hit_and_no_training_runs(runs):
    a, b = runs["a"], runs["b"]
    assert b["ran"] == ["snapshot-data"]  # never cached: it looks at the data every run
    assert set(TRAINING) <= set(b["cached"]) and "stage-model" in b["cached"]
    assert b["fingerprint"] == a["fingerprint"]
    line = f"no new data since snapshot {a['fingerprint']}: validate-data .. evaluate came from the cache"
    assert line in b["summary"] and "no training ran" in b["summary"]
    # the cached run still reports the model it reuses: the same lineage and metrics as (a)
    assert b["rows"] == a["rows"] and b["result"]["metrics"] == a["result"]["metrics"]
    assert b["result"]["passed"] == a["result"]["passed"]


def test_appended_rows_are_validated_and_trained_on(runs):
    a, c = runs["a"], runs["c"]
    assert set(TRAINING) <= set(c["ran"]) and "stage-model" in c["cached"]
    assert c["fingerprint"] != a["fingerprint"] and "no new data" not in c["summary"]
    assert c["rows"] == a["rows"] + N_EXTRA and c["train_rows"] == a["train_rows"] + N_EXTRA
    assert _lineage(c)["snapshot"] == c["fingerprint"]
    # validate-data's own figures say the same: its metrics and the lineage it wrote
    metrics = _executor_output(c["result"]["run_dir"], "validate-data")["artifacts"]["metrics"]["artifacts"][0]
    assert metrics["metadata"]["n_train"] == a["train_rows"] + N_EXTRA
    assert metrics["metadata"]["data_snapshot"] == c["fingerprint"]
    written = json.loads(
        (Path(c["result"]["run_dir"]) / "validate-data" / "train_dataset" / "data_snapshot.json").read_text()
    )
    shard = next(uri for uri in written["files"] if uri.endswith(SHARDS[1]))
    assert written["files"][shard]["rows"] == 32 + N_EXTRA and written["n_train"] == c["train_rows"]


def test_a_shard_overwritten_in_place_is_retrained(runs):
    c, d = runs["c"], runs["d"]
    assert set(TRAINING) <= set(d["ran"])
    assert d["fingerprint"] not in (c["fingerprint"], runs["a"]["fingerprint"])
    assert d["rows"] == c["rows"]  # same rows, other bytes (reordered): only the content hash tells
    assert _lineage(d)["snapshot"] == d["fingerprint"]


def test_the_benchmark_checks_agree(runs):
    assert check([runs[k] for k in "abcd"]) == []
