"""Scheduled retraining that sees new data (#13), locally: four kfp.local runs with caching on.

    .venv/bin/python -m benchmarks.retrain_local [--work DIR] [--max-steps 4] [--epochs 1]
        [--eval-samples 4] [--max-new-tokens 32]

The tiny offline Qwen3-VL and the demo drawings (`configs/local/tiny_cpu.yaml`), with the
demo's 64 training rows copied into a folder of two shards (`part-000.jsonl`,
`part-001.jsonl`, 32 rows each, plus `images/`); `data.train` is that folder (a prefix
source, which snapshot-data resolves to its JSONL files), `data.eval` the demo eval file.
All four runs share one pipeline root, so kfp.local's cache carries over between them:

    (a) first run: every task runs;
    (b) the same again, nothing changed: snapshot-data runs (never cached), everything
        after it is a cache hit, no train-lora, the run says "no new data";
    (c) 8 rows appended to part-001.jsonl (the demo generator's rows 64..71, whose images
        were in images/ from the start): re-validated and retrained, the merged model's
        lineage shows 8 more rows;
    (d) part-000.jsonl overwritten in place with its rows in reverse order (same name,
        same size, other bytes): a new fingerprint, retrained.

Prints each run's summary (`pipelines.local_console.format_summary`), a table (scenario, wall
seconds, tasks that ran, tasks from the cache, rows in the lineage, fingerprint) and the
checks; exits 1 when a check fails. Training length is cut by `--max-steps` (swift
`max_steps`) and `--epochs` (`num_train_epochs`), evaluation by `--eval-samples` and
`--max-new-tokens`: the point is what runs and what is reused, not model quality.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.config import DEFAULT_LOCAL_CONFIG, Config, load_config  # noqa: E402
from pipelines.local_console import format_summary  # noqa: E402
from pipelines.local_run import RunError, resolve_demo_inputs, run_local  # noqa: E402

SHARDS = ("part-000.jsonl", "part-001.jsonl")
N_EXTRA = 8  # rows appended in (c)
SCENARIOS = (
    ("a", "first run"),
    ("b", "again, unchanged"),
    ("c", f"+{N_EXTRA} rows appended to {SHARDS[1]}"),
    ("d", f"{SHARDS[0]} overwritten in place"),
)


def make_shards(folder: Path, demo_train: str) -> list[str]:
    """Copies the demo training rows into `folder` as two shards and an images folder.

    Args:
        folder: The dataset folder (created).
        demo_train: The demo's train.jsonl (its images are under `images/` beside it).

    Returns:
        The `N_EXTRA` rows (JSONL lines) that (c) appends; their images are already in
        `folder/images/`, so appending changes the JSONL file only.
    """
    from pipelines.demo.drawings import generate_dataset

    rows = Path(demo_train).read_text().splitlines()
    images = folder / "images"
    images.mkdir(parents=True)
    half = len(rows) // 2
    for name, part in zip(SHARDS, (rows[:half], rows[half:])):
        (folder / name).write_text("\n".join(part) + "\n")
    # The generator is deterministic: with N_EXTRA more rows its first rows are the demo's.
    more = generate_dataset(folder.parent / "more-rows", n_train=len(rows) + N_EXTRA, n_eval=0)
    lines = Path(more["train"]).read_text().splitlines()
    if lines[: len(rows)] != rows:
        raise RuntimeError(f"{demo_train}: not the demo generator's rows; rebuild the demo data")
    for src in Path(demo_train).parent.joinpath("images").glob("train_*.png"):
        shutil.copy2(src, images / src.name)
    for src in sorted(Path(more["train"]).parent.joinpath("images").glob("train_*.png"))[len(rows) :]:
        shutil.copy2(src, images / src.name)
    shutil.rmtree(folder.parent / "more-rows")
    return lines[len(rows) :]


def append_rows(shard: Path, rows: list[str]) -> None:
    """Appends JSONL rows to a shard (scenario c)."""
    with shard.open("a") as f:
        f.write("\n".join(rows) + "\n")


def overwrite_reversed(shard: Path) -> None:
    """Rewrites a shard in place with its rows in reverse order: same name and size, other bytes (scenario d)."""
    rows = shard.read_text().splitlines()
    shard.write_text("\n".join(reversed(rows)) + "\n")


def retrain_config(
    work: Path,
    *,
    max_steps: int,
    epochs: float,
    eval_samples: int,
    max_new_tokens: int,
) -> tuple[Config, list[str]]:
    """Builds the shard folder under `work` and the config that trains on it.

    Args:
        work: Scratch folder: `data/` (the shards), `model-cache/`, `runs/` (pipeline root).
        max_steps: swift `max_steps` (optimizer steps per training run).
        epochs: swift `num_train_epochs` (max_steps wins when it ends training first).
        eval_samples: `eval.max_samples` (0 = all 16).
        max_new_tokens: `eval.max_new_tokens`.

    Returns:
        (the config, the rows that (c) appends).
    """
    cfg = resolve_demo_inputs(load_config(DEFAULT_LOCAL_CONFIG))
    extra = make_shards(work / "data", cfg.data.train)
    swift = {**cfg.swift, "max_steps": max_steps, "num_train_epochs": epochs, "logging_steps": 1}
    cfg = dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, cache=str(work / "model-cache")),
        data=dataclasses.replace(cfg.data, train=str(work / "data") + "/"),
        swift=swift,
        eval=dataclasses.replace(cfg.eval, max_samples=eval_samples, max_new_tokens=max_new_tokens),
    )
    return cfg, extra


def run_scenarios(work: Path, cfg: Config, extra: list[str], out: Any = None) -> list[dict[str, Any]]:
    """Runs (a) .. (d) on one pipeline root with caching on; prints each run's summary.

    Args:
        work: The scratch folder `retrain_config` filled.
        cfg: Its config.
        extra: The rows (c) appends.
        out: Stream for the summaries. Default stdout.

    Returns:
        One dict per scenario: {"scenario", "what", "wall_s", "ran", "cached", "rows",
        "train_rows", "fingerprint", "summary", "result"} (`result`: what run_local returned).
    """
    out = out or sys.stdout
    data = work / "data"
    rows = []
    for key, what in SCENARIOS:
        if key == "c":
            append_rows(data / SHARDS[1], extra)
        elif key == "d":
            overwrite_reversed(data / SHARDS[0])
        result = run_local(cfg, root=str(work / "runs"), enable_caching=True)
        summary = format_summary(result)
        print(f"\n=== ({key}) {what}\n{summary}", file=out, flush=True)
        lineage = result.get("data") or {}
        rows.append(
            {
                "scenario": key,
                "what": what,
                "wall_s": result["wall_s"],
                "ran": list(result["tasks"]),
                "cached": list(result["cached"]),
                "rows": lineage.get("rows"),
                "train_rows": lineage.get("train_rows"),
                "fingerprint": lineage.get("fingerprint", ""),
                "summary": summary,
                "result": result,
            }
        )
    return rows


def check(rows: list[dict[str, Any]]) -> list[str]:
    """Returns the failed checks of a (a)..(d) sequence (empty: all hold)."""
    a, b, c, d = rows
    checks = [
        ("(a) train-lora ran", "train-lora" in a["ran"]),
        ("(b) train-lora came from the cache", "train-lora" in b["cached"] and "train-lora" not in b["ran"]),
        ("(b) the run says no new data", "no new data since snapshot" in b["summary"]),
        ("(b) same fingerprint as (a)", b["fingerprint"] == a["fingerprint"]),
        ("(c) validate-data and train-lora ran", {"validate-data", "train-lora"} <= set(c["ran"])),
        (f"(c) lineage rows = (a) + {N_EXTRA}", (c["rows"] or 0) == (a["rows"] or 0) + N_EXTRA),
        (f"(c) train rows = (a) + {N_EXTRA}", (c["train_rows"] or 0) == (a["train_rows"] or 0) + N_EXTRA),
        ("(d) train-lora ran", "train-lora" in d["ran"]),
        ("(d) fingerprint differs from (c) and (a)", d["fingerprint"] not in (c["fingerprint"], a["fingerprint"])),
        ("(d) lineage rows = (c)'s", d["rows"] == c["rows"]),
    ]
    return [name for name, ok in checks if not ok]


def format_table(rows: list[dict[str, Any]]) -> str:
    """Returns the Markdown table of the scenarios."""
    lines = [
        "| scenario | wall s | tasks that ran | tasks from the cache | rows (train) | fingerprint |",
        "|---|---:|---|---|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| ({r['scenario']}) {r['what']} | {r['wall_s']:.1f} | {', '.join(r['ran']) or '-'} | "
            f"{', '.join(r['cached']) or '-'} | {r['rows']} ({r['train_rows']}) | `{r['fingerprint']}` |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.retrain_local", description=__doc__.splitlines()[0])
    parser.add_argument("--work", default=None, help="scratch folder, kept (default: a temp folder, removed)")
    parser.add_argument("--max-steps", type=int, default=4, help="swift max_steps per training run (default 4)")
    parser.add_argument("--epochs", type=float, default=1, help="swift num_train_epochs (default 1)")
    parser.add_argument("--eval-samples", type=int, default=4, help="eval.max_samples (default 4; 0 = all 16)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="eval.max_new_tokens (default 32)")
    args = parser.parse_args(argv)
    tmp = None
    if args.work:
        work = Path(args.work).resolve()
        if work.exists():
            parser.error(f"--work {work} exists; give a new folder")
    else:
        tmp = tempfile.mkdtemp(prefix="retrain-local-")
        work = Path(tmp)
    try:
        cfg, extra = retrain_config(
            work,
            max_steps=args.max_steps,
            epochs=args.epochs,
            eval_samples=args.eval_samples,
            max_new_tokens=args.max_new_tokens,
        )
        print(
            f"data.train: {cfg.data.train} ({', '.join(SHARDS)} + images/)\ndata.eval: {cfg.data.eval}\n"
            f"swift max_steps {args.max_steps}, num_train_epochs {args.epochs}; eval max_samples "
            f"{args.eval_samples}, max_new_tokens {args.max_new_tokens}",
            flush=True,
        )
        rows = run_scenarios(work, cfg, extra)
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    print("\n" + format_table(rows))
    failed = check(rows)
    print("\nchecks: " + ("all hold" if not failed else "FAILED: " + "; ".join(failed)))
    print(json.dumps([{k: v for k, v in r.items() if k not in ("summary", "result")} for r in rows]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
