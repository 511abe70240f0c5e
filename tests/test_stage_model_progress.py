"""stage-model logs copy / download progress (bytes done / total, rate), rate-limited, also in the pipeline."""

from __future__ import annotations

import functools
import re
import time

from components.common.progress import Progress, format_bytes, tree_bytes
from components.stage_model import transfer
from components.stage_model.core import stage_model
from tests.test_stage_model import make_model


def test_checksums_and_copy_log_bytes_done_of_total_then_no_copy_on_a_cache_hit(tmp_path, capsys):
    model = make_model(tmp_path / "src" / "tiny")
    total = sum(p.stat().st_size for p in model.iterdir())
    result = stage_model(str(model), str(tmp_path / "cache"), progress=True)
    lines = capsys.readouterr().err.splitlines()
    # a small model: each step's first and last line, nothing between
    assert len(lines) == 4
    both = format_bytes(2 * total)  # sha256 and crc32c: every byte read twice
    assert lines[0] == f"stage-model: checksums of {model.resolve()}: 0 B / {both} (0 %)"
    assert lines[1].startswith(f"stage-model: checksums of {model.resolve()}: {both} / {both} (100 %)")
    assert lines[2] == f"stage-model: copy to {result.entry}: 0 B / {total} B (0 %)"
    assert re.fullmatch(rf"stage-model: copy to .*: {total} B / {total} B \(100 %\), .*/s, done in \d+ s", lines[3])

    stage_model(str(model), str(tmp_path / "cache"), progress=True)
    again = capsys.readouterr().err
    assert "checksums of" in again and "copy to" not in again  # the content is read for its fingerprint, not copied
    stage_model(str(model), str(tmp_path / "other"))
    assert capsys.readouterr().err == ""  # progress off (the library default)


def test_the_pipeline_task_turns_progress_on():
    """The task runs `stage_step`, which stages with progress=True (tests/test_component_steps.py runs it)."""
    import inspect

    from components.stage_model import step
    from components.stage_model.component import stage_model as task

    assert "stage_step(" in task.component_spec.implementation.container.command[-1]
    assert "progress=True" in inspect.getsource(step.stage_step)


def test_one_large_file_shows_progress_while_it_is_written(tmp_path, monkeypatch):
    """With `measure`, the bytes written so far count, not only finished files."""
    lines: list[str] = []
    fast = functools.partial(Progress, every_s=0, every_fraction=0.2, emit=lines.append)
    monkeypatch.setattr(transfer, "Progress", fast)
    folder = tmp_path / "work"
    folder.mkdir()

    def fetch(rel: str) -> int:
        with open(folder / (rel + ".incomplete"), "wb") as f:
            for _ in range(4):
                f.write(b"x" * 200)
                f.flush()
                time.sleep(0.15)
        (folder / (rel + ".incomplete")).rename(folder / rel)
        return 800

    transfer.parallel(fetch, ["big"], 1, 800, True, "download x", measure=lambda: tree_bytes(folder), every_s=0.02)
    done = [int(m.group(1)) for m in map(re.compile(r": (\d+) B / 800 B").search, lines) if m]
    assert done[0] == 0 and done[-1] == 800
    assert any(0 < n < 800 for n in done), lines  # seen while the one file was still being written
