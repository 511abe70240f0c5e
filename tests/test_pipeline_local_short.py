"""Short DAGs under kfp.local on the tiny model, each in a root of its own (4 training steps: quality does
not matter here): a gate no model can meet, and a cached eval set cut short after its run. Marked
`pipeline`; CI runs it. Apart from tests/test_pipeline_local.py so that pytest-xdist (`--dist loadfile`)
can run the two files on two workers.
"""

import dataclasses
from pathlib import Path

import pytest

from pipelines.config import DEFAULT_LOCAL_CONFIG, load_config
from pipelines.local_run import run_local
from pipelines.pipeline import REGRESSION_TASK, TASK_ORDER

pytestmark = pytest.mark.pipeline


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pipeline-short-root")


def test_unreachable_gate_fails(root):
    """The same DAG with a gate no model can meet (f1 >= 1.01) ends with passed=False.

    Training quality does not matter here, so this run trains 4 steps only.
    """
    cfg = load_config(DEFAULT_LOCAL_CONFIG)
    cfg = dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, cache=str(root / "model-cache")),
        swift={**cfg.swift, "max_steps": 4},
        eval=dataclasses.replace(cfg.eval, metric="f1", min_value=1.01, max_samples=4, max_new_tokens=32),
    )
    second = run_local(cfg, root=str(root / "runs-gate"), enable_caching=False)
    assert second["passed"] is False
    assert second["metrics"]["tuned_f1"] < 1.01 and second["metrics"]["tuned_n"] == 4
    assert set(second["tasks"]) == {*TASK_ORDER, REGRESSION_TASK}
    assert second["reason"].startswith("FAIL: task metric: f1")  # the rule that failed is named


def test_a_truncated_cached_eval_set_runs_validate_data_again(root, capsys):
    """#41 must-show 3: a run's cached eval set cut from its rows to 3; the re-run drops the cache
    entry (one line naming validate-data and the file), validates again and scores every row.

    Its own runs in a root of their own (the module's first run stays untouched); training quality does
    not matter here, so they train 4 steps and answer in at most 32 tokens.
    """
    cfg = load_config(DEFAULT_LOCAL_CONFIG)
    cfg = dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, cache=str(root / "model-cache")),
        swift={**cfg.swift, "max_steps": 4},
        eval=dataclasses.replace(cfg.eval, max_new_tokens=32),
    )
    runs = str(root / "runs-truncated")
    first = run_local(cfg, root=runs, enable_caching=True)
    eval_file = Path(first["run_dir"]) / "validate-data" / "eval_dataset" / "data.jsonl"
    rows = eval_file.read_text().splitlines(keepends=True)
    assert len(rows) > 3 and first["metrics"]["tuned_n"] == len(rows)
    eval_file.write_text("".join(rows[:3]))
    capsys.readouterr()
    again = run_local(cfg, root=runs, enable_caching=True)
    out = capsys.readouterr().out
    assert (
        f"cache: validate-data's output eval_dataset changed since validate-data wrote it ({eval_file.parent}/"
        "data.jsonl: size" in out
    )
    assert "validate-data" in again["tasks"] and "evaluate" in again["tasks"]
    assert again["metrics"]["tuned_n"] == len(rows) == again["data"]["eval_rows"]
