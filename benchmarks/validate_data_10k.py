"""Benchmark: validate 10,000 ms-swift lines, each with its own 1024x1024 PNG file.

    python benchmarks/validate_data_10k.py [--lines 10000] [--distinct 300] [--workers 0]
        [--max-length 3000] [--task detection] [--keep DIR]

Generates the dataset in a temp folder (not timed): `--distinct` different 1024x1024 PNGs
(noise over a drawing-like background, ~0.3-0.5 MB each), then one file per line, as a
hard link to one of them (each line has its own path; every file is read, hashed and its
header checked), then times `validate_data` end to end: parse, image checks, token
estimate, split, writes (clean sets, quarantine, HTML report). The page cache is warm
(the files were just written), as on a re-run; the clean sets hold the `--distinct`
unique images, since files with the same bytes are copied once.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from PIL import Image, ImageDraw  # noqa: E402

from components.validate_data.core import validate_data  # noqa: E402


def make_image(seed: int) -> Image.Image:
    rnd = random.Random(seed)
    img = Image.effect_noise((1024, 1024), 8).convert("RGB")
    draw = ImageDraw.Draw(img)
    for _ in range(30):
        x, y = rnd.randrange(900), rnd.randrange(900)
        draw.rectangle([x, y, x + rnd.randrange(20, 120), y + rnd.randrange(20, 120)], outline=(0, 0, 0), width=2)
    return img


def generate(root: Path, n_lines: int, n_distinct: int) -> Path:
    pool = root / "pool"
    pool.mkdir()
    for i in range(n_distinct):
        make_image(i).save(pool / f"p{i}.png", compress_level=1)
    images = root / "data" / "images"
    images.mkdir(parents=True)
    with open(root / "data" / "train.jsonl", "w") as f:
        for i in range(n_lines):
            name = f"img_{i:05d}.png"
            os.link(pool / f"p{i % n_distinct}.png", images / name)
            answer = json.dumps([{"label": "hole", "bbox": [i % 900, 10, i % 900 + 50, 80]}])
            row = {
                "messages": [
                    {"role": "user", "content": f"<image>Detect the elements of engineering drawing {i}."},
                    {"role": "assistant", "content": f"```json\n{answer}\n```"},
                ],
                "images": [f"images/{name}"],
            }
            f.write(json.dumps(row) + "\n")
    return root / "data" / "train.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--distinct", type=int, default=300)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--max-length", type=int, default=3000)
    parser.add_argument("--task", default="detection")
    parser.add_argument("--keep", default="", help="write outputs here instead of a temp folder")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-validate-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        data = generate(root, args.lines, args.distinct)
        size = sum(p.stat().st_size for p in (root / "pool").iterdir())
        print(
            f"generated {args.lines} lines, {args.distinct} distinct PNGs ({size / args.distinct / 1e6:.2f} MB each) "
            f"in {time.perf_counter() - t0:.1f} s; cpus={os.cpu_count()}"
        )
        out = Path(args.keep) if args.keep else root / "out"
        t0 = time.perf_counter()
        result = validate_data(
            [str(data)], str(out / "train"), str(out / "eval"), str(out / "quarantine.jsonl"),
            report_out=str(out / "report.html"), max_length=args.max_length, task=args.task, workers=args.workers,
        )  # fmt: skip
        elapsed = time.perf_counter() - t0
        print(result.summary())
        mb_read = args.lines * size / args.distinct / 1e6
        print(
            f"validated {args.lines} lines in {elapsed:.1f} s: {args.lines / elapsed:.0f} lines/s, "
            f"{mb_read / elapsed:.0f} MB/s of image files read and hashed"
        )


if __name__ == "__main__":
    main()
