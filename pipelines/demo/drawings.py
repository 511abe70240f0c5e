"""Synthetic engineering drawings for a tiny, fully offline demo dataset.

The generated data mirrors the seed task of the project: given an engineering
drawing, the model answers with a JSON list of detected elements. Every
drawing contains, on a white sheet inside a border frame:

* one part outline (rectangle, L-shape, chamfered rectangle or trapezoid) with
  dash-dot center lines,
* zero to two holes (circles with center-line crosses),
* zero or one dimension (horizontal, vertical or a diameter leader, with
  arrowheads and text such as ``"45.0"`` or ``"Ø12"``),
* a title block that is ALWAYS near the bottom-right corner (a few pixels of
  jitter), holding a part number, a scale and a sheet number,
* an unannotated "general tolerance" note at the bottom-left as clutter.

Only the elements with a label in :data:`pipelines.demo.drawing_render.LABELS` are annotated. A drawing has
at most four findings (title block + part outline + at most two of
holes/dimensions).

Bounding boxes are integer pixel coordinates ``[x1, y1, x2, y2]`` of the
element's ink, in PIL ``getbbox`` convention: ``x1``/``y1`` are the first
inked column/row and ``x2``/``y2`` are one past the last inked column/row, so
``0 <= x1 < x2 <= width`` and ``0 <= y1 < y2 <= height``. They are measured by
drawing every annotated element on its own mask, so they are tight by
construction. One drawing is rendered by :mod:`pipelines.demo.drawing_render`;
this module writes the rows.

Box conventions (``convention``, see :mod:`components.common.boxes`): the
default ``"pixel"`` writes the pixel boxes above under the key ``"bbox"``
(output unchanged). ``"norm1000"`` (Qwen2-VL, Qwen3-VL) writes them relative to
the image in [0, 1000] and ``"resized_pixel"`` (Qwen2.5-VL) in pixels of the
processor's smart-resized image (default Qwen2.5-VL rule), both as integers
from :func:`components.common.boxes.from_pixels`, under the key ``"bbox_2d"``
and in the order ``{"bbox_2d": ..., "label": ...}`` of the Qwen-VL grounding
cookbook, so answers match the form each model family was trained on. The
prompt names the convention.

Rows use the ms-swift messages format with image paths relative to the
JSONL's folder::

    {"messages": [{"role": "user", "content": "<image>" + PROMPT},
                  {"role": "assistant", "content": "```json\\n[...]\\n```"}],
     "images": ["images/train_00000.png"]}

Generation is deterministic: for the same arguments, the JSONL files and the
PNGs are byte-identical across runs (per-image RNGs are seeded from a string,
which :mod:`random` hashes with SHA-512, independent of ``PYTHONHASHSEED``).

CLI::

    python -m pipelines.demo.drawings OUT_DIR [--n-train N] [--n-eval N] [--seed S]
        [--convention pixel|norm1000|resized_pixel]
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path

from components.common import boxes
from pipelines.demo.drawing_render import MIN_IMAGE_SIZE, convert_findings, render_drawing, render_drawing_facts

PROMPT: str = (
    "Detect the title_block, part_outline, hole and dimension elements of this "
    'engineering drawing. Answer with a JSON list of {"label": ..., "bbox": '
    "[x1, y1, x2, y2]} in pixels, top to bottom."
)
"""User prompt that follows the ``<image>`` tag in every row (pixel convention)."""

PROMPTS: dict[str, str] = {
    "pixel": PROMPT,
    "norm1000": (
        "Detect the title_block, part_outline, hole and dimension elements of this "
        'engineering drawing. Answer with a JSON list of {"bbox_2d": [x1, y1, x2, y2], '
        '"label": ...} with coordinates relative to the image in [0, 1000], top to bottom.'
    ),
    "resized_pixel": (
        "Detect the title_block, part_outline, hole and dimension elements of this "
        'engineering drawing. Answer with a JSON list of {"bbox_2d": [x1, y1, x2, y2], '
        '"label": ...} in pixels of the resized image, top to bottom.'
    ),
}
"""User prompt per box convention."""

IMAGE_TAG = "<image>"


def format_answer(findings: list[dict]) -> str:
    """Formats findings (of any convention, keys as given) as the assistant answer: a fenced ```json block."""
    return "```json\n" + json.dumps(findings) + "\n```"


def _write_split(out_dir: Path, split: str, n: int, image_size: int, seed: int, convention: str) -> Path:
    images_dir = out_dir / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    jsonl = out_dir / f"{split}.jsonl"
    lines = []
    for i in range(n):
        rng = random.Random(f"drawings:{seed}:{split}:{i}")
        image, findings = render_drawing(image_size, rng, convention)
        rel = f"images/{split}_{i:05d}.png"
        image.save(out_dir / rel, format="PNG", optimize=False)
        row = {
            "messages": [
                {"role": "user", "content": IMAGE_TAG + PROMPTS[convention]},
                {"role": "assistant", "content": format_answer(findings)},
            ],
            "images": [rel],
        }
        lines.append(json.dumps(row, ensure_ascii=False))
    jsonl.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return jsonl


def generate_dataset(
    out_dir: str | Path,
    n_train: int = 64,
    n_eval: int = 16,
    image_size: int = 256,
    seed: int = 0,
    convention: str = "pixel",
) -> dict:
    """Generates the synthetic drawing dataset.

    Writes ``out_dir/train.jsonl``, ``out_dir/eval.jsonl`` and the PNGs under
    ``out_dir/images/`` (``train_00000.png``, ..., ``eval_00000.png``, ...).
    Existing files with the same names are overwritten; other files are left
    alone. Train and eval images are drawn from disjoint RNG streams.

    Args:
        out_dir: Output folder, created if missing.
        n_train: Number of training rows (>= 0).
        n_eval: Number of evaluation rows (>= 0).
        image_size: Side of the square images in pixels (>= 128).
        seed: Seed; equal arguments give byte-identical files.
        convention: Box convention of the answers: "pixel" (key "bbox", the
            default, output unchanged), "norm1000" or "resized_pixel" (integer
            "bbox_2d"); the images are the same for every convention.

    Returns:
        ``{"train": str, "eval": str, "n_train": int, "n_eval": int}`` with
        the paths of the two JSONL files.

    Raises:
        ValueError: On a negative count, a too small ``image_size`` or an
            unknown convention.
    """
    if convention not in boxes.CONVENTIONS:
        raise ValueError(f"convention must be one of {boxes.CONVENTIONS}, got {convention!r}")
    if n_train < 0 or n_eval < 0:
        raise ValueError(f"n_train and n_eval must be >= 0, got {n_train} and {n_eval}")
    if image_size < MIN_IMAGE_SIZE:
        raise ValueError(f"image_size must be >= {MIN_IMAGE_SIZE}, got {image_size}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train = _write_split(out, "train", n_train, image_size, seed, convention)
    evl = _write_split(out, "eval", n_eval, image_size, seed, convention)
    return {"train": str(train), "eval": str(evl), "n_train": n_train, "n_eval": n_eval}


REGRESSION_PROMPTS: dict[str, str] = {
    "ocr": "Read the part number written in the title block of this engineering drawing. Answer with the text only.",
    "holes": "How many holes does this engineering drawing show? Answer with a number.",
    "scale": "What scale is written in the title block of this drawing? Answer with the scale only, such as 1:1.",
    "dimension": "Does this engineering drawing carry a dimension? Answer yes or no.",
    "grounding": "Locate the general note at the bottom left of this drawing (a tolerance, units or material text). "
    'Answer with a JSON list of {"label": "note", "bbox": [x1, y1, x2, y2]} in pixels.',
}
"""The regression set's questions: about what the drawings show beyond the task's labels."""


def regression_rows(facts: dict, image: str, index: int, convention: str, image_size: int) -> list[dict]:
    """Returns a drawing's three regression rows (`components.common.regression`): ocr, vqa and grounding.

    ocr reads the part number; vqa asks, by turns (`index` % 3), the number of holes, the scale, or
    whether a dimension is drawn; grounding boxes the unannotated note at the bottom left (a
    label the detection task does not know), in the data's box convention.

    Args:
        facts: `render_drawing_facts`' facts of the drawing.
        image: The image path the rows name (relative to the JSONL file).
        index: The drawing's number in the set.
        convention: Box convention of the grounding answer (pixel: "bbox"; others "bbox_2d").
        image_size: Side of the square image, px.
    """
    topic, answer = (
        ("holes", str(facts["holes"])),
        ("scale", facts["scale"]),
        ("dimension", "yes" if facts.get("dimension") else "no"),
    )[index % 3]
    note = convert_findings([{"label": "note", "bbox": facts["note_bbox"]}], convention, (image_size, image_size))
    grounding = REGRESSION_PROMPTS["grounding"]
    if convention != "pixel":
        grounding = grounding.replace('"bbox"', '"bbox_2d"').replace(" in pixels.", f" ({convention}).")
    asked = (("ocr", REGRESSION_PROMPTS["ocr"], facts["part_number"]), ("vqa", REGRESSION_PROMPTS[topic], answer),
             ("grounding", grounding, format_answer(note)))  # fmt: skip
    return [
        {
            "messages": [{"role": "user", "content": IMAGE_TAG + prompt}, {"role": "assistant", "content": gold}],
            "images": [image],
            "kind": kind,
        }
        for kind, prompt, gold in asked
    ]


def generate_regression(
    out_dir: str | Path, n: int = 4, image_size: int = 256, seed: int = 0, convention: str = "pixel"
) -> dict:
    """Generates the demo's regression set: three general rows (ocr, vqa, grounding) on each of `n` new drawings.

    Writes ``out_dir/regression.jsonl`` and ``out_dir/images/regression_*.png``, drawn from an RNG
    stream of their own (no image of the train or eval split). Deterministic, as `generate_dataset`.

    Args:
        out_dir: Output folder, created if missing.
        n: Number of drawings (3 rows each, >= 1). Default 4.
        image_size: Side of the square images, px (>= 128). Default 256.
        seed: Seed. Default 0.
        convention: Box convention of the grounding answers. Default "pixel".

    Returns:
        ``{"regression": str, "n_rows": int}``: the JSONL file's path and its number of rows.

    Raises:
        ValueError: n < 1, a too small image_size or an unknown convention.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        image, findings, facts = render_drawing_facts(image_size, random.Random(f"drawings:{seed}:regression:{i}"))
        facts["dimension"] = any(f["label"] == "dimension" for f in findings)
        rel = f"images/regression_{i:05d}.png"
        image.save(out / rel, format="PNG", optimize=False)
        rows += regression_rows(facts, rel, i, convention, image_size)
    jsonl = out / "regression.jsonl"
    jsonl.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return {"regression": str(jsonl), "n_rows": len(rows)}


def main(argv: Sequence[str] | None = None) -> None:
    """CLI entry point; prints the JSON result of :func:`generate_dataset`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="output folder")
    parser.add_argument("--n-train", type=int, default=64)
    parser.add_argument("--n-eval", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--convention", default="pixel", choices=boxes.CONVENTIONS, help="box convention of the answers"
    )
    args = parser.parse_args(argv)
    result = generate_dataset(args.out_dir, args.n_train, args.n_eval, args.image_size, args.seed, args.convention)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
