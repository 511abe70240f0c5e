"""Build hooks for the wheel and the sdist; the package's metadata is all in pyproject.toml.

What a plain `pyproject.toml` cannot say:

- The default image tags (`components/images.py`) are hashes of the source tree, which an
  installed wheel does not hold. `build_py` computes them from the tree being built, with the
  same code `make image-tag` runs, and writes them into the built package as
  `components/_image_tags.json` (never into the tree), so `vlm-lora compile` from a
  `pip install .` names the same images as a compile from the checkout. An sdist carries the
  file too, since the tree unpacked from it lacks the Dockerfiles the hash needs.
- The shipped configs (`configs/` at the repository root, where the README's commands name
  them) travel inside the `pipelines` package as `pipelines/configs/`, so the install adds no
  top-level package named `configs` (`pipelines.config.CONFIG_DIR` finds either place).
- setuptools' scratch folder is `.setuptools-build/`, not `build/` (where
  `python -m pipelines.compile` writes the compiled pipelines).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
CONFIGS = "configs"  # at the repository root
SHIPPED_CONFIGS = ("pipelines", "configs")  # where they go in the package
TAGS_FILE = ("components", "_image_tags.json")


def _image_tags(root: Path) -> dict[str, str]:
    """Returns {"tag", "deps_tag"} of the tree at `root`, computed by its own components/images.py.

    Raises:
        RuntimeError: `root` holds neither the files the tags hash nor a `_image_tags.json` made
            from them (an sdist's), naming what is missing.
    """
    baked = root.joinpath(*TAGS_FILE)
    spec = importlib.util.spec_from_file_location("_vlm_lora_images", root / "components" / "images.py")
    images = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(images)
    try:
        return {"tag": images.source_tag(root), "deps_tag": images.deps_tag(root)}
    except images.ImageTagError as exc:
        if baked.is_file():  # the tree unpacked from an sdist: the tags of the checkout it was made from
            return json.loads(baked.read_text(encoding="utf-8"))
        raise RuntimeError(
            f"cannot bake the default image tags into the package: {exc}. Build from a checkout of the "
            "project (or an sdist made from one), which holds every file the tags hash (components/images.py)"
        ) from None


class BuildPy(build_py):
    """build_py that also writes the image tags and copies the shipped configs into the built package."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads the tree itself: tags and configs from there
            return
        out = Path(self.build_lib)
        tags = out.joinpath(*TAGS_FILE)
        tags.parent.mkdir(parents=True, exist_ok=True)
        tags.write_text(json.dumps(_image_tags(HERE), indent=1) + "\n", encoding="utf-8")
        source = HERE / CONFIGS
        if not source.is_dir():  # an image's build context: its tasks take settings as parameters, not files
            return
        target = out.joinpath(*SHIPPED_CONFIGS)
        shutil.rmtree(target, ignore_errors=True)
        for config in sorted(source.glob("**/*.yaml")):
            dest = target / config.relative_to(source)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(config, dest)


class Sdist(sdist):
    """sdist that adds `components/_image_tags.json`: the tree unpacked from it cannot compute the tags."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        dest = Path(base_dir).joinpath(*TAGS_FILE)
        dest.unlink(missing_ok=True)  # a hard link into the tree, where the file must never be written
        dest.write_text(json.dumps(_image_tags(HERE), indent=1) + "\n", encoding="utf-8")


setup(
    cmdclass={"build_py": BuildPy, "sdist": Sdist},
    options={"build": {"build_base": ".setuptools-build"}},
)
