"""Runs Python code in a fresh interpreter (the train-lora plugin patches libraries at import) and
returns the last line it printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def last_line(code: str, **env: str) -> str:
    """The last stdout line of `python -c code` run from the repository root with `env` added; fails on an error."""
    out = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]
