"""`vlm-lora COMMAND --help` imports no heavy library: each prints its help in well under a second.

Measured on the shared 2-core machine under load (load average 5; `time`, 2026-12-01): 0.2-0.9 s per
command, from 1.7-2.6 s before scipy.optimize (1.1-1.7 s of it, imported by components.common.tasks
through the config) became a lazy import. The test checks the cause, not the clock: which modules a
help text pulls in, in a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.cli import COMMANDS

HEAVY = ("scipy", "torch", "transformers", "swift", "datasets", "matplotlib", "numpy", "pyarrow", "kfp")
ROOT = Path(__file__).resolve().parent.parent

_PROBE = """
import contextlib, io, json, sys
from pipelines.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    try:
        main([sys.argv[1], "--help"])
    except SystemExit:
        pass
print(json.dumps({"help": out.getvalue(), "heavy": [m for m in json.loads(sys.argv[2]) if m in sys.modules]}))
"""


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_imports_no_heavy_library(command):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, command, json.dumps(HEAVY)], capture_output=True, text=True, env=env,
        timeout=120, check=True,
    )  # fmt: skip
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["heavy"] == [], f"vlm-lora {command} --help imports {got['heavy']}"
    assert "usage" in got["help"].lower() or command == "ls"
