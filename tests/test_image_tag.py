"""The images' default tag is a hash of what they hold (components/images.py): stable, and new for new code.

Vertex keys a task's cache on its component spec, which names the image; a tag that stayed
the same across a code change would let a run reuse results made by other code. The tests
run the hashing on small generated trees (with and without git), on copies of this checkout,
on the layout the Dockerfiles build under /app, and end to end through a Vertex compile.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from components import images
from components.images import ImageTagError, deps_tag, source_files, source_tag
from tests.test_vertex_images import parse_dockerfile

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "configs" / "qwen3_vl_4b" / "lora_seed.yaml"
TAG_RE = re.compile(r"0\.1\.0-[0-9a-f]{12}")
HAS_GIT = shutil.which("git") is not None
# each listing of the files: by `git ls-files`, and by the walk used where there is no git
WITH_AND_WITHOUT_GIT = pytest.mark.parametrize(
    "git", [False, True] if HAS_GIT else [False], ids=["walk", "git"][: 1 + HAS_GIT]
)

TINY = {
    "components/__init__.py": "",
    "components/images.py": "TAG = None\n",
    "components/evaluate/core.py": "def score(a, b):\n    return a == b\n",
    "components/evaluate/report.html.jinja": "<p>{{ score }}</p>\n",
    "pipelines/__init__.py": "",
    "pipelines/pipeline.py": "STEPS = 3\n",
    "speedups/__init__.py": "",
    "pyproject.toml": '[project]\nname = "vlm-lora-pipeline"\nversion = "0.1.0"\n',
    "setup.py": "from setuptools import setup\n\nsetup()\n",
    "requirements.lock": "kfp==2.17.0\n",
    "images/Dockerfile.light": "FROM python:3.11.11-slim-bookworm\n",
    "images/Dockerfile.train-deps": "FROM nvidia/cuda:13.0.1-cudnn-devel-ubuntu22.04\n",
    "images/Dockerfile.train": "ARG DEPS_IMAGE\nFROM ${DEPS_IMAGE}\n",
    "README.md": "# the project\n",
    "configs/seed.yaml": "# a config\n",
    "tests/test_x.py": "def test_x():\n    pass\n",
}


def make_tree(root: Path, files: dict[str, str] = TINY, git: bool = False) -> Path:
    """Writes `files` under `root` (a git work tree, nothing committed, when `git`); returns root."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(text.encode())
    if git:
        subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def copy_sources(src: Path, dst: Path, extra: tuple[str, ...] = ()) -> Path:
    """Copies the files the tag hashes (and `extra`) from `src` to `dst`, keeping mtimes; returns dst."""
    for rel in [*source_files(src), *extra]:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, dst / rel)
    return dst


# ---------------------------------------------------------------- stable


@WITH_AND_WITHOUT_GIT
def test_the_tag_is_stable_and_the_same_at_another_path(tmp_path, git):
    a = make_tree(tmp_path / "a", git=git)
    tag = source_tag(a)
    assert TAG_RE.fullmatch(tag), tag
    assert source_tag(a) == tag
    b = make_tree(tmp_path / "elsewhere" / "b", git=git)
    assert source_tag(b) == tag
    assert source_files(a) == [
        "components/__init__.py",
        "components/evaluate/core.py",
        "components/evaluate/report.html.jinja",
        "components/images.py",
        "images/Dockerfile.light",
        "images/Dockerfile.train",
        "images/Dockerfile.train-deps",
        "pipelines/__init__.py",
        "pipelines/pipeline.py",
        "pyproject.toml",
        "requirements.lock",
        "setup.py",
        "speedups/__init__.py",
    ]


@pytest.mark.skipif(not HAS_GIT, reason="needs git")
def test_git_and_the_walk_list_the_same_files(tmp_path):
    """Inside an image (no .git) the walk must give the tag git gave in the checkout."""
    caches = {"components/__pycache__/images.cpython-311.pyc": "x", "pipelines/x.egg-info/PKG-INFO": "y"}
    with_git = make_tree(tmp_path / "g", {**TINY, **caches}, git=True)
    (with_git / ".gitignore").write_text("__pycache__/\n*.egg-info/\n")
    without = make_tree(tmp_path / "w", {**TINY, **caches})
    assert source_files(with_git) == source_files(without)
    assert source_tag(with_git) == source_tag(without)


def test_this_checkout_gives_the_same_tag_from_a_copy(tmp_path):
    tag = source_tag(ROOT)
    assert TAG_RE.fullmatch(tag), tag
    assert images.TAG and TAG_RE.fullmatch(images.TAG)
    copy = copy_sources(ROOT, tmp_path / "copy")  # no .git: the walk
    assert source_tag(copy) == tag


def test_mtimes_do_not_count(tmp_path):
    root = make_tree(tmp_path)
    tag = source_tag(root)
    os.utime(root / "components/evaluate/core.py", (1_000_000_000, 1_000_000_000))
    assert source_tag(root) == tag


# ---------------------------------------------------------------- what changes it, what does not

CHANGES = {
    "a component's code": ("components/evaluate/core.py", "def score(a, b):\n    return a != b\n"),
    "a line ending": ("components/evaluate/core.py", "def score(a, b):\r\n    return a == b\r\n"),
    "a new component file": ("components/evaluate/metrics.py", "K = 1\n"),
    "package data": ("components/evaluate/report.html.jinja", "<b>{{ score }}</b>\n"),
    "the pipeline code": ("pipelines/pipeline.py", "STEPS = 4\n"),
    "the lock": ("requirements.lock", "kfp==2.17.1\n"),
    "a Dockerfile": ("images/Dockerfile.train", "ARG DEPS_IMAGE\nFROM ${DEPS_IMAGE}\nENV X=1\n"),
    "the dependency Dockerfile": ("images/Dockerfile.train-deps", "FROM nvidia/cuda:13.0.2-cudnn-devel-ubuntu22.04\n"),
    "the build hooks": ("setup.py", "from setuptools import setup\n\nsetup(zip_safe=False)\n"),
    "the version": ("pyproject.toml", '[project]\nname = "vlm-lora-pipeline"\nversion = "0.2.0"\n'),
}


@WITH_AND_WITHOUT_GIT
@pytest.mark.parametrize("change", CHANGES, ids=list(CHANGES))
def test_a_change_to_what_the_images_hold_changes_the_tag(tmp_path, change, git):
    root = make_tree(tmp_path, git=git)
    tag = source_tag(root)
    rel, text = CHANGES[change]
    (root / rel).write_bytes(text.encode())
    new = source_tag(root)
    assert new != tag
    assert new.startswith("0.2.0-" if change == "the version" else "0.1.0-")


def test_a_rename_changes_the_tag(tmp_path):
    root = make_tree(tmp_path)
    tag = source_tag(root)
    (root / "components/evaluate/core.py").rename(root / "components/evaluate/core2.py")
    assert source_tag(root) != tag


NOT_HASHED = {
    "bytecode": ("components/evaluate/__pycache__/core.cpython-311.pyc", "\x00bytes"),
    "a stray .pyc": ("pipelines/pipeline.cpython-311.pyc", "\x00bytes"),
    "egg-info": ("components/vlm_lora.egg-info/PKG-INFO", "Name: x\n"),
    "the README": ("README.md", "# changed\n"),
    "a config (not in the images)": ("configs/seed.yaml", "# changed\n"),
    "a test": ("tests/test_x.py", "def test_x():\n    assert 1\n"),
    "a speed-up test": ("speedups/tests/test_x.py", "def test_x():\n    assert 1\n"),
    "a speed-up benchmark": ("speedups/benchmarks/kernels.py", "print(1)\n"),
    "the speed-up layer's README": ("speedups/README.md", "# speedups\n"),
    "another image file": ("images/README.md", "# how to build\n"),
}


@WITH_AND_WITHOUT_GIT
@pytest.mark.parametrize("what", NOT_HASHED, ids=list(NOT_HASHED))
def test_caches_and_files_outside_the_images_do_not_change_the_tag(tmp_path, what, git):
    root = make_tree(tmp_path, git=git)
    if git:
        (root / ".gitignore").write_text("__pycache__/\n*.pyc\n*.egg-info/\n")
    tag = source_tag(root)
    rel, text = NOT_HASHED[what]
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_bytes(text.encode())
    assert source_tag(root) == tag


@pytest.mark.skipif(not HAS_GIT, reason="needs git")
def test_in_a_git_checkout_ignored_files_do_not_count_and_untracked_ones_do(tmp_path):
    root = make_tree(tmp_path, git=True)
    (root / ".gitignore").write_text("*.local\n")
    tag = source_tag(root)
    (root / "components/evaluate/notes.local").write_text("scratch\n")  # ignored: not uploaded, not hashed
    assert source_tag(root) == tag
    (root / "components/evaluate/notes.txt").write_text("scratch\n")  # untracked, not ignored: in the context
    assert source_tag(root) != tag


def test_a_tree_without_the_inputs_is_refused_with_what_is_missing(tmp_path):
    root = make_tree(
        tmp_path, {k: v for k, v in TINY.items() if k not in ("requirements.lock", "images/Dockerfile.train")}
    )
    with pytest.raises(ImageTagError, match=r"no requirements\.lock, images/Dockerfile\.train$"):
        source_tag(root)


# ---------------------------------------------------------------- the command, and where there is no source tree


def run_module(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Runs `python -m components.images ARGS` with `cwd` first on the path."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("VLM_LORA_")},
        "PYTHONPATH": str(cwd),
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "components.images", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def test_the_command_prints_the_tag_and_the_image_uris():
    done = run_module(["--tag"], ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout == source_tag(ROOT) + "\n"
    tag = done.stdout.strip()
    done = run_module(["--print"], ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"light: {images.REGISTRY}/light:{tag}",
        f"train: {images.REGISTRY}/train:{tag}",
    ]


def test_check_accepts_only_the_trees_own_tag(tmp_path, capsys):
    tag = images.TAG
    assert images.main(["--check", tag]) == 0
    assert images.main(["--check", "0.1.0-000000000000"]) == 1
    assert f"have the tag {tag!r}; build with the output of `python -m components.images --tag`" in (
        capsys.readouterr().err
    )
    assert images.main(["--check", ""]) == 1
    assert "the image build was given no tag" in capsys.readouterr().err
    assert images.main(["--check", f"{tag}-flash-attn", "--variant", "flash-attn"]) == 0  # the opt-in train image
    assert images.main(["--check", tag, "--variant", "flash-attn"]) == 1
    assert images.main(["--check", f"{tag}-flash-attn"]) == 1
    assert images.main(["--check", f"{tag}-sdpa", "--variant", "sdpa"]) == 1
    assert "unknown build variant 'sdpa': the variants are flash-attn" in capsys.readouterr().err


def test_the_override_order_is_config_then_environment_then_the_tag(tmp_path):
    code = (
        "from components import images as m\n"
        "print(m.resolve_images()['light'], m.resolve_images()['train'])\n"
        "print(m.resolve_images('cfg/light:1', 'cfg/train:1'))\n"
    )
    env = {"VLM_LORA_LIGHT_IMAGE": "env/light:2"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    first, second = done.stdout.splitlines()
    assert first == f"env/light:2 {images.REGISTRY}/train:{source_tag(ROOT)}"
    assert second == "{'light': 'cfg/light:1', 'train': 'cfg/train:1'}"


def test_without_a_source_tree_the_module_imports_and_refuses_only_a_default_image(tmp_path):
    """An installed wheel: components/ without pyproject.toml, the lock or the Dockerfiles beside it."""
    site = tmp_path / "site-packages"
    (site / "components").mkdir(parents=True)
    shutil.copy(ROOT / "components" / "__init__.py", site / "components")
    shutil.copy(ROOT / "components" / "images.py", site / "components")
    for package in ("pipelines", "speedups"):
        (site / package).mkdir()
        (site / package / "__init__.py").write_text("")
    code = (
        "from components import images as m\n"
        "print(m.TAG, m.LIGHT_IMAGE)\n"
        "print(m.resolve_images('cfg/light:1', 'cfg/train:1'))\n"
        "try:\n    m.resolve_images('cfg/light:1')\nexcept m.ImageTagError as e:\n    print('refused', e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("None ") and lines[0].endswith("/light:no-source-tree")
    assert lines[1] == "{'light': 'cfg/light:1', 'train': 'cfg/train:1'}"
    assert lines[2].startswith("refused no default tag for the train image:")
    assert "is not the project's source tree" in lines[2] and "images.train" in lines[2]
    # the environment names the images: nothing refused
    done = run_module(["--print"], site, {"VLM_LORA_LIGHT_IMAGE": "e/l:1", "VLM_LORA_TRAIN_IMAGE": "e/t:1"})
    assert done.returncode == 0 and done.stdout.splitlines() == ["light: e/l:1", "train: e/t:1"]
    done = run_module(["--tag"], site)
    assert done.returncode == 1 and not done.stdout
    assert done.stderr.startswith("error: no image tag: ") and "has no pyproject.toml, setup.py" in done.stderr
    assert "this install has no _image_tags.json (built without the source tree)" in done.stderr


def test_compiling_for_vertex_without_a_tag_is_a_config_error_and_local_still_compiles(monkeypatch):
    from pipelines.config import ConfigError, load_config
    from pipelines.pipeline import build_pipeline
    from pipelines.vertex import VertexError, placeholder_values

    cfg = load_config(str(SEED))
    monkeypatch.setattr(images, "TAG", None)
    monkeypatch.setattr(images, "_TAG_ERROR", "/site-packages is not the project's source tree")
    monkeypatch.setattr(images, "LIGHT_IMAGE", f"{images.REGISTRY}/light:no-source-tree")
    monkeypatch.setattr(images, "TRAIN_IMAGE", f"{images.REGISTRY}/train:no-source-tree")
    with pytest.raises(ConfigError, match=r"lora_seed\.yaml: no default tag for the light and train image"):
        build_pipeline(cfg, "vertex")
    with pytest.raises(VertexError, match="no default tag"):
        placeholder_values(cfg)
    assert build_pipeline(cfg, "local") is not None  # kfp.local runs no image


# ---------------------------------------------------------------- the images' build and the docs


def image_layout(context: Path, dockerfile: Path, app: Path) -> Path:
    """Copies what `dockerfile`'s COPY lines take from `context` into `app` (its WORKDIR); returns app."""
    for ins, arg in parse_dockerfile(dockerfile):
        if ins == "COPY":
            *sources, dest = arg.split()
            for src in sources:
                if (context / src).is_dir():
                    shutil.copytree(context / src, app / dest, dirs_exist_ok=True)
                else:
                    assert dest.endswith("/"), arg  # files go into a folder: `COPY a b ./` or `./images/`
                    (app / dest).mkdir(parents=True, exist_ok=True)
                    shutil.copy2(context / src, app / dest / Path(src).name)
    return app


@pytest.mark.parametrize("name", ["Dockerfile.light", "Dockerfile.train"])
def test_inside_the_image_the_files_give_the_tag_they_were_built_with(tmp_path, name):
    """What the Dockerfile's last step runs, on the files it copied into /app (no .git there)."""
    context = copy_sources(ROOT, tmp_path / "context", extra=images.NOT_HASHED)
    tag, deps = source_tag(context), deps_tag(context)
    app = image_layout(context, context / "images" / name, tmp_path / "app")
    # what the build leaves beside them: bytecode, pip's in-tree build
    (app / "components" / "__pycache__").mkdir(exist_ok=True)
    (app / "components" / "__pycache__" / "images.cpython-311.pyc").write_bytes(b"\x00")
    (app / ".setuptools-build" / "lib").mkdir(parents=True)
    (app / "vlm_lora_pipeline.egg-info").mkdir()
    done = run_module(["--check", tag, "--deps", deps], app)
    assert done.returncode == 0, done.stderr
    assert run_module(["--tag"], app).stdout.strip() == tag
    wrong = run_module(["--check", "0.1.0-000000000000"], app)
    assert wrong.returncode == 1 and tag in wrong.stderr
    # the train layer on a dependency image of another lock
    wrong = run_module(["--check", tag, "--deps", "deps-000000000000"], app)
    assert wrong.returncode == 1 and f"have the dependency tag {deps!r}; build FROM train-deps:{deps}" in wrong.stderr
    done = run_module(["--check", f"{tag}-flash-attn", "--deps", f"{deps}-flash-attn", "--variant", "flash-attn"], app)
    assert done.returncode == 0, done.stderr


def test_inside_the_dependency_image_the_lock_gives_its_tag(tmp_path):
    """Dockerfile.train-deps's last step: its copies of the lock and itself, checked by a copy of images.py."""
    context = copy_sources(ROOT, tmp_path / "context")
    deps = deps_tag(context)
    opt = image_layout(context, context / "images" / "Dockerfile.train-deps", tmp_path / "opt")
    assert sorted(p.relative_to(opt).as_posix() for p in opt.rglob("*") if p.is_file()) == [
        "components/images.py",
        "images/Dockerfile.train-deps",
        "requirements.lock",
    ]

    def check(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "components/images.py", "--check-deps", *args], cwd=opt, capture_output=True, text=True
        )

    assert check(deps, "--variant", "").returncode == 0
    assert check(f"{deps}-flash-attn", "--variant", "flash-attn").returncode == 0
    done = check(deps, "--variant", "flash-attn")  # FLASH_ATTN=1 pushed without the suffix
    assert done.returncode == 1 and f"have the tag '{deps}-flash-attn'" in done.stderr
    # a code change does not change it; the lock does
    assert deps == deps_tag(ROOT) and deps.startswith("deps-")
    (opt / "requirements.lock").write_text("kfp==2.17.1\n")
    assert check(deps).returncode == 1


@pytest.mark.parametrize("name", ["Dockerfile.light", "Dockerfile.train"])
def test_each_dockerfile_copies_only_hashed_files_and_checks_its_tag_last(name):
    steps = parse_dockerfile(ROOT / "images" / name)
    copied = {src.rstrip("/") for ins, arg in steps if ins == "COPY" for src in arg.split()[:-1]}
    assert copied <= set(images.TAG_INPUTS) | set(images.NOT_HASHED), copied
    assert set(images.TAG_INPUTS) <= copied  # all of them are in the image: the check there can hash them
    ins, arg = steps[-1]
    assert steps[-2] == ("ARG", 'IMAGE_TAG=""')
    assert ("ENV", "PYTHONPATH=/app") in steps[: len(steps) - 1]  # the check hashes /app, not site-packages
    # setup.py bakes the tags from the Dockerfiles: they are in /app before the project is installed
    install = next(
        i for i, (ins_, arg_) in enumerate(steps) if ins_ == "RUN" and "pip install" in arg_ and '".[' in arg_
    )
    assert all(i < install for i, (ins_, arg_) in enumerate(steps) if ins_ == "COPY")
    if name == "Dockerfile.light":
        assert (ins, arg) == ("RUN", 'python -m components.images --check "${IMAGE_TAG}"')
    else:  # the variant comes from the dependency image below, so the two cannot disagree
        assert ins == "RUN" and " ".join(arg.split()) == (
            'VARIANT=$(case "${VLM_LORA_DEPS_TAG}" in *-flash-attn) echo flash-attn;; esac) && python -m '
            'components.images --check "${IMAGE_TAG}" --deps "${VLM_LORA_DEPS_TAG}" --variant "${VARIANT}"'
        )


def test_the_dependency_dockerfile_installs_the_lock_and_flash_attn_only_when_asked():
    steps = parse_dockerfile(ROOT / "images" / "Dockerfile.train-deps")
    assert ("ARG", "FLASH_ATTN=0") in steps  # opt-in: every shipped config sets attn_impl: sdpa
    copied = [src for ins, arg in steps if ins == "COPY" for src in arg.split()[:-1]]
    assert sorted(copied) == ["components/images.py", *sorted(images.DEPS_INPUTS)]
    # the heavy install sees only the lock: a code change cannot invalidate it
    install = next(i for i, (ins, arg) in enumerate(steps) if ins == "RUN" and "-r requirements.lock" in arg)
    assert [arg for ins, arg in steps[:install] if ins == "COPY"] == ["requirements.lock ./"]
    run = " ".join(steps[install][1].split())
    assert "pip install --no-deps -r requirements.lock && pip check" in run
    assert 'if [ "${FLASH_ATTN}" = "1" ]; then' in run and "flash-attn==" in run
    assert ("ENV", "VLM_LORA_DEPS_TAG=${DEPS_TAG}") in steps
    assert steps[-1][0] == "RUN" and '--check-deps "${DEPS_TAG}" --variant "${VARIANT}"' in steps[-1][1]


def test_the_dockerfiles_are_the_hashed_ones():
    assert sorted(p for p in images.TAG_INPUTS if p.startswith("images/")) == sorted(
        f"images/{p.name}" for p in (ROOT / "images").glob("Dockerfile.*")
    )


def substitute(text: str, subs: dict[str, str]) -> str:
    """Applies Cloud Build's substitutions to a step's text: ${_NAME} -> value, then $$ -> $."""
    for name, value in subs.items():
        text = text.replace("${" + name + "}", value)
    assert "${_" not in text, text
    return text.replace("$$", "$")


def test_cloudbuild_and_the_readmes_pass_the_computed_tags():
    text = (ROOT / "images" / "cloudbuild.yaml").read_text()
    build = yaml.safe_load(text)
    command = "$(python -m components.images --substitutions)"
    assert command in text and command in (ROOT / "images" / "README.md").read_text()
    assert "make image-tag" in (ROOT / "README.md").read_text()
    assert "image-tag:" in (ROOT / "Makefile").read_text()
    for name in ("_TAG", "_DEPS_TAG"):
        default = build["substitutions"][name]
        assert not TAG_RE.fullmatch(default) and images.main(["--check", default]) == 1
    assert build["substitutions"]["_VARIANT"] == ""  # flash-attn is opt-in
    steps = {step["id"]: step for step in build["steps"]}
    assert build["steps"][0]["id"] == "check-tag"
    [light_base] = [arg for ins, arg in parse_dockerfile(ROOT / "images" / "Dockerfile.light") if ins == "FROM"]
    assert steps["check-tag"]["name"] == light_base  # a pinned Python
    assert steps["light"]["waitFor"] == steps["train-deps"]["waitFor"] == ["check-tag"]
    assert steps["train"]["waitFor"] == ["train-deps"]
    light, train = " ".join(steps["light"]["args"]), " ".join(steps["train"]["args"])
    assert "-f images/Dockerfile.light --build-arg IMAGE_TAG=${_TAG} -t ${_REGISTRY}/light:${_TAG} ." in light
    assert (
        "-f images/Dockerfile.train --build-arg DEPS_IMAGE=${_REGISTRY}/train-deps:${_DEPS_TAG}${_VARIANT} "
        "--build-arg IMAGE_TAG=${_TAG}${_VARIANT} -t ${_REGISTRY}/train:${_TAG}${_VARIANT} ."
    ) in train
    assert build["images"] == ["${_REGISTRY}/light:${_TAG}", "${_REGISTRY}/train:${_TAG}${_VARIANT}"]
    assert build["options"]["machineType"] == "E2_HIGHCPU_8"  # nothing is compiled by default


def test_the_substitutions_command_prints_what_cloudbuild_takes():
    done = run_module(["--substitutions"], ROOT)
    assert done.stdout.strip() == f"_TAG={source_tag(ROOT)},_DEPS_TAG={deps_tag(ROOT)}"
    done = run_module(["--substitutions", "--variant", "flash-attn"], ROOT)
    assert done.stdout.strip() == f"_TAG={source_tag(ROOT)},_DEPS_TAG={deps_tag(ROOT)},_VARIANT=-flash-attn"
    assert run_module(["--deps-tag"], ROOT).stdout.strip() == deps_tag(ROOT)


def _step_script(step_id: str) -> str:
    [step] = [
        s for s in yaml.safe_load((ROOT / "images" / "cloudbuild.yaml").read_text())["steps"] if s["id"] == step_id
    ]
    assert step["entrypoint"] == "bash" and step["args"][0] == "-c"
    return step["args"][1]


@pytest.mark.parametrize("variant", ["", "-flash-attn"])
def test_cloudbuilds_first_step_passes_the_computed_tags_and_stops_others(tmp_path, variant):
    """The check-tag step's script as Cloud Build runs it: on the upload (no .git), before any build."""
    upload = copy_sources(ROOT, tmp_path / "upload")
    script = _step_script("check-tag")
    good = {"_TAG": source_tag(upload), "_DEPS_TAG": deps_tag(upload), "_VARIANT": variant}

    def run(subs: dict[str, str]) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "-c", substitute(script, subs).replace("python -m", f"{sys.executable} -m")],
            cwd=upload,
            env={**os.environ, "PYTHONPATH": str(upload)},
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert run(good).returncode == 0, run(good).stderr
    default = yaml.safe_load((ROOT / "images" / "cloudbuild.yaml").read_text())["substitutions"]
    assert run({**good, "_TAG": default["_TAG"]}).returncode == 1
    done = run({**good, "_DEPS_TAG": "deps-000000000000"})
    assert done.returncode == 1 and f"dependency tag {good['_DEPS_TAG']!r}" in done.stderr
    done = run({**good, "_VARIANT": "-sdpa"})
    assert done.returncode == 1 and "_VARIANT must be empty or -flash-attn, got '-sdpa'" in done.stderr


@pytest.mark.parametrize("variant", ["", "-flash-attn"])
def test_cloudbuild_reuses_a_pushed_dependency_image_and_builds_a_missing_one(tmp_path, variant):
    """The train-deps step's script with a stand-in `docker` that logs its calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "docker.log"
    (bin_dir / "docker").write_text(
        f'#!/bin/bash\necho "$*" >> {log}\n[ "$1 $2" != "manifest inspect" ] || [ -n "$PUSHED" ]\n'
    )
    (bin_dir / "docker").chmod(0o755)
    subs = {"_REGISTRY": "r", "_TAG": "0.1.0-aaaaaaaaaaaa", "_DEPS_TAG": "deps-bbbbbbbbbbbb", "_VARIANT": variant}
    script = substitute(_step_script("train-deps"), subs)
    deps = f"r/train-deps:deps-bbbbbbbbbbbb{variant}"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == f"manifest inspect {deps}"
    flash = 1 if variant else 0
    assert calls[1] == (
        f"build -f images/Dockerfile.train-deps --build-arg FLASH_ATTN={flash} --build-arg MAX_JOBS=16 "
        f"--build-arg DEPS_TAG=deps-bbbbbbbbbbbb{variant} -t {deps} ."
    )
    assert calls[2:] == [f"push {deps}"]
    log.unlink()
    done = subprocess.run(["bash", "-c", script], env={**env, "PUSHED": "1"}, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == f"reusing {deps}"
    assert log.read_text().splitlines() == [f"manifest inspect {deps}"]  # nothing built, nothing pushed


# ---------------------------------------------------------------- end to end: the compiled pipeline


def compiled_images(tree: Path, out: Path) -> dict[str, str]:
    """Compiles the seed config for Vertex with the code in `tree`; returns {executor: image}."""
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.compile", "--config", str(SEED), "--output", str(out)],
        cwd=tree,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("VLM_LORA_")}, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    spec = yaml.safe_load(out.read_text())
    found = {
        name: executor["container"]["image"]
        for name, executor in spec["deploymentSpec"]["executors"].items()
        if executor["container"]["image"].startswith(images.REGISTRY)  # not GCPC's CustomJob launcher
    }
    # the CustomJob's worker pools are an input default: part of train-lora's spec, so of its cache key
    pools = spec["components"]["comp-train-lora"]["inputDefinitions"]["parameters"]["worker_pool_specs"]["defaultValue"]
    found["train-lora (CustomJob)"] = pools[0]["container_spec"]["image_uri"]
    return found


def test_a_code_change_gives_the_compiled_pipeline_new_image_names(tmp_path):
    """The bug this tag fixes: new train-lora code must not keep the image name a cached run was keyed on."""
    tree = copy_sources(ROOT, tmp_path / "tree")
    before = compiled_images(tree, tmp_path / "before.yaml")
    tag = source_tag(tree)
    assert before["train-lora (CustomJob)"].endswith(f"/train:{tag}")
    assert before["exec-evaluate"].endswith(f"/train:{tag}") and before["exec-stage-model"].endswith(f"/light:{tag}")
    with (tree / "components" / "train_lora" / "core.py").open("a") as f:
        f.write("\n# a new training lever\n")
    after = compiled_images(tree, tmp_path / "after.yaml")
    assert after.keys() == before.keys()
    assert all(after[name] != before[name] for name in before), (before, after)
    assert after["train-lora (CustomJob)"].endswith(f"/train:{source_tag(tree)}")


def _ignore_entries(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def test_dockerignore_covers_every_gitignore_entry():
    """A local build's context must leave out what git ignores, at the same depth, or the in-image check
    of the Dockerfiles would hash files Cloud Build's upload never holds."""
    import fnmatch

    docker = _ignore_entries(ROOT / ".dockerignore")
    missing = []
    for entry in _ignore_entries(ROOT / ".gitignore"):
        name = entry.strip("/")
        anchored = entry.startswith("/") or "/" in name
        wanted = [p for p in docker if fnmatch.fnmatch(name, p)] if anchored else []
        wanted += [p for p in docker if p.startswith("**/") and fnmatch.fnmatch(name, p[3:])]
        if not wanted:
            missing.append(f"{entry} (write {'' if anchored else '**/'}{name} into .dockerignore)")
    assert not missing, missing


def test_the_build_context_leaves_out_what_the_tag_does_not_hash():
    """The speed-up layer's tests, GPU benchmarks and README: a COPY of speedups/ must not put them into /app, where
    the image's last step hashes what it holds."""
    assert set(images.NOT_IN_IMAGES) <= set(_ignore_entries(ROOT / ".dockerignore"))
    assert all(name.split("/")[0] in images.TAG_INPUTS for name in images.NOT_IN_IMAGES)
    assert not [p for p in source_files(ROOT) if p.startswith(("speedups/tests/", "speedups/benchmarks/"))]


def test_walk_without_git_skips_what_gitignore_ignores_at_any_depth():
    """Without git (a source tarball) the tag's walk must leave out the same leftovers git ignores under
    components/ and pipelines/, or the two listings would give two tags for one tree."""
    for entry in _ignore_entries(ROOT / ".gitignore"):
        if entry.startswith("/"):
            continue  # anchored at the root: never under components/ or pipelines/
        name = entry.strip("/")
        example = name.replace("*", "x")
        assert images._skipped(f"components/sub/{example}/f.py") or images._skipped(f"components/sub/{example}"), (
            f".gitignore ignores {entry} at any depth; add it to components/images.py _SKIP_DIRS / _SKIP_SUFFIXES"
        )
