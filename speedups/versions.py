"""The library versions the speed-up layer supports, in one place, and how an installed version is read.

"Verified" means measured on a GPU (benchmarks/README.md): torch 2.11.0, Triton 3.6.0, transformers 5.17.0 (and 5.19.0
for one run), accelerate 1.15.0, peft 0.20.0, ms-swift 4.6.0, liger-kernel 0.8.5. A range starts at the oldest measured
version and stops before the next minor release (the patch releases in between are taken as measured); transformers
spans the two measured releases. torch and Triton gate only the items whose GPU kernels they compile or run
(`Item.gpu_verified`, checked where a GPU is), and only 2.11.x / 3.6.x were measured. A version outside its range
skips the item with a line that names the package, the version and the range. Each item names the ranges of the
packages it depends on (`items.py`); `SUPPORTED` is the union, which `__version__` stands for.
"""

from __future__ import annotations

import importlib.metadata

# The package's own version: a new one whenever an item, a patched symbol or a range below changes.
__version__ = "1.0.0"

# What was measured (see the module docstring).
TRANSFORMERS = ">=5.17,<5.20"
PEFT = ">=0.20,<0.21"
ACCELERATE = ">=1.15,<1.16"
MS_SWIFT = ">=4.6,<4.7"
LIGER = ">=0.8.5,<0.9"
TORCH = ">=2.11,<2.12"
TRITON = ">=3.6,<3.7"

# {distribution: range} every item's code may run under (the union of the items' ranges; tests check it is).
SUPPORTED: dict[str, str] = {
    "transformers": TRANSFORMERS,
    "peft": PEFT,
    "accelerate": ACCELERATE,
    "ms-swift": MS_SWIFT,
    "liger-kernel": LIGER,
}
# {distribution: range} checked only where a GPU runs an item's kernels.
GPU_SUPPORTED: dict[str, str] = {"torch": TORCH, "triton": TRITON}


def installed_version(distribution: str) -> str | None:
    """The installed version of `distribution` (None: not installed). The one source of versions: tests replace it."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def in_range(version: str, spec: str) -> bool:
    """Whether `version` satisfies the PEP 440 `spec` (a local label such as +cu130 is ignored)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return Version(Version(version).public) in SpecifierSet(spec)
    except InvalidVersion:
        return False
