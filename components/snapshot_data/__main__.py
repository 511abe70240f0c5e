"""Resolve data sources to a snapshot from a terminal (the snapshot-data core).

    python -m components.snapshot_data TRAIN_SOURCES [--eval EVAL_SOURCES] [--out manifest.json]

Sources are files, folders / prefixes and globs, local or gs://, comma-separated. Prints
what the snapshot holds (files, skipped non-JSONL files, fingerprint); exit 1 with a
one-line error when a source matches nothing or cannot be listed.
"""

from __future__ import annotations

import argparse
import json
import sys

from components.common.snapshot import SnapshotError
from components.snapshot_data.core import snapshot_data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=sys.argv[0] if sys.argv[0].startswith("vlm-lora ") else "python -m components.snapshot_data",
        description=__doc__.split("\n")[0],
    )
    parser.add_argument("train", help="training data sources, comma-separated (files, folders/prefixes, globs)")
    parser.add_argument("--eval", default="", help="held-out data sources, the same way")
    parser.add_argument("--out", default=None, help="write the manifest (snapshot + skipped files) as JSON here")
    parser.add_argument("--champion", default="", help="a merged model folder whose data lineage to compare with")
    args = parser.parse_args(argv)
    try:
        result = snapshot_data(train=args.train, eval_=args.eval, champion_dir=args.champion, manifest_out=args.out)
    except SnapshotError as exc:
        print(f"snapshot-data: {exc}", file=sys.stderr)
        return 1
    print(result.summary)
    for split in ("train", "eval"):
        for entry in json.loads(result.snapshot_json)[split]:
            version = entry.get("generation") or entry.get("sha256", "")[:16]
            print(f"  {split:5} {entry['uri']}  {entry['size']} bytes  {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
