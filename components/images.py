"""Container images of the pipeline's tasks: the one place their tags live.

Three images are built from `images/` (see images/README.md), none with model weights:
`light` (CPU: stage-model, validate-data, register), `train-deps` (CUDA and every package of
requirements.lock, no project code) and `train` (the project's code on top of `train-deps`:
train-lora, merge-export, evaluate). Which image a compiled pipeline uses, first match wins:

1. the config's `images.light` / `images.train`,
2. the environment variables `VLM_LORA_LIGHT_IMAGE` / `VLM_LORA_TRAIN_IMAGE`,
3. the defaults `REGISTRY/light:TAG` and `REGISTRY/train:TAG`.

`TAG` is derived from what the images hold, so that Vertex's cache (keyed on the component
spec, which names the image) never reuses a result made by other code: `<version>-<hash>`,
the project version and 12 hex digits of a sha256 over `TAG_INPUTS` (the project's code
and package data under components/, pipelines/ and speedups/, pyproject.toml, setup.py, requirements.lock
and the Dockerfiles), each file's relative path and bytes as they are on disk, in path order. The speed-up layer's
tests, GPU benchmarks and README (`NOT_IN_IMAGES`) are neither in the images nor hashed: a test's change keeps the tag.
Not hashed: `__pycache__`, `*.pyc` and every file git ignores (the build context leaves
them out too), README.md (copied for the package metadata only; nothing runs it). Where
git cannot list the files (no .git: inside an image, an unpacked archive) a walk skips
caches and build leftovers only.

`DEPS_TAG` names the dependency image: `deps-<12 hex digits>` over `DEPS_INPUTS` only (the
lock and its Dockerfile), so a code change reuses the pushed `train-deps` image and rebuilds
only the thin `train` layer. A build with flash-attn (opt-in) is another image: both of its
tags end in `-flash-attn` (`VARIANTS`).

Print the tags with `python -m components.images --tag` / `--deps-tag` (or `--substitutions`
for Cloud Build); `images/cloudbuild.yaml` pushes under them, and the build checks them
against the files (`--check`, `--check-deps`: the yaml's first step, on the upload; each
Dockerfile's last, inside the image).

Where the source tree is not beside this module (an installed wheel), the tags are the ones
setup.py computed from the tree the wheel was built from, read from `_image_tags.json` beside
this module; without that file (a wheel built without the tree) `TAG` is None: the module
still imports (the task wrappers need it), and `resolve_images` raises `ImageTagError` only
when a default image is asked for. Inside an image the tree is /app, which holds every
input, so the tag there is the one the image was checked against.

Locally (kfp.local) tasks run in the current Python environment and no image is used.
"""

from __future__ import annotations

import argparse
import hashlib
import json
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
    "speedups",
    "pyproject.toml",
    "setup.py",
    "requirements.lock",
    "images/Dockerfile.light",
    "images/Dockerfile.train-deps",
    "images/Dockerfile.train",
)
# What the dependency image's tag hashes: it holds the lock's packages and nothing of the project.
DEPS_INPUTS = ("requirements.lock", "images/Dockerfile.train-deps")
# Build variants: another image, whose tags end in "-<variant>" (images/README.md).
VARIANTS = ("flash-attn",)
# Build context files that are copied into the images but do not change what runs.
NOT_HASHED = ("README.md",)
# Folders and files inside TAG_INPUTS that the images leave out (.dockerignore) and the tag does not hash: the
# speed-up layer's tests, GPU benchmarks and README, none of them in the wheel either (pyproject's package find).
NOT_IN_IMAGES = ("speedups/tests", "speedups/benchmarks", "speedups/README.md")
# Written by setup.py into the built package (never into the tree): {"tag": TAG, "deps_tag": DEPS_TAG}.
BAKED_TAGS = "_image_tags.json"
# Skipped where git cannot list the files (inside an image, an unpacked archive); the same
# things .gitignore and .dockerignore leave out under components/, pipelines/ and speedups/.
_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".venv"}
_SKIP_SUFFIXES = (".pyc", ".pyo", ".egg-info")
_SCHEME = b"vlm-lora image tag v2\n"  # change to change every tag when the hashing itself changes
_DEPS_SCHEME = b"vlm-lora deps tag v1\n"
_HASH_CHARS = 12
_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
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
    return sorted({p for p in listed if not _skipped(p) and not _outside_images(p) and (root / p).is_file()})


def _skipped(rel: str) -> bool:
    """Whether a relative path is a cache or build leftover (`__pycache__`, `*.pyc`, `*.egg-info`, ...)."""
    return any(part in _SKIP_DIRS or part.endswith(_SKIP_SUFFIXES) for part in rel.split("/"))


def _outside_images(rel: str) -> bool:
    """Whether a relative path is, or is inside, one of `NOT_IN_IMAGES`."""
    return any(rel == name or rel.startswith(f"{name}/") for name in NOT_IN_IMAGES)


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


def _digest(scheme: bytes, root: Path, files: list[str]) -> str:
    """Returns 12 hex digits of a sha256 over `scheme` and each file's relative path and sha256, in order."""
    digest = hashlib.sha256(scheme)
    for rel in files:
        digest.update(
            rel.encode("utf-8", "surrogateescape") + b"\0" + hashlib.sha256((root / rel).read_bytes()).digest()
        )
    return digest.hexdigest()[:_HASH_CHARS]


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
    try:
        digits = _digest(_SCHEME, root, source_files(root))
        version = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as exc:
        raise ImageTagError(f"cannot compute the image tag of {root}: {exc}") from None
    return f"{version}-{digits}"


def deps_tag(root: Path) -> str:
    """Returns the dependency image's tag: `deps-<12 hex digits>` over `DEPS_INPUTS` only.

    The project's code and version do not enter: a code change keeps the tag, so the pushed
    `train-deps` image is reused and only the `train` layer on top of it is rebuilt.

    Args:
        root: A folder holding `DEPS_INPUTS` at their relative paths (the repository root, or
            the copy the dependency image keeps).

    Returns:
        The tag, e.g. "deps-9b1c0e77a2f4".

    Raises:
        ImageTagError: A file of `DEPS_INPUTS` is missing or cannot be read.
    """
    root = Path(root)
    missing = [name for name in DEPS_INPUTS if not (root / name).is_file()]
    if missing:
        raise ImageTagError(f"{root} has no {', '.join(missing)}: the dependency image's tag hashes them")
    try:
        return f"deps-{_digest(_DEPS_SCHEME, root, sorted(DEPS_INPUTS))}"
    except OSError as exc:
        raise ImageTagError(f"cannot compute the dependency image's tag of {root}: {exc}") from None


def _known_tags() -> tuple[str | None, str | None, str]:
    """Returns (TAG, DEPS_TAG, "") of the tree this module is in, else the ones baked in at build
    time (`BAKED_TAGS`), else (None, None, why not)."""
    try:
        return source_tag(_ROOT), deps_tag(_ROOT), ""
    except ImageTagError as exc:
        why = str(exc)
    baked = _HERE / BAKED_TAGS
    try:
        tags = json.loads(baked.read_text(encoding="utf-8"))
        return str(tags["tag"]), str(tags["deps_tag"]), ""
    except FileNotFoundError:
        return None, None, f"{why}, and this install has no {baked.name} (built without the source tree)"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, None, f"{why}, and {baked} cannot be read ({exc}); reinstall the package"


TAG, DEPS_TAG, _TAG_ERROR = _known_tags()

# CPU image for staging, validation and registration.
LIGHT_IMAGE = os.environ.get("VLM_LORA_LIGHT_IMAGE") or f"{REGISTRY}/light:{TAG or _NO_TAG}"
# CUDA image with torch, ms-swift, deepspeed and liger-kernel for train/merge/eval (flash-attn: the -flash-attn variant).
TRAIN_IMAGE = os.environ.get("VLM_LORA_TRAIN_IMAGE") or f"{REGISTRY}/train:{TAG or _NO_TAG}"


def resolve_images(light: str = "", train: str = "") -> dict[str, str]:
    """Returns the task images: the overrides where given, else the environment's, else the defaults.

    Args:
        light: The config's `images.light`; "" = `VLM_LORA_LIGHT_IMAGE` or `REGISTRY/light:TAG`.
        train: The config's `images.train`; "" = `VLM_LORA_TRAIN_IMAGE` or `REGISTRY/train:TAG`.

    Returns:
        {"light": uri, "train": uri}.

    Raises:
        ImageTagError: A default image is needed but `TAG` is unknown (no source tree, no baked tags).
    """
    images = {"light": light or LIGHT_IMAGE, "train": train or TRAIN_IMAGE}
    unknown = [name for name, uri in images.items() if TAG is None and uri.endswith(f":{_NO_TAG}")]
    if unknown:
        raise ImageTagError(
            f"no default tag for the {' and '.join(unknown)} image: {_TAG_ERROR}. The tag is a hash of the "
            "sources, so compile from a checkout of the project or a package built from one "
            "(`python -m components.images --tag` prints it), or name the images with the config's "
            "images.light / images.train or VLM_LORA_LIGHT_IMAGE / VLM_LORA_TRAIN_IMAGE"
        )
    return images


def _with_variant(tag: str, variant: str) -> str:
    """Returns `tag` with "-<variant>" on the end ("" = the default build)."""
    if variant and variant not in VARIANTS:
        raise ImageTagError(f"unknown build variant {variant!r}: the variants are {', '.join(VARIANTS)} (or none)")
    return f"{tag}-{variant}" if variant else tag


def _check(what: str, given: str, expected: str, flag: str) -> None:
    """Raises ImageTagError unless `given` is `expected`, naming the tag to build with."""
    if given != expected:
        shown = f"the tag {given!r}" if given else "no tag"
        raise ImageTagError(
            f"the {what} build was given {shown}, but the files in {_ROOT} have the tag {expected!r}; build with "
            f"the output of `python -m components.images {flag}` from the checkout being built, with nothing "
            "changed in between (images/README.md)"
        )


def main(argv: list[str] | None = None) -> int:
    """`python -m components.images --tag | --deps-tag | --substitutions | --print | --check TAG | --check-deps TAG`.

    Exit 0, or 1 with one line on stderr. `--variant V` gives the tags of a build variant;
    `--check TAG --deps DEPS` also checks the dependency image's tag the image was built on.
    """
    parser = argparse.ArgumentParser(prog="python -m components.images", description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--tag", action="store_true", help="print the default image tag of this source tree")
    what.add_argument("--deps-tag", action="store_true", help="print the dependency image's tag (lock + Dockerfile)")
    what.add_argument(
        "--substitutions", action="store_true", help="print _TAG=...,_DEPS_TAG=...[,_VARIANT=-V] for Cloud Build"
    )
    what.add_argument("--print", action="store_true", help="print the light and train image URIs a compile uses")
    what.add_argument("--check", metavar="TAG", help="exit 1 unless TAG is this tree's tag (the images' last step)")
    what.add_argument("--check-deps", metavar="TAG", help="exit 1 unless TAG is this tree's dependency tag")
    parser.add_argument("--variant", default="", help=f"a build variant ({', '.join(VARIANTS)}): the tags end '-V'")
    parser.add_argument("--deps", metavar="TAG", default=None, help="with --check: the dependency image's tag too")
    args = parser.parse_args(argv)
    try:
        if args.print:
            for name, uri in resolve_images().items():
                print(f"{name}: {uri}")
            return 0
        if args.check_deps is not None:
            tag = _with_variant(deps_tag(_ROOT), args.variant)
            _check("dependency image", args.check_deps, tag, "--deps-tag")
            return 0
        if TAG is None or DEPS_TAG is None:
            raise ImageTagError(f"no image tag: {_TAG_ERROR}; the tag hashes the sources, run this in a checkout")
        if args.tag:
            print(_with_variant(TAG, args.variant))
        elif args.deps_tag:
            print(_with_variant(DEPS_TAG, args.variant))
        elif args.substitutions:
            variant = _with_variant("", args.variant)  # "" or "-<variant>": the train images' suffix
            print(f"_TAG={TAG},_DEPS_TAG={DEPS_TAG}" + (f",_VARIANT={variant}" if variant else ""))
        else:
            _check("image", args.check, _with_variant(TAG, args.variant), "--tag")
            expected = _with_variant(DEPS_TAG, args.variant)
            if args.deps is not None and args.deps != expected:
                raise ImageTagError(
                    f"this image was built on the dependency image tagged {args.deps or '(none)'!r}, but the lock and "
                    f"Dockerfile in {_ROOT} have the dependency tag {expected!r}; build FROM train-deps:{expected} "
                    "(images/cloudbuild.yaml builds it when it is missing; images/README.md)"
                )
    except ImageTagError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
