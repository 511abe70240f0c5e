"""Stage a model into the model cache from the command line (the component's core).

    python -m components.stage_model SOURCE --cache DEST [--revision R]
        [--allow GLOB ...] [--ignore GLOB ...] [--token-from env:VAR|projects/P/secrets/S]

Prints the cache entry and whether it was a cache hit; exits 0 only on a verified entry.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from components.common import cli_numbers
from components.stage_model.core import StageError, result_summary, stage_model
from components.stage_model.entry import verify_entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=sys.argv[0] if sys.argv[0].startswith("vlm-lora ") else "python -m components.stage_model",
        description=__doc__.split("\n")[0],
    )
    parser.add_argument("source", help="hf://org/name[@rev], ms://org/name[@rev], gs://bucket/prefix or a folder")
    parser.add_argument("--cache", required=True, help="cache root: a folder or gs://bucket/prefix")
    parser.add_argument("--revision", default=None, help="branch, tag or commit (hf://, ms://)")
    parser.add_argument("--allow", action="append", default=None, help="only stage files matching this glob")
    parser.add_argument("--ignore", action="append", default=None, help="skip files matching this glob")
    parser.add_argument(
        "--token-from",
        default=None,
        help="hub token source: env:VAR or projects/P/secrets/S[/versions/V] (never the token)",
    )
    parser.add_argument(
        "--workers", type=cli_numbers.ranged(int, 1, 256), default=8, help="files copied in parallel (default 8)"
    )
    parser.add_argument("--json", action="store_true", help="print the result summary as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("stage_model").setLevel(logging.INFO)  # ours only: no HTTP request lines

    try:
        result = stage_model(
            args.source,
            args.cache,
            args.allow,
            args.ignore,
            revision=args.revision,
            token_from=args.token_from,
            workers=args.workers,
            progress=not args.quiet,
        )
    except StageError as exc:
        print(f"stage-model: error: {exc}", file=sys.stderr)
        return 1
    valid, reason = verify_entry(result.entry)
    if not valid:
        print(
            f"stage-model: error: cache entry {result.entry} does not verify ({reason}); stage again", file=sys.stderr
        )
        return 1
    if args.json:
        print(json.dumps(result_summary(result), indent=2, sort_keys=True))
    else:
        print(result.entry)
        print(
            f"cache_hit={str(result.cache_hit).lower()} bytes_copied={result.bytes_copied} "
            f"revision={result.manifest.get('revision', '')}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
