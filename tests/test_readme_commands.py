"""Every command in README.md's ```bash blocks runs as written, or is skipped here by name with a reason.

A command added to the README without an entry in RUN or SKIP fails `test_every_readme_command_is_listed`,
so the README stays runnable. RUN's commands run in README order in one scratch folder that links to the
checkout's files (a compile writes its `build/` there, not into the checkout), with the virtualenv's `bin`
first on PATH, and must exit with the code given (0 unless the README says otherwise). An `export` line
holds for the commands after it, as in one shell.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

CREDENTIALS = "needs Google Cloud credentials and a project (Vertex AI)"

# README command -> expected exit code. Each takes seconds and needs no cloud, GPU or download.
RUN = {
    "vlm-lora --help": 0,
    "vlm-lora --version": 0,
    "vlm-lora ls": 0,
    "vlm-lora compile --config lora_seed eval.max_samples=64": 0,
    "vlm-lora compile --config local/tiny_cpu --target local": 0,
    "sed -e s/YOUR_PROJECT/my-project/g -e s/YOUR_BUCKET/my-project-vlm-lora/g "
    "-e s/name:\\ qwen3-vl-4b-lora-seed/name:\\ my-vlm-lora/ configs/qwen3_vl_4b/lora_seed.yaml > my.yaml": 0,
    "python -m pipelines.compile --config configs/qwen3_vl_4b/lora_seed.yaml": 0,
    "export VLM_LORA_LIGHT_IMAGE=us-docker.pkg.dev/my-project/vlm-lora/light:$(python -m components.images --tag)": 0,
    "export VLM_LORA_TRAIN_IMAGE=us-docker.pkg.dev/my-project/vlm-lora/train:$(python -m components.images --tag)": 0,
    "vlm-lora run --dry-run --config qwen3_vl_4b/lora_seed": 2,  # the README: exit 2, every placeholder listed
    "vlm-lora run --config my.yaml --dry-run": 0,  # my.yaml: the sed line above; the images: the exports
    "vlm-lora compile --config my.yaml": 0,
    ".venv/bin/python -m components.validate_data --help": 0,
}

# README command -> why it does not run here.
SKIP = {
    "make demo": "minutes; the kfp.local pipeline tests run the same DAG (its recipe is checked by STAND_INS)",
    "make test": "the test suite itself (its recipe is checked by STAND_INS)",
    "vlm-lora run --local eval.max_samples=4": "the whole demo DAG: minutes (the pipeline tests cover it)",
    "vlm-lora run --config qwen3_vl_4b/lora_seed vertex.project=my-proj --wait": CREDENTIALS,
    "vlm-lora jobs ls --config qwen3_vl_4b/lora_seed vertex.project=my-proj": CREDENTIALS,
    "vlm-lora run --config my.yaml --wait": CREDENTIALS,
    "vlm-lora upload --config my.yaml": CREDENTIALS + " and an Artifact Registry repository",
    'vlm-lora schedule create --config my.yaml --cron "0 3 * * 1" --time-zone Europe/Berlin': CREDENTIALS,
    "vlm-lora schedule list --config my.yaml": CREDENTIALS,
    "vlm-lora serve": "needs a merged model from `make demo`; serves until stopped",
    "vlm-lora serve --smoke": "needs a merged model from `make demo`; starts swift deploy "
    "(tests/test_serve_local.py covers it)",
}

# A skipped command's quick stand-in, run like RUN's: proves the target exists and what it runs.
STAND_INS = {
    "make demo": ("make -n demo", "pipelines.run --local"),
    "make test": ("make -n test", "pytest"),
}


def readme_commands(text: str) -> list[str]:
    """Returns the commands of every ```bash block, in order: comments stripped, `\\` continuations joined."""
    commands, block, pending = [], False, ""
    for line in text.splitlines():
        if line.strip().startswith("```"):
            block = line.strip() == "```bash" if not block else False
            continue
        if not block:
            continue
        line = pending + line
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1] + " "
            continue
        pending = ""
        command = re.sub(r"\s+#\s.*$", "", line).strip()
        if command and not command.startswith("#"):
            commands.append(re.sub(r"\s+", " ", command))
    return commands


def test_readme_commands_are_parsed():
    text = "x\n```bash\nmake demo   # a comment\n# only a comment\na \\\n  b\n```\n```\nnot bash\n```\n"
    assert readme_commands(text) == ["make demo", "a b"]


def test_every_readme_command_is_listed():
    """A command in README.md must be in RUN or SKIP, and every entry must still be in README.md."""
    commands = readme_commands(README.read_text(encoding="utf-8"))
    listed = set(RUN) | set(SKIP)
    assert not set(RUN) & set(SKIP)
    unlisted = [c for c in commands if c not in listed]
    assert not unlisted, f"README commands in neither RUN nor SKIP of {__file__}: {unlisted}"
    stale = sorted(listed - set(commands))
    assert not stale, f"entries of RUN / SKIP no longer in README.md: {stale}"
    assert all(reason.strip() for reason in SKIP.values())


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A folder that looks like the checkout (links to its files), so relative paths work and outputs stay out."""
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("README's commands use .venv (make install)")
    folder = tmp_path_factory.mktemp("readme")
    for entry in ROOT.iterdir():
        if entry.name not in {".git", "build", "runs", "my.yaml"}:
            (folder / entry.name).symlink_to(entry)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(ROOT / ".venv" / "bin"), str(Path(sys.executable).parent), env["PATH"]])
    return folder, env


def _run(command: str, folder: Path, env: dict) -> subprocess.CompletedProcess:
    # hang guard at ~10x the slowest command's time (a compile, ~3 s)
    return subprocess.run(
        ["bash", "-c", command], cwd=folder, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_readme_commands_run_as_written(scratch):
    folder, env = scratch
    failures, exports = [], []
    for command in readme_commands(README.read_text(encoding="utf-8")):
        if command not in RUN:
            continue
        done = _run("; ".join([*exports, command]), folder, env)
        if command.startswith("export "):
            exports.append(command)
        if done.returncode != RUN[command]:
            failures.append(f"{command}\n  exit {done.returncode} (README: {RUN[command]})\n  {done.stderr[-800:]}")
    assert not failures, "\n".join(failures)
    assert (folder / "build").is_dir() and not (folder / "build").is_symlink()  # compile wrote here, not the checkout


@pytest.mark.parametrize("command", sorted(STAND_INS))
def test_skipped_make_targets_exist(scratch, command):
    folder, env = scratch
    stand_in, expected = STAND_INS[command]
    done = _run(stand_in, folder, env)
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout


def test_readme_and_docs_links_point_at_files_and_headings():
    """Every relative link of README.md and docs/*.md names a file that exists, and a #heading it has."""

    def anchors(path: Path) -> set[str]:
        heads = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), flags=re.M)
        return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}

    broken = []
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            name, _, anchor = target.partition("#")
            path = (page.parent / name).resolve() if name else page
            if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken
