"""A GPU benchmark's command line off the GPU: bad arguments refused (argparse's exit code 2), then a clear
"needs a CUDA GPU" instead of a stack trace (tests of speedups/benchmarks/lora_kernels.py and vision_forward.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch


def assert_refuses_then_needs_a_gpu(main: Callable[[list[str]], object], bad: list[list[str]], monkeypatch) -> None:
    for argv in bad:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2, argv
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        main([])
