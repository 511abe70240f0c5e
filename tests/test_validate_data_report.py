"""The validate-data HTML report: its content, and what a person sees in a browser.

The browser check renders the report in headless Chromium (Debian package `chromium`)
and looks at the pixels: the verdict banner, the histogram bars and an error's thumbnail
must be on screen. It skips only when Chromium is absent and CI is unset; in CI it runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from components.validate_data.core import CODES
from tests.test_validate_data import Run, fenced, line, png, row, write_lines

GREEN = (0, 200, 0)  # the colour of the image of the over-long row: its thumbnail must show


def make_report(tmp_path: Path) -> tuple[Path, object]:
    folder = tmp_path / "data"
    for i in range(6):
        png(folder / f"d{i}.png", size=(64 + 32 * i, 48 + 16 * i), color=(200, 30 + 30 * i, 30))
    png(folder / "big.png", size=(1024, 1024), color=GREEN)
    png(folder / "tiny.png", size=(8, 8))
    rows = [line(row(f"find the holes {i}", [f"d{i % 6}.png"], answer=fenced(i))) for i in range(20)]
    rows += [
        "{not json",
        line(row("too many tokens", ["big.png"])),
        line(row("tiny", ["tiny.png"])),
        line(row("escape <b>bold</b>", ["../../etc/passwd"])),
    ]
    path = write_lines(folder / "train.jsonl", rows)
    run = Run(tmp_path / "out")
    report = tmp_path / "out" / "report.html"
    result = run([path], max_invalid_fraction=0.25, max_length=600, report_out=str(report))
    return report, result


def test_report_holds_counts_histograms_and_examples(tmp_path):
    report, result = make_report(tmp_path)
    assert result.report == str(report)
    html = report.read_text(encoding="utf-8")
    assert "PASSED" in html and "16.7% invalid" in html
    for code in CODES:
        assert f"<code>{code}</code>" in html  # every check has a row, zero or not
    assert html.count("<rect") >= 2 and "max_length 600" in html  # token histogram with the limit
    assert html.count("<circle") == 6  # one dot per distinct image size
    assert "train.jsonl:21" in html and "train.jsonl:22" in html and "train.jsonl:24" in html
    assert html.count("data:image/jpeg;base64,") == 2  # thumbnails of big.png (E_TOKENS) and tiny.png (E_IMAGE_SIZE)
    assert "&lt;b&gt;bold&lt;/b&gt;" in html and "<b>bold</b>" not in html  # row text is escaped
    assert "<script" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


def test_report_renders_in_chromium(tmp_path):
    browser = _chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is required in CI: apt-get install -y chromium")
        pytest.skip("chromium not installed (apt-get install -y chromium)")
    report, _ = make_report(tmp_path)
    shot = tmp_path / "report.png"
    cmd = [
        browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1100,2400", f"--screenshot={shot}", report.as_uri(),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert shot.is_file(), proc.stderr[-2000:]
    if os.environ.get("VALIDATE_REPORT_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["VALIDATE_REPORT_SCREENSHOT"])
    img = Image.open(shot).convert("RGB")
    assert img.size == (1100, 2400)
    colors = img.getcolors(maxcolors=1 << 20)
    count = {c: n for n, c in colors}

    def near(target, tol=12):
        return sum(n for c, n in count.items() if all(abs(a - b) <= tol for a, b in zip(c, target)))

    assert near((0xE6, 0xF4, 0xEA), 3) > 2000  # the green "PASSED" banner
    assert near((0x1A, 0x73, 0xE8), 20) > 300  # blue histogram bars and size dots
    assert near(GREEN, 30) > 500  # the E_TOKENS example's thumbnail (96x96 px)
    assert len(colors) > 50  # text and charts, not a blank or error page
