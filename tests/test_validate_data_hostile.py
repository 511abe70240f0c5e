"""validate-data on hostile and careless input (issue #21): no silent last-wins, no hangs,
no tracebacks, nothing lost.

Duplicate JSON keys, re-validating a cleaned set into its own folder, truncated and
16-bit images, an HTTP server that trickles its headers, and a 13300x13300 PNG.
"""

from __future__ import annotations

import json
import socketserver
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from components.validate_data import _report, core
from components.validate_data.types import CODES, DataError
from tests.test_validate_data import Run, fenced, good_rows, line, png, read_jsonl, row, write_lines

CLI = [sys.executable, "-m", "components.validate_data"]


@pytest.fixture
def data(tmp_path) -> Path:
    """A dataset folder with four good images."""
    folder = tmp_path / "data"
    for i in range(4):
        png(folder / "img" / f"d{i}.png", color=(i * 60, 100, 255 - i * 60))
    return folder


@pytest.fixture
def run(tmp_path) -> Run:
    return Run(tmp_path / "out")


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def good_lines() -> list[str]:
    return [line(r) for r in good_rows()]


# --- 1. duplicate keys: quarantined, never last-wins --------------------------------

ANSWER = json.dumps(fenced(0))
DUPLICATE_KEY_LINES = {  # "ANSWER" stands for a good fenced answer
    "messages": (
        '{"messages": [{"role": "user", "content": "<image>old"}, {"role": "assistant", "content": ANSWER}], '
        '"messages": [{"role": "user", "content": "<image>new"}, {"role": "assistant", "content": ANSWER}], '
        '"images": ["img/d0.png"]}'
    ).replace("ANSWER", ANSWER),
    "role": (
        '{"messages": [{"role": "system", "role": "user", "content": "<image>q"}, '
        '{"role": "assistant", "content": ANSWER}], "images": ["img/d0.png"]}'
    ).replace("ANSWER", ANSWER),
    "content": (
        '{"messages": [{"role": "user", "content": "<image>ignore me", "content": "<image>q"}, '
        '{"role": "assistant", "content": ANSWER}], "images": ["img/d0.png"]}'
    ).replace("ANSWER", ANSWER),
}


@pytest.mark.parametrize("key", list(DUPLICATE_KEY_LINES))
def test_duplicate_key_is_quarantined_and_named(data, run, key):
    bad = DUPLICATE_KEY_LINES[key]
    assert json.loads(bad)  # plain json.loads takes it: the last one silently wins
    path = write_lines(data / "train.jsonl", good_lines()[:2] + [bad] + good_lines()[2:])
    result = run([path], max_invalid_fraction=0.5, task="detection")
    assert [(i.line, i.code) for i in result.issues] == [(3, "E_DUPLICATE_KEY")]
    message = str(result.issues[0])
    assert f"{path}:3: E_DUPLICATE_KEY" in message and repr(key) in message and "remove" in message
    assert run.quarantined()[0]["raw"] == bad  # the line is kept whole in the quarantine
    train, evals = run.rows()
    assert len(train) + len(evals) == 4  # the other rows are kept


def test_duplicate_key_code_is_listed_after_the_json_check():
    codes = list(CODES)
    assert codes.index("E_DUPLICATE_KEY") == codes.index("E_JSON") + 1
    assert "key" in CODES["E_DUPLICATE_KEY"]


def test_same_key_in_different_objects_is_not_a_duplicate(data, run):
    path = write_lines(data / "train.jsonl", good_lines())  # every message has its own role and content
    assert run([path]).counts["n_valid"] == 4


# --- 2. outputs that overlap the inputs: refused before anything is written -----------


def snapshot_tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_revalidating_a_clean_set_into_its_own_folder_is_refused(data, run):
    run([write_lines(data / "train.jsonl", good_lines())])
    before = snapshot_tree(run.train.parent)
    with pytest.raises(DataError) as info:
        run([run.train / "data.jsonl"])
    message = str(info.value)
    assert str(run.train / "data.jsonl") in message and str(run.train) in message
    assert "another folder" in message
    assert snapshot_tree(run.train.parent) == before  # nothing written, nothing lost


def test_quarantine_as_input_is_refused(data, run):
    rows = good_lines() + ["{oops"]
    run([write_lines(data / "train.jsonl", rows)], max_invalid_fraction=0.5)
    before = snapshot_tree(run.train.parent)
    with pytest.raises(DataError, match="quarantine"):
        run([run.quarantine], max_invalid_fraction=1.0)
    assert snapshot_tree(run.train.parent) == before


def test_eval_output_as_eval_input_is_refused(data, run):
    run([write_lines(data / "train.jsonl", good_lines())])
    before = snapshot_tree(run.train.parent)
    with pytest.raises(DataError, match="another folder"):
        run([data / "train.jsonl"], eval_files=[str(run.eval / "data.jsonl")])
    assert snapshot_tree(run.train.parent) == before


def test_image_inside_an_output_folder_is_refused(data, run, tmp_path):
    run([write_lines(data / "train.jsonl", good_lines())])
    image = next((run.train / "images").iterdir())
    other = write_lines(tmp_path / "elsewhere" / "train.jsonl", good_lines() + [line(row("q", [str(image)]))])
    before = snapshot_tree(run.train.parent)
    with pytest.raises(DataError) as info:
        run([other])
    assert f"{other}:5" in str(info.value) and str(image) in str(info.value)
    assert snapshot_tree(run.train.parent) == before


def test_same_train_and_eval_folder_is_refused(data, tmp_path):
    path = write_lines(data / "train.jsonl", good_lines())
    out = tmp_path / "out"
    with pytest.raises(DataError, match="another folder"):
        core.validate_data([str(path)], str(out), str(out), str(tmp_path / "q.jsonl"))
    assert not out.exists()


def test_output_next_to_the_input_is_allowed(data):
    path = write_lines(data / "train.jsonl", good_lines())
    result = Run(data / "validated")([path])  # the output folder is inside the input's folder: fine
    assert result.counts["n_valid"] == 4


def test_cli_refuses_to_revalidate_into_its_own_out(data, tmp_path):
    out = tmp_path / "out"
    first = subprocess.run(
        CLI + [str(write_lines(data / "train.jsonl", good_lines())), "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    before = snapshot_tree(out)
    for data_file in (out / "train" / "data.jsonl", out / "eval" / "data.jsonl", out / "quarantine.jsonl"):
        again = subprocess.run(CLI + [str(data_file), "--out", str(out)], capture_output=True, text=True, timeout=120)
        assert again.returncode == 1
        assert "Traceback" not in again.stderr and "SameFileError" not in again.stderr
        assert str(data_file) in again.stderr and "another folder" in again.stderr
        assert snapshot_tree(out) == before  # the report is not deleted either


# --- 3. images are decoded in full ---------------------------------------------------


def noise_jpeg(path: Path, size=(256, 192)) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.effect_noise(size, 40).convert("RGB").save(path, "JPEG", quality=90)
    return path.read_bytes()


@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_truncated_jpeg_is_unreadable(data, run, keep):
    full = noise_jpeg(data / "full.jpg")
    (data / "cut.jpg").write_bytes(full[: int(len(full) * keep)])
    with Image.open(data / "cut.jpg") as img:
        img.verify()  # the header check alone passes it
    path = write_lines(data / "train.jsonl", good_lines() + [line(row("q", ["cut.jpg"]))])
    result = run([path], max_invalid_fraction=0.5)
    assert [(i.line, i.code) for i in result.issues] == [(5, "E_IMAGE_UNREADABLE")]
    assert "cut.jpg" in result.issues[0].message and "truncated" in result.issues[0].message


def test_corrupt_png_data_is_unreadable(data, run):
    img = Image.effect_noise((128, 128), 40).convert("RGB")
    img.save(data / "ok.png")
    raw = bytearray((data / "ok.png").read_bytes())
    start = raw.index(b"IDAT") + 4
    end = start + struct.unpack(">I", raw[start - 8 : start - 4])[0]
    raw[start + 20 : end] = bytes(end - start - 20)  # zeroed compressed data ...
    raw[end : end + 4] = struct.pack(">I", zlib.crc32(bytes(raw[start - 4 : end])))  # ... with a valid CRC
    (data / "bad.png").write_bytes(bytes(raw))
    with Image.open(data / "bad.png") as check:
        check.verify()  # chunk CRCs are fine: only decoding finds it
    path = write_lines(data / "train.jsonl", good_lines() + [line(row("q", ["bad.png"]))])
    result = run([path], max_invalid_fraction=0.5)
    assert [(i.line, i.code) for i in result.issues] == [(5, "E_IMAGE_UNREADABLE")]


def test_sixteen_bit_png_is_converted_to_eight_bit(data, run):
    Image.fromarray(np.full((40, 50), 32768, dtype=np.uint16)).save(data / "g16.png")
    with Image.open(data / "g16.png") as img:
        assert img.mode == "I;16" and img.convert("RGB").getpixel((0, 0)) == (255, 255, 255)  # white as is
    path = write_lines(data / "train.jsonl", good_lines() + [line(row("sixteen", ["g16.png"]))])
    result = run([path])
    assert result.counts["n_valid"] == 5
    for out_dir, rows in zip((run.train, run.eval), run.rows()):
        for r in rows:
            if r["messages"][0]["content"].endswith("sixteen"):
                with Image.open(out_dir / r["images"][0]) as img:  # what training reads
                    assert img.mode == "L" and img.size == (50, 40)
                    assert img.convert("RGB").getpixel((0, 0)) == (128, 128, 128)
                    assert r["images"][0].endswith(".png")


def test_sixteen_bit_conversion_keeps_the_gradient(data, run):
    ramp = np.tile(np.arange(0, 65536, 256, dtype=np.uint16), (32, 1))  # 256 columns, 0 .. 65280
    Image.fromarray(ramp).save(data / "ramp.png")
    path = write_lines(data / "train.jsonl", good_lines() + [line(row("ramp", ["ramp.png"]))])
    run([path])
    out = [
        d / r["images"][0] for d, rows in zip((run.train, run.eval), run.rows()) for r in rows
        if r["messages"][0]["content"].endswith("ramp")
    ]  # fmt: skip
    with Image.open(out[0]) as img:
        assert list(np.asarray(img)[0]) == list(range(256))


# --- 4. a total deadline on every download, headers included ------------------------


@pytest.fixture
def trickler():
    """A local server that sends its response headers one byte every 0.2 s (~50 s for all), for up to 60 s."""
    stop = threading.Event()

    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            self.request.recv(65536)
            head = b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nX-Slow: " + b"a" * 200
            give_up = time.monotonic() + 60
            for byte in head:
                if stop.wait(0.2) or time.monotonic() > give_up:
                    return
                try:
                    self.request.sendall(bytes([byte]))
                except OSError:
                    return

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/slow-headers.png"
    stop.set()
    server.shutdown()
    server.server_close()


def test_headers_trickled_byte_by_byte_are_cut_at_the_timeout(tmp_path, run, trickler):
    path = write_lines(tmp_path / "train.jsonl", [line(row(f"q{i}")) for i in range(4)] + [line(row("s", [trickler]))])
    start = time.monotonic()
    result = run([path], max_invalid_fraction=0.5, fetch_timeout=1.0)
    elapsed = time.monotonic() - start
    assert [(i.line, i.code) for i in result.issues] == [(5, "E_IMAGE_FETCH")]
    assert "1 s" in result.issues[0].message and trickler in result.issues[0].message
    # a hang guard: cut at ~1-2 s; without the total deadline the headers take ~50 s
    assert elapsed < 25.0, f"took {elapsed:.1f} s with fetch_timeout 1 s"


# --- 5. a huge image: quarantined from its header, no full decode, bounded thumbnail --


def solid_png(path: Path, side: int) -> Path:
    """Writes a side x side RGB PNG of one colour, streaming (never holds the pixels)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    comp, parts = zlib.compressobj(9), []
    scanline = b"\x00" + b"\x10\x20\x30" * side
    for _ in range(side):
        parts.append(comp.compress(scanline))
    parts.append(comp.flush())
    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", b"".join(parts)) + chunk(b"IEND", b"")
    )
    return path


@pytest.fixture(scope="module")
def huge_png(tmp_path_factory) -> Path:
    return solid_png(tmp_path_factory.mktemp("huge") / "huge.png", 13300)


def test_thumbnail_of_a_huge_png_is_not_decoded(huge_png, monkeypatch):
    decoded = []
    monkeypatch.setattr(Image.Image, "load", lambda self: decoded.append(self.size))
    note = _report._thumb(huge_png)["note"]
    assert "too large to preview" in note and "13300" in note
    assert decoded == []


def test_huge_png_is_a_size_error_with_bounded_memory(huge_png, tmp_path):
    folder = tmp_path / "data"
    for i in range(4):
        png(folder / "img" / f"d{i}.png", color=(i * 60, 100, 255 - i * 60))
    path = write_lines(folder / "train.jsonl", good_lines() + [line(row("q", [str(huge_png)]))])
    out = tmp_path / "out"
    script = (
        "import re, sys\n"
        "from components.validate_data.__main__ import main\n"
        "rc = main(sys.argv[1:])\n"
        # VmHWM (this program's peak RSS) starts anew at exec; ru_maxrss would carry the forking pytest's size
        "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)\n"
        "print('maxrss_kb', hwm)\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(path), "--out", str(out), "--max-invalid-fraction", "0.5"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "E_IMAGE_SIZE: 1" in proc.stdout
    quarantined = read_jsonl(out / "quarantine.jsonl")
    assert [(q["line"], q["code"]) for q in quarantined] == [(5, "E_IMAGE_SIZE")]
    assert "13300x13300" in quarantined[0]["message"]
    assert "too large to preview" in (out / "report.html").read_text(encoding="utf-8")
    maxrss_mb = int(proc.stdout.split("maxrss_kb")[1].split()[0]) / 1024
    assert maxrss_mb < 400, f"peak RSS {maxrss_mb:.0f} MB"  # the pixels alone would be 700 MB


# --- 6. lone surrogates stay an encoding error ---------------------------------------


def test_lone_surrogate_is_still_an_encoding_error(data, run):
    bad = '{"messages": [{"role": "user", "content": "\\ud800"}, {"role": "assistant", "content": "a"}]}'
    path = write_lines(data / "train.jsonl", good_lines() + [bad])
    result = run([path], max_invalid_fraction=0.5)
    assert [(i.line, i.code) for i in result.issues] == [(5, "E_ENCODING")]
