"""Serve a merged model locally with `swift deploy` and chat with it through the `openai` client.

    python -m pipelines.serve [--model DIR] [--port P] [--root runs] [--smoke [--task T]]

Without `--model` it serves the newest merged model of a local run (`<root>/*/merge-export/
merged_model`, what `make demo` makes). It prints the base URL and a ready-to-paste client
snippet, then serves until Ctrl-C, which stops the server's whole process group. `--smoke`
sends a few held-out rows (the same run's validated eval dataset) through the smoke test of
`components.deploy.smoke` and exits 0 when every answer parses for the task, 1 otherwise.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import time
from pathlib import Path

from components.common import cli_numbers
from components.deploy.errors import DeployError
from components.deploy.local_server import LocalServer
from components.deploy.smoke import load_rows, smoke_test
from pipelines.cli import exit_for_missing_extra, program, require_modules

SNIPPET = """\
from openai import OpenAI
import base64

client = OpenAI(base_url="{base_url}/v1", api_key="EMPTY")
image = base64.b64encode(open({image!r}, "rb").read()).decode()
reply = client.chat.completions.create(
    model="{model}",
    messages=[{{"role": "user", "content": [
        {{"type": "image_url", "image_url": {{"url": "data:image/png;base64," + image}}}},
        {{"type": "text", "text": {prompt!r}}},
    ]}}],
    max_tokens=512,
    temperature=0,
)
print(reply.choices[0].message.content)"""
# without a held-out row to copy: the image and the question of the demo's drawings
FALLBACK_EXAMPLE = ("drawing.png", "Detect the title_block, part_outline, hole and dimension elements.")


def example_of(rows: list[dict]) -> tuple[str, str]:
    """The image and question of the first held-out row (what the model was trained to answer), for the snippet."""
    for row in rows:
        user = next((m for m in row.get("messages") or [] if m.get("role") == "user"), None)
        text = user.get("content") if isinstance(user, dict) else None
        if isinstance(text, str) and row.get("images"):
            return str(row["images"][0]), text.replace("<image>", "").strip()
    return FALLBACK_EXAMPLE


def newest_merged_model(root: str | Path) -> Path | None:
    """Returns the newest `<root>/*/merge-export/merged_model` that holds a model, or None."""
    found = [p.parent for p in Path(root).glob("*/merge-export/merged_model/config.json")]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def eval_rows_for(model_dir: Path, root: str | Path, limit: int) -> list[dict]:
    """Returns smoke-test rows: the model's run's eval dataset, else the newest under root, else the demo's.

    Raises:
        DeployError: No eval dataset anywhere.
    """
    candidates = [model_dir.parent.parent / "validate-data" / "eval_dataset"]
    candidates += sorted(Path(root).glob("*/validate-data/eval_dataset"), key=lambda p: p.stat().st_mtime, reverse=True)
    for folder in candidates:
        if (folder / "data.jsonl").is_file():
            return load_rows(folder, limit)
    from pipelines.local_run import demo_cache_dir

    demo = demo_cache_dir() / "demo-drawings-v2" / "eval.jsonl"
    if demo.is_file():
        return load_rows(demo, limit)
    raise DeployError(f"no eval dataset under {root} nor {demo}: run `make demo` first, or pass --model of a run")


def task_of(model_dir: Path) -> str | None:
    """Returns the task a merged model's data was validated for, from its lineage; None when it names none.

    merge-export writes `lineage.json` (`data.task`) and copies validate-data's data lineage
    (`data_snapshot.json`, `task`) beside the model; a model trained before either held the task has neither.
    """
    import json

    from components.common.snapshot import LINEAGE_FILE

    for name, keys in (("lineage.json", ("data", "task")), (LINEAGE_FILE, ("task",))):
        try:
            value: object = json.loads((model_dir / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, str):
            return value
    return None


def _rows_or_none(model_dir: Path, root: str | Path, limit: int) -> list[dict]:
    try:
        return eval_rows_for(model_dir, root, limit)
    except DeployError:
        return []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        require_modules("swift", "torch", "transformers", "openai")  # swift deploy runs in a subprocess
    except ImportError as exc:
        return exit_for_missing_extra(exc, parser.prog)

    model = Path(args.model) if args.model else newest_merged_model(args.root)
    if model is None:
        print(f"serve: no merged model under {args.root}/*/merge-export/merged_model: run `make demo` or pass --model")
        return 1
    task = args.task if args.task is not None else task_of(model)
    if args.smoke and task is None:
        print(
            f"serve: {model} has no lineage naming its task (trained before lineage held it): pass --task",
            file=sys.stderr,
        )
        return 1
    log = Path(args.log) if args.log else model.parent / "serve.log"
    server = LocalServer(
        model, args.port or free_port(), log, start_timeout_s=args.start_timeout, served_model_name=args.name
    )
    print(f"serve: {' '.join(server.command)}\nserve: log {log}", flush=True)
    # Ctrl-C and SIGTERM both end in `finally`, which stops the server's process group
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    # Python leaves SIGINT ignored when it starts ignored (a background job of a non-interactive shell, as in CI)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        waited = server.start()
        print(f"serve: healthy after {waited:.0f} s\nbase URL: {server.base_url}/v1  (model {args.name!r})\n")
        image, prompt = example_of(_rows_or_none(model, args.root, 1))
        print(SNIPPET.format(base_url=server.base_url, model=args.name, image=image, prompt=prompt), flush=True)
        return _smoke(server, args, model, task) if args.smoke else _serve_until_exit(server)
    except DeployError as exc:
        print(f"serve: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nserve: stopping", flush=True)
        return 0
    finally:
        server.stop()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=program("python -m pipelines.serve"), description=__doc__.splitlines()[0])
    parser.add_argument("--local", action="store_true", help="serve on 127.0.0.1: the only mode, so optional")
    parser.add_argument("--model", default="", help="merged model folder; default the newest under --root")
    parser.add_argument("--root", default="runs", help="local pipeline root (default runs)")
    parser.add_argument(
        "--port",
        type=cli_numbers.ranged(int, 0, 65535, "0 (a free port) or a port 1..65535"),
        default=0,
        help="TCP port; default a free one",
    )
    parser.add_argument("--name", default="tuned", help="served model name (default tuned)")
    parser.add_argument("--smoke", action="store_true", help="run the smoke test, then exit 0 / 1")
    parser.add_argument(
        "--task", default=None,
        help="smoke-test task: detection, key_value, json or '' (default: the task the model's data was validated "
        "for, from its lineage)",
    )  # fmt: skip
    parser.add_argument("--rows", type=cli_numbers.positive(int), default=3, help="smoke-test rows (default 3)")
    parser.add_argument(
        "--max-tokens", type=cli_numbers.positive(int), default=512, help="smoke-test answer length limit (default 512)"
    )
    parser.add_argument(
        "--start-timeout",
        type=cli_numbers.positive(float, "a positive number of seconds"),
        default=300,
        help="seconds to wait for health (default 300)",
    )
    parser.add_argument("--log", default="", help="server log file; default <model>/../serve.log")
    return parser


def _smoke(server: LocalServer, args: argparse.Namespace, model: Path, task: str) -> int:
    """Sends `--rows` held-out rows through the healthy server; 0 when every answer parses for the task."""
    rows = eval_rows_for(model, args.root, args.rows)
    result = smoke_test(server.base_url, args.name, rows, task, timeout_s=300, max_tokens=args.max_tokens)
    for item in result.answers:
        print(f"smoke: row {item['row']} ({item['seconds']:.1f} s): {item['answer'][:200]!r}")
    source = "--task" if args.task is not None else "the model's lineage"
    print(f"smoke: passed, {len(result.answers)} answers parse for task {task!r} (from {source})")
    return 0


def _serve_until_exit(server: LocalServer) -> int:
    """Serves until Ctrl-C (KeyboardInterrupt to the caller) or the server exits (1)."""
    print("\nserving; Ctrl-C stops", flush=True)
    while server.process is not None and server.process.poll() is None:
        time.sleep(0.5)
    print(f"serve: the server exited with code {server.process.returncode if server.process else '?'}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
