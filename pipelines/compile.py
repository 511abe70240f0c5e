"""Compile the pipeline to a YAML that Vertex AI Pipelines (or any KFP backend) runs.

    python -m pipelines.compile [--config F] [--target vertex|local|gke] [--output F]

The config's values become the parameters' defaults (each with a description the console
shows), so a console run needs no typing. `--target vertex` (default) runs train-lora as a
Vertex CustomJob with the config's `resources` profile; `--target local` compiles the plain
components that `kfp.local` runs; `--target gke` the same DAG for Kubeflow Pipelines on GKE
(`pipelines.gke`, docs/gke.md: placement, GPUs and the bucket mount with kfp-kubernetes, a
JobSet for several training nodes). Shapes, regions and the schedule are checked when the
config loads, so a bad one stops here, before anything is created; for `--target local`
so are a pipeline root or model cache this user cannot create or write. Exit codes: 0
compiled, 2 a bad config or an output that cannot be written (one line on stderr, no
traceback).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipelines.cli import program
from pipelines.compile_guards import check_not_another_configs, check_vertex_roots, write_source_note
from pipelines.config import ConfigError, check_local_dirs, load_config, parse_overrides

DEFAULT_CONFIG = "configs/qwen3_vl_4b/lora_seed.yaml"


def compile_pipeline(
    config_path: str, output: str | None = None, target: str = "vertex", overrides: dict | None = None
) -> Path:
    """Compiles the pipeline for a config.

    Args:
        config_path: Config YAML.
        output: Output YAML path. Default `build/<pipeline name>.yaml` (vertex) or
            `build/<pipeline name>-<target>.yaml` (local, gke).
        target: "vertex", "local" or "gke". Default "vertex".
        overrides: {"section.key": value} on top of the file (`parse_overrides`). Default none.

    Returns:
        The written YAML path.

    Raises:
        ConfigError: The config is invalid (bad key, value, machine shape, region, cron);
            for the local target, its pipeline root or model cache cannot be written; for
            the Vertex target, its pipeline root or model cache is not gs://; for gke, its
            `gke` section does not suit the profile (`pipelines.gke_section`); or the default
            output was compiled from another config (`pipelines.compile_guards`).
        OSError: The output cannot be written.
    """
    from kfp import compiler

    from pipelines.pipeline import build_pipeline

    cfg = load_config(config_path, overrides)
    suffix = "" if target == "vertex" else f"-{target}"
    out = Path(output or f"build/{cfg.pipeline.name}{suffix}.yaml")
    problem = output_problem(out)  # first: a wrong --output is named whatever else the config needs
    if problem:
        raise ConfigError(f"--output {out}: {problem}")
    if target == "local":
        check_local_dirs(cfg)
    elif target == "vertex":
        check_vertex_roots(cfg)
    if output is None:
        check_not_another_configs(out, cfg.path)
    pipeline = build_pipeline(cfg, target)
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(pipeline, package_path=str(out))
    if output is None:
        write_source_note(out, cfg.path)
    return out


def output_problem(out: Path) -> str | None:
    """Why the compiled YAML cannot be written to `out` (checked before compiling), or None."""
    if out.is_dir():
        return "is a folder; name the file to write in it, e.g. --output " + str(out / "pipeline.yaml")
    if out.suffix.lower() not in (".yaml", ".yml"):
        return "the pipeline is written as YAML: name a file ending in .yaml (e.g. build/pipeline.yaml)"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=program("python -m pipelines.compile"), description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=f"config YAML (default {DEFAULT_CONFIG})")
    parser.add_argument(
        "--target", default="vertex", choices=("vertex", "local", "gke"), help="backend (default vertex)"
    )
    parser.add_argument("--output", default=None, help="output YAML (default build/<pipeline name>.yaml)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    args = parser.parse_args(argv)
    try:
        out = compile_pipeline(args.config, args.output, args.target, parse_overrides(args.overrides))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the output path: under a file, read-only, ...
        under_file = isinstance(exc, (FileExistsError, NotADirectoryError))
        reason = "part of its path is a file, not a folder" if under_file else (exc.strerror or str(exc))
        print(
            f"error: cannot write {args.output or exc.filename}: {reason}; pass --output FILE in a folder you can write",
            file=sys.stderr,
        )
        return 2
    print(f"compiled {args.config} ({args.target}) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
