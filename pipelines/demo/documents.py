"""Synthetic invoices, receipts and quotes for a tiny, fully offline key-value demo dataset.

The second task of the project (``data.task: key_value``, `components.common.tasks`): given
a scanned-looking document, the model answers with a JSON object of its fields. Every
document, on a white sheet, holds:

* a header naming the document type (``INVOICE``, ``RECEIPT`` or ``QUOTE``) in a large
  font, near the top;
* four to six "Label: value" lines at varied positions, in varied font sizes and in a
  random order: always the number (``INV-0042``, ``RCT-…``, ``QTE-…``, the prefix follows
  the type), the date (``2026-03-14``) and the total (``1,234.50``); sometimes the
  currency and the vendor;
* an unannotated footer line and a rule under the header, as clutter.

The answer is a fenced ```json object with the fields in a fixed key order
(`FIELDS`): ``document_type``, ``number``, ``date``, ``total``, then ``currency`` and
``vendor`` when printed. Values are strings, copied as printed.

Rows use the ms-swift messages format with image paths relative to the JSONL's folder::

    {"messages": [{"role": "user", "content": "<image>" + PROMPT},
                  {"role": "assistant", "content": "```json\\n{...}\\n```"}],
     "images": ["images/train_00000.png"]}

Generation is deterministic: for the same arguments, the JSONL files and the PNGs are
byte-identical across runs (per-image RNGs are seeded from a string; the font is the one
bundled with Pillow, `ImageFont.load_default(size)`, falling back to its bitmap font).

CLI::

    python -m pipelines.demo.documents OUT_DIR [--n-train N] [--n-eval N] [--image-size PX] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

FIELDS: tuple[str, ...] = ("document_type", "number", "date", "total", "currency", "vendor")
"""Keys an answer can have, in answer order; the first four are always present."""

PROMPT: str = (
    "Extract the fields of this document as a JSON object with the keys document_type, number, "
    "date, total and, when printed, currency and vendor. Copy the values as printed."
)
"""User prompt that follows the ``<image>`` tag in every row."""

IMAGE_TAG = "<image>"
MIN_IMAGE_SIZE = 128

_TYPES: dict[str, str] = {"INVOICE": "INV", "RECEIPT": "RCT", "QUOTE": "QTE"}
_LABELS: dict[str, tuple[str, ...]] = {
    "number": ("No.", "Number", "Ref"),
    "date": ("Date", "Issued"),
    "total": ("Total", "Amount"),
    "currency": ("Currency",),
    "vendor": ("Vendor", "From"),
}
_CURRENCIES = ("EUR", "USD", "GBP")
_VENDORS = ("ACME GmbH", "Globex Ltd", "Initech", "Umbrella AG", "Stark & Co", "Wayne SA")
_FOOTERS = ("Thank you!", "Page 1/1", "Bank: DE00 1234", "Keep for records")
_INK = (20, 20, 20)
_GREY = (120, 120, 120)
_PAPER = (255, 255, 255)


def _font(size: int) -> ImageFont.ImageFont:
    """Returns Pillow's bundled scalable font at `size` px (no font files; bitmap font without FreeType)."""
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, ImportError, OSError):  # Pillow < 10.1 or no FreeType
        return ImageFont.load_default()


def _text_size(draw: ImageDraw.ImageDraw, text: str, font: ImageFont.ImageFont) -> tuple[int, int]:
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    return right - left, bottom - top


def _fields(rng: random.Random) -> dict[str, str]:
    """Draws one document's fields, in `FIELDS` order."""
    doc_type = rng.choice(sorted(_TYPES))
    cents = rng.randint(100, 999_999)
    fields = {
        "document_type": doc_type,
        "number": f"{_TYPES[doc_type]}-{rng.randint(1, 9999):04d}",
        "date": f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
        "total": f"{cents // 100:,}.{cents % 100:02d}",
    }
    if rng.random() < 0.6:
        fields["currency"] = rng.choice(_CURRENCIES)
    if rng.random() < 0.5:
        fields["vendor"] = rng.choice(_VENDORS)
    return fields


def render_document(image_size: int, rng: random.Random) -> tuple[Image.Image, dict[str, str]]:
    """Draws one document; returns (image, fields in `FIELDS` order).

    Args:
        image_size: Side of the square image, px (>= 128).
        rng: The document's random generator.

    Raises:
        ValueError: A too small image_size.
    """
    if image_size < MIN_IMAGE_SIZE:
        raise ValueError(f"image_size must be >= {MIN_IMAGE_SIZE}, got {image_size}")
    s = image_size / 256
    fields = _fields(rng)
    image = Image.new("RGB", (image_size, image_size), _PAPER)
    draw = ImageDraw.Draw(image)
    margin = max(6, round(10 * s))

    header_font = _font(round(rng.randint(20, 26) * s))
    header = fields["document_type"]
    hw, hh = _text_size(draw, header, header_font)
    hx = rng.choice((margin, (image_size - hw) // 2, image_size - margin - hw))
    hy = margin + rng.randint(0, round(8 * s))
    draw.text((hx, hy), header, font=header_font, fill=_INK, anchor="lt")
    rule_y = hy + hh + round(5 * s)
    draw.line([(margin, rule_y), (image_size - margin, rule_y)], fill=_GREY, width=1)

    footer_font = _font(round(9 * s))
    footer = rng.choice(_FOOTERS)
    fh = _text_size(draw, footer, footer_font)[1]
    footer_y = image_size - margin - fh
    draw.text((margin, footer_y), footer, font=footer_font, fill=_GREY, anchor="lt")

    keys = [key for key in fields if key != "document_type"]
    rng.shuffle(keys)
    lines = []
    for key in keys:
        font = _font(round(rng.randint(11, 16) * s))
        text = f"{rng.choice(_LABELS[key])}: {fields[key]}"
        lines.append((text, font, _text_size(draw, text, font)))
    top, bottom = rule_y + round(8 * s), footer_y - round(6 * s)
    spare = max(0, bottom - top - sum(h for _, _, (_, h) in lines))
    gaps = sorted(rng.randint(0, spare) for _ in lines)  # vertical slack before each line, cumulative
    y = top
    previous = 0
    for (text, font, (w, h)), gap in zip(lines, gaps):
        y += gap - previous
        previous = gap
        x = rng.randint(margin, max(margin, image_size - margin - w))
        draw.text((x, y), text, font=font, fill=_INK, anchor="lt")
        y += h + round(3 * s)
    return image, fields


def format_answer(fields: dict[str, str]) -> str:
    """Formats the fields as the assistant answer: a fenced ```json object."""
    return "```json\n" + json.dumps(fields, ensure_ascii=False) + "\n```"


def _write_split(out_dir: Path, split: str, n: int, image_size: int, seed: int) -> Path:
    images_dir = out_dir / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        rng = random.Random(f"documents:{seed}:{split}:{i}")
        image, fields = render_document(image_size, rng)
        rel = f"images/{split}_{i:05d}.png"
        image.save(out_dir / rel, format="PNG", optimize=False)
        row = {
            "messages": [
                {"role": "user", "content": IMAGE_TAG + PROMPT},
                {"role": "assistant", "content": format_answer(fields)},
            ],
            "images": [rel],
        }
        lines.append(json.dumps(row, ensure_ascii=False))
    jsonl = out_dir / f"{split}.jsonl"
    jsonl.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return jsonl


def generate_dataset(
    out_dir: str | Path,
    n_train: int = 64,
    n_eval: int = 16,
    image_size: int = 256,
    seed: int = 0,
) -> dict:
    """Generates the synthetic document dataset.

    Writes ``out_dir/train.jsonl``, ``out_dir/eval.jsonl`` and the PNGs under
    ``out_dir/images/`` (``train_00000.png``, ..., ``eval_00000.png``, ...). Existing files
    with the same names are overwritten; other files are left alone. Train and eval
    documents are drawn from disjoint RNG streams.

    Args:
        out_dir: Output folder, created if missing.
        n_train: Number of training rows (>= 0). Default 64.
        n_eval: Number of evaluation rows (>= 0). Default 16.
        image_size: Side of the square images, px (>= 128). Default 256.
        seed: Seed; equal arguments give byte-identical files. Default 0.

    Returns:
        ``{"train": str, "eval": str, "n_train": int, "n_eval": int}`` with the paths of
        the two JSONL files.

    Raises:
        ValueError: A negative count or a too small image_size.
    """
    if n_train < 0 or n_eval < 0:
        raise ValueError(f"n_train and n_eval must be >= 0, got {n_train} and {n_eval}")
    if image_size < MIN_IMAGE_SIZE:
        raise ValueError(f"image_size must be >= {MIN_IMAGE_SIZE}, got {image_size}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train = _write_split(out, "train", n_train, image_size, seed)
    evl = _write_split(out, "eval", n_eval, image_size, seed)
    return {"train": str(train), "eval": str(evl), "n_train": n_train, "n_eval": n_eval}


def main(argv: Sequence[str] | None = None) -> None:
    """CLI entry point; prints the JSON result of `generate_dataset`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="output folder")
    parser.add_argument("--n-train", type=int, default=64)
    parser.add_argument("--n-eval", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    result = generate_dataset(args.out_dir, args.n_train, args.n_eval, args.image_size, args.seed)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
