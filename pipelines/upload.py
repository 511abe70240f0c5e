"""Upload the compiled pipeline to an Artifact Registry KFP repository.

    python -m pipelines.upload --config F [--repo https://REGION-kfp.pkg.dev/PROJECT/REPO] [--tag T ...]

The template then shows in the Vertex AI console under Pipelines -> Create run ->
"Select from existing pipelines", with the config's values as its defaults. Every upload
is a new version (named by its sha256); tags (default: `latest` and the project version)
move to it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from pipelines.cli import program
from pipelines.config import Config, load_config, parse_overrides
from pipelines.vertex import VertexError, command_errors

PROJECT_VERSION = "0.1.0"


def default_tags() -> list[str]:
    """Returns the tags an upload gets without --tag: `latest` and `v<project version>`."""
    return ["latest", "v" + PROJECT_VERSION.replace(".", "-")]


def upload_template(
    cfg: Config, repo: str = "", tags: list[str] | None = None, *, auth: Any = None, config_file: str | None = None
) -> tuple[str, str]:
    """Compiles the config for Vertex and uploads it to a KFP repository.

    Args:
        cfg: The validated config.
        repo: Repository URL; default the config's `vertex.template_repo`.
        tags: Version tags; default `default_tags()`.
        auth: `requests` auth or google-auth credentials; default ADC (Artifact Registry).
        config_file: kfp registry context file (tests). Default none.

    Returns:
        (package name, version).

    Raises:
        VertexError: No repository, or a tag Artifact Registry would reject.
    """
    from kfp import compiler
    from kfp.registry import RegistryClient

    from pipelines.pipeline import build_pipeline

    repo = repo or cfg.vertex.template_repo
    if not repo:
        raise VertexError(
            f"{cfg.path}: vertex.template_repo is not set; set https://REGION-kfp.pkg.dev/PROJECT/REPO "
            "(docs/setup.md creates the repository) or pass --repo"
        )
    if "YOUR_PROJECT" in repo:
        raise VertexError(f"{cfg.path}: vertex.template_repo still holds the placeholder {repo!r}")
    tags = default_tags() if tags is None else tags
    for tag in tags:
        if not tag or not all(c.isalnum() or c in "-_" for c in tag) or tag.startswith("sha256"):
            raise VertexError(f"tag {tag!r}: use letters, digits, '-' and '_' (not a sha256 version)")
    client = RegistryClient(host=repo, auth=auth, config_file=config_file)
    with tempfile.TemporaryDirectory(prefix="vlm-lora-") as tmp:
        template = str(Path(tmp) / f"{cfg.pipeline.name}.yaml")
        compiler.Compiler().compile(build_pipeline(cfg, "vertex"), package_path=template)
        return client.upload_pipeline(file_name=template, tags=tags)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=program("python -m pipelines.upload"), description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/qwen3_vl_4b/lora_seed.yaml", help="config YAML")
    parser.add_argument("--repo", default="", help="KFP repository URL (default: the config's vertex.template_repo)")
    parser.add_argument(
        "--tag", action="append", default=None, help="version tag (repeatable; default latest, v<version>)"
    )
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    args = parser.parse_args(argv)
    with command_errors() as outcome:
        cfg = load_config(args.config, parse_overrides(args.overrides))
        package, version = upload_template(cfg, args.repo, args.tag)
    if outcome.code:
        return outcome.code
    print(f"uploaded {package} version {version} (tags: {', '.join(args.tag or default_tags())})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
