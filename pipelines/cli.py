"""`vlm-lora`: one command for the whole project (installed by `pip install`).

    vlm-lora ls                                         # the shipped configs
    vlm-lora run --local [--config NAME] [section.key=value ...]
    vlm-lora run --config qwen3_vl_4b/lora_seed vertex.project=my-proj
    vlm-lora compile --config NAME [--target local|gke] [section.key=value ...]
    vlm-lora schedule create|list|pause|resume|delete --config NAME ...
    vlm-lora upload --config NAME ...
    vlm-lora validate SOURCES ...                       # validate-data's checks on a JSONL file / folder / glob
    vlm-lora import coco|label-studio FILE --images DIR --out ROWS.jsonl   # detection rows from labels
    vlm-lora stage SOURCE ...                           # stage a model into a cache folder
    vlm-lora snapshot SOURCES ...                       # what snapshot-data would train on
    vlm-lora serve [--smoke]                            # chat with the tuned demo model
    vlm-lora jobs ls|show|logs|cancel|fetch --config NAME [RUN]   # a config's Vertex runs
    vlm-lora gke jobset --config NAME --out DIR --model gs://.. ...  # the training JobSet for kubectl apply

`--config` takes a path or the name of a shipped config (`vlm-lora ls`); `section.key=value`
words override the config and are checked by the same schema. Each subcommand is the
`python -m ...` module of the same job (those forms keep working); `vlm-lora SUB --help`
shows its options; `vlm-lora --version` the installed version.

The light install (`pip install vlm-lora-pipeline`) compiles and submits; the commands that
run the training stack here (validate, stage, serve, run --local) need the `train` extra and
say so in one line (exit 2) when it is missing.
"""

from __future__ import annotations

import difflib
import errno
import importlib
import os
import re
import shutil
import sys
import textwrap
from pathlib import Path

PACKAGE = "vlm-lora-pipeline"  # [project].name in pyproject.toml
TRAIN_EXTRA = f"pip install '{PACKAGE}[train]'"
# Top-level modules that only the `train` extra installs: a missing one means "install the extra".
TRAIN_MODULES = frozenset(
    {"PIL", "torch", "torchvision", "transformers", "swift", "peft", "trl", "deepspeed", "safetensors", "scipy",
     "accelerate", "datasets", "modelscope", "numpy", "openai"}
)  # fmt: skip

# subcommand -> (module with main(argv), one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("pipelines.run", "run the pipeline: --local here under kfp.local, or submit to Vertex AI"),
    "compile": ("pipelines.compile", "compile the pipeline YAML (Vertex AI, --target local or --target gke)"),
    "schedule": ("pipelines.schedule", "create / list / pause / resume / delete a recurring Vertex run"),
    "upload": ("pipelines.upload", "upload the compiled template to an Artifact Registry KFP repository"),
    "validate": ("components.validate_data.__main__", "check training data as the validate-data task does"),
    "import": ("components.validate_data._import", "detection rows from a COCO or Label Studio export"),
    "stage": ("components.stage_model.__main__", "stage a model (hub, gs://, folder) into a cache"),
    "snapshot": ("components.snapshot_data.__main__", "list the exact files a run would train on"),
    "serve": ("pipelines.serve", "serve a merged model locally (swift deploy) and smoke-test it"),
    "jobs": ("pipelines.jobs", "a config's Vertex runs: ls, show (tasks, links), logs [--follow], cancel, fetch"),
    "gke": ("pipelines.gke", "GKE: setup (the bucket's volume, RBAC) and jobset (the training JobSet) for kubectl"),
    "ls": ("", "list the shipped configs"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: vlm-lora COMMAND [options]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", "`vlm-lora COMMAND --help` for a command's options; `vlm-lora --version` the installed version."]
    return "\n".join(lines)


def config_summary(text: str, limit: int = 240) -> str:
    """Returns the first sentence of a config's opening comment (its lines joined), whole.

    Args:
        text: The config file's text.
        limit: Characters at most; a longer sentence ends at a word with "...". Default 240.

    Returns:
        The sentence, or "" when the file opens without a comment.
    """
    comment = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        comment.append(line.lstrip("#").strip())
    joined = " ".join(filter(None, comment))
    first = re.split(r"(?<=[.!?])\s+(?=[A-Z(`])", joined, maxsplit=1)[0]
    return first if len(first) <= limit else textwrap.shorten(first, limit, placeholder=" ...")


def list_configs() -> int:
    """Prints each shipped config's name and the first sentence of its header, wrapped to the terminal."""
    from pipelines.config import CONFIG_DIR, shipped_configs

    configs = shipped_configs()
    if not configs:
        print(f"no configs found under {CONFIG_DIR}", file=sys.stderr)
        return 1
    rows = [(str(p.relative_to(CONFIG_DIR).with_suffix("")), config_summary(p.read_text())) for p in configs]
    width = max(len(name) for name, _ in rows)
    columns = max(shutil.get_terminal_size((120, 24)).columns, width + 40)
    for name, summary in rows:
        wrapped = textwrap.wrap(summary, columns - width - 2) or [""]
        print(f"{name.ljust(width)}  {wrapped[0]}")
        for more in wrapped[1:]:
            print(f"{' ' * width}  {more}")
    print(f"\n({CONFIG_DIR}; pass a name or a path to --config)")
    return 0


def program(default: str) -> str:
    """The program name for a command's help: `vlm-lora SUB` when run through `vlm-lora`, else `default`.

    Args:
        default: The module form, e.g. "python -m pipelines.run".
    """
    return sys.argv[0] if sys.argv and sys.argv[0].startswith("vlm-lora ") else default


def version() -> str:
    """Returns the installed package's version (pyproject.toml's in a source tree that is not installed)."""
    from importlib import metadata

    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        found = re.search(r'^version = "([^"]+)"', pyproject.read_text(), re.M) if pyproject.is_file() else None
        return f"{found.group(1)} (source tree, not installed)" if found else "unknown (not installed)"


def require_modules(*names: str) -> None:
    """Checks that modules are installed (found, not imported), for a command that runs them in a subprocess.

    Args:
        *names: Top-level module names, e.g. "swift", "torch".

    Raises:
        ModuleNotFoundError: The first one missing (its name in `name`: `missing_extra` words it).
    """
    import importlib.util

    for name in names:
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def missing_extra(exc: ImportError) -> str | None:
    """The one line for an import of the training stack that failed, or None for any other module.

    Args:
        exc: The ImportError (ModuleNotFoundError) raised by an import.

    Returns:
        "... needs the train extra (no module named 'PIL'): pip install 'vlm-lora-pipeline[train]'"
        when the missing module is one the `train` extra installs, else None.
    """
    name = exc.name
    if not name:  # an ImportError raised without a name: read it from the message
        found = re.search(r"(?:named|module|install:?)\s+'?([A-Za-z_][\w.]*)", str(exc))
        name = found.group(1) if found else ""
    top = name.split(".")[0]
    if top not in TRAIN_MODULES:
        return None
    return f"needs the train extra (no module named {top!r} here): {TRAIN_EXTRA}"


def exit_for_missing_extra(exc: ImportError, command: str) -> int:
    """Prints the one line for a missing training stack and returns exit status 2; re-raises any other ImportError.

    Call it inside the `except ImportError as exc:` block of a command's entry point.

    Args:
        exc: The ImportError.
        command: The command's name as the user typed it, e.g. "vlm-lora run --local".

    Returns:
        2.
    """
    line = missing_extra(exc)
    if line is None:
        raise exc
    print(f"{command}: {line}", file=sys.stderr)
    return 2


# Exit codes at the edges, as a shell's own commands end: 128 + the signal's number.
EXIT_BROKEN_PIPE = 141  # SIGPIPE: `vlm-lora ls | head -1`
EXIT_INTERRUPTED = 130  # SIGINT: Ctrl-C
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def _detach_stdout() -> None:
    """Points standard output at /dev/null, so that the interpreter's last flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real file descriptor (a test's capture): nothing to flush
        pass


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:  # stderr is gone too: the exit code is all that is left
        pass


def main(argv: list[str] | None = None) -> int:
    """Runs one subcommand: `vlm-lora COMMAND [options]`, ending at the edges with one line, never a traceback.

    A closed pipe (`vlm-lora ls | head -1`) ends quietly with 141, a full disk on the output
    (`vlm-lora ls > /dev/full`) with one line and 1, Ctrl-C with one line and 130.

    Args:
        argv: The words after `vlm-lora`. Default `sys.argv[1:]`.

    Returns:
        The subcommand's exit code; 2 for an unknown command or a missing `train` extra.
    """
    name = f"vlm-lora {argv[0] if argv else sys.argv[1] if len(sys.argv) > 1 else ''}".strip()
    try:
        try:
            code = _dispatch(argv)
        except SystemExit:  # argparse's --help and usage errors: their output is flushed here too
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # a write error of buffered output surfaces here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        _detach_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        _say(f"{name}: interrupted (Ctrl-C); nothing more was done")
        return EXIT_INTERRUPTED
    except OSError as exc:
        if exc.errno not in _NO_SPACE:
            raise
        _detach_stdout()
        where = exc.filename or "standard output"
        _say(f"{name}: cannot write {where}: {os.strerror(exc.errno)}; free some space or write elsewhere")
        return 1


def _dispatch(argv: list[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    if args[0] in ("--version", "-V", "version"):
        print(f"vlm-lora {version()}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        print(f"vlm-lora: unknown command '{name}'{hint}\n\n{usage()}", file=sys.stderr)
        return 2
    if name == "ls":
        return list_configs()
    sys.argv[0] = f"vlm-lora {name}"  # argparse's prog when the module leaves it unset
    try:
        module = importlib.import_module(COMMANDS[name][0])
        return int(module.main(rest) or 0)
    except ImportError as exc:
        return exit_for_missing_extra(exc, f"vlm-lora {name}")


if __name__ == "__main__":
    sys.exit(main())
