"""`vlm-lora import coco|label-studio`: exports in each tool's own format become detection rows.

The fixtures are written in the tools' real export formats (COCO's instances JSON; Label Studio's
full JSON and JSON-MIN, percent coordinates with original_width / original_height); the COCO file is
read back with pycocotools, and every imported box, turned back into pixels, equals the export's box
within the convention's rounding (half a norm1000 unit: width / 2000 px). The rows then pass
validate-data's detection checks in norm1000, each carrying its source record.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from components.common.boxes import to_pixels
from components.common.provenance import ORIGIN_KEY
from components.validate_data._import import ImportFailure, import_file, main
from components.validate_data.core import validate_data
from components.validate_data.types import DataError

SIZES = {"a.png": (640, 480), "b.png": (320, 200), "c.png": (500, 500), "d.png": (300, 300)}


def _images(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for k, (name, size) in enumerate(SIZES.items()):
        Image.new("RGB", size, (40 * k, 120, 200)).save(folder / name)
    return folder


def _coco() -> dict:
    images = [{"id": 10 + k, "file_name": name, "width": w, "height": h, "license": 1, "date_captured": ""}
              for k, (name, (w, h)) in enumerate(SIZES.items())]  # fmt: skip
    images.append({"id": 99, "file_name": "gone.png", "width": 100, "height": 100})
    boxes = [(10, 1, [12.5, 30.0, 200.25, 100.0]), (10, 2, [300, 200, 40.4, 60.6]), (11, 1, [0, 0, 320, 200]),
             (12, 2, [400, 400, 150, 50]),  # x2 = 550 > 500: outside its image
             (13, 1, [5, 5, 100, 100])]  # fmt: skip
    annotations = [{"id": 100 + i, "image_id": img, "category_id": cat, "bbox": bbox, "area": bbox[2] * bbox[3],
                    "iscrowd": 0, "segmentation": []} for i, (img, cat, bbox) in enumerate(boxes)]  # fmt: skip
    categories = [{"id": 1, "name": "bolt", "supercategory": "part"}, {"id": 2, "name": "nut", "supercategory": "part"}]
    return {"info": {"description": "fixture", "version": "1.0", "year": 2026}, "licenses": [{"id": 1, "name": "x"}],
            "images": images, "annotations": annotations, "categories": categories}  # fmt: skip


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _pixels(row: dict, images: Path) -> list[tuple[str, list[float]]]:
    answer = json.loads(row["messages"][1]["content"].removeprefix("```json\n").removesuffix("\n```"))
    size = SIZES[Path(row["images"][0]).name]
    return [(f["label"], to_pixels(f["bbox_2d"], "norm1000", size)) for f in answer]


def test_coco_import_round_trips_through_pycocotools(tmp_path):
    from pycocotools.coco import COCO

    images = _images(tmp_path / "images")
    (tmp_path / "instances.json").write_text(json.dumps(_coco()))
    out = tmp_path / "rows" / "train.jsonl"
    result = import_file("coco", tmp_path / "instances.json", images, out)
    assert (result.rows, result.quarantined, result.boxes) == (3, 2, 4)
    quarantined = {q["record"]: q["code"] for q in _read(Path(f"{out}.quarantine.jsonl"))}
    assert quarantined == {"image_id=12": "I_BOX_OUTSIDE", "image_id=99": "I_IMAGE_MISSING"}

    coco = COCO(str(tmp_path / "instances.json"))  # the tool's own reader
    for row in _read(out):
        image_id = int(row[ORIGIN_KEY]["record"].removeprefix("image_id="))
        w = coco.imgs[image_id]["width"]
        want = sorted(
            (coco.cats[a["category_id"]]["name"], a["bbox"]) for a in coco.loadAnns(coco.getAnnIds([image_id]))
        )
        got = sorted(_pixels(row, images))
        assert [label for label, _ in got] == [label for label, _ in want]
        for (_, box), (_, (x, y, bw, bh)) in zip(got, want):
            assert box == pytest.approx([x, y, x + bw, y + bh], abs=w / 2000 + 1e-9)
    assert json.loads(Path(f"{out}.boxes.json").read_text())["convention"] == "norm1000"

    clean = validate_data([str(out)], str(tmp_path / "v/train"), str(tmp_path / "v/eval"), str(tmp_path / "v/q.jsonl"),
                          task="detection", box_convention="norm1000")  # fmt: skip
    assert (clean.counts["n_valid"], clean.counts["n_invalid"]) == (3, 0)
    kept = [json.loads(line) for s in ("train", "eval") for line in (tmp_path / "v" / s / "data.jsonl").open()]
    assert {r[ORIGIN_KEY]["record"] for r in kept} == {"image_id=10", "image_id=11", "image_id=13"}


def test_coco_ids_that_do_not_resolve_are_named_errors(tmp_path):
    bad = _coco()
    bad["annotations"][1]["category_id"] = 7
    (tmp_path / "c.json").write_text(json.dumps(bad))
    with pytest.raises(ImportFailure, match=r"annotations\[1\] \(id 101\): category_id 7 is not an id in 'categories'"):
        import_file("coco", tmp_path / "c.json", _images(tmp_path / "i"), tmp_path / "o.jsonl")
    bad = _coco()
    bad["annotations"][0]["image_id"] = 5
    (tmp_path / "i.json").write_text(json.dumps(bad))
    with pytest.raises(ImportFailure, match="image_id 5 is not an id in 'images'"):
        import_file("coco", tmp_path / "i.json", tmp_path / "i", tmp_path / "o.jsonl")


def _region(x: float, y: float, w: float, h: float, label: str, size: tuple[int, int], **extra) -> dict:
    return {"x": x, "y": y, "width": w, "height": h, "rotation": 0, "rectanglelabels": [label],
            "original_width": size[0], "original_height": size[1], **extra}  # fmt: skip


def _label_studio_full(regions: dict[str, list[dict]]) -> list[dict]:
    tasks = []
    for k, (name, items) in enumerate(regions.items()):
        result = [{"id": f"r{k}{i}", "type": "rectanglelabels", "from_name": "label", "to_name": "image",
                   "original_width": it["original_width"], "original_height": it["original_height"],
                   "image_rotation": 0, "origin": "manual",
                   "value": {key: it[key] for key in ("x", "y", "width", "height", "rotation", "rectanglelabels")}}
                  for i, it in enumerate(items)]  # fmt: skip
        tasks.append({"id": 1 + k, "data": {"image": f"/data/upload/1/8f3a2c{k}-{name}"}, "meta": {},
                      "annotations": [{"id": 20 + k, "completed_by": 1, "result": result, "was_cancelled": False,
                                       "ground_truth": False, "lead_time": 3.2}], "predictions": []})  # fmt: skip
    return tasks


def _label_studio_min(regions: dict[str, list[dict]]) -> list[dict]:
    return [{"image": f"/data/upload/1/8f3a2c{k}-{name}", "id": 1 + k, "label": items, "annotator": 1,
             "annotation_id": 20 + k, "created_at": "2026-12-01T10:00:00Z", "updated_at": "2026-12-01T10:00:00Z",
             "lead_time": 3.2} for k, (name, items) in enumerate(regions.items())]  # fmt: skip


REGIONS = {
    "a.png": [_region(10.0, 12.5, 25.0, 30.0, "bolt", SIZES["a.png"]), _region(50, 50, 10, 10, "nut", SIZES["a.png"])],
    "b.png": [_region(0, 0, 100, 100, "nut", SIZES["b.png"])],
    "c.png": [_region(80, 80, 30, 10, "bolt", SIZES["c.png"])],  # x + width = 110 %: outside
    "d.png": [_region(10, 10, 20, 20, "washer", SIZES["d.png"])],  # not in --labels
}


@pytest.mark.parametrize("form", [_label_studio_full, _label_studio_min])
def test_label_studio_exports_round_trip(tmp_path, form, capsys):
    images = _images(tmp_path / "images")
    (tmp_path / "export.json").write_text(json.dumps(form(REGIONS)))
    out = tmp_path / "rows.jsonl"
    argv = ["label-studio", str(tmp_path / "export.json"), "--images", str(images), "--out", str(out)]
    assert main([*argv, "--labels", "bolt,nut"]) == 0
    assert "2 rows (3 boxes, norm1000)" in capsys.readouterr().out
    quarantined = {q["image"].rsplit("-", 1)[1]: q["code"] for q in _read(Path(f"{out}.quarantine.jsonl"))}
    assert quarantined == {"c.png": "I_BOX_OUTSIDE", "d.png": "I_LABEL"}
    for row in _read(out):
        name = Path(row["images"][0]).name
        w, h = SIZES[name]
        want = [(r["rectanglelabels"][0], [r["x"] * w / 100, r["y"] * h / 100, (r["x"] + r["width"]) * w / 100,
                 (r["y"] + r["height"]) * h / 100]) for r in REGIONS[name]]  # fmt: skip
        for (label, box), (want_label, want_box) in zip(_pixels(row, images), want):
            assert label == want_label and box == pytest.approx(want_box, abs=w / 2000 + 1e-9)
        assert row[ORIGIN_KEY]["record"].startswith("task=")


def test_label_studio_export_of_another_labelling_type_is_refused(tmp_path):
    polygons = [{"image": "/data/upload/1/x-a.png", "id": 4, "label": [{"points": [[1, 2], [3, 4], [5, 1]],
                 "polygonlabels": ["bolt"], "original_width": 640, "original_height": 480}]}]  # fmt: skip
    (tmp_path / "poly.json").write_text(json.dumps(polygons))
    with pytest.raises(ImportFailure, match="task 4 region 0 is polygonlabels region, not rectanglelabels"):
        import_file("label-studio", tmp_path / "poly.json", _images(tmp_path / "i"), tmp_path / "o.jsonl")


def test_imported_rows_edited_since_lose_their_trust(tmp_path):
    images = _images(tmp_path / "images")
    (tmp_path / "instances.json").write_text(json.dumps(_coco()))
    out = tmp_path / "rows" / "train.jsonl"
    import_file("coco", tmp_path / "instances.json", images, out)
    rows = _read(out)
    rows[0][ORIGIN_KEY]["file"] = "/etc/passwd"  # an edit after the import: the seal no longer lists these bytes
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match="E_RESERVED_KEY: 3"):
        validate_data([str(out)], str(tmp_path / "v/train"), str(tmp_path / "v/eval"), str(tmp_path / "v/q.jsonl"),
                      task="detection", box_convention="norm1000")  # fmt: skip


def test_converted_import_keeps_its_origins(tmp_path):
    from components.validate_data._convert import convert_file

    (tmp_path / "instances.json").write_text(json.dumps(_coco()))
    out = tmp_path / "rows" / "train.jsonl"
    import_file("coco", tmp_path / "instances.json", _images(tmp_path / "images"), out)
    px = tmp_path / "rows" / "px.jsonl"
    convert_file(out, px, to="pixel")  # the import's seal is checked, and the converted rows sealed in turn
    clean = validate_data([str(px)], str(tmp_path / "v/train"), str(tmp_path / "v/eval"), str(tmp_path / "v/q.jsonl"),
                          task="detection", box_convention="pixel")  # fmt: skip
    assert (clean.counts["n_valid"], clean.counts["n_invalid"]) == (3, 0)
    kept = [json.loads(line) for s in ("train", "eval") for line in (tmp_path / "v" / s / "data.jsonl").open()]
    assert {r[ORIGIN_KEY]["record"] for r in kept} == {"image_id=10", "image_id=11", "image_id=13"}
