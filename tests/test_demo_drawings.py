"""Tests of the synthetic engineering-drawing generator."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from PIL import Image

from pipelines.demo import drawings
from pipelines.demo.drawing_render import LABELS, render_drawing
from pipelines.demo.drawings import PROMPT, generate_dataset

FENCE_START, FENCE_END = "```json\n", "\n```"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("drawings")
    return generate_dataset(out, n_train=12, n_eval=6, seed=3)


def read_rows(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def findings_of(row: dict) -> list[dict]:
    content = row["messages"][1]["content"]
    assert content.startswith(FENCE_START) and content.endswith(FENCE_END)
    return json.loads(content[len(FENCE_START) : -len(FENCE_END)])


def all_rows(dataset: dict) -> list[tuple[Path, dict]]:
    return [(Path(dataset[split]).parent, row) for split in ("train", "eval") for row in read_rows(dataset[split])]


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_return_value_and_counts(dataset):
    assert dataset["n_train"] == 12 and dataset["n_eval"] == 6
    assert Path(dataset["train"]).name == "train.jsonl"
    assert Path(dataset["eval"]).name == "eval.jsonl"
    assert len(read_rows(dataset["train"])) == 12
    assert len(read_rows(dataset["eval"])) == 6


def test_deterministic_byte_identical(tmp_path):
    a = generate_dataset(tmp_path / "a", n_train=5, n_eval=3, seed=7)
    b = generate_dataset(tmp_path / "b", n_train=5, n_eval=3, seed=7)
    files_a, files_b = tree_bytes(tmp_path / "a"), tree_bytes(tmp_path / "b")
    assert sorted(files_a) == sorted(files_b)
    assert len([k for k in files_a if k.endswith(".png")]) == 8
    assert files_a == files_b
    assert Path(a["train"]).read_bytes() == Path(b["train"]).read_bytes()


def test_seed_changes_output(tmp_path):
    a = generate_dataset(tmp_path / "a", n_train=3, n_eval=1, seed=0)
    b = generate_dataset(tmp_path / "b", n_train=3, n_eval=1, seed=1)
    assert Path(a["train"]).read_bytes() != Path(b["train"]).read_bytes()


def test_train_and_eval_images_differ(dataset):
    root = Path(dataset["train"]).parent
    train = {(root / r["images"][0]).read_bytes() for r in read_rows(dataset["train"])}
    evl = {(root / r["images"][0]).read_bytes() for r in read_rows(dataset["eval"])}
    assert not train & evl


def test_rows_are_well_formed(dataset):
    for _, row in all_rows(dataset):
        assert set(row) == {"messages", "images"}
        user, assistant = row["messages"]
        assert user == {"role": "user", "content": "<image>" + PROMPT}
        assert assistant["role"] == "assistant"
        assert user["content"].count("<image>") == len(row["images"]) == 1


def test_images_resolve_relative_to_jsonl(dataset):
    for root, row in all_rows(dataset):
        for rel in row["images"]:
            assert not Path(rel).is_absolute()
            with Image.open(root / rel) as im:
                assert im.size == (256, 256)
                assert im.format == "PNG"


def test_findings_valid(dataset):
    for root, row in all_rows(dataset):
        findings = findings_of(row)
        assert 1 <= len(findings) <= 4
        with Image.open(root / row["images"][0]) as im:
            width, height = im.size
        for item in findings:
            assert set(item) == {"label", "bbox"}
            assert item["label"] in LABELS
            x1, y1, x2, y2 = item["bbox"]
            assert all(isinstance(v, int) for v in item["bbox"])
            assert 0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height
        keys = [(i["bbox"][1], i["bbox"][0]) for i in findings]
        assert keys == sorted(keys), "findings must be sorted top-to-bottom, left-to-right"


def test_title_block_always_bottom_right(dataset):
    for _, row in all_rows(dataset):
        titles = [i for i in findings_of(row) if i["label"] == "title_block"]
        assert len(titles) == 1
        x1, y1, x2, y2 = titles[0]["bbox"]
        assert x1 > 256 / 2 and y1 > 256 * 2 / 3
        assert x2 >= 256 - 20 and y2 >= 256 - 20


def test_bboxes_touch_ink(dataset):
    """Each bbox edge row/column holds dark pixels (boxes are tight)."""
    for root, row in all_rows(dataset)[:6]:
        with Image.open(root / row["images"][0]) as im:
            gray = im.convert("L")
        for item in findings_of(row):
            x1, y1, x2, y2 = item["bbox"]
            crop = gray.crop((x1, y1, x2, y2))
            assert crop.getextrema()[0] < 128
            w, h = crop.size
            for edge in ((0, 0, 1, h), (w - 1, 0, w, h), (0, 0, w, 1), (0, h - 1, w, h)):
                assert crop.crop(edge).getextrema()[0] < 128, (item, edge)


def test_labels_variety():
    rows = []
    for i in range(20):
        _, findings = render_drawing(256, random.Random(i))
        rows.append(findings)
    seen = {item["label"] for findings in rows for item in findings}
    assert seen == set(LABELS)


def test_other_image_size(tmp_path):
    result = generate_dataset(tmp_path, n_train=4, n_eval=0, image_size=128, seed=1)
    assert result["n_eval"] == 0 and read_rows(result["eval"]) == []
    for row in read_rows(result["train"]):
        for item in findings_of(row):
            x1, y1, x2, y2 = item["bbox"]
            assert 0 <= x1 < x2 <= 128 and 0 <= y1 < y2 <= 128


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="image_size"):
        generate_dataset(tmp_path, image_size=64)
    with pytest.raises(ValueError, match="n_train"):
        generate_dataset(tmp_path, n_train=-1)


def test_cli(tmp_path, capsys):
    drawings.main([str(tmp_path / "cli"), "--n-train", "2", "--n-eval", "1", "--seed", "5"])
    printed = json.loads(capsys.readouterr().out)
    assert printed["n_train"] == 2 and printed["n_eval"] == 1
    assert Path(printed["train"]).is_file() and Path(printed["eval"]).is_file()


def test_prompt_mentions_every_label():
    for label in LABELS:
        assert label in PROMPT


def _answers(jsonl: Path) -> list[list[dict]]:
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    return [json.loads(r["messages"][1]["content"].removeprefix("```json\n").removesuffix("\n```")) for r in rows]


def test_norm1000_answers_round_trip_to_the_pixel_boxes(tmp_path):
    from components.common.answers import parse_findings
    from components.common.boxes import to_pixels

    pixel = generate_dataset(tmp_path / "px", n_train=6, n_eval=2, image_size=256, seed=3)
    norm = generate_dataset(tmp_path / "n", n_train=6, n_eval=2, image_size=256, seed=3, convention="norm1000")
    assert (tmp_path / "px/images/train_00000.png").read_bytes() == (tmp_path / "n/images/train_00000.png").read_bytes()
    for split in ("train", "eval"):
        for px_findings, n_findings in zip(_answers(Path(pixel[split])), _answers(Path(norm[split]))):
            assert all(list(f) == ["bbox_2d", "label"] for f in n_findings)  # the cookbook's form
            assert all(isinstance(v, int) and 0 <= v <= 1000 for f in n_findings for v in f["bbox_2d"])
            assert [f["label"] for f in n_findings] == [f["label"] for f in px_findings]
            for p, n in zip(px_findings, n_findings):
                assert to_pixels(n["bbox_2d"], "norm1000", (256, 256)) == pytest.approx(p["bbox"], abs=1.0)
    row = json.loads(Path(norm["train"]).read_text().splitlines()[0])
    assert "[0, 1000]" in row["messages"][0]["content"]
    assert parse_findings(row["messages"][1]["content"])[1] is None  # evaluate and validate-data read it


def test_pixel_convention_is_the_default_output(tmp_path):
    a = generate_dataset(tmp_path / "a", n_train=2, n_eval=0, seed=1)
    b = generate_dataset(tmp_path / "b", n_train=2, n_eval=0, seed=1, convention="pixel")
    assert Path(a["train"]).read_text() == Path(b["train"]).read_text()
    assert all(list(f) == ["label", "bbox"] for f in _answers(Path(a["train"]))[0])
    with pytest.raises(ValueError, match="convention"):
        generate_dataset(tmp_path / "c", convention="auto")


def test_cli_convention_flag(tmp_path, capsys):
    drawings.main([str(tmp_path), "--n-train", "1", "--n-eval", "0", "--convention", "norm1000"])
    assert "bbox_2d" in (tmp_path / "train.jsonl").read_text()
