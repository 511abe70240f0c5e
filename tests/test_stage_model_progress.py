"""stage-model logs copy / download progress (bytes done / total, rate), rate-limited, also in the pipeline."""

from __future__ import annotations

import re

from components.stage_model.core import stage_model
from tests.test_stage_model import make_model


def test_copy_logs_bytes_done_of_total_then_nothing_on_a_cache_hit(tmp_path, capsys):
    model = make_model(tmp_path / "src" / "tiny")
    total = sum(p.stat().st_size for p in model.iterdir())
    result = stage_model(str(model), str(tmp_path / "cache"), progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"stage-model: copy to {result.entry}: 0 B / {total} B (0 %)"
    assert re.fullmatch(rf"stage-model: copy to .*: {total} B / {total} B \(100 %\), .*/s, done in \d+ s", lines[-1])
    assert len(lines) == 2  # a small copy: the start and the end line, nothing between

    stage_model(str(model), str(tmp_path / "cache"), progress=True)
    assert capsys.readouterr().err == ""  # nothing copied, nothing logged
    stage_model(str(model), str(tmp_path / "other"))
    assert capsys.readouterr().err == ""  # progress off (the library default)


def test_the_pipeline_task_turns_progress_on():
    from components.stage_model.component import stage_model as task

    assert "progress=True" in task.component_spec.implementation.container.command[-1]
