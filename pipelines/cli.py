"""`vlm-lora`: one command for the whole project (installed by `pip install`).

    vlm-lora ls                                         # the shipped configs
    vlm-lora run --local [--config NAME] [section.key=value ...]
    vlm-lora run --config qwen3_vl_4b/lora_seed vertex.project=my-proj
    vlm-lora compile --config NAME [--target local] [section.key=value ...]
    vlm-lora schedule create|list|pause|resume|delete --config NAME ...
    vlm-lora upload --config NAME ...
    vlm-lora validate SOURCES ...                       # validate-data's checks on a JSONL file / folder / glob
    vlm-lora stage SOURCE ...                           # stage a model into a cache folder
    vlm-lora snapshot SOURCES ...                       # what snapshot-data would train on
    vlm-lora serve --local [--smoke]                    # chat with the tuned demo model
    vlm-lora jobs ls|show|logs|cancel|fetch --config NAME [RUN]   # a config's Vertex runs

`--config` takes a path or the name of a shipped config (`vlm-lora ls`); `section.key=value`
words override the config and are checked by the same schema. Each subcommand is the
`python -m ...` module of the same job (those forms keep working); `vlm-lora SUB --help`
shows its options.
"""

from __future__ import annotations

import difflib
import importlib
import sys

# subcommand -> (module with main(argv), one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("pipelines.run", "run the pipeline: --local here under kfp.local, or submit to Vertex AI"),
    "compile": ("pipelines.compile", "compile the pipeline YAML (Vertex AI or --target local)"),
    "schedule": ("pipelines.schedule", "create / list / pause / resume / delete a recurring Vertex run"),
    "upload": ("pipelines.upload", "upload the compiled template to an Artifact Registry KFP repository"),
    "validate": ("components.validate_data.__main__", "check training data as the validate-data task does"),
    "stage": ("components.stage_model.__main__", "stage a model (hub, gs://, folder) into a cache"),
    "snapshot": ("components.snapshot_data.__main__", "list the exact files a run would train on"),
    "serve": ("pipelines.serve", "serve a merged model locally (swift deploy) and smoke-test it"),
    "jobs": ("pipelines.jobs", "a config's Vertex runs: ls, show (tasks, links), logs [--follow], cancel, fetch"),
    "ls": ("", "list the shipped configs"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: vlm-lora COMMAND [options]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", "`vlm-lora COMMAND --help` for a command's options."]
    return "\n".join(lines)


def list_configs() -> int:
    """Prints each shipped config's name, its first comment line and its path."""
    from pipelines.config import CONFIG_DIR, shipped_configs

    configs = shipped_configs()
    if not configs:
        print(f"no configs found under {CONFIG_DIR}", file=sys.stderr)
        return 1
    rows = []
    for path in configs:
        first = next((ln.lstrip("# ").strip() for ln in path.read_text().splitlines() if ln.startswith("#")), "")
        rows.append((str(path.relative_to(CONFIG_DIR).with_suffix("")), first))
    width = max(len(name) for name, _ in rows)
    for name, first in rows:
        print(f"{name.ljust(width)}  {first}")
    print(f"\n({CONFIG_DIR}; pass a name or a path to --config)")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        print(f"vlm-lora: unknown command '{name}'{hint}\n\n{usage()}", file=sys.stderr)
        return 2
    if name == "ls":
        return list_configs()
    module = importlib.import_module(COMMANDS[name][0])
    sys.argv[0] = f"vlm-lora {name}"
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
