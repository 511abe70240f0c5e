"""Container images of the pipeline's tasks: the one place their tags live.

Both images are built from `images/` (see images/README.md) with the project installed
from `requirements.lock` (no model weights). Which image a compiled pipeline uses, first
match wins:

1. the config's `images.light` / `images.train`,
2. the environment variables `VLM_LORA_LIGHT_IMAGE` / `VLM_LORA_TRAIN_IMAGE`,
3. the defaults `REGISTRY/light:TAG` and `REGISTRY/train:TAG`.

`TAG` is derived from what the images hold, so that Vertex's cache (keyed on the component
spec, which names the image) never reuses a result made by other code: `<version>-<hash>`,
the project version and 12 hex digits of a sha256 over `TAG_INPUTS` (the project's code
and package data under components/ and pipelines/, pyproject.toml, requirements.lock and
the Dockerfiles), each file's relative path and bytes as they are on disk, in path order.
Not hashed: `__pycache__`, `*.pyc` and every file git ignores (the build context leaves
them out too), README.md (copied for the package metadata only; nothing runs it). Where
git cannot list the files (no .git: inside an image, an unpacked archive) a walk skips
caches and build leftovers only. Print the tag with `python -m components.images --tag`;
`images/cloudbuild.yaml` pushes under it, and the build checks it against the files
(`--check`: the yaml's first step, on the upload; each Dockerfile's last, inside the image).

Where the source tree is not beside this module (an installed wheel), `TAG` is None: the
module still imports (the task wrappers need it), and `resolve_images` raises
`ImageTagError` only when a default image is asked for. Inside an image the tree is
/app, which holds every input, so the tag there is the one the image was checked against.

Locally (kfp.local) tasks run in the current Python environment and no image is used.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tomllib
from pathlib import Path

REGISTRY = "us-docker.pkg.dev/YOUR_PROJECT/vlm-lora"

# What the tag hashes, relative to the repository root: folders (every file in them that is
# not ignored) and files. tests/test_image_tag.py checks every COPY of the Dockerfiles is here.
TAG_INPUTS = (
    "components",
    "pipelines",
    "pyproject.toml",
    "requirements.lock",
    "images/Dockerfile.light",
    "images/Dockerfile.train",
)
# Build context files that are copied into the images but do not change what runs.
NOT_HASHED = ("README.md",)
# Skipped where git cannot list the files (inside an image, an unpacked archive); the same
# things .gitignore and .dockerignore leave out under components/ and pipelines/.
_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".venv"}
_SKIP_SUFFIXES = (".pyc", ".pyo", ".egg-info")
_SCHEME = b"vlm-lora image tag v1\n"  # change to change every tag when the hashing itself changes
_HASH_CHARS = 12
_ROOT = Path(__file__).resolve().parent.parent
_NO_TAG = "no-source-tree"  # in the placeholder URIs only; resolve_images refuses them


class ImageTagError(RuntimeError):
    """The default image tag cannot be computed (no source tree, an unreadable file)."""


def source_files(root: Path) -> list[str]:
    """Returns the files the tag hashes: sorted paths relative to `root`, with / separators.

    Listed by `git ls-files` (tracked and untracked, without ignored files) where `root` is in
    a git work tree, else by walking `TAG_INPUTS` without `__pycache__`, `*.pyc` and `*.egg-info`.

    Args:
        root: The repository root (the folder holding pyproject.toml and components/).

    Returns:
        The relative paths, sorted.

    Raises:
        ImageTagError: A file or folder of `TAG_INPUTS` is missing under `root`.
    """
    root = Path(root)
    missing = [name for name in TAG_INPUTS if not (root / name).exists()]
    if missing:
        raise ImageTagError(f"{root} is not the project's source tree: it has no {', '.join(missing)}")
    listed = _git_files(root)
    if listed is None:
        listed = []
        for name in TAG_INPUTS:
            if (root / name).is_file():
                listed.append(name)
                continue
            for folder, dirs, files in os.walk(root / name):
                dirs[:] = [d for d in dirs if not _skipped(d)]
                rel = Path(folder).relative_to(root).as_posix()
                listed += [f"{rel}/{f}" for f in files]
    return sorted({p for p in listed if not _skipped(p) and (root / p).is_file()})


def _skipped(rel: str) -> bool:
    """Whether a relative path is a cache or build leftover (`__pycache__`, `*.pyc`, `*.egg-info`, ...)."""
    return any(part in _SKIP_DIRS or part.endswith(_SKIP_SUFFIXES) for part in rel.split("/"))


def _git_files(root: Path) -> list[str] | None:
    """Returns git's list of the non-ignored files of `TAG_INPUTS`; None where git cannot list them."""
    try:
        done = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *TAG_INPUTS],
            cwd=root,
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):  # no git, or it hangs
        return None
    if done.returncode != 0:  # not a work tree (inside an image, an archive), or one git does not trust
        return None
    return [p for p in done.stdout.decode("utf-8", "surrogateescape").split("\0") if p]


def source_tag(root: Path) -> str:
    """Returns the image tag of a source tree: `<project version>-<12 hex digits>`.

    The digits are the start of a sha256 over each of `source_files(root)`: its relative path
    and the sha256 of its bytes (as on disk: no line-ending or mtime enters), in path order.
    The same files at any path give the same tag.

    Args:
        root: The repository root.

    Returns:
        The tag, e.g. "0.1.0-3f2a9c01b7de".

    Raises:
        ImageTagError: `root` is not the source tree, a file cannot be read, or pyproject.toml
            has no `project.version`.
    """
    root = Path(root)
    digest = hashlib.sha256(_SCHEME)
    try:
        for rel in source_files(root):
            digest.update(
                rel.encode("utf-8", "surrogateescape") + b"\0" + hashlib.sha256((root / rel).read_bytes()).digest()
            )
        version = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as exc:
        raise ImageTagError(f"cannot compute the image tag of {root}: {exc}") from None
    return f"{version}-{digest.hexdigest()[:_HASH_CHARS]}"


def _this_tree_tag() -> tuple[str | None, str]:
    """Returns (tag of the tree this module is in, "") or (None, why not)."""
    try:
        return source_tag(_ROOT), ""
    except ImageTagError as exc:
        return None, str(exc)


TAG, _TAG_ERROR = _this_tree_tag()

# CPU image for staging, validation and registration.
LIGHT_IMAGE = os.environ.get("VLM_LORA_LIGHT_IMAGE") or f"{REGISTRY}/light:{TAG or _NO_TAG}"
# CUDA image with torch, ms-swift, deepspeed, liger-kernel and flash-attn for train/merge/eval.
TRAIN_IMAGE = os.environ.get("VLM_LORA_TRAIN_IMAGE") or f"{REGISTRY}/train:{TAG or _NO_TAG}"


def resolve_images(light: str = "", train: str = "") -> dict[str, str]:
    """Returns the task images: the overrides where given, else the environment's, else the defaults.

    Args:
        light: The config's `images.light`; "" = `VLM_LORA_LIGHT_IMAGE` or `REGISTRY/light:TAG`.
        train: The config's `images.train`; "" = `VLM_LORA_TRAIN_IMAGE` or `REGISTRY/train:TAG`.

    Returns:
        {"light": uri, "train": uri}.

    Raises:
        ImageTagError: A default image is needed but `TAG` is unknown (no source tree here).
    """
    images = {"light": light or LIGHT_IMAGE, "train": train or TRAIN_IMAGE}
    unknown = [name for name, uri in images.items() if TAG is None and uri.endswith(f":{_NO_TAG}")]
    if unknown:
        raise ImageTagError(
            f"no default tag for the {' and '.join(unknown)} image: {_TAG_ERROR}. The tag is a hash of the "
            "sources, so compile from a checkout of the project (`python -m components.images --tag` prints it), "
            "or name the images with the config's images.light / images.train or "
            "VLM_LORA_LIGHT_IMAGE / VLM_LORA_TRAIN_IMAGE"
        )
    return images


def main(argv: list[str] | None = None) -> int:
    """`python -m components.images --tag | --print | --check TAG [--variant V]`; exit 0, or 1 with one line on stderr."""
    parser = argparse.ArgumentParser(prog="python -m components.images", description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--tag", action="store_true", help="print the default image tag of this source tree")
    what.add_argument("--print", action="store_true", help="print the light and train image URIs a compile uses")
    what.add_argument("--check", metavar="TAG", help="exit 1 unless TAG is this tree's tag (the images' last step)")
    parser.add_argument("--variant", default="", help="with --check: a build variant the tag ends with, '-V'")
    args = parser.parse_args(argv)
    try:
        if args.tag:
            if TAG is None:
                raise ImageTagError(f"no image tag: {_TAG_ERROR}; the tag hashes the sources, run this in a checkout")
            print(TAG)
        elif args.print:
            for name, uri in resolve_images().items():
                print(f"{name}: {uri}")
        else:
            if TAG is None:
                raise ImageTagError(f"cannot check the image tag: {_TAG_ERROR}")
            expected = f"{TAG}-{args.variant}" if args.variant else TAG
            if args.check != expected:
                given = f"the tag {args.check!r}" if args.check else "no tag"
                raise ImageTagError(
                    f"the build was given {given}, but the files in {_ROOT} have the tag {expected!r}; build with "
                    "_TAG=$(python -m components.images --tag) from the checkout being built, with nothing changed "
                    "in between (images/README.md)"
                )
    except ImageTagError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
