"""benchmarks/serve_4b.py: its arithmetic, and a real `--tiny` run (swift deploy on the tiny model, CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.serve_4b import SUMMARY_NAME, latency_figures, markdown_table, percentile

ROOT = Path(__file__).resolve().parents[1]


def test_percentiles_interpolate_between_ranks():
    assert percentile([], 50) is None
    assert percentile([3.0], 90) == 3.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0], 90) == pytest.approx(10.0)


def test_latency_keeps_the_first_request_apart():
    results = [
        {"seconds": 10.0, "prompt_tokens": 1100, "completion_tokens": 100, "tokens_per_s": 10.0},
        {"seconds": 2.0, "prompt_tokens": 1100, "completion_tokens": 100, "tokens_per_s": 50.0},
        {"seconds": 4.0, "prompt_tokens": 1100, "completion_tokens": 100, "tokens_per_s": 25.0},
    ]
    lat = latency_figures(results)
    assert lat["first_request_s"] == 10.0 and lat["rest_p50_s"] == pytest.approx(3.0)
    assert lat["rest_p90_s"] == pytest.approx(3.8)
    assert lat["tokens_per_s_overall"] == pytest.approx(300 / 16) and lat["prompt_tokens"] == [1100]
    one = latency_figures(results[:1])
    assert one["rest_p50_s"] is None and one["rest_mean_s"] is None
    assert "| first request latency | 10.0 s |" in markdown_table({"latency": lat})


@pytest.mark.pipeline
def test_tiny_run_serves_times_and_writes_every_figure(tmp_path):
    out = tmp_path / "serve"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.serve_4b", "--tiny", "--requests", "2", "--max-tokens", "4"]
        + ["--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / SUMMARY_NAME).read_text())
    assert summary["model_source"] == "tiny" and summary["load_s"] > 0
    lat = summary["latency"]
    assert lat["requests"] == 2 and lat["first_request_s"] > 0 and lat["rest_p50_s"] > 0
    assert lat["rest_p90_s"] >= lat["rest_p50_s"]
    assert lat["completion_tokens"] == [4, 4]  # random weights never stop early
    assert all(t > 0 for t in lat["prompt_tokens"]) and lat["tokens_per_s_overall"] > 0
    assert len(lat["tokens_per_s_per_request"]) == 2
    assert summary["smoke"] == {"passed": True, "rows": 2, "seconds": summary["smoke"]["seconds"]}
    assert "peak" in summary["gpu_memory_mib"]  # None on a machine without nvidia-smi
    assert "| server start-up" in proc.stdout and "SERVE {" in proc.stdout
    assert not (out / "merged").exists()  # --tiny builds no 4B model
