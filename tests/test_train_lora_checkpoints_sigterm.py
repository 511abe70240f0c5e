"""SIGTERM (Vertex preemption) during training: swift's process group is stopped, the finished
checkpoint gets its durable verified copy, and the task exits non-zero naming it.

`train_lora` runs in a subprocess (so only it is signalled, not the test runner) with a fake
`swift` that writes checkpoint-2 the way swift does, starts a child (like torchrun's
workers), and sleeps. No training, a few seconds.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.common.swift import SigtermForwarder, run_command
from components.train_lora import _checkpoints as ck

ROOT = Path(__file__).resolve().parent.parent

FAKE_SWIFT = """#!{python}
import json, os, subprocess, sys, time
out = sys.argv[sys.argv.index("--output_dir") + 1]
for step in (2, 4):
    d = os.path.join(out, "checkpoint-%d" % step)
    os.makedirs(d)
    with open(os.path.join(d, "trainer_state.json"), "w") as f:
        json.dump({{"global_step": step}}, f)
    with open(os.path.join(d, "adapter_model.safetensors"), "wb") as f:
        f.write(b"weights" * 100)
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        f.write("{{}}")
    if step == 2:  # swift points last-checkpoint at a checkpoint once it is completely saved; 4 is mid-save
        os.symlink("checkpoint-2", os.path.join(out, "last-checkpoint"))
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
with open(os.path.join(out, "..", "pids.tmp"), "w") as f:
    f.write("%d %d" % (os.getpid(), child.pid))
os.rename(os.path.join(out, "..", "pids.tmp"), os.path.join(out, "..", "pids"))
print("fake swift: checkpoint-2 saved, training on", flush=True)
time.sleep(120)
"""

RUNNER = """
import json, sys
from components.train_lora import core
kw = json.loads(sys.argv[1])
fake = kw.pop("fake_swift")
core.swift_executable = lambda: fake
try:
    core.train_lora(**kw)
except core.TrainError as exc:  # as the KFP wrapper does
    raise SystemExit(f"train-lora: {exc}") from None
"""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


def _start(tmp_path: Path, checkpoint_dir: str | None) -> tuple[subprocess.Popen, Path]:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 4096}}))
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "data.jsonl").write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}) + "\n"
    )
    fake = tmp_path / "swift"
    fake.write_text(FAKE_SWIFT.format(python=sys.executable))
    fake.chmod(0o755)
    work = tmp_path / "work"
    kw = dict(
        model_dir=str(model),
        model_type="qwen3_vl",
        train_dir=str(ds),
        eval_dir="",
        swift_args={},
        adapter_out=str(tmp_path / "adapter"),
        work_dir=str(work),
        checkpoint_dir=checkpoint_dir,
        gpus=[0, 0],
        environ={},
        checkpoint_interval_s=60.0,
        term_wait_s=5.0,
        fake_swift=str(fake),
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(
        [sys.executable, "-c", RUNNER, json.dumps(kw)],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    pids = work / "pids"
    deadline = time.monotonic() + 60
    while not pids.is_file():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"the fake swift did not start:\n{out[-2000:]}\n{err[-2000:]}")
        time.sleep(0.05)
    return proc, pids


def _terminate(proc: subprocess.Popen, pids: Path) -> tuple[str, str, list[int]]:
    swift_pid, child_pid = map(int, pids.read_text().split())
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)  # only the train process, as Vertex signals the task
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        for pid in (swift_pid, child_pid):  # never leave strays behind, whatever happened
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    # Vertex sends SIGKILL 30 s after SIGTERM; the task's own grace (term_wait_s=5) ends it in ~5-8 s
    assert time.monotonic() - t0 < 30, "the task outlived Vertex's 30 s grace after SIGTERM"
    return out, err, [swift_pid, child_pid]


def test_sigterm_stops_swift_copies_the_finished_checkpoint_and_exits_nonzero(tmp_path):
    durable = tmp_path / "durable"
    proc, pids = _start(tmp_path, str(durable))
    assert not (durable / "checkpoint-2").exists()  # the background copy polls only every 60 s
    out, err, group = _terminate(proc, pids)

    assert proc.returncode != 0
    assert "train-lora: preempted: last durable checkpoint is 2" in err, err[-3000:]
    assert "Traceback" not in err
    assert "SIGTERM received" in err and "fake swift: checkpoint-2 saved" in out
    assert ck.verify_checkpoint(durable / "checkpoint-2")  # copied in the grace period, marker written last
    assert json.loads((durable / "checkpoint-2" / ck.MARKER).read_text())["step"] == 2
    assert ck.newest_complete_checkpoint(durable) == durable / "checkpoint-2"
    assert not (durable / "checkpoint-4").exists()  # mid-save: not copied
    assert not any(_alive(pid) for pid in group), "swift's process group outlived the task"
    assert not (tmp_path / "adapter" / "adapter_model.safetensors").exists()


def test_sigterm_without_checkpoint_dir_says_nothing_was_saved(tmp_path):
    proc, pids = _start(tmp_path, None)
    _out, err, group = _terminate(proc, pids)
    assert proc.returncode != 0
    assert "train-lora: preempted: no checkpoint_dir is set" in err and "Traceback" not in err
    assert not any(_alive(pid) for pid in group)


def test_forwarder_restores_the_previous_handler():
    def mine(signum, frame):
        pass

    before = signal.signal(signal.SIGTERM, mine)
    try:
        with SigtermForwarder() as guard:
            assert signal.getsignal(signal.SIGTERM) == guard._handle
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)


def test_run_command_runs_the_command_in_its_own_process_group(tmp_path):
    code, tail = run_command([sys.executable, "-c", "import os; print(os.getpgid(0) == os.getpid())"])
    assert code == 0 and tail.strip() == "True"
