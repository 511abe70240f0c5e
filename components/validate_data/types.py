"""The records of a validate-data run: its check codes, errors, results and the rows between phases.

Shared by the phases (`_read`, `_images`, `_row_checks`, `_split`, `_write`), the run (`core`) and
the report (`_report`), which import these and not each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.common.provenance import ORIGIN_KEY, origin_of, where
from components.common.tasks import GOLD_CODES, TASK_NAMES
from components.validate_data import _formats
from components.validate_data._sources import Reject, Source

if TYPE_CHECKING:  # imported in `_images._decode`: numpy and imagehash stay out of `vlm-lora validate --help`
    from components.validate_data import _looks

MAX_LINE_BYTES = 8 * 1024 * 1024
MAX_IMAGE_PIXELS = 8192 * 8192

# Stable check codes, in the order checks run.
CODES = {
    "E_ENCODING": "line is not valid UTF-8",
    "E_TOO_LONG": f"line longer than {MAX_LINE_BYTES} bytes",
    "E_JSON": "line is not valid JSON",
    "E_DUPLICATE_KEY": "a JSON object has the same key twice (a JSON reader keeps only the last)",
    _formats.CODE: _formats.DESCRIPTION,
    "E_SCHEMA": "row does not match {messages: [{role, content}], images: [...]}",
    "E_RESERVED_KEY": f"row carries {ORIGIN_KEY!r}, the origin record validate-data writes into clean sets only "
    "(a raw row may not say where it came from)",
    "E_MEDIA_KEY": "row has 'videos' or 'audios', which ms-swift reads but validate-data does not check yet",
    "E_ROLE": "unknown role",
    "E_ORDER": "messages out of order (alternation / last message must be the assistant's)",
    "E_IMAGE_COUNT": "number of <image> tags differs from len(images)",
    "E_ANSWER": "assistant answer is not fenced JSON of the task's shape (only with task=...)",
    **GOLD_CODES,  # the strict parse of gold answers (components.common.tasks.check_gold; only with task=...)
    "E_IMAGE_PATH": "image path escapes the dataset folder or uses an unsupported form",
    "E_IMAGE_FETCH": "image URL / gs:// object could not be downloaded (timeout, HTTP or storage error)",
    "E_IMAGE_MISSING": "image file not found",
    "E_IMAGE_UNREADABLE": "image cannot be opened or decoded (corrupt or truncated file)",
    "E_IMAGE_SIZE": "image size, aspect ratio or mode not usable",
    "E_BOX": "a detection box is not 4 numbers with x1 < x2, y1 < y2 inside the image / the convention's range "
    "(only with task=detection)",
    "E_TOKENS": "token count (as ms-swift encodes the row, images resized by max_pixels) exceeds max_length "
    "(only with max_length > 0)",
    "E_DUPLICATE": "same row as an earlier line",
    "E_LEAK": "eval row shares an image (bytes, decoded pixels or a near-duplicate) or its prompt (case and spaces "
    "aside) with a train row (data.leakage: quarantine)",
}
TASKS = TASK_NAMES  # answer checks (components.common.tasks): none, fenced JSON, detection, key_value


class DataError(ValueError):
    """The data cannot be validated at all, or fails the policy; the message says why."""


class LineAccountingError(RuntimeError):
    """Train + eval + quarantined rows differ from the rows read: a bug in validate-data, not in the data."""


@dataclass
class Issue:
    """One rejected line."""

    file: str
    line: int
    code: str
    message: str
    raw: str = ""  # the rejected line (first 64 KiB), so nothing is lost
    origin: str = ""  # the user's `file:line` when the row carries its origin (a clean set validated again)
    origin_images: list[str] = field(default_factory=list)  # its images as the user named them

    def __str__(self) -> str:
        also = f" (originally {self.origin})" if self.origin else ""
        return f"{self.file}:{self.line}{also}: {self.code}: {self.message}"


@dataclass
class ValidationResult:
    """What validation produced.

    Attributes:
        train_dir: Clean train dataset folder.
        eval_dir: Clean eval dataset folder.
        quarantine: JSONL of rejected lines (file, line, code, message, raw text).
        counts: n_lines (non-blank lines read = n_valid + n_invalid), n_valid, n_invalid,
            n_train, n_eval, n_images, per-code counts.
        issues: The rejected lines, in input order.
        stats: token_counts (per valid row), token_source ("approx" or the tokenizer),
            max_length, max_pixels (ms-swift's `max_pixels` the image tokens were counted
            with; 0 = none), image_sizes ((width, height) per distinct valid image).
        report: The HTML report file ("" when none was asked for).
    """

    train_dir: str
    eval_dir: str
    quarantine: str
    counts: dict[str, int]
    issues: list[Issue] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    report: str = ""

    def summary(self, max_issues: int = 10) -> str:
        """Returns a human-readable summary: counts per check and the first errors."""
        c = self.counts
        lines = [
            f"{c['n_lines']} lines: {c['n_valid']} valid ({c['n_train']} train, {c['n_eval']} eval), "
            f"{c['n_invalid']} quarantined; {c['n_images']} images"
        ]
        tokens = sorted(self.stats.get("token_counts", []))
        if tokens:
            limit = self.stats.get("max_length") or "none"
            pixels = self.stats.get("max_pixels") or "none"
            lines.append(
                f"tokens per valid row ({self.stats.get('token_source', 'approx')}): "
                f"median {tokens[len(tokens) // 2]}, "
                f"p95 {tokens[min(len(tokens) - 1, int(len(tokens) * 0.95))]}, max {tokens[-1]} "
                f"(max_length {limit}, max_pixels {pixels})"
            )
        forms = [f"{c[f'n_form_{form}']} {form}" for form in _formats.FORMS if c.get(f"n_form_{form}")]
        if forms:
            lines.append(f"rows read by form (the conversion step): {', '.join(forms)}")
        for code in CODES:
            if c.get(code):
                lines.append(f"  {code}: {c[code]}  ({CODES[code]})")
        if c.get("n_exif_rotated"):
            lines.append(f"  {c['n_exif_rotated']} image(s) with an EXIF orientation written upright (tag applied)")
        if c.get("n_leaked"):
            lines.append(
                f"  {c['n_leaked']} eval row(s) share an image or a prompt with train rows "
                f"(data.leakage {self.stats.get('leakage', 'quarantine')}; the report lists them)"
            )
        for issue in self.issues[:max_issues]:
            lines.append(f"  {issue}")
        if len(self.issues) > max_issues:
            lines.append(f"  ... and {len(self.issues) - max_issues} more in {self.quarantine}")
        return "\n".join(lines)


def invalid_fraction(counts: dict[str, int]) -> float:
    """Returns the fraction of lines that max_invalid_fraction limits: quarantined ones, leaked eval rows not
    counted (E_LEAK rows are valid rows moved out of eval, by the data.leakage setting)."""
    return (counts["n_invalid"] - counts.get("E_LEAK", 0)) / counts["n_lines"] if counts["n_lines"] else 0.0


@dataclass
class InspectedImage:
    """One inspected image: its local file, content hash and header facts (of the upright image).

    `exif_orientation` is the source's EXIF Orientation (1 = upright); when it is not 1, `path`
    is the upright copy that the clean dataset holds (`_images._decode`).
    """

    path: Path
    sha: str
    width: int
    height: int
    mode: str
    suffix: str
    exif_orientation: int = 1
    looks: _looks.Looks | None = None  # decoded pixels' identity and pHash (leakage by what the model sees)


@dataclass
class PendingRow:
    """A line that passed the text checks, waiting for its images."""

    file: str
    line: int
    raw: bytes
    row: dict[str, Any]
    sources: list[tuple[str, Source]]
    is_eval: bool


@dataclass
class RejectedLine:
    """A quarantined line, with its local images for the report's thumbnails."""

    issue: Issue
    thumbnails: list[Path] = field(default_factory=list)


@dataclass
class ReadFile:
    """One input file after the text checks.

    Attributes:
        name: The file as given (path or gs:// URI).
        n_read: Lines read from it, blank ones included.
        n_blank: Blank lines among them (not rows: neither clean nor quarantined).
        pending: Rows that passed the text checks, in line order.
        rejected: Lines that failed a text check, in line order.
        forms: Rows read per input form (`_formats.FORMS`), and conversion failures. Default empty.
    """

    name: str
    n_read: int
    n_blank: int
    pending: list[PendingRow]
    rejected: list[RejectedLine]
    forms: dict[str, int] = field(default_factory=dict)


@dataclass
class CheckedRow:
    """A row that passed every check, ready to be written.

    Attributes:
        row: The parsed JSON row, as read.
        images: Its inspected images, in the row's order.
        key: sha256 of its messages and image hashes: the duplicate check and the split key.
        tokens: Its estimated token count.
        is_eval: Whether it came from an eval file.
        origin: The user's file, line and image names (`components.common.provenance`).
        file: The file it was read from. Default "".
        line: Its line number there. Default 0.
        raw: The line as read (a leaked eval row goes to the quarantine with it). Default b"".
    """

    row: dict[str, Any]
    images: list[InspectedImage]
    key: str
    tokens: int
    is_eval: bool
    origin: dict[str, Any] = field(default_factory=dict)
    file: str = ""
    line: int = 0
    raw: bytes = b""


@dataclass(frozen=True)
class Outputs:
    """Where one run writes: two dataset folders, the quarantine JSONL and the report ("" = none)."""

    train: Path
    eval: Path
    quarantine: Path
    report: str


def raw_text(raw: bytes) -> str:
    """Returns a quarantined line's text as kept in the quarantine (first 64 KiB)."""
    return raw[:65536].decode("utf-8", errors="replace")


def issue_of(file: str, line: int, rej: Reject, raw: bytes, row: Any) -> Issue:
    """Returns the quarantine record of a rejected line, with the row's original file:line when it carries one."""
    origin = origin_of(row)
    return Issue(file, line, rej.code, rej.message, raw_text(raw), where(origin), origin["images"] if origin else [])
