"""Issue 41: two local runs into one pipeline root each know their own run folder.

Two real processes run a one-task kfp.local pipeline into one root at the same time, through
`pipelines.local_run.own_run_dir`, the way `run_local` runs the DAG; each must report the folder
its own task wrote into (no mtime guessing: the one started first finishes first here, but
the folder made last is the other's).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.local_run import RunError, own_run_dir

ROOT = Path(__file__).resolve().parents[1]

_RUN = """
import sys, time
from pathlib import Path
from kfp import dsl, local
from pipelines.local_run import own_run_dir


@dsl.component(install_kfp_package=False)
def write(tag: str, seconds: float, out: dsl.Output[dsl.Artifact]):
    import time
    time.sleep(seconds)
    with open(out.path, "w") as f:
        f.write(tag)


@dsl.pipeline(name="iso")
def iso(tag: str, seconds: float):
    write(tag=tag, seconds=seconds).set_caching_options(False)


root, tag, delay, seconds = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
time.sleep(delay)
local.init(local.SubprocessRunner(use_venv=False), pipeline_root=str(root), enable_caching=False)
with own_run_dir(root, "iso") as run_dir:
    iso(tag=tag, seconds=seconds)
print("RUN_DIR", run_dir, flush=True)
"""


def test_two_runs_into_one_root_each_report_their_own_folder(tmp_path):
    script = tmp_path / "iso_run.py"  # a file: kfp reads the component's source from it
    script.write_text(_RUN)
    root = tmp_path / "root"
    root.mkdir()
    # A starts first and works longer; B's folder is made later and is the newest while A ends
    procs = {
        tag: subprocess.Popen(
            [sys.executable, str(script), str(root), tag, delay, seconds],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag, delay, seconds in (("A", "0", "6"), ("B", "1.5", "0"))
    }
    reported = {}
    for tag, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=240)
        assert proc.returncode == 0, stderr[-3000:]
        line = [x for x in stdout.splitlines() if x.startswith("RUN_DIR ")]
        assert line, stdout
        reported[tag] = Path(line[-1].split(" ", 1)[1])
    assert reported["A"] != reported["B"]
    for tag, run_dir in reported.items():
        assert run_dir.parent == root and run_dir.name.endswith(f"-{procs[tag].pid}")  # the name the run made
        assert (run_dir / "write" / "out").read_text() == tag  # its own task's output is in it
    assert sorted(p.name for p in root.iterdir() if p.is_dir() and p.name.startswith("iso-")) == sorted(
        p.name for p in reported.values()
    )


def test_the_run_folder_is_created_by_the_run_and_unique(tmp_path):
    from kfp.local import executor_input_utils

    original = executor_input_utils.get_local_pipeline_resource_name
    with own_run_dir(tmp_path, "demo") as first:
        assert first.is_dir() and first.parent == tmp_path
        assert executor_input_utils.get_local_pipeline_resource_name("demo") == first.name
    assert executor_input_utils.get_local_pipeline_resource_name is original  # restored
    with pytest.raises(RunError, match=r"kfp.local named 0 runs \[\] instead of taking demo-.* once"):
        with own_run_dir(tmp_path, "demo") as second:
            assert second != first
