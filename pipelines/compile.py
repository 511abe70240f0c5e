"""Compile the pipeline to a YAML that Vertex AI Pipelines (or any KFP backend) runs.

    python -m pipelines.compile [--config F] [--target vertex|local] [--output F]

The config's values become the parameters' defaults (each with a description the console
shows), so a console run needs no typing. `--target vertex` (default) runs train-lora as a
Vertex CustomJob with the config's `resources` profile; `--target local` compiles the plain
components that `kfp.local` runs. Shapes, regions and the schedule are checked when the
config loads, so a bad one stops here, before anything is created.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipelines.config import ConfigError, load_config

DEFAULT_CONFIG = "configs/qwen3_vl_4b/lora_seed.yaml"


def compile_pipeline(config_path: str, output: str | None = None, target: str = "vertex") -> Path:
    """Compiles the pipeline for a config.

    Args:
        config_path: Config YAML.
        output: Output YAML path. Default `build/<pipeline name>.yaml` (vertex) or
            `build/<pipeline name>-local.yaml` (local).
        target: "vertex" or "local". Default "vertex".

    Returns:
        The written YAML path.

    Raises:
        ConfigError: The config is invalid (bad key, value, machine shape, region, cron).
    """
    from kfp import compiler

    from pipelines.pipeline import build_pipeline

    cfg = load_config(config_path)
    suffix = "" if target == "vertex" else f"-{target}"
    out = Path(output or f"build/{cfg.pipeline.name}{suffix}.yaml")
    pipeline = build_pipeline(cfg, target)
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(pipeline, package_path=str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.compile", description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=f"config YAML (default {DEFAULT_CONFIG})")
    parser.add_argument("--target", default="vertex", choices=("vertex", "local"), help="backend (default vertex)")
    parser.add_argument("--output", default=None, help="output YAML (default build/<pipeline name>.yaml)")
    args = parser.parse_args(argv)
    try:
        out = compile_pipeline(args.config, args.output, args.target)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"compiled {args.config} ({args.target}) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
