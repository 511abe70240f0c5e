"""No orphans (issue #41): a command started by `run_command` (swift sft / swift export) and every
process it starts die with the task process that started it, even after a `kill -9` of the task.

Real processes, no training: a fake command that starts a child in its own process group
(as swift starts python) and one in a session of its own that ignores SIGTERM (as torchrun
starts its workers), then sleeps. The task is killed with SIGKILL; the watchdog must stop
them all. A few seconds each.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from components.common import swift
from tests.test_train_lora_checkpoints_sigterm import _alive, _start

ROOT = Path(__file__).resolve().parent.parent

FAKE_COMMAND = """
import os, signal, subprocess, sys, time
if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
sleeper = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"]
same_group = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
own_session = subprocess.Popen(sleeper, start_new_session=True)  # like torchrun's workers
pids = sys.argv[1]
with open(pids + ".tmp", "w") as f:
    f.write("%d %d %d" % (os.getpid(), same_group.pid, own_session.pid))
os.rename(pids + ".tmp", pids)
print("fake: started", flush=True)
if "--exit" in sys.argv:
    time.sleep(3)  # the watchdog reads the process tree every second: it knows the children by now
    sys.exit(3)
time.sleep(120)
"""

RUNNER = """
import json, sys
from components.common.swift import run_command
print(json.dumps(run_command(json.loads(sys.argv[1]))))
"""

# Expected: gone within ~0.3 s of SIGTERM, or at the watchdog's 5 s SIGKILL for a process that
# ignores SIGTERM. The bound is 6x the latter, for a loaded 2-core machine; not a timing test.
GONE_BOUND_S = 30.0


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _wait_for(path: Path, proc: subprocess.Popen) -> list[int]:
    deadline = time.monotonic() + 60
    while not path.is_file():
        assert proc.poll() is None, f"the runner exited early: {proc.communicate()}"
        assert time.monotonic() < deadline, "the fake command did not start"
        time.sleep(0.05)
    return [int(p) for p in path.read_text().split()]


def _wait_gone(pids: list[int]) -> list[int]:
    """Polls until none of `pids` runs (or GONE_BOUND_S passed); returns those still running, then kills them."""
    deadline = time.monotonic() + GONE_BOUND_S
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if _alive(p)]
    for pid in left:  # never leave strays behind, whatever happened
        os.kill(pid, signal.SIGKILL)
    return left


def _run_in_own_group(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen, list[int]]:
    fake = tmp_path / "fake.py"
    fake.write_text(FAKE_COMMAND)
    cmd = [sys.executable, str(fake), str(tmp_path / "pids"), *flags]
    proc = subprocess.Popen(
        [sys.executable, "-c", RUNNER, json.dumps(cmd)],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group, as a local run's: killed whole below
    )
    return proc, _wait_for(tmp_path / "pids", proc)


def test_kill_9_of_the_tasks_group_stops_the_command_and_all_it_started(tmp_path):
    proc, pids = _run_in_own_group(tmp_path, "--ignore-term")
    os.killpg(proc.pid, signal.SIGKILL)  # the local run's process group, as in the issue
    _out, err = proc.communicate(timeout=60)
    left = _wait_gone(pids)
    assert not left, f"processes outlived the killed task: {left}"


def test_kill_9_of_the_task_alone_stops_the_command(tmp_path):
    proc, pids = _run_in_own_group(tmp_path)
    proc.kill()  # only the task process; its command runs in a group of its own
    proc.communicate(timeout=60)
    assert not _wait_gone(pids), "processes outlived the killed task"


def test_processes_left_by_an_exited_command_are_stopped(tmp_path):
    """A command that exits while its children still run: run_command returns, the children do not outlive it."""
    fake = tmp_path / "fake.py"
    fake.write_text(FAKE_COMMAND)
    start = time.monotonic()
    code, tail = swift.run_command([sys.executable, str(fake), str(tmp_path / "pids"), "--exit"])
    # ~8 s expected (3 s of the command, the watchdog's 5 s grace); the children would hold the
    # output open for 120 s. A bound of 60 s (7x) tells the two apart on a loaded machine.
    assert time.monotonic() - start < 60, "run_command waited for the command's leftovers"
    assert code == 3 and "fake: started" in tail
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert not _wait_gone(pids[1:]), "the exited command's children were left running"


def test_watchdog_ends_with_the_command(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "print('hi')"], start_new_session=True)
    watchdog = swift.start_watchdog(proc.pid)
    assert watchdog is not None and proc.wait(timeout=60) == 0
    swift.end_watchdog(watchdog)
    assert watchdog.returncode == 0


def test_kill_9_of_train_lora_stops_swift_and_its_children(tmp_path):
    """train-lora (the real core, a fake `swift` that starts a child and sleeps) killed with SIGKILL."""
    proc, pids_file = _start(tmp_path, None)
    group = [int(p) for p in pids_file.read_text().split()]
    proc.kill()
    _out, err = proc.communicate(timeout=60)
    assert not _wait_gone(group), "swift outlived the killed train-lora task"
    assert "the task process" in err and "is gone; stopping its command's processes" in err


GUARDED = """
import subprocess, sys, time
from components.common.swift import guard_descendants, release_guard
guard = guard_descendants()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # as kfp.local starts a task
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(child.pid))
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
if "--release" in sys.argv:
    time.sleep(2)  # the watchdog has seen the child by now
    release_guard(guard)
    open(sys.argv[1] + ".released", "w").close()
time.sleep(120)
"""


def _guarded(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen, int]:
    script = tmp_path / "guarded.py"
    script.write_text(GUARDED)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "child"), *flags],
        cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    (child,) = _wait_for(tmp_path / "child", proc)
    time.sleep(1.5)  # the watchdog reads the process tree every second
    return proc, child


def test_a_run_killed_alone_takes_its_task_processes_with_it(tmp_path):
    """pipelines.run --local: a SIGTERM or kill -9 of the run (not its group) stopped before at the run itself."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        (tmp_path / sig.name).mkdir()
        proc, child = _guarded(tmp_path / sig.name)
        proc.send_signal(sig)
        proc.wait(timeout=60)
        assert not _wait_gone([child]), f"the task process outlived the run after {sig.name}"


def test_a_released_guard_signals_nothing(tmp_path):
    proc, child = _guarded(tmp_path, "--release")
    released = tmp_path / "child.released"
    deadline = time.monotonic() + 60
    while not released.exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the run never released its guard"
        time.sleep(0.1)
    time.sleep(2)
    try:
        assert proc.poll() is None and _alive(child), "a released guard stopped the run or its task"
    finally:
        os.kill(child, signal.SIGKILL)
        proc.kill()
        proc.wait(timeout=60)
