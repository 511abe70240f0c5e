"""The package as users install it: a wheel built from the tree, installed away from the checkout.

`pip install .` (the light install, no `train` extra) must give a `vlm-lora compile` for Vertex
that names the same default images as a compile from the checkout (setup.py bakes the tags into
the package), ship the configs inside `pipelines` (no top-level `configs`), and leave the
checkout's `build/` (where compile writes) alone. pyproject.toml states ranges; the exact pins
are only in requirements.lock, and they must fall inside those ranges.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from components.images import NOT_IN_IMAGES, deps_tag, source_files, source_tag

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCK = {
    canonicalize_name(name): version.strip()
    for name, _, version in (
        line.partition("==") for line in (ROOT / "requirements.lock").read_text().splitlines() if "==" in line
    )
}
# Besides what the tag hashes, a build needs these (the README for the metadata, the configs it ships).
BUILD_EXTRA = ("README.md", "MANIFEST.in")


def copy_tree(dst: Path) -> Path:
    """Copies what a build of this checkout reads (the hashed files, the configs, the README, and the speed-up
    layer's tests and benchmarks, which sit inside a package folder but must stay out of the wheel) to `dst`."""
    beside = [ROOT / name for name in NOT_IN_IMAGES]
    files = [
        *source_files(ROOT),
        *BUILD_EXTRA,
        *(p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").rglob("*.yaml")),
        *(p.relative_to(ROOT).as_posix() for b in beside for p in [b, *b.rglob("*.py")] if p.is_file()),
    ]
    for rel in files:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        (dst / rel).write_bytes((ROOT / rel).read_bytes())
    return dst


def pip(*args: str, cwd: Path) -> None:
    """Runs this environment's pip offline (no build isolation: setuptools comes from the environment)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", *args, "--no-deps", "--no-build-isolation", "--no-index", "-q"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def run_installed(target: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Runs the installed `vlm-lora` script of `target` (installed with --target) from `cwd`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLM_LORA_") and k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, str(target / "bin" / "vlm-lora"), *args],
        cwd=cwd,
        env={**env, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A wheel of a copy of this checkout, installed with --target; returns (tree, wheel, target)."""
    base = tmp_path_factory.mktemp("pkg")
    tree = copy_tree(base / "tree")
    pip("wheel", "-w", str(base / "dist"), ".", cwd=tree)
    [wheel] = (base / "dist").glob("*.whl")
    pip("install", "--target", str(base / "target"), str(wheel), cwd=base)
    return tree, wheel, base / "target"


def test_the_wheel_carries_the_trees_image_tags_and_the_configs_under_pipelines(built):
    tree, wheel, target = built
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {
        "components",
        "pipelines",
        "speedups",
        "vlm_lora_pipeline-0.1.0.dist-info",
    }
    assert not [n for n in names if n.startswith(("speedups/tests/", "speedups/benchmarks/", "speedups/README"))]
    assert (tree / "speedups/tests/conftest.py").is_file()  # they were in the tree it was built from
    tags = json.loads((target / "components" / "_image_tags.json").read_text())
    assert tags == {"tag": source_tag(tree), "deps_tag": deps_tag(tree)}
    assert tags["tag"] == source_tag(ROOT)  # the same hash `make image-tag` prints for this code
    shipped = sorted(
        p.relative_to(target / "pipelines" / "configs") for p in (target / "pipelines/configs").rglob("*.yaml")
    )
    assert shipped == sorted(p.relative_to(ROOT / "configs") for p in (ROOT / "configs").rglob("*.yaml"))
    # built in .setuptools-build/, not in build/ (where compile writes); nothing written into the package tree
    assert not (tree / "build").exists() and (tree / ".setuptools-build").is_dir()
    assert not (tree / "components" / "_image_tags.json").exists() and not (tree / "pipelines" / "configs").exists()


def test_the_installed_command_compiles_for_vertex_with_the_default_images_outside_the_checkout(built, tmp_path):
    """The README's light-install line, run from a folder that is not the checkout."""
    tree, _, target = built
    done = run_installed(target, ["compile", "--config", "lora_seed", "eval.max_samples=64"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    [out] = (tmp_path / "build").glob("*.yaml")
    spec = yaml.safe_load(out.read_text())
    images = {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()}
    tag = source_tag(tree)
    assert {i.rsplit("/", 1)[1] for i in images if "/vlm-lora/" in i} == {f"light:{tag}", f"train:{tag}"}
    done = run_installed(target, ["ls"], tmp_path)
    assert done.returncode == 0 and "qwen3_vl_4b/lora_seed" in done.stdout, done.stderr
    code = "import components.images as m, pipelines.config as c; print(m.__file__); print(c.CONFIG_DIR); print(m.TAG)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLM_LORA_")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
    )
    module, configs, baked = done.stdout.split()
    assert module.startswith(str(target)) and configs == str(target / "pipelines" / "configs") and baked == tag


def test_an_sdist_carries_the_tags_of_the_checkout_it_was_made_from(tmp_path):
    """`python -m build` makes the wheel from the unpacked sdist, which cannot hash the tree itself."""
    tree = copy_tree(tmp_path / "tree")
    code = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "sdist")], cwd=tree, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    name = done.stdout.strip().splitlines()[-1]
    with tarfile.open(tmp_path / "sdist" / name) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    [unpacked] = (tmp_path / "unpacked").iterdir()
    assert not (tree / "components" / "_image_tags.json").exists()  # written into the sdist only
    pip("wheel", "-w", str(tmp_path / "dist"), ".", cwd=unpacked)
    [wheel] = (tmp_path / "dist").glob("*.whl")
    tags = json.loads(zipfile.ZipFile(wheel).read("components/_image_tags.json"))
    assert tags == {"tag": source_tag(tree), "deps_tag": deps_tag(tree)}
    assert "pipelines/configs/qwen3_vl_4b/lora_seed.yaml" in zipfile.ZipFile(wheel).namelist()


def test_a_build_without_the_source_tree_is_refused_naming_what_is_missing(tmp_path):
    tree = copy_tree(tmp_path / "tree")
    (tree / "images" / "Dockerfile.train-deps").unlink()
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", "d", "."],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert "cannot bake the default image tags into the package" in done.stderr
    assert "images/Dockerfile.train-deps" in done.stderr


# ---------------------------------------------------------------- ranges in pyproject.toml, pins in the lock


def requirements(*extras: str) -> list[Requirement]:
    """The project's requirements: the base list and the named extras."""
    project = PYPROJECT["project"]
    return [
        Requirement(r)
        for r in project["dependencies"] + [r for e in extras for r in project["optional-dependencies"][e]]
    ]


def test_pyproject_states_ranges_and_the_lock_pins_each_inside_them():
    reqs = requirements(*PYPROJECT["project"]["optional-dependencies"])
    for req in reqs:
        assert not any(s.operator in ("==", "===") for s in req.specifier), f"pyproject.toml pins {req}: give a range"
        name = canonicalize_name(req.name)
        assert name in LOCK, f"requirements.lock has no pin for {req.name}"
        assert req.specifier.contains(LOCK[name], prereleases=True), (
            f"the lock's {req.name}=={LOCK[name]} is outside {req}"
        )


def test_the_lock_holds_every_package_the_train_and_gpu_extras_pull_in():
    """The dependency image installs the lock alone (--no-deps): it must hold the whole closure."""
    env = default_environment()
    seen, todo, missing, not_here = set(), requirements("train", "gpu"), [], []
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        if name in ("pip", "setuptools"):  # left out of the lock by pip freeze: the Dockerfiles pin them
            continue
        if name not in LOCK:
            missing.append(req.name)
            continue
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:  # the gpu extra on a CPU machine: its own pin is checked above
            not_here.append(req.name)
            continue
        for extra in [""] + sorted(req.extras):
            for sub in requires:
                sub = Requirement(sub)
                if sub.marker is None or sub.marker.evaluate({**env, "extra": extra}):
                    todo.append(sub)
    assert not missing, f"not in requirements.lock: {missing}"
    assert set(not_here) <= {r.name for r in requirements("gpu")}, not_here


def test_make_install_takes_the_locked_versions():
    make = (ROOT / "Makefile").read_text()
    installs = re.findall(r"pip install [^\n]*\.\[train,dev\][^\n]*", make)
    assert installs and all("-c requirements.lock" in line for line in installs), installs
    torch = re.search(r"pip install -q (torch==\S+) (torchvision==\S+)", make)
    assert (
        torch
        and torch.group(1) == f"torch=={LOCK['torch']}"
        and torch.group(2) == f"torchvision=={LOCK['torchvision']}"
    )
