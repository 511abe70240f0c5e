"""validate-data logs its progress: images inspected and rows checked, rate-limited (components.common.progress)."""

from __future__ import annotations

from tests.test_validate_data import Run, good_rows, line, png, row, write_lines


def test_images_and_rows_get_a_start_and_an_end_line(tmp_path, capsys):
    for i in range(4):
        png(tmp_path / "data" / "img" / f"d{i}.png", color=(i * 60, 100, 255 - i * 60))
    rows = [*good_rows(6), row("a row whose image is missing", ["img/missing.png"], answer="[]")]
    train = write_lines(tmp_path / "data" / "train.jsonl", [line(r) for r in rows])
    Run(tmp_path / "out")([train], task="detection", max_invalid_fraction=1.0)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("validate-data: ")]
    # 4 distinct images and 6 rows (the row naming a missing file is refused before both); each: a start line, then done
    assert err[0] == "validate-data: images: 0 / 4 images (0 %)"
    assert err[1].startswith("validate-data: images: 4 / 4 images (100 %), ") and "done in" in err[1]
    assert err[2] == "validate-data: rows (tokens, boxes): 0 / 6 rows (0 %)"
    assert err[3].startswith("validate-data: rows (tokens, boxes): 6 / 6 rows (100 %), ") and "done in" in err[3]
    assert len(err) == 4
