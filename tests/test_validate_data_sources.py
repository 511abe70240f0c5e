"""validate-data on images from http(s), gs:// (GCS emulator), base64, and on bad input files."""

from __future__ import annotations

import base64
import http.server
import io
import json
import socket
import subprocess
import sys
import threading
import time

import pytest
from PIL import Image

from components.validate_data.types import DataError
from tests.test_validate_data import Run, fenced, line, png, read_jsonl, row, write_lines


def png_bytes(size=(40, 30), color=(10, 200, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture
def run(tmp_path) -> Run:
    return Run(tmp_path / "out")


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


# --- http(s) -----------------------------------------------------------------------


@pytest.fixture
def web():
    """A local web server: /ok.png, /other.png, 404 elsewhere, /slow trickles for 30 s."""
    files = {"/ok.png": png_bytes(), "/other.png": png_bytes(color=(1, 2, 3)), "/junk.png": b"not an image"}
    stop = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.path == "/slow":
                self.send_response(200)
                self.end_headers()
                while not stop.wait(0.2):  # a byte every 0.2 s: never done within the timeout
                    try:
                        self.wfile.write(b"x")
                        self.wfile.flush()
                    except OSError:
                        return
                return
            body = files.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", files
    stop.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def silent_port():
    """A port that accepts TCP connections (kernel backlog) but never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield sock.getsockname()[1]
    sock.close()


def test_http_images_are_fetched_and_copied_in(tmp_path, run, web):
    url, files = web
    rows = [row(f"q{i}", [f"{url}/ok.png"]) for i in range(3)] + [row("q3", [f"{url}/other.png"])]
    path = write_lines(tmp_path / "data" / "train.jsonl", [line(r) for r in rows])
    result = run([path])
    assert result.counts["n_invalid"] == 0 and result.counts["n_valid"] == 4
    train, evals = run.rows()
    for out_dir, out_rows in ((run.train, train), (run.eval, evals)):
        for r in out_rows:
            ref = r["images"][0]
            assert ref.startswith("images/") and ref.endswith(".png")
            assert (out_dir / ref).read_bytes() in (files["/ok.png"], files["/other.png"])


def test_http_errors_are_quarantined(tmp_path, run, web):
    url, _ = web
    good = [line(row(f"q{i}", [f"{url}/ok.png"])) for i in range(4)]
    bad = [line(row("missing", [f"{url}/nope.png"])), line(row("junk", [f"{url}/junk.png"]))]
    path = write_lines(tmp_path / "train.jsonl", good + bad)
    result = run([path], max_invalid_fraction=0.5)
    assert [(i.line, i.code) for i in result.issues] == [(5, "E_IMAGE_MISSING"), (6, "E_IMAGE_UNREADABLE")]
    assert "HTTP 404" in result.issues[0].message and f"{url}/nope.png" in result.issues[0].message


def test_url_that_never_answers_times_out(tmp_path, run, silent_port):
    good = [line(row(f"q{i}")) for i in range(4)]
    bad = line(row("hang", [f"http://127.0.0.1:{silent_port}/a.png"]))
    path = write_lines(tmp_path / "train.jsonl", good + [bad])
    start = time.monotonic()
    result = run([path], max_invalid_fraction=0.5, fetch_timeout=1.0)
    assert time.monotonic() - start < 20  # a hang guard: cut at ~1-2 s; without the timeout it never ends
    assert [(i.line, i.code) for i in result.issues] == [(5, "E_IMAGE_FETCH")]
    assert "1 s" in result.issues[0].message


def test_url_that_trickles_is_cut_at_the_timeout(tmp_path, run, web):
    url, _ = web
    path = write_lines(
        tmp_path / "train.jsonl", [line(row(f"q{i}")) for i in range(4)] + [line(row("slow", [f"{url}/slow"]))]
    )
    start = time.monotonic()
    result = run([path], max_invalid_fraction=0.5, fetch_timeout=1.0)
    assert time.monotonic() - start < 20  # a hang guard: cut at ~1-2 s; without the timeout it never ends
    assert [(i.line, i.code) for i in result.issues] == [(5, "E_IMAGE_FETCH")]


# --- base64 ------------------------------------------------------------------------


def test_base64_images_are_decoded_and_copied_in(tmp_path, run):
    buf = io.BytesIO()
    Image.effect_noise((40, 30), 60).convert("RGB").save(buf, "PNG")  # noise: a few KB
    data = buf.getvalue()
    b64 = base64.b64encode(data).decode()
    assert len(b64) > 200  # ms-swift treats a long non-path string as bare base64
    rows = [row("uri", [f"data:image/png;base64,{b64}"]), row("bare", [b64]), row("plain")]
    path = write_lines(tmp_path / "train.jsonl", [line(r) for r in rows])
    result = run([path])
    assert result.counts["n_invalid"] == 0
    train, evals = run.rows()
    outs = [(d, r) for d, rs in ((run.train, train), (run.eval, evals)) for r in rs if r.get("images")]
    assert len(outs) == 2
    for out_dir, r in outs:
        assert r["images"][0].endswith(".png")
        assert (out_dir / r["images"][0]).read_bytes() == data


def test_bad_base64_is_unreadable(tmp_path, run):
    rows = [row(f"q{i}") for i in range(4)] + [row("bad", ["data:image/png;base64,!!!!"])]
    path = write_lines(tmp_path / "train.jsonl", [line(r) for r in rows])
    result = run([path], max_invalid_fraction=0.5)
    assert [(i.line, i.code) for i in result.issues] == [(5, "E_IMAGE_UNREADABLE")]


# --- gs:// through the GCS emulator -------------------------------------------------


@pytest.fixture(scope="module")
def gcs(gcs_emulator):
    """Bucket "data" on the shared GCS emulator (tests/conftest.py) holding a small
    dataset; yields (client, emulator URL)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    mp = pytest.MonkeyPatch()
    mp.setenv("no_proxy", "127.0.0.1,localhost")
    client = storage.Client(project="test", credentials=AnonymousCredentials())
    bucket = client.create_bucket("data")
    bucket.blob("set/img/a.png").upload_from_string(png_bytes(color=(9, 9, 9)))
    bucket.blob("set/img/b.png").upload_from_string(png_bytes(color=(99, 9, 9)))
    bucket.blob("other/secret.png").upload_from_string(png_bytes(color=(0, 0, 99)))
    rows = [row(f"g{i}", ["img/a.png" if i % 2 else "img/b.png"]) for i in range(4)]
    rows += [row("escape", ["../other/secret.png"]), row("absent", ["img/none.png"])]
    bucket.blob("set/train.jsonl").upload_from_string("\n".join(line(r) for r in rows) + "\n")
    yield client, gcs_emulator
    mp.undo()


def test_gs_images_are_downloaded_and_copied_in(tmp_path, run, gcs, monkeypatch):
    client, host = gcs
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", host)
    expected = client.bucket("data").blob("set/img/a.png").download_as_bytes()
    rows = [row(f"q{i}", ["gs://data/set/img/a.png"]) for i in range(3)]
    rows.append(row("absent", ["gs://data/set/img/none.png"]))
    path = write_lines(tmp_path / "train.jsonl", [line(r) for r in rows])
    result = run([path], max_invalid_fraction=0.3, fetch_timeout=10)
    assert [(i.line, i.code) for i in result.issues] == [(4, "E_IMAGE_MISSING")]
    assert "gs://data/set/img/none.png" in result.issues[0].message
    train, evals = run.rows()
    assert len(train) + len(evals) == 3
    for out_dir, out_rows in ((run.train, train), (run.eval, evals)):
        for r in out_rows:
            assert (out_dir / r["images"][0]).read_bytes() == expected


def test_gs_jsonl_resolves_relative_images_against_its_folder(run, gcs, monkeypatch):
    _, host = gcs
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", host)
    result = run(["gs://data/set/train.jsonl"], max_invalid_fraction=0.5, fetch_timeout=10)
    issues = [(i.file, i.line, i.code) for i in result.issues]
    assert issues == [
        ("gs://data/set/train.jsonl", 5, "E_IMAGE_PATH"),
        ("gs://data/set/train.jsonl", 6, "E_IMAGE_MISSING"),
    ]
    assert result.counts["n_valid"] == 4 and result.counts["n_images"] >= 2
    train, evals = run.rows()
    assert all((run.train / r["images"][0]).is_file() for r in train)


def test_missing_gs_jsonl_is_a_named_error(run, gcs, monkeypatch):
    _, host = gcs
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", host)
    with pytest.raises(DataError, match="gs://data/set/nope.jsonl"):
        run(["gs://data/set/nope.jsonl"])


# --- bad input files ---------------------------------------------------------------


def test_ten_megabyte_line_is_too_long(tmp_path, run):
    huge = line(row("x" * (10 * 1024 * 1024)))
    path = write_lines(tmp_path / "train.jsonl", [line(row(f"q{i}")) for i in range(4)] + [huge])
    result = run([path], max_invalid_fraction=0.5)
    assert [(i.line, i.code) for i in result.issues] == [(5, "E_TOO_LONG")]
    assert str(len(huge.encode())) in result.issues[0].message
    assert len(run.quarantined()[0]["raw"]) == 65536  # the first 64 KiB are kept, not 10 MB


def test_file_that_is_not_utf8_fails_with_a_named_error(tmp_path, run):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes("\n".join(line(row(f"café {i}")) for i in range(3)).encode("latin-1"))
    with pytest.raises(DataError) as info:
        run([path])
    assert "3 of 3 lines invalid" in str(info.value) and "E_ENCODING: 3" in str(info.value)
    assert f"{path}:1: E_ENCODING" in str(info.value)


def test_binary_file_does_not_crash(tmp_path, run):
    path = tmp_path / "image.jsonl"
    path.write_bytes(png_bytes(size=(300, 300)))
    with pytest.raises(DataError, match="lines invalid"):
        run([path])


def test_directory_instead_of_file_is_a_named_error(tmp_path, run):
    with pytest.raises(DataError, match="not found"):
        run([tmp_path])


def test_cli_runs_the_core_and_fails_on_policy(tmp_path):
    folder = tmp_path / "data"
    png(folder / "a.png")
    rows = [row(f"q{i}", ["a.png"], answer=fenced(i)) for i in range(6)]
    good = write_lines(folder / "train.jsonl", [line(r) for r in rows])
    bad = write_lines(folder / "bad.jsonl", [line(r) for r in rows] + ["{oops", line(row("q", ["../../etc/passwd"]))])
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "components.validate_data"]
    ok = subprocess.run(
        cmd + [str(good), "--out", str(out), "--task", "detection"], capture_output=True, text=True, timeout=120
    )
    assert ok.returncode == 0, ok.stderr
    assert "6 lines: 6 valid" in ok.stdout
    assert len(read_jsonl(out / "train" / "data.jsonl")) + len(read_jsonl(out / "eval" / "data.jsonl")) == 6
    assert (out / "report.html").is_file() and (out / "quarantine.jsonl").read_text() == ""

    failed = subprocess.run(cmd + [str(bad), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1
    assert "2 of 8 lines invalid" in failed.stderr
    assert f"{bad}:7: E_JSON" in failed.stderr and f"{bad}:8: E_IMAGE_PATH" in failed.stderr
    assert [json.loads(x)["line"] for x in (out / "quarantine.jsonl").read_text().splitlines()] == [7, 8]

    tolerated = subprocess.run(
        cmd + [str(bad), "--out", str(out), "--max-invalid-fraction", "0.25"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert tolerated.returncode == 0, tolerated.stderr
    assert "2 quarantined" in tolerated.stdout and "E_IMAGE_PATH: 1" in tolerated.stdout

    missing = subprocess.run(
        cmd + [str(folder / "nope.jsonl"), "--out", str(out)], capture_output=True, text=True, timeout=120
    )
    assert missing.returncode == 1 and "not found" in missing.stderr
