"""`python -m components.validate_data convert`: a pixel-box dataset into a model's convention, once."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from components.common.answers import parse_findings
from components.common.boxes import to_pixels
from components.validate_data._convert import ConvertError, convert_file, sidecar
from pipelines.demo.drawings import generate_dataset


@pytest.fixture(scope="module")
def pixel_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    return generate_dataset(out, n_train=6, n_eval=2, image_size=200, seed=3)


def _findings(path):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [parse_findings(r["messages"][1]["content"])[0] for r in rows], rows


def test_pixel_to_norm1000_and_back_within_a_pixel(pixel_data, tmp_path):
    src = Path(pixel_data["train"])
    norm = tmp_path / "conv" / "train_norm1000.jsonl"
    result = convert_file(src, norm, to="norm1000")
    assert (result.rows, result.source, result.to) == (6, "pixel", "norm1000") and result.boxes > 6
    assert json.loads(sidecar(norm).read_text())["convention"] == "norm1000"
    before, _ = _findings(src)
    after, rows = _findings(norm)
    assert '"bbox_2d"' in rows[0]["messages"][1]["content"]  # the cookbook's key
    image = (norm.parent / rows[0]["images"][0]).resolve()
    assert image.is_file()  # relative image paths rewritten for the new folder
    for old, new in zip(before, after, strict=True):
        for a, b in zip(old, new, strict=True):
            assert a["label"] == b["label"]
            back = to_pixels(b["bbox"], "norm1000", (200, 200))
            assert all(abs(x - y) <= 1 for x, y in zip(back, a["bbox"], strict=True))
    again = tmp_path / "conv" / "pixel_again.jsonl"
    convert_file(norm, again, to="pixel")  # the sidecar says norm1000
    restored, _ = _findings(again)
    assert [[f["label"] for f in r] for r in restored] == [[f["label"] for f in r] for r in before]


def test_converting_twice_is_refused(pixel_data, tmp_path):
    norm = tmp_path / "n.jsonl"
    convert_file(pixel_data["train"], norm, to="norm1000")
    with pytest.raises(ConvertError, match="already norm1000"):
        convert_file(norm, tmp_path / "n2.jsonl", to="norm1000")
    sidecar(norm).unlink()  # without the sidecar, bbox_2d answers need --from
    with pytest.raises(ConvertError, match="pass --from norm1000 or --from resized_pixel"):
        convert_file(norm, tmp_path / "n3.jsonl", to="resized_pixel")


def test_bad_inputs_are_named(pixel_data, tmp_path):
    with pytest.raises(ConvertError, match="exists"):
        convert_file(pixel_data["train"], pixel_data["train"], to="norm1000")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"messages": [{"role": "user", "content": "<image>q"}, {"role": "assistant", "content": "no"}], '
        f'"images": ["{pixel_data["train"].rsplit("/", 1)[0]}/images/train_00000.png"]}}\n'
    )
    with pytest.raises(ConvertError, match=r"bad.jsonl:1: messages\[1\] is not a detection answer"):
        convert_file(bad, tmp_path / "o.jsonl", to="norm1000")


def test_cli(pixel_data, tmp_path):
    out = tmp_path / "cli.jsonl"
    cmd = [sys.executable, "-m", "components.validate_data", "convert", pixel_data["train"], "--to", "norm1000",
           "--out", str(out)]  # fmt: skip
    ok = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert ok.returncode == 0 and "pixel -> norm1000" in ok.stdout, ok.stderr
    twice = subprocess.run([*cmd[:4], str(out), "--to", "norm1000", "--out", str(tmp_path / "x.jsonl")],
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert twice.returncode == 1 and "already norm1000" in twice.stderr and "Traceback" not in twice.stderr
