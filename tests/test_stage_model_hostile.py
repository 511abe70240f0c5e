"""Hostile and careless input to stage-model (issue #21): named errors, no reads outside the
entry, no hangs on a dead stager's lock, nothing left half-written."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from components.stage_model import _gcs, _lock, transfer
from components.stage_model import entry as entry_module
from components.stage_model.__main__ import main
from components.stage_model.core import stage_model
from components.stage_model.entry import MANIFEST, verify_entry
from components.stage_model.errors import StageError
from tests.test_stage_model import make_model, sha

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def model(tmp_path) -> Path:
    return make_model(tmp_path / "src" / "tiny")


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def hashed(monkeypatch) -> list[Path]:
    """Every path sha256-hashed by the core, resolved (to prove nothing outside the entry is read)."""
    seen: list[Path] = []
    real = transfer.sha256_file

    def spy(path, *args, **kwargs):
        seen.append(Path(path).resolve())
        return real(path, *args, **kwargs)

    monkeypatch.setattr(entry_module, "sha256_file", spy)  # the entry checked
    monkeypatch.setattr(transfer, "sha256_file", spy)  # the source hashed
    return seen


def partials(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if ".partial-" in p.name]


def cli_env(extra_path: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in ([extra_path] if extra_path else []) + [ROOT])
    return env


# --- 1. manifest paths stay inside the entry ----------------------------------------------


def edit_manifest(entry: Path, rel: str, info: dict) -> None:
    manifest = json.loads((entry / MANIFEST).read_text())
    manifest["files"][rel] = info
    (entry / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    "make_rel",
    [
        lambda entry, secret: os.path.relpath(secret, entry),  # ../../../secret.txt
        lambda entry, secret: "sub/../" + os.path.relpath(secret, entry),
        lambda entry, secret: str(secret),  # absolute
        lambda entry, secret: "sub\\..\\secret.txt",
        lambda entry, secret: "C:/secret.txt",
        lambda entry, secret: "sub//secret.txt",
        lambda entry, secret: "./README.md",
        lambda entry, secret: "",
    ],
    ids=["dotdot", "inner-dotdot", "absolute", "backslash", "drive", "empty-segment", "dot", "empty"],
)
def test_manifest_path_outside_the_entry_is_refused(model, cache, tmp_path, hashed, make_rel):
    entry = Path(stage_model(str(model), str(cache)).entry)
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours\n")
    rel = make_rel(entry, secret)
    # a well-formed record of the outside file: today's check would read it and call the entry valid
    edit_manifest(entry, rel, {"size": secret.stat().st_size, "sha256": sha(secret), "crc32c": ""})
    hashed.clear()

    with pytest.raises(StageError) as info:
        stage_model(str(model), str(cache))
    msg = str(info.value)
    assert str(entry) in msg and repr(rel) in msg and "delete" in msg and "\n" not in msg
    assert secret.resolve() not in hashed
    assert all(p.is_relative_to(entry) or p.is_relative_to(model.resolve()) for p in hashed)

    valid, reason = verify_entry(entry)
    assert valid is False and repr(rel) in reason
    assert secret.resolve() not in hashed


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_symlink_out_of_the_entry_is_refused(model, cache, tmp_path, hashed, kind):
    entry = Path(stage_model(str(model), str(cache)).entry)
    outside = tmp_path / "outside"
    outside.mkdir()
    if kind == "file":  # same bytes as the real file: only the link gives it away
        shutil.copy(entry / "README.md", outside / "README.md")
        (entry / "README.md").unlink()
        (entry / "README.md").symlink_to(outside / "README.md")
        rel, target = "README.md", outside / "README.md"
    else:
        (outside / "notes.txt").write_text("outside\n")
        (entry / "sub").symlink_to(outside, target_is_directory=True)
        rel, target = "sub/notes.txt", outside / "notes.txt"
        edit_manifest(entry, rel, {"size": target.stat().st_size, "sha256": sha(target), "crc32c": ""})
    hashed.clear()

    with pytest.raises(StageError) as info:
        stage_model(str(model), str(cache))
    msg = str(info.value)
    assert str(entry) in msg and repr(rel) in msg and "outside the entry" in msg and "delete" in msg
    assert target.resolve() not in hashed
    assert verify_entry(entry)[0] is False


def test_symlinked_folder_in_an_incomplete_entry_is_not_written_through(model, cache, tmp_path):
    """Without a manifest the entry is repaired; a planted link must not send the copy elsewhere."""
    (model / "sub").mkdir()
    (model / "sub" / "x.txt").write_text("x\n")
    entry = Path(stage_model(str(model), str(cache)).entry)
    shutil.rmtree(entry)
    entry.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (entry / "sub").symlink_to(outside, target_is_directory=True)
    with pytest.raises(StageError, match="'sub/x.txt'.*outside the entry"):
        stage_model(str(model), str(cache))
    assert list(outside.iterdir()) == []


def test_cli_refuses_a_hostile_manifest_in_one_line(model, cache, tmp_path, capsys):
    entry = Path(stage_model(str(model), str(cache)).entry)
    edit_manifest(entry, "../../../../etc/passwd", {"size": 1, "sha256": "0" * 64, "crc32c": ""})
    assert main([str(model), "--cache", str(cache), "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("stage-model: error: cache entry ") and "'../../../../etc/passwd'" in err
    assert "\n" not in err


@pytest.mark.parametrize("rel", ["../../other/model.safetensors", "/etc/passwd", "a/../b"])
def test_gcs_manifest_path_outside_the_entry_is_refused(model, gcs_client, gcs_bucket, rel):
    cache = f"gs://{gcs_bucket}/models"
    entry = stage_model(str(model), cache).entry
    blob = gcs_client.bucket(gcs_bucket).blob(entry[len(f"gs://{gcs_bucket}/") :] + "/" + MANIFEST)
    manifest = json.loads(blob.download_as_bytes())
    manifest["files"][rel] = {"size": 1, "sha256": "0" * 64, "crc32c": "AAAAAA=="}
    blob.upload_from_string(json.dumps(manifest))
    with pytest.raises(StageError) as info:
        stage_model(str(model), cache)
    assert entry in str(info.value) and repr(rel) in str(info.value) and "delete" in str(info.value)
    assert verify_entry(entry)[0] is False


@pytest.mark.parametrize("name", ["../../../escape.txt", "/escape.txt", "sub//escape.txt"])
def test_source_file_names_outside_the_folder_are_refused(model, tmp_path, monkeypatch, name):
    """A gs:// (or hub) listing naming a path outside the folder: nothing is downloaded."""
    listing = {p.name: (p.stat().st_size, "AAAAAA==") for p in model.iterdir()}
    monkeypatch.setattr(_gcs, "list_source", lambda uri: {**listing, name: (1, "AAAAAA==")})
    monkeypatch.setattr(_gcs, "download", lambda *a, **k: pytest.fail("nothing may be downloaded"))
    with pytest.raises(StageError) as info:
        stage_model("gs://bucket/up/m", str(tmp_path / "c"))
    msg = str(info.value)
    assert msg.startswith("model source gs://bucket/up/m: ") and repr(name) in msg and "--ignore" in msg
    assert not (tmp_path / "c").exists()


# --- 2. a dead stager's lock and partial files ----------------------------------------------

_SLOW_STAGER = """
import shutil, sys, time
from pathlib import Path

real = shutil.copyfile

def slow_copy(src, dst, *args, **kwargs):
    if Path(src).name != "model.safetensors":
        return real(src, dst, *args, **kwargs)
    data = Path(src).read_bytes()
    with open(dst, "wb") as f:
        f.write(data[: len(data) // 2])
    Path(sys.argv[3]).write_text("half")  # the partial file is on disk: kill me now
    time.sleep(120)
    return real(src, dst, *args, **kwargs)

shutil.copyfile = slow_copy
from components.stage_model.core import stage_model
stage_model(sys.argv[1], sys.argv[2])
"""


def start_slow_stager(model: Path, cache: Path, tmp_path: Path) -> subprocess.Popen:
    script, ready = tmp_path / "slow_stager.py", tmp_path / "ready"
    script.write_text(_SLOW_STAGER)
    proc = subprocess.Popen([sys.executable, str(script), str(model), str(cache), str(ready)], cwd=ROOT, env=cli_env())
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None, "the slow stager exited early"
        assert time.monotonic() < deadline, "the slow stager never started copying"
        time.sleep(0.05)
    return proc


def test_lock_records_its_owner(model, cache, tmp_path):
    proc = start_slow_stager(model, cache, tmp_path)
    try:
        (lock,) = list(cache.rglob("*.lock"))
        held = json.loads(lock.read_text())
        assert held["host"] == socket.gethostname() and held["pid"] == proc.pid
        assert isinstance(held["proc_start"], int) and held["started"] <= time.time()
    finally:
        proc.kill()
        proc.wait()


def test_killed_stager_is_taken_over_at_once_and_its_partials_cleaned(model, cache, tmp_path):
    proc = start_slow_stager(model, cache, tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (lock,) = list(cache.rglob("*.lock"))
    entry = lock.with_name(lock.name[: -len(".lock")])
    assert partials(entry), "the killed stager should have left a partial file"

    start = time.monotonic()
    result = stage_model(str(model), str(cache), lock_wait_s=120)  # default stale bound: 300 s
    elapsed = time.monotonic() - start
    print(f"second stager after kill -9: {elapsed:.2f} s")
    assert elapsed < 60  # "at once" against the 300 s stale bound: it takes ~1-3 s
    assert Path(result.entry) == entry and verify_entry(entry) == (True, "ok")
    assert not partials(entry) and not lock.exists()


def test_lock_of_a_zombie_owner_is_taken_over_at_once(model, cache, tmp_path):
    """A dead stager its parent has not reaped yet still has a pid; it is dead all the same."""
    entry = Path(stage_model(str(model), str(cache)).entry)
    (entry / MANIFEST).unlink()
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    while not Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
        time.sleep(0.01)
    lock = entry.parent / (entry.name + ".lock")
    held = _lock.record("zombie-run")
    held.update(pid=zombie.pid, proc_start=_lock.process_start(zombie.pid))
    lock.write_text(json.dumps(held))
    try:
        start = time.monotonic()
        result = stage_model(str(model), str(cache), lock_wait_s=120)
        assert time.monotonic() - start < 60 and result.cache_hit is False  # not waited out: ~1 s, the wait is 120
        assert verify_entry(entry) == (True, "ok")
    finally:
        zombie.wait()


def test_lock_of_a_reused_pid_is_taken_over(model, cache):
    """The pid is alive but is another process now (start time differs): the owner is gone."""
    entry = Path(stage_model(str(model), str(cache)).entry)
    (entry / MANIFEST).unlink()
    held = _lock.record("old-run")
    held["proc_start"] = held["proc_start"] - 1  # our own pid, started at another time
    (entry.parent / (entry.name + ".lock")).write_text(json.dumps(held))
    start = time.monotonic()
    assert stage_model(str(model), str(cache), lock_wait_s=120).cache_hit is False
    assert time.monotonic() - start < 60  # not waited out: ~1 s, the wait is 120


def test_live_lock_of_another_host_is_waited_for(model, cache):
    """Another host's pid means nothing here: only its heartbeat decides."""
    entry = Path(stage_model(str(model), str(cache)).entry)
    (entry / MANIFEST).unlink()
    held = _lock.record("remote-run")
    held.update(host="other-host", place="ffffffff", pid=999999)
    lock = entry.parent / (entry.name + ".lock")
    lock.write_text(json.dumps(held))
    threading.Timer(0.5, lock.unlink).start()
    start = time.monotonic()
    stage_model(str(model), str(cache), poll_s=0.05, lock_wait_s=10)
    assert time.monotonic() - start >= 0.45


def slow_first_put(monkeypatch, cls, seconds: float) -> threading.Event:
    """Makes the copy of the weights take `seconds`; the event is set once a stager copies them."""
    real = cls.put
    copying = threading.Event()

    def put(self, local, rel, info):
        if rel == "model.safetensors":
            copying.set()
            time.sleep(seconds)
        return real(self, local, rel, info)

    monkeypatch.setattr(cls, "put", put)
    return copying


def two_stagers(cache: str, model: Path, stale_s: float, copying: threading.Event) -> list:
    results = [None, None]

    def run(i):
        results[i] = stage_model(str(model), cache, lock_stale_s=stale_s, poll_s=0.02, lock_wait_s=60)

    first = threading.Thread(target=run, args=(0,))
    first.start()
    assert copying.wait(60), "the first stager never started copying"  # it holds the lock now
    run(1)
    first.join(timeout=60)
    return results


def test_short_stale_bound_keeps_a_live_local_lock(model, cache, monkeypatch):
    """The heartbeat beats faster than the stale bound, so a live holder is never taken over."""
    copying = slow_first_put(monkeypatch, entry_module.LocalEntry, 3.0)
    first, second = two_stagers(str(cache), model, stale_s=1.0, copying=copying)
    assert first.cache_hit is False and second.cache_hit is True and second.bytes_copied == 0


def test_short_stale_bound_keeps_a_live_gcs_lock(model, gcs_bucket, monkeypatch):
    copying = slow_first_put(monkeypatch, _gcs.GcsEntry, 3.0)
    first, second = two_stagers(f"gs://{gcs_bucket}/models", model, stale_s=1.0, copying=copying)
    assert first.cache_hit is False and second.cache_hit is True and second.bytes_copied == 0


def test_gcs_heartbeat_keeps_the_owner_record(gcs_bucket):
    held = _gcs.GcsEntry(f"gs://{gcs_bucket}/models/e")
    assert held.try_lock("me", stale_s=60)
    before = json.loads(held.bucket.blob(held.prefix + ".lock").download_as_bytes())
    time.sleep(0.02)
    held.refresh_lock("me")
    after = json.loads(held.bucket.blob(held.prefix + ".lock").download_as_bytes())
    assert after["time"] > before["time"] and {**after, "time": 0} == {**before, "time": 0}
    held.refresh_lock("someone-else")  # not the owner: nothing changes
    assert json.loads(held.bucket.blob(held.prefix + ".lock").download_as_bytes()) == after
    held.unlock("me")


def test_gcs_lock_of_a_dead_stager_on_this_host_is_taken_over_at_once(model, gcs_bucket):
    cache = f"gs://{gcs_bucket}/models"
    entry = stage_model(str(model), cache).entry
    gcs = _gcs.GcsEntry(entry)
    gcs.bucket.blob(gcs.prefix + "/" + MANIFEST).delete()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    held = _lock.record("dead-run")
    held.update(pid=dead.pid, proc_start=None)
    gcs.bucket.blob(gcs.prefix + ".lock").upload_from_string(json.dumps(held))
    start = time.monotonic()
    result = stage_model(str(model), cache, lock_wait_s=120)
    assert time.monotonic() - start < 60 and result.cache_hit is False  # not waited out: ~1 s, the wait is 120
    assert verify_entry(entry) == (True, "ok") and gcs.bucket.get_blob(gcs.prefix + ".lock") is None


# --- 3. a full disk ---------------------------------------------------------------------------


def enospc_after_half(monkeypatch) -> None:
    real = shutil.copyfile

    def copy(src, dst, *args, **kwargs):
        if Path(src).name != "model.safetensors":
            return real(src, dst, *args, **kwargs)
        Path(dst).write_bytes(Path(src).read_bytes()[:10])
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))

    monkeypatch.setattr(shutil, "copyfile", copy)


def test_full_disk_is_a_named_error_and_leaves_no_partials(model, cache, monkeypatch):
    enospc_after_half(monkeypatch)
    with pytest.raises(StageError) as info:
        stage_model(str(model), str(cache))
    msg = str(info.value)
    assert msg.startswith("no space left on device while copying ") and "\n" not in msg
    assert str(model.resolve() / "model.safetensors") in msg and str(cache.resolve()) in msg
    assert "point model.cache elsewhere" in msg and "free " in msg
    assert not partials(cache) and not list(cache.rglob(MANIFEST))
    assert not list(cache.rglob("*.lock"))
    monkeypatch.undo()
    assert verify_entry(stage_model(str(model), str(cache)).entry) == (True, "ok")


def test_full_disk_while_writing_the_manifest_is_a_named_error(model, cache, monkeypatch):
    def full(self, manifest, replace_generation=None):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.path / MANIFEST))

    monkeypatch.setattr(entry_module.LocalEntry, "write_manifest", full)
    with pytest.raises(StageError) as info:
        stage_model(str(model), str(cache))
    msg = str(info.value)
    assert msg.startswith("no space left on device") and MANIFEST in msg and "model.cache" in msg


def test_cli_full_disk_exits_1_without_a_traceback(model, cache, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        textwrap.dedent(
            """
            import errno, shutil
            from pathlib import Path
            real = shutil.copyfile
            def copy(src, dst, *args, **kwargs):
                if Path(src).name != "model.safetensors":
                    return real(src, dst, *args, **kwargs)
                Path(dst).write_bytes(b"half")
                raise OSError(errno.ENOSPC, "No space left on device", str(dst))
            shutil.copyfile = copy
            """
        )
    )
    cmd = [sys.executable, "-m", "components.stage_model", str(model), "--cache", str(cache), "--quiet"]
    run = subprocess.run(cmd, cwd=ROOT, env=cli_env(site), capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    err = [line for line in run.stderr.splitlines() if line.startswith("stage-model: error:")]
    assert len(err) == 1 and "no space left on device while copying" in err[0]
    assert not partials(cache) and not list(cache.rglob(MANIFEST))


# --- 4. a cache path under a file -------------------------------------------------------------


def test_cache_under_a_file_is_a_named_error_at_the_start(model, tmp_path, hashed):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    with pytest.raises(StageError) as info:
        stage_model(str(model), str(blocker / "cache"))
    assert str(info.value) == (
        f"model cache {blocker / 'cache'}: {blocker} is a file, not a folder; "
        "point model.cache at a folder (or move the file)"
    )
    assert hashed == []  # failed before hashing the source


def test_cache_that_is_a_file(model, tmp_path):
    blocker = tmp_path / "cache"
    blocker.write_text("x")
    with pytest.raises(StageError, match=f"model cache {blocker}: {blocker} is a file, not a folder"):
        stage_model(str(model), str(blocker))


def test_cli_cache_under_a_file_exits_1(model, tmp_path, capsys):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    assert main([str(model), "--cache", str(blocker / "cache"), "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("stage-model: error: model cache ") and "is a file, not a folder" in err
    assert "\n" not in err
