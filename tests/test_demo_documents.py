"""Tests of the synthetic document generator (key_value demo data)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from PIL import Image

from components.common.tasks import get_task
from pipelines.demo import documents
from pipelines.demo.documents import FIELDS, PROMPT, generate_dataset

KV = get_task("key_value")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> dict:
    return generate_dataset(tmp_path_factory.mktemp("documents"), n_train=10, n_eval=4, seed=5)


def rows_of(dataset: dict) -> list[tuple[Path, dict]]:
    out = []
    for split in ("train", "eval"):
        path = Path(dataset[split])
        out.extend((path.parent, json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines())
    return out


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_counts_paths_and_images(dataset):
    assert dataset["n_train"] == 10 and dataset["n_eval"] == 4
    rows = rows_of(dataset)
    assert len(rows) == 14
    for folder, row in rows:
        (image_path,) = row["images"]
        assert not Path(image_path).is_absolute() and image_path.startswith("images/")
        with Image.open(folder / image_path) as image:
            assert image.size == (256, 256) and image.mode == "RGB"
            assert image.getextrema() != ((255, 255),) * 3  # something is printed


def test_answers_are_valid_key_value_answers(dataset):
    seen_types, optional = set(), 0
    for _, row in rows_of(dataset):
        user, assistant = row["messages"]
        assert user["content"] == "<image>" + PROMPT
        assert KV.check_answer(assistant["content"]) == ""
        fields = json.loads(assistant["content"].removeprefix("```json\n").removesuffix("\n```"))
        assert list(fields) == [key for key in FIELDS if key in fields]  # fixed key order
        assert 4 <= len(fields) <= 6 and set(FIELDS[:4]) <= set(fields)
        assert (
            fields["number"].split("-")[0]
            == {"INVOICE": "INV", "RECEIPT": "RCT", "QUOTE": "QTE"}[fields["document_type"]]
        )
        assert KV.score(assistant["content"], assistant["content"])["exact_match"]
        seen_types.add(fields["document_type"])
        optional += len(fields) - 4
    assert len(seen_types) > 1 and optional > 0


def test_deterministic_and_seed_dependent(dataset, tmp_path):
    again = generate_dataset(tmp_path / "again", n_train=10, n_eval=4, seed=5)
    assert tree_bytes(Path(again["train"]).parent) == tree_bytes(Path(dataset["train"]).parent)
    other = generate_dataset(tmp_path / "other", n_train=10, n_eval=4, seed=6)
    assert Path(other["train"]).read_bytes() != Path(dataset["train"]).read_bytes()


def test_train_and_eval_differ(dataset):
    train = Path(dataset["train"]).read_text().splitlines()
    evl = Path(dataset["eval"]).read_text().splitlines()
    answers = {json.loads(line)["messages"][1]["content"] for line in train}
    assert not any(json.loads(line)["messages"][1]["content"] in answers for line in evl)


def test_render_validates_size_and_counts(tmp_path):
    with pytest.raises(ValueError, match="image_size"):
        documents.render_document(64, random.Random(0))
    with pytest.raises(ValueError, match="n_train"):
        generate_dataset(tmp_path, n_train=-1)
    image, fields = documents.render_document(384, random.Random("x"))
    assert image.size == (384, 384) and fields["document_type"] in ("INVOICE", "RECEIPT", "QUOTE")


def test_cli(tmp_path, capsys):
    documents.main([str(tmp_path / "cli"), "--n-train", "2", "--n-eval", "1", "--image-size", "128"])
    result = json.loads(capsys.readouterr().out)
    assert result["n_train"] == 2 and Path(result["eval"]).is_file()
