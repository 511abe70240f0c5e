"""Output path checks, before anything is written: no output may be, or hold, an input or a row's image."""

from __future__ import annotations

import os
from pathlib import Path

from components.validate_data.types import DataError, Outputs, PendingRow

OTHER_FOLDER = "write the outputs to another folder (CLI: --out OTHER_DIR)"


def local_path(name: str) -> str:
    """Returns the absolute real path of a file or folder name; gs://b/o is /gcs/b/o (Cloud Storage FUSE)."""
    return os.path.realpath("/gcs/" + name[len("gs://") :] if name.startswith("gs://") else name)


def is_in(path: str, folder: str) -> bool:
    """Whether real path `path` is `folder` or lies under it."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def output_problem(name: str, *, want_folder: bool) -> str:
    """Returns why an output cannot be written where it is named ("" when it can), reading nothing.

    Checks what is there now: the output itself of the wrong kind (a file where a folder goes,
    a folder where a file goes), its nearest existing parent not a folder, or that folder not
    writable. gs:// outputs are not checked here.
    """
    if name.startswith("gs://"):
        return ""
    path = Path(name)
    if path.exists():
        if want_folder and not path.is_dir():
            return "is a file, but a dataset folder goes here: remove or rename it, or write the outputs elsewhere"
        if not want_folder and path.is_dir():
            return "is a folder, but a file goes here: remove or rename the folder, or write the outputs elsewhere"
    parent = path if path.is_dir() else path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is a file, not a folder: pass an output folder that is not inside a file"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"the folder {parent} is not writable by this user: pass a folder you can write ({OTHER_FOLDER})"
    return ""


def check_paths(inputs: list[str], *, train_out: str, eval_out: str, quarantine_out: str, report_out: str = "") -> None:
    """Refuses outputs that would overwrite an input or each other; reads and writes nothing.

    Args:
        inputs: The JSONL files to validate (train and eval; paths or gs:// URIs).
        train_out: Folder for the clean training set.
        eval_out: Folder for the clean held-out set.
        quarantine_out: JSONL file for the rejected lines.
        report_out: HTML report file; "" = none. Default "".

    Raises:
        DataError: An output cannot be written (a file where a folder goes or the reverse,
            inside a file, or in a folder this user cannot write), an input file lies in an
            output dataset folder or is an output file
            (re-validating a clean set into its own folder), the two dataset folders are
            one, or an output file lies in a dataset folder. The message names both paths.
    """
    folders = {"train_out": train_out, "eval_out": eval_out}
    files = {"quarantine_out": quarantine_out, **({"report_out": report_out} if report_out else {})}
    for arg, name in {**folders, **files}.items():
        problem = output_problem(name, want_folder=arg in folders)
        if problem:
            raise DataError(f"{arg} {name}: {problem}")
    real = {arg: local_path(name) for arg, name in {**folders, **files}.items()}
    if real["train_out"] == real["eval_out"]:
        raise DataError(f"train_out and eval_out are the same folder {train_out}: {OTHER_FOLDER} for each")
    if real.get("report_out") == real["quarantine_out"]:
        raise DataError(f"quarantine_out and report_out are the same file {quarantine_out}: {OTHER_FOLDER}")
    for file_arg, file_name in files.items():
        for folder_arg, folder in folders.items():
            if is_in(real[file_arg], real[folder_arg]):
                raise DataError(f"{file_arg} {file_name} is inside {folder_arg} {folder}: {OTHER_FOLDER}")
    for name in inputs:
        path = local_path(name)
        for folder_arg, folder in folders.items():
            if is_in(path, real[folder_arg]):
                raise DataError(
                    f"{name}: this input file is inside the output folder {folder} ({folder_arg}); validating "
                    f"into it would overwrite the data while it is read: {OTHER_FOLDER}"
                )
        for file_arg, file_name in files.items():
            if path == real[file_arg]:
                raise DataError(
                    f"{name}: this input file is the output {file_arg} {file_name}; validating would overwrite "
                    f"it: {OTHER_FOLDER}"
                )


def check_image_paths(pending: list[PendingRow], outputs: Outputs) -> None:
    """Refuses a local image that lies in an output dataset folder (it would be overwritten while read)."""
    folders = {"train_out": outputs.train, "eval_out": outputs.eval}
    real = {arg: local_path(str(folder)) for arg, folder in folders.items()}
    seen: set[str] = set()
    for p in pending:
        for ref, src in p.sources:
            if src.kind != "file" or src.location in seen:
                continue
            seen.add(src.location)
            # a relative reference is already resolved (_sources.resolve); an absolute one may hold links
            path = os.path.realpath(src.location) if os.path.isabs(ref.strip()) else src.location
            for folder_arg, folder in folders.items():
                if is_in(path, real[folder_arg]):
                    raise DataError(
                        f"{p.file}:{p.line}: image {ref!r} ({path}) is inside the output folder {folder} "
                        f"({folder_arg}); validating into it would overwrite the image while it is read: "
                        f"{OTHER_FOLDER}"
                    )
