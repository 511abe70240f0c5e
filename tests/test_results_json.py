"""benchmarks/results_json.py: the RESULT lines of a GPU call become one record per run with issue 53's keys."""

from __future__ import annotations

import json
import subprocess
import sys

KEYS = {
    "date", "machine", "versions", "command", "trainer", "model", "precision", "cap_gib", "plan", "leanest",
    "seconds_per_step", "tokens_per_second", "peak_gib", "predicted_peak_gib",
}  # fmt: skip

OURS = {
    "profile": "auto_liger@nf4@cap39.4", "batch": 8, "grad_accum": 2, "seconds_per_step": 1.189,
    "tokens_per_second": 16245.9, "peak_memory_gib": 35.5, "env": {"VLM_LORA_GPU_MEMORY_GIB": "39.4"},
    "plan": {"plan_micro_batch": 8, "plan_gradient_checkpointing": False, "plan_peak_gib": 36.5},
    "speedups": {"speedup_3_fused_lora": 1},
}  # fmt: skip
PEER = {
    "batch": 16, "grad_accum": 1, "seconds_per_step": 1.208, "tokens_per_second": 15997.6, "peak_memory_gib": 6.87,
    "gradient_checkpointing": "unsloth", "load_in_4bit": True, "cap_gib": 39.4, "versions": {"unsloth": "2026.10.9"},
}  # fmt: skip
REFUSED = {
    "profile": "auto_liger@cap10.7", "batch": "auto", "grad_accum": 16, "env": {"VLM_LORA_GPU_MEMORY_GIB": "10.7"},
    "settings": {"gradient_checkpointing": "auto"}, "error": "the frozen base alone (11.5 GiB with buffers) ...",
}  # fmt: skip


def test_a_call_log_becomes_one_record_per_run(tmp_path):
    log = tmp_path / "peer.log"
    log.write_text(
        "order: ...\n"
        f"[ours:auto_liger@nf4@cap39.4] RESULT {json.dumps(OURS)}\n"
        "[ours:auto_liger@nf4@cap39.4] train-lora: plan: ...\n"
        f"[peer:4bit:16:unsloth:39.4] RESULT {json.dumps(PEER)}\n"
        f"[ours:auto_liger@cap10.7] RESULT {json.dumps(REFUSED)}\n"
        f"[ours:b1_gc_liger] RESULT {json.dumps({**OURS, 'batch': 1, 'grad_accum': 16, 'plan': {}})[:-1]}, "
        '"speedups": {"speedup_3_fu',  # a line cut inside its last key, as the 2026-12-01 logs were
        encoding="utf-8",
    )
    out = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.results_json", str(log), "--date", "2026-12-02", "--machine", "1 x H200",
         "--command", "bash benchmarks/cards_gpu.sh peer ...", "--leanest", "b1_gc_liger", "--out", str(out)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    records = {p.name: json.loads(p.read_text()) for p in out.iterdir()}
    assert len(done.stdout.splitlines()) == 4 and len(records) == 4
    ours = records["2026-12-02_project_auto_liger_nf4_cap39.4.json"]
    assert KEYS <= set(ours)
    assert (ours["trainer"], ours["precision"], ours["cap_gib"], ours["leanest"]) == ("project", "nf4", 39.4, False)
    assert ours["plan"] == {
        "micro_batch": 8, "grad_accum": 2, "checkpointing": False, "checkpoint_layers": 0, "offload": False,
    }  # fmt: skip
    assert (ours["peak_gib"], ours["predicted_peak_gib"], ours["seconds_per_step"]) == (35.5, 36.5, 1.189)
    peer = records["2026-12-02_unsloth_4bit_16_unsloth_39.4.json"]
    assert (peer["trainer"], peer["precision"], peer["predicted_peak_gib"]) == ("unsloth", "nf4", None)
    assert peer["plan"]["checkpointing"] == "unsloth" and peer["versions"] == {"unsloth": "2026.10.9"}
    refused = records["2026-12-02_project_auto_liger_cap10.7.json"]
    assert refused["plan"] is None and refused["error"].startswith("the frozen base alone")
    assert refused["peak_gib"] is None and refused["cap_gib"] == 10.7
    lean = records["2026-12-02_project_b1_gc_liger.json"]
    assert lean["leanest"] is True and lean["precision"] == "bf16" and lean["cap_gib"] is None


def test_the_model_and_a_tag_name_the_files_and_an_earlier_record_is_kept(tmp_path):
    log = tmp_path / "ours.log"
    log.write_text(f"[ours:auto_liger@nf4@cap39.4] RESULT {json.dumps(OURS)}\n", encoding="utf-8")
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "benchmarks.results_json", str(log), "--date", "2026-12-02", "--machine", "1 x H200",
           "--command", "MODEL=8b bash benchmarks/cards_gpu.sh ours ...", "--model", "8b", "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, capture_output=True, text=True, check=True)
    first = out / "2026-12-02_project_8b_auto_liger_nf4_cap39.4.json"
    assert json.loads(first.read_text())["model"] == "8b"
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode != 0 and "give this call a --tag" in again.stderr
    assert json.loads(first.read_text())["command"].startswith("MODEL=8b")
    subprocess.run([*cmd, "--tag", "b"], capture_output=True, text=True, check=True)
    assert (out / "2026-12-02b_project_8b_auto_liger_nf4_cap39.4.json").is_file()
