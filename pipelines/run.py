"""Run the pipeline.

    python -m pipelines.run --config F [--wait] [--no-cache] [--project P]   (Vertex AI)
    python -m pipelines.run --local [--config F] [--root DIR] [--no-cache] [-v]
    python -m pipelines.run --dry-run [--local] [--config F]     (the plan, machine, time, cost; nothing runs)

Both print the expected training time, GPU-hours and cost first (`pipelines.estimate`: the
profile's GPU, the measured throughput, the price table or `resources.price_usd_per_hour`).

Without `--local` it compiles the config for Vertex, checks project, region, GPU shape and
buckets, and submits an `aiplatform.PipelineJob` (pipeline root, labels, experiment,
caching switch, service account, network, CMEK key); it prints the console link, and with
`--wait` the job's state until it ends.

`--local` runs the whole DAG on this machine under `kfp.local` (SubprocessRunner, no
containers, no cloud): each task runs in this Python environment, artifacts go to a local
pipeline root. With the default config it builds the tiny offline Qwen3-VL and the
synthetic drawings dataset first (cached), so it needs no download.

`--dry-run` prints the plan (the tasks), the machine, the expected time and cost and what
would be submitted (pipeline name, root, labels, the parameters that differ from the config
file), with no credentials and no network; placeholders left in the config are listed all
at once (exit 2).

The local console is quiet: one line per task start and end (its time and key figures),
the newest progress line at most every 30 s, each warning once; everything the tasks print
goes to `<run folder>/run.log`, whose path is printed. `-v` shows it all on the console.
Each task's HTML report gets a `.html` copy beside its KFP artifact (which has no
extension), so a browser opens it; the summary lists their paths.

It prints the run folder, each task's time or that it came from the kfp.local cache, the
data lineage (snapshot fingerprint, files, rows) and the evaluation metrics, and exits 0
only when every task succeeded. When validate-data and train-lora were cache hits it says
so: no new data since the snapshot, no training ran.

The pieces: `pipelines.local_run` (the kfp.local run), `pipelines.local_console` (its quiet
console and summary), `pipelines.submit` (the Vertex submission) and `pipelines.dry_run`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from pipelines.cli import program
from pipelines.config import DEFAULT_LOCAL_CONFIG, Config, check_local_dirs, load_config, parse_overrides
from pipelines.dry_run import dry_run
from pipelines.local_console import format_summary
from pipelines.local_run import RunError, preflight_local, run_local, with_local_root
from pipelines.submit import submit_vertex
from pipelines.vertex import VertexError, command_errors


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    vertex_only = [flag for flag, used in (("--wait", args.wait), ("--project", args.project is not None)) if used]
    if args.local and vertex_only:  # else silently ignored: the user thinks they asked for something
        print(
            f"error: {' and '.join(vertex_only)} {'is' if len(vertex_only) == 1 else 'are'} for a Vertex run; "
            "drop it with --local (or drop --local to submit to Vertex AI)",
            file=sys.stderr,
        )
        return 2
    if args.dry_run:
        return _main_dry_run(args)
    if not args.local:
        return _main_vertex(args)
    return _main_local(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=program("python -m pipelines.run"), description=__doc__.splitlines()[0])
    parser.add_argument("--local", action="store_true", help="run the whole DAG here under kfp.local")
    parser.add_argument(
        "--config", default=None, help="config YAML (default with --local: configs/local/tiny_cpu.yaml)"
    )
    parser.add_argument("--root", default=None, help="pipeline root: folder (--local) or gs:// (default: the config's)")
    parser.add_argument("--no-cache", action="store_true", help="run every task even if its inputs did not change")
    parser.add_argument("--wait", action="store_true", help="Vertex: print the job's state until it ends")
    parser.add_argument("--project", default=None, help="Vertex: project ID (default: the config's vertex.project)")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan, machine, expected time and cost and what would be submitted; no credentials, no network",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="--local: show every task's full log here (default: in run.log)"
    )
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    return parser


def _main_local(args: argparse.Namespace) -> int:
    with command_errors(failures=(RunError,)) as outcome:
        cfg = load_config(args.config or DEFAULT_LOCAL_CONFIG, parse_overrides(args.overrides))
        try:
            result = run_local(cfg, args.root, False if args.no_cache else None, verbose=args.verbose)
        except ImportError as exc:
            from pipelines.cli import exit_for_missing_extra

            return exit_for_missing_extra(exc, f"{program('python -m pipelines.run')} --local")
    if outcome.code:
        return outcome.code
    print(format_summary(result))
    return 0


def _with_flags(cfg: Config, args: argparse.Namespace) -> Config:
    """The config with --project and --root applied (Vertex)."""
    if args.project:
        cfg = dataclasses.replace(cfg, vertex=dataclasses.replace(cfg.vertex, project=args.project))
    if args.root:
        cfg = dataclasses.replace(cfg, pipeline=dataclasses.replace(cfg.pipeline, root=args.root))
    return cfg


def _main_dry_run(args: argparse.Namespace) -> int:
    if not args.config and not args.local:
        print("error: --config is required for a Vertex dry run (or add --local)", file=sys.stderr)
        return 2
    with command_errors(failures=(RunError,)) as outcome:
        cfg = load_config(args.config or DEFAULT_LOCAL_CONFIG, parse_overrides(args.overrides))
        cfg = with_local_root(cfg, args.root) if args.local and args.root else _with_flags(cfg, args)
        if args.local:  # what the real local run refuses before any task (run_local), without building inputs
            check_local_dirs(cfg, root_from="--root" if args.root else "")
            preflight_local(cfg)
        problems = dry_run(cfg, local=args.local, enable_caching=False if args.no_cache else None)
        if problems:
            raise VertexError(
                f"{cfg.path}: {len(problems)} settings to fill in before a run can be submitted "
                "(edit the config, or pass section.key=value words):\n" + "\n".join(f"  {p}" for p in problems)
            )
    return outcome.code


def _main_vertex(args: argparse.Namespace) -> int:
    if not args.config:
        print("error: --config is required to submit to Vertex AI (or use --local)", file=sys.stderr)
        return 2
    with command_errors(failures=(RunError,)) as outcome:
        cfg = _with_flags(load_config(args.config, parse_overrides(args.overrides)), args)
        submit_vertex(cfg, wait=args.wait, enable_caching=False if args.no_cache else None)
    return outcome.code


if __name__ == "__main__":
    sys.exit(main())
