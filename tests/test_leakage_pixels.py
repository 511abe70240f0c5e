"""Issue 50, leakage by what the model sees: re-encoded, JPEG, edited and resized copies of a train image,
and prompts that differ in case or spaces only, are reported as leaks (E_LEAK) by validate-data.

Real `validate_data` runs on demo drawings (`pipelines.demo.drawing_render.render_drawing`: images with
structure, as the pHash threshold was measured on).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from PIL import Image

from components.validate_data import _looks
from pipelines.demo.drawing_render import render_drawing
from tests.test_validate_data import Run, fenced, line, row, write_lines

SIZE = 256


def drawing(seed: str) -> Image.Image:
    return render_drawing(SIZE, random.Random(seed))[0]


@pytest.fixture
def run(tmp_path) -> Run:
    return Run(tmp_path / "out")


def _copies(folder: Path, a: Image.Image) -> dict[str, tuple[str, str]]:
    """The eval images: {file name: (expected match kind, how it was made)}."""
    folder.mkdir(parents=True, exist_ok=True)
    a.save(folder / "level0.png", compress_level=0)
    a.save(folder / "copy.bmp")
    rgba = a.convert("RGBA")
    rgba.putalpha(255)
    rgba.save(folder / "rgba.png")
    exif = Image.Exif()
    exif[0x010E] = "scanned again"  # ImageDescription: an extra eXIf chunk, no orientation
    a.save(folder / "exif.png", exif=exif)
    a.save(folder / "q100.jpg", quality=100)
    edited = a.copy()
    edited.putpixel(
        (SIZE // 2, SIZE // 2), (255, 0, 0) if edited.getpixel((SIZE // 2, SIZE // 2)) != (255, 0, 0) else 0
    )
    edited.save(folder / "one_pixel.png")
    a.resize((SIZE - 1, SIZE - 1), Image.Resampling.LANCZOS).save(folder / "resized.png")
    return {
        "level0.png": "pixels",
        "copy.bmp": "pixels",
        "rgba.png": "pixels",
        "exif.png": "pixels",
        "q100.jpg": "near",
        "one_pixel.png": "near",
        "resized.png": "near",
    }


def test_every_copy_of_a_train_image_and_a_case_or_space_variant_of_a_prompt_is_a_leak(tmp_path, run):
    data = tmp_path / "data"
    a = drawing("leak-a")
    (data / "img").mkdir(parents=True)
    a.save(data / "img" / "a.png")
    for k in range(3):
        drawing(f"leak-other-{k}").save(data / "img" / f"t{k}.png")
    train_rows = [row("find the holes in drawing a", ["img/a.png"], answer=fenced(0))]
    train_rows += [row(f"find the holes in drawing {k}", [f"img/t{k}.png"], answer=fenced(k)) for k in range(3)]
    train_rows.append(row("What is the  Scale of sheet 7?", answer="1:2"))
    train = write_lines(data / "train.jsonl", [line(r) for r in train_rows])
    copies = _copies(data / "eval_img", a)
    drawing("leak-fresh").save(data / "eval_img" / "fresh.png")
    eval_rows = [row("find the holes in drawing a", [f"eval_img/{name}"], answer=fenced(1)) for name in copies]
    eval_rows.append(row("find the holes here", ["eval_img/fresh.png"], answer=fenced(2)))  # its own drawing
    eval_rows.append(row("  what is the scale of SHEET 7? ", answer="1:2"))
    eval_rows.append(row("what is the scale of sheet 8?", answer="1:2"))  # another question
    evals = write_lines(data / "eval.jsonl", [line(r) for r in eval_rows])

    result = run([train], eval_files=[str(evals)])

    leaked = {i.line: i.message for i in result.issues if i.code == "E_LEAK"}
    n = len(copies)
    assert sorted(leaked) == [*range(1, n + 1), n + 2], leaked
    assert result.counts["n_leaked"] == n + 1 and result.counts["n_eval"] == 2
    records = {r["eval"]: r for r in result.stats["leaks"]}
    for k, (name, kind) in enumerate(copies.items(), start=1):
        record = records[f"{evals}:{k}"]
        assert record["train"] == [f"{train}:1"] and record["images"] == [f"eval_img/{name}"], record
        assert record["train_images"] == ["img/a.png"] and record["shared"] == "image and prompt"
        assert record["match"][0].split(":")[0] == kind, (name, record)
        if kind == "near":
            assert 0 <= int(record["match"][0].split(":")[1]) <= _looks.NEAR_DUPLICATE_BITS
            assert "perceptual hash (a near-duplicate: pHash" in leaked[k]
        else:
            assert "compared by decoded pixels (the same RGB pixels in another file)" in leaked[k]
    assert f"the same prompt as train row {train}:5 (no image)" in leaked[n + 2]
    assert records[f"{evals}:{n + 2}"]["shared"] == "prompt"


def test_the_hash_split_keeps_near_duplicates_on_one_side(tmp_path, run):
    data = tmp_path / "data"
    (data / "img").mkdir(parents=True)
    rows = []
    for k in range(12):
        img = drawing(f"split-{k}")
        img.save(data / "img" / f"p{k}.png")
        img.save(data / "img" / f"p{k}.jpg", quality=95)  # a near-duplicate of p{k}, other pixels
        rows.append(row(f"find the holes in drawing {k}", [f"img/p{k}.png"], answer=fenced(k)))
        rows.append(row(f"find the holes in scan {k}", [f"img/p{k}.jpg"], answer=fenced(k)))
    train = write_lines(data / "train.jsonl", [line(r) for r in rows])
    result = run([train], eval_fraction=0.3)
    assert result.counts.get("n_leaked", 0) == 0 and result.counts["n_eval"] >= 2
    train_rows, eval_rows = run.rows()
    sides = {}
    for side, rows_ in (("train", train_rows), ("eval", eval_rows)):
        for r in rows_:
            k = r["messages"][0]["content"].rsplit(" ", 1)[1]
            sides.setdefault(k, set()).add(side)
    assert all(len(s) == 1 for s in sides.values()), sides  # each drawing and its scan on one side


def test_distinct_demo_drawings_are_not_near_duplicates_and_flat_images_get_no_phash():
    hashes = [_looks.looks_of(drawing(f"fp-{k}")).phash for k in range(150)]
    assert all(len(h) == 32 for h in hashes) and _looks.near_pairs(hashes) == []
    flat = [_looks.looks_of(Image.new("RGB", (64, 48), (40 * k, 100, 200))) for k in range(3)]
    assert [f.phash for f in flat] == [b""] * 3 and len({f.pixels for f in flat}) == 3


def test_near_pairs_compares_across_blocks(monkeypatch):
    a = _looks.looks_of(drawing("blk-a")).phash
    b = _looks.looks_of(drawing("blk-b")).phash
    near_a = bytes([a[0] ^ 0b111]) + a[1:]  # 3 bits apart
    monkeypatch.setattr(_looks, "_BLOCK", 2)  # one left hash per block
    assert _looks.near_pairs([b, a, b], [b, near_a]) == [(0, 0), (1, 1), (2, 0)]
    assert _looks.near_pairs([a, b, near_a]) == [(0, 2)]
    assert _looks.distance(a, near_a) == 3


def test_one_pixel_resizes_and_jpeg_copies_of_demo_drawings_stay_within_the_threshold():
    for k in range(60):
        a = drawing(f"rs-{k}")
        base = _looks.looks_of(a).phash
        for size in ((SIZE - 1, SIZE - 1), (SIZE + 1, SIZE + 1)):
            for method in (Image.Resampling.LANCZOS, Image.Resampling.NEAREST, Image.Resampling.BICUBIC):
                copy = _looks.looks_of(a.resize(size, method)).phash
                assert _looks.distance(base, copy) <= _looks.NEAR_DUPLICATE_BITS, (k, size, method)
