"""Counting the host's waits for the GPU with torch's CUDA sync debug mode (GPU tests)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch


def gpu_waits(fn: Callable[[], Any]) -> tuple[Any, list[str]]:
    """`fn()` with torch's sync debug mode on: its result and the `file:line` of each wait it made for the GPU."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode(1)
        try:
            out = fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return out, [f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)]
