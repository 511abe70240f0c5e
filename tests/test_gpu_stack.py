"""Shipped = measured: requirements.lock pins the GPU stack the GPU figures were measured on.

benchmarks/gpu_stack.json records that stack (the GPU machine's torch, Triton and CUDA packages, and the
packages above torch carried to it as wheels). These tests fail when the lock, an install path (Makefile,
the images) or the wheels the GPU runs carry leave it: re-measure on the new versions and update the record,
or keep the lock where it was measured.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
RECORD = json.loads((ROOT / "benchmarks" / "gpu_stack.json").read_text())
LOCK = {
    canonicalize_name(name): version.strip()
    for name, _, version in (
        line.partition("==") for line in (ROOT / "requirements.lock").read_text().splitlines() if "==" in line
    )
}
# What decides the GPU figures: a lock that moves any of these away from the record ships an unmeasured stack.
MUST_MATCH = ("torch", "torchvision", "triton", "transformers", "accelerate", "peft", "liger-kernel", "ms-swift")


def measured(name: str) -> str:
    """The recorded version of `name`, without a local label (torch's +cu130 is the CUDA build of the same release)."""
    pins = {canonicalize_name(n): v for n, v in {**RECORD["image"], **RECORD["carried"]}.items()}
    return pins[canonicalize_name(name)].split("+")[0]


def test_the_record_says_what_when_and_where():
    assert RECORD["date"] == "2026-11-28" and "GPU" in RECORD["machine"] and "Python 3.12" in RECORD["machine"]
    for name in MUST_MATCH:
        assert measured(name), name
    assert RECORD["image"]["torch"].endswith("+cu130")


@pytest.mark.parametrize("name", MUST_MATCH)
def test_the_lock_pins_the_measured_version(name):
    key = canonicalize_name(name)
    assert key in LOCK, f"requirements.lock has no pin for {name}"
    assert Version(LOCK[key]) == Version(measured(name)), (
        f"requirements.lock pins {name}=={LOCK[key]}, but the GPU figures were measured on {measured(name)} "
        "(benchmarks/gpu_stack.json): measure the new version on a GPU and update the record, or pin the measured one"
    )


def test_the_lock_pins_every_recorded_cuda_package_as_measured():
    """torch 2.11.0 pins most of them itself; cuda-bindings / cuda-pathfinder (ranges in torch) as on the image."""
    wrong = {
        name: (LOCK.get(canonicalize_name(name)), version)
        for name, version in RECORD["image"].items()
        if LOCK.get(canonicalize_name(name)) != version.split("+")[0]
    }
    assert not wrong, f"lock vs measured: {wrong}"
    # on the image but required by nothing the project installs: recorded, not pinned
    assert not set(map(canonicalize_name, RECORD["image_not_locked"])) & set(LOCK)


def test_every_torch_install_path_takes_the_measured_torch():
    torch, vision = f"torch=={measured('torch')}", f"torchvision=={measured('torchvision')}"
    make = (ROOT / "Makefile").read_text()
    light = (ROOT / "images" / "Dockerfile.light").read_text()
    for where, text in (("Makefile", make), ("images/Dockerfile.light", light)):
        installs = re.findall(r"pip install [^\n]*torch==\S+[^\n]*", text)
        assert installs and all(torch in line and vision in line for line in installs), (where, installs)


def test_the_training_image_comment_names_the_measured_stack():
    text = (ROOT / "images" / "Dockerfile.train-deps").read_text()
    for name in ("torch", "torchvision", "Triton", "transformers", "accelerate", "peft", "ms-swift", "liger-kernel"):
        assert f"{name} {measured(name)}" in text, name
    assert RECORD["date"] in text


def test_the_gpu_wheels_carry_the_locks_versions_above_torch():
    """gpu_wheels.sh names the packages and reads each version from the lock: no second list of versions."""
    script = (ROOT / "benchmarks" / "gpu_wheels.sh").read_text()
    swift = script[script.index("swift() {") : script.index("unsloth() {")]
    assert "==" not in swift, "gpu_wheels.sh swift hard-codes a version: name the package, the lock gives it"
    assert "locked " in swift
    for name in RECORD["carried"]:
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", swift), name
