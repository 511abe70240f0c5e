"""images/: Dockerfiles parse, pin every version, install from the project's lock; docs say how to build."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "images"
DOCKERFILES = sorted(IMAGES.glob("Dockerfile.*"))
INSTRUCTIONS = {
    "FROM",
    "RUN",
    "COPY",
    "ADD",
    "ENV",
    "ARG",
    "WORKDIR",
    "LABEL",
    "USER",
    "EXPOSE",
    "ENTRYPOINT",
    "CMD",
    "SHELL",
    "VOLUME",
    "HEALTHCHECK",
    "STOPSIGNAL",
    "ONBUILD",
}


def parse_dockerfile(path: Path) -> list[tuple[str, str]]:
    """Returns (instruction, argument) pairs; raises on an unknown instruction."""
    out, buf = [], ""
    for line in path.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        buf += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if line.endswith("\\"):
            continue
        word, _, rest = buf.strip().partition(" ")
        if word.upper() not in INSTRUCTIONS:
            raise ValueError(f"{path.name}: unknown instruction {word!r}")
        out.append((word.upper(), rest.strip()))
        buf = ""
    assert not buf, f"{path.name}: dangling line continuation"
    return out


def pip_requirements(run: str) -> list[str]:
    """Returns the requirement specifiers of every `pip install` in a RUN line."""
    reqs = []
    for command in re.split(r"&&|;|\|\|", run):
        words = shlex.split(command.replace("${", "{"))
        if "pip" in words and "install" in words:
            args = words[words.index("install") + 1 :]
            skip = False
            for word in args:
                if skip:
                    skip = False
                    continue
                if word in ("-c", "--index-url", "--extra-index-url", "-r"):
                    skip = True
                    continue
                if word.startswith("-") or re.fullmatch(r"\.(\[[a-z,]+\])?", word):  # the project, with extras
                    continue
                reqs.append(word)
    return reqs


def test_there_are_a_training_and_a_light_image():
    assert {p.name for p in DOCKERFILES} == {"Dockerfile.train", "Dockerfile.train-deps", "Dockerfile.light"}


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_parses_and_pins_its_base(path):
    steps = parse_dockerfile(path)
    assert steps[0][0] in ("FROM", "ARG")
    [base] = [arg for ins, arg in steps if ins == "FROM"]
    if path.name == "Dockerfile.train":  # the dependency image, named by its content tag (cloudbuild.yaml)
        assert steps[:2] == [("ARG", 'DEPS_IMAGE=""'), ("FROM", "${DEPS_IMAGE}")]
        return
    image, _, tag = base.partition(":")
    assert tag and tag != "latest" and re.search(r"\d+\.\d+", tag), base


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_every_package_is_pinned_and_the_project_installs_from_the_lock(path):
    runs = [arg for ins, arg in parse_dockerfile(path) if ins == "RUN"]
    reqs = [r for run in runs for r in pip_requirements(run)]
    assert reqs or path.name == "Dockerfile.train", "no pip install found"  # the code layer adds no package
    for req in reqs:
        assert re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[0-9][0-9A-Za-z.+\-]*", req), f"{path.name}: {req!r} is not pinned"
    if path.name == "Dockerfile.train-deps":  # exactly the lock, nothing resolved on top
        assert any("pip install --no-deps -r requirements.lock" in run for run in runs)
    else:
        project = (
            r'pip install (--no-index --no-build-isolation )?-c requirements\.lock "?\.\[train(,gpu)?(,tracking)?\]"?'
        )
        assert any(re.search(project, run) for run in runs), "the project must install with -c requirements.lock"
    lock = dict(
        line.split("==", 1)
        for line in (ROOT / "requirements.lock").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    for req in reqs:  # pins also in the lock must agree with it
        name, version = req.split("==")
        if name.lower() in {k.lower() for k in lock}:
            assert {k.lower(): v for k, v in lock.items()}[name.lower()].split(" ")[0].strip() == version, req
    copies = " ".join(arg for ins, arg in parse_dockerfile(path) if ins in ("COPY", "ADD"))
    assert "requirements.lock" in copies
    assert not re.search(
        r"safetensors|\.bin\b|models?/|huggingface-cli download|snapshot_download", copies + " ".join(runs)
    ), "no model weights in images"


def test_cloudbuild_builds_both_images_with_the_tags_components_images_uses():
    from components import images

    build = yaml.safe_load((IMAGES / "cloudbuild.yaml").read_text())
    args = [" ".join(step["args"]) for step in build["steps"]]
    assert any("images/Dockerfile.train " in a and "/train:${_TAG}${_VARIANT}" in a for a in args)
    assert any("images/Dockerfile.train-deps " in a and "DEPS_TAG=${_DEPS_TAG}${_VARIANT}" in a for a in args)
    assert any("images/Dockerfile.light" in a and "/light:${_TAG}" in a for a in args)
    # the tag is not written here: it is computed from the sources and passed (tests/test_image_tag.py)
    assert (
        build["substitutions"]["_TAG"] != images.TAG
        and "python -m components.images --substitutions" in (IMAGES / "cloudbuild.yaml").read_text()
    )
    assert images.TRAIN_IMAGE.endswith(f"/train:{images.TAG}") and images.LIGHT_IMAGE.endswith(f"/light:{images.TAG}")


def test_readme_says_how_to_build_with_cloud_build():
    text = (IMAGES / "README.md").read_text()
    assert "gcloud builds submit --config images/cloudbuild.yaml" in text
    assert "requirements.lock" in text


def test_setup_doc_names_each_role_and_the_secret():
    text = (ROOT / "docs" / "setup.md").read_text()
    for role in (
        "roles/aiplatform.user",
        "roles/storage.objectUser",
        "roles/artifactregistry.reader",
        "roles/secretmanager.secretAccessor",
        "roles/iam.serviceAccountUser",
        "roles/artifactregistry.writer",
    ):
        assert text.count(role) >= 2, role  # granted in the script and explained in the table
    assert "gcloud secrets create hf-token" in text and "gcloud iam service-accounts create" in text


def test_training_image_is_the_locks_torch_and_cuda_stack():
    """The image runs what CI tested: torch from the lock with the lock's CUDA major, no other index."""
    lock = (ROOT / "requirements.lock").read_text()
    cuda_major = re.search(r"^cuda-toolkit==(\d+)\.", lock, re.M).group(1)
    assert re.search(rf"^nvidia-cudnn-cu{cuda_major}==", lock, re.M)  # the lock's torch is a CUDA {major} build
    steps = parse_dockerfile(IMAGES / "Dockerfile.train-deps")
    [base] = [arg for ins, arg in steps if ins == "FROM"]
    assert re.match(rf"nvidia/cuda:{cuda_major}\.\d+\.\d+-cudnn-devel-", base), base
    runs = " ".join(arg for ins, arg in steps if ins == "RUN")
    assert re.search(r"^torch==", lock, re.M)  # torch comes from the lock's own pin, from PyPI
    assert "pip install --no-deps -r requirements.lock" in runs and "--index-url" not in runs and "cu12" not in runs
    # the code layer installs nothing: every dependency is already there
    code = " ".join(arg for ins, arg in parse_dockerfile(IMAGES / "Dockerfile.train") if ins == "RUN")
    assert "pip install --no-index" in code


def test_the_training_images_comments_say_which_versions_the_gpu_benchmarks_ran():
    """The lock's torch stack is the one the GPU figures ran (benchmarks/gpu_stack.json); the comment says so."""
    text = (IMAGES / "Dockerfile.train-deps").read_text()
    lock = (ROOT / "requirements.lock").read_text()
    for pin, said in (
        ("torch", "torch"),
        ("torchvision", "torchvision"),
        ("triton", "Triton"),
        ("transformers", "transformers"),
    ):
        version = re.search(rf"^{pin}==(\S+)", lock, re.M).group(1)
        assert f"{said} {version}" in text, pin
    assert "benchmarks/gpu_stack.json" in text and "did NOT" not in text
