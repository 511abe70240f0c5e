"""`python -m components.stage_model`: the command line runs the same core."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from components.stage_model.__main__ import main
from tests.test_stage_model import make_model

ROOT = Path(__file__).resolve().parents[1]


def test_cli_stages_then_hits(tmp_path, capsys):
    model = make_model(tmp_path / "src" / "tiny")
    cache = tmp_path / "cache"
    assert main([str(model), "--cache", str(cache), "--quiet"]) == 0
    out = capsys.readouterr().out.splitlines()
    entry = Path(out[0])
    assert entry.parent == (cache / "local" / "tiny").resolve() and (entry / "manifest.json").is_file()
    assert out[1].startswith("cache_hit=false ")
    assert main([str(model), "--cache", str(cache), "--quiet", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["cache_hit"] is True and summary["bytes_copied"] == 0 and summary["entry"] == str(entry)


def test_cli_errors_exit_nonzero_with_one_line(tmp_path, capsys):
    assert main(["s3://b/m", "--cache", str(tmp_path / "c"), "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("stage-model: error: model source 's3://b/m'") and "\n" not in err
    assert main([str(tmp_path / "missing"), "--cache", str(tmp_path / "c")]) == 1
    assert "folder not found" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_cli_as_a_module_against_the_fake_hub(hub_server, tmp_path):
    from tests.conftest import HubRepo

    model = make_model(tmp_path / "hubsrc")
    hub_server.repos["org/tiny"] = HubRepo({p.name: p.read_bytes() for p in model.iterdir()})
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")}  # this test is online (fake hub)
    env["PYTHONPATH"] = str(ROOT)
    cmd = [
        sys.executable,
        "-m",
        "components.stage_model",
        "hf://org/tiny",
        "--cache",
        str(tmp_path / "c"),
        "--revision",
        "main",
    ]
    first = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    commit = hub_server.repos["org/tiny"].refs["main"]
    assert first.stdout.splitlines()[0].endswith(f"/hf/org/tiny/{commit}")
    assert "cache_hit=false" in first.stdout
    second = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0 and "cache_hit=true bytes_copied=0" in second.stdout
    bad = subprocess.run(
        cmd[:3] + ["hf://org/nope"] + cmd[4:], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 1 and bad.stderr.strip().startswith("stage-model: error: model source hf://org/nope")
    assert "repo not found" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
