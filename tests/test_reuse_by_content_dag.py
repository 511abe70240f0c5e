"""Issue 50 must-show 2 on the tiny DAG: a changed file is never reused, and the rerun says which.

Marked `pipeline`; CI runs it. kfp.local with caching on, the demo rows as two shards with their
images beside them (`benchmarks.retrain_local.retrain_config`, 1 training step, 1 evaluation sample
of at most 8 tokens), seven runs on one pipeline root:
(a) first run; (b) a byte of the cached merged model flipped: merge-export and evaluate run again,
train-lora does not; (c) the cached adapter truncated: train-lora runs again, validate-data does
not; (c2) the cached eval set cut to 3 rows: validate-data runs again on every row; (c3) a gate no
model can meet: evaluate runs again and the run fails, naming the rule; (d) an image rewritten with
other pixels and the same size and mtime: the snapshot changes and validate-data runs again; (e) a
file of the staged base changed in the model cache: stage-model stages it again. The cores' cases
are in tests/test_reuse_by_content.py. (c2) and (c3) were a file of their own, two DAGs from
scratch each (380 s on 2 cores); here they are reruns of this root.
"""

import os
import shutil
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from benchmarks.retrain_local import retrain_config
from pipelines.local_run import run_local

pytestmark = pytest.mark.pipeline


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    work = tmp_path_factory.mktemp("reuse-dag")
    cfg, _ = retrain_config(work, max_steps=1, epochs=1, eval_samples=1, max_new_tokens=8)
    first = run_local(cfg, root=str(work / "runs"), enable_caching=True)
    return work, cfg, first


def _again(setup, capsys) -> tuple[dict, str]:
    work, cfg, _ = setup
    capsys.readouterr()
    result = run_local(cfg, root=str(work / "runs"), enable_caching=True)
    return result, capsys.readouterr().out


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_flipped_byte_in_the_cached_merged_model_remakes_it(setup, capsys):
    _, _, first = setup
    weights = Path(first["run_dir"]) / "merge-export" / "merged_model" / "model.safetensors"
    _flip(weights)
    again, out = _again(setup, capsys)
    assert f"cache: merge-export's output merged_model changed since merge-export wrote it ({weights}: " in out
    assert "same size, other bytes" in out
    assert {"merge-export", "evaluate"} <= set(again["tasks"])
    assert {"stage-model", "validate-data", "train-lora"} <= set(again["cached"])


def test_a_truncated_cached_adapter_retrains(setup, capsys):
    _, _, first = setup
    weights = Path(first["run_dir"]) / "train-lora" / "adapter" / "adapter_model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    again, out = _again(setup, capsys)
    assert f"cache: train-lora's output adapter changed since train-lora wrote it ({weights}: size" in out
    assert {"train-lora", "merge-export", "evaluate"} <= set(again["tasks"])
    assert {"stage-model", "validate-data"} <= set(again["cached"])


def test_a_truncated_cached_eval_set_runs_validate_data_again(setup, capsys):
    """#41 must-show 3: the cached eval set cut from its rows to 3; the re-run drops the cache entry (one line naming
    validate-data and the file), validates again and evaluates on the whole set again."""
    _, _, first = setup
    eval_file = Path(first["run_dir"]) / "validate-data" / "eval_dataset" / "data.jsonl"
    rows = eval_file.read_text().splitlines(keepends=True)
    assert len(rows) > 3 and first["data"]["eval_rows"] == len(rows)
    eval_file.write_text("".join(rows[:3]))
    again, out = _again(setup, capsys)
    assert (
        f"cache: validate-data's output eval_dataset changed since validate-data wrote it ({eval_file.parent}/"
        "data.jsonl: size" in out
    )
    assert {"validate-data", "evaluate"} <= set(again["tasks"]) and "stage-model" in again["cached"]
    assert again["data"]["eval_rows"] == len(rows)


def test_an_unreachable_gate_fails_and_only_the_gate_runs_again(setup, capsys):
    """The same root with a gate no model can meet (f1 >= 1.0): evaluate runs again (its settings changed), the
    run ends with passed=False and names the rule; the data, the training and the merge stay cached."""
    import dataclasses

    work, cfg, _ = setup
    strict = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, metric="f1", min_value=1.0))
    result = run_local(strict, root=str(work / "runs"), enable_caching=True)
    assert result["passed"] is False and result["reason"].startswith("FAIL: task metric: f1")
    assert "evaluate" in result["tasks"]
    assert {"stage-model", "validate-data", "train-lora", "merge-export"} <= set(result["cached"])


def test_an_image_rewritten_with_the_same_size_and_mtime_is_new_data(setup, capsys):
    work, _, first = setup
    image = sorted((work / "data" / "images").glob("train_*.png"))[0]
    st = image.stat()
    with Image.open(image) as img:
        other = img.convert("RGB")
    half = other.height // 2  # the lower half blanked: other pixels, less ink, so a smaller PNG
    ImageDraw.Draw(other).rectangle([0, half, other.width - 1, other.height - 1], fill=(255, 255, 255))
    tmp = image.with_name("edited.tmp")
    other.save(tmp, format="PNG")
    data = tmp.read_bytes()
    assert len(data) < st.st_size
    tmp.write_bytes(data + b"\0" * (st.st_size - len(data)))  # the same size: a PNG reader stops at IEND
    shutil.copyfile(tmp, image)
    tmp.unlink()
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (image.stat().st_size, image.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    again, out = _again(setup, capsys)
    assert again["data"]["fingerprint"] != first["data"]["fingerprint"]
    assert {"validate-data", "train-lora", "merge-export", "evaluate"} <= set(again["tasks"])
    assert "stage-model" in again["cached"]


def test_a_file_changed_in_the_model_cache_restages_it(setup, capsys):
    work, _, _ = setup
    entry = next(p.parent for p in (work / "model-cache").rglob("manifest.json"))
    config = entry / "config.json"
    good = config.read_bytes()
    at = good.index(b"\n")
    config.write_bytes(good[:at] + b" " + good[at + 1 :])  # one byte other (JSON whitespace), the same size
    assert config.read_bytes() != good and len(config.read_bytes()) == len(good)
    again, out = _again(setup, capsys)
    assert f"cache: stage-model's output model changed since stage-model wrote it ({entry}/config.json: " in out
    assert "stage-model" in again["tasks"] and config.read_bytes() == good
