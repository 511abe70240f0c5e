"""A regression set that quarantines to nothing stops the local run before any training (issue 44).

Marked `pipeline` (kfp.local on the tiny model: snapshot-data, stage-model and the
validations run, seconds on 2 cores); train-lora never starts.
"""

from __future__ import annotations

import json

import pytest
from PIL import Image

from pipelines.run import main

pytestmark = pytest.mark.pipeline


def test_a_regression_set_that_quarantines_to_nothing_stops_the_run_before_training(tmp_path, capsys):
    folder = tmp_path / "regression"
    (folder / "img").mkdir(parents=True)
    Image.new("RGB", (64, 64), (255, 255, 255)).save(folder / "img" / "a.png")
    rows = [
        {"messages": [{"role": "user", "content": "<image>What is this?"}, {"role": "assistant", "content": "a part"}],
         "images": ["img/a.png"], "kind": "captioning"},  # not a kind the project scores
        {"messages": [{"role": "user", "content": "<image>Read it."}, {"role": "assistant", "content": " "}],
         "images": ["img/a.png"], "kind": "ocr"},  # no gold answer
    ]  # fmt: skip
    (folder / "regression.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    root = tmp_path / "runs"
    code = main(["--local", "--root", str(root), f"eval.regression={folder / 'regression.jsonl'}"])
    out = capsys.readouterr()
    assert code == 1
    assert "pipeline failed at task validate-regression" in out.err
    console = out.out + out.err
    assert "the regression set (eval.regression) is empty after validation: all 2 of its rows were quarantined" in (
        console
    )
    assert "E_REGRESSION_KIND" in console and "E_REGRESSION_GOLD" in console
    (run_dir,) = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("vlm-lora-local-demo-")]
    assert (run_dir / "validate-regression").is_dir()
    assert not (run_dir / "train-lora").exists()  # no training started
    quarantine = [json.loads(x) for x in next(run_dir.glob("validate-regression/quarantine")).read_text().splitlines()]
    assert [(q["line"], q["code"]) for q in quarantine] == [(1, "E_REGRESSION_KIND"), (2, "E_REGRESSION_GOLD")]
