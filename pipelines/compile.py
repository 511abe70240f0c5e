"""Compile the pipeline to a YAML that Vertex AI Pipelines (or any KFP backend) runs.

    python -m pipelines.compile [--config F] [--output F]

The config's values become the parameters' defaults, so a console run needs no typing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipelines.config import ConfigError, load_config

DEFAULT_CONFIG = "configs/qwen3_vl_4b/lora_seed.yaml"


def compile_pipeline(config_path: str, output: str | None = None) -> Path:
    """Compiles the pipeline for a config.

    Args:
        config_path: Config YAML.
        output: Output YAML path. Default `build/<pipeline name>.yaml`.

    Returns:
        The written YAML path.

    Raises:
        ConfigError: The config is invalid.
    """
    from kfp import compiler

    from pipelines.pipeline import build_pipeline

    cfg = load_config(config_path)
    out = Path(output or f"build/{cfg.pipeline.name}.yaml")
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build_pipeline(cfg), package_path=str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.compile", description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=f"config YAML (default {DEFAULT_CONFIG})")
    parser.add_argument("--output", default=None, help="output YAML (default build/<pipeline name>.yaml)")
    args = parser.parse_args(argv)
    try:
        out = compile_pipeline(args.config, args.output)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"compiled {args.config} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
