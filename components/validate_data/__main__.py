"""Validate ms-swift JSONL data on your own machine, with the pipeline's core.

    python -m components.validate_data DATA.jsonl [DATA2.jsonl ...] [--eval EVAL.jsonl]
        [--model DIR] [--max-length N] [--max-pixels N] [--task detection] [--box-convention C] [--out DIR]
    python -m components.validate_data convert DATA.jsonl --to norm1000 --out NEW.jsonl
        [--from pixel] [--model DIR] [--max-pixels N]     (rewrite the boxes into a model's convention)

Writes DIR/train/, DIR/eval/ (data.jsonl + images/, each whole with its completion
marker), DIR/quarantine.jsonl, DIR/report.html and, last, DIR/complete.json (DIR is
complete; a run that was killed leaves none), prints the summary, and exits 1 when the
policy fails (or a file is missing / empty, or DIR holds an input: re-validate a clean set
into another folder, or DIR lies inside a local data file's folder, where a folder source
would read its quarantine and splits as data), 0 otherwise. One run writes DIR at a time: a second one into the same DIR is refused by
name (the holder's pid and host), exit 1.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from components.common import cli_numbers, data_policy, manifest
from components.common.lock import LockError, Taken, hold_folder, leftovers_of_dead_writers
from components.validate_data._paths import check_paths
from components.validate_data.core import validate_data
from components.validate_data.types import TASKS, DataError


def main(argv: list[str] | None = None) -> int:
    """Runs the command line: parse, check DIR, then validate into it with DIR's lock held; returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["convert"]:
        from components.validate_data._convert import main as convert

        return convert(argv[1:])
    args = _parser().parse_args(argv)
    problem = _argument_problem(args)
    if problem:  # one line, exit 2 as argparse's own usage errors
        print(f"validate-data: {problem}", file=sys.stderr)
        return 2
    out = Path(args.out)
    code = _prepare_out(args, out)
    if code:
        return code
    try:  # one writer per --out: a second one is refused by name (components.common.lock)
        with hold_folder(out, "validate-data", fix=_IN_USE_FIX) as taken:
            _clear_for_writing(out, taken)
            code = _validate(args, out)
            if code == 0:  # written last: DIR is complete (train/ and eval/ carry their own markers)
                manifest.write_manifest(out, _OUT_FILES, producer="validate-data")
            return code
    except LockError as exc:
        print(f"validate-data: FAILED: {exc}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    """Returns the command line's parser: the data, the checks, then the split and the outputs."""
    parser = cli_numbers.OneLineParser(  # a refused value is one line, exit 2 (--help shows the usage)
        prog=sys.argv[0] if sys.argv[0].startswith("vlm-lora ") else "python -m components.validate_data",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "data", nargs="+",
        help="data file(s): JSONL (ms-swift messages, ShareGPT / LLaVA conversations, query/response rows), a JSON "
        "list, parquet, or a Hugging Face save_to_disk folder; local paths or gs:// URIs (JSONL)",
    )  # fmt: skip
    parser.add_argument("--eval", action="append", default=[], help="held-out JSONL (repeatable); default: hash split")
    parser.add_argument("--model", default="", help="model folder: its tokenizer counts tokens (offline)")
    parser.add_argument(
        "--max-length",
        type=cli_numbers.non_negative(int),
        default=0,
        help="largest token count of a row (0 = no check)",
    )
    parser.add_argument(
        "--max-pixels", type=cli_numbers.non_negative(int), default=0,
        help="ms-swift's max_pixels of the training run (swift.max_pixels): larger images are counted scaled down "
        "to it, as ms-swift trains them (0 = none)",
    )  # fmt: skip
    parser.add_argument("--task", default="", choices=TASKS, help="answer check: json or detection (default none)")
    parser.add_argument(
        "--box-convention", default="pixel", choices=("auto", "pixel", "norm1000", "resized_pixel"),
        help="what detection boxes mean (pixel); auto = the family of --model",
    )  # fmt: skip
    _add_split_and_output_flags(parser)
    return parser


def _add_split_and_output_flags(parser: argparse.ArgumentParser) -> None:
    """Adds the split, download, leakage, layout and output flags."""
    parser.add_argument(
        "--eval-fraction",
        type=cli_numbers.any_number,  # its range: the config's rule (_argument_problem), in its words
        default=0.1,
        help="held-out fraction of the split (0.1)",
    )
    parser.add_argument(
        "--max-invalid-fraction",
        type=cli_numbers.any_number,  # its range: the config's rule (_argument_problem), in its words
        default=0.0,
        help="tolerated invalid fraction (0)",
    )
    parser.add_argument("--split-seed", default="split-v1", help="salt of the split hash (split-v1)")
    parser.add_argument(
        "--fetch-timeout",
        type=cli_numbers.positive(float, "a positive number of seconds"),
        default=30.0,
        help="seconds per image download (30)",
    )
    parser.add_argument(
        "--leakage", default=data_policy.DEFAULT_LEAKAGE, choices=data_policy.LEAKAGE_MODES,
        help="an eval row sharing an image (or images and prompt) with a train row: quarantine it (E_LEAK), fail "
        "(error) or keep it (warn); default quarantine",
    )  # fmt: skip
    parser.add_argument(
        "--columns", default="",
        help="LLaMA-Factory dataset_info.json (FILE or FILE:NAME): its sharegpt columns / tags say how rows are laid out",
    )  # fmt: skip
    parser.add_argument("--out", default="validate-data-out", help="output folder (validate-data-out)")


def _prepare_out(args: argparse.Namespace, out: Path) -> int:
    """Checks DIR before anything in it changes and creates it; returns 1 (a message printed) or 0."""
    try:  # before the old report is removed: refused here, nothing in DIR changes
        check_paths(
            args.data + args.eval, train_out=str(out / "train"), eval_out=str(out / "eval"),
            quarantine_out=str(out / "quarantine.jsonl"), report_out=str(out / "report.html"),
        )  # fmt: skip
    except DataError as exc:
        print(f"validate-data: FAILED: {exc}", file=sys.stderr)
        return 1
    problem = _out_in_a_data_folder(out, args.data + args.eval)
    if problem:
        print(f"validate-data: FAILED: {problem}", file=sys.stderr)
        return 1
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"validate-data: FAILED: --out {out}: cannot create the folder ({exc}); pass a folder you can write",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


_IN_USE_FIX = "wait for it to finish, or write to another folder (--out OTHER_DIR)"
# DIR's own completion marker lists these: the two datasets through their markers, and the files beside them
_OUT_FILES = ("train/complete.json", "eval/complete.json", "quarantine.jsonl", "report.html")


def _clear_for_writing(out: Path, taken: Taken) -> None:
    """Removes DIR's completion marker (DIR is incomplete until this run ends) and a dead writer's leftovers."""
    (out / manifest.MANIFEST_FILE).unlink(missing_ok=True)
    for path in leftovers_of_dead_writers(out):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    if taken.previous:
        print(
            f"validate-data: {out} was left by pid {taken.previous.get('pid')} on {taken.previous.get('host')}, "
            "which ended while writing; its leftovers are removed and DIR is written again",
            file=sys.stderr,
        )


# The flags checked with the config's rules (components.common.data_policy): flag -> setting
_RULED_FLAGS = {"--eval-fraction": "eval_fraction", "--max-invalid-fraction": "max_invalid_fraction"}


def _out_in_a_data_folder(out: Path, inputs: list[str]) -> str:
    """Why `--out` may not go where it was asked: inside the folder of a local input file ("" when fine).

    A folder source (`data.train: data/`, snapshot-data) reads every `*.jsonl` below it: DIR's
    quarantine and both clean splits would come back as training data.
    """
    target = out.expanduser().resolve()
    for name in inputs:
        if name.startswith("gs://"):
            continue
        folder = Path(name).expanduser().resolve().parent
        if target.is_relative_to(folder):
            return (
                f"--out {out} is inside {folder}, the folder of the data file {name}: a folder source there would "
                "read DIR's quarantine.jsonl and both clean splits as data; pass --out a folder outside it"
            )
    return ""


def _argument_problem(args: argparse.Namespace) -> str:
    """Returns the first flag whose value breaks the config's rule for its setting ("" when none)."""
    for flag, name in _RULED_FLAGS.items():
        problem = data_policy.setting_problem(name, getattr(args, name))
        if problem:
            return f"{flag} {problem} (the rule of data.{name} in a config)"
    return ""


def _validate(args: argparse.Namespace, out: Path) -> int:
    """Validates into DIR (its lock held); returns the exit code."""
    (out / "report.html").unlink(missing_ok=True)  # never point at an older run's report
    print(f"validate-data: {', '.join(args.data)}" + (f" (eval: {', '.join(args.eval)})" if args.eval else ""))
    try:
        result = validate_data(
            args.data,
            str(out / "train"),
            str(out / "eval"),
            str(out / "quarantine.jsonl"),
            eval_files=args.eval,
            eval_fraction=args.eval_fraction,
            max_invalid_fraction=args.max_invalid_fraction,
            split_seed=args.split_seed,
            report_out=str(out / "report.html"),
            model_dir=args.model or None,
            max_length=args.max_length,
            max_pixels=args.max_pixels,
            task=args.task,
            box_convention=args.box_convention,
            fetch_timeout=args.fetch_timeout,
            leakage=args.leakage,
            columns=args.columns,
        )
    except DataError as exc:
        print(f"validate-data: FAILED: {exc}", file=sys.stderr)
        if (out / "report.html").is_file():
            print(f"report: {out / 'report.html'}", file=sys.stderr)
        return 1
    print(result.summary())
    print(f"outputs: {out}/train, {out}/eval, {result.quarantine}, {result.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
