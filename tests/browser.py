"""Headless Chromium for the report tests: render an HTML file to a PNG screenshot.

Debian's `chromium` package (CI installs it, `.ci/run`). Without it a test skips, except in
CI (`CI` set), where a missing browser is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image


def chromium() -> str | None:
    """Returns the path of a Chromium / Chrome executable, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


def require_chromium() -> str:
    """Returns Chromium's path; skips the test without it (fails in CI)."""
    browser = chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is required in CI: apt-get install -y chromium")
        pytest.skip("chromium not installed (apt-get install -y chromium)")
    return browser


def screenshot(page: Path, out: Path, size: tuple[int, int] = (1100, 2400)) -> Image.Image:
    """Renders `page` in headless Chromium (no network, a fresh profile) to `out`; returns it as RGB.

    Set `REPORT_SCREENSHOT_DIR` to keep a copy of each screenshot (to look at it).
    """
    browser = require_chromium()
    cmd = [
        browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
        f"--user-data-dir={out.parent / (out.stem + '-profile')}", f"--window-size={size[0]},{size[1]}",
        f"--screenshot={out}", page.as_uri(),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert out.is_file(), proc.stderr[-2000:]
    if keep := os.environ.get("REPORT_SCREENSHOT_DIR"):
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out, Path(keep) / out.name)
    with Image.open(out) as img:
        assert img.format == "PNG"
        shot = img.convert("RGB")
    assert shot.size == size
    return shot


def pixels_near(img: Image.Image, target: tuple[int, int, int], tol: int = 12) -> int:
    """Counts the pixels within `tol` of `target` on every channel."""
    colors = img.getcolors(maxcolors=1 << 22) or []
    return sum(n for n, c in colors if all(abs(a - b) <= tol for a, b in zip(c, target)))


def assert_not_blank(img: Image.Image, min_colors: int = 50) -> None:
    """Asserts a screenshot shows a page with text and figures, not a blank or an error page."""
    colors = img.getcolors(maxcolors=1 << 22) or []
    assert len(colors) > min_colors, f"only {len(colors)} colours: a blank page?"
    white = pixels_near(img, (255, 255, 255), 2)
    assert white < img.width * img.height * 0.985, "the page is almost all white"
