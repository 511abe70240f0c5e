"""The train / eval split (by source file, or the hash split of groups) and what is done with leaked eval rows."""

from __future__ import annotations

import hashlib
import warnings

from components.validate_data import _leakage
from components.validate_data._leakage import Leak
from components.validate_data._sources import Reject
from components.validate_data.types import CheckedRow, RejectedLine, issue_of


def split_key(row_key: str, salt: str) -> float:
    """Returns a row's deterministic position in [0, 1) for the hash split."""
    digest = hashlib.sha256(f"{salt}\0{row_key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_rows(
    checked: list[CheckedRow], *, hash_split: bool, eval_fraction: float, split_seed: str
) -> tuple[list[CheckedRow], list[CheckedRow]]:
    """Returns (train rows, eval rows): by source file, or by the hash split when `hash_split`.

    The hash split places groups of rows (`_leakage.split_groups`: rows sharing an image by
    content, or a prompt when they have no image), each at the split position of its
    smallest row key; a row that shares nothing keeps its own position. When all rows form
    one group, no split keeps them apart: rows are split one by one and the leaks reported
    (`handle_leaks`).
    """
    train = [r for r in checked if not r.is_eval]
    if not hash_split:
        return train, [r for r in checked if r.is_eval]
    group = _leakage.split_groups(train)  # rows sharing an image or a prompt stay on one side: no leak
    if len(set(group.values())) < 2:  # one group: no split keeps them apart (the leaks are reported)
        group = {r.key: r.key for r in train}
    positions = {g: split_key(g, split_seed) for g in set(group.values())}
    eval_groups = {g for g, pos in positions.items() if pos < eval_fraction}
    if not eval_groups and len(positions) >= 2:
        eval_groups = {min(positions, key=positions.get)}
    return [r for r in train if group[r.key] not in eval_groups], [r for r in train if group[r.key] in eval_groups]


def handle_leaks(
    train: list[CheckedRow], held_out: list[CheckedRow], rejected: list[RejectedLine], leakage: str
) -> tuple[list[CheckedRow], list[Leak]]:
    """Finds the eval rows a train row gives away (`_leakage.find_leaks`) and applies the leakage setting.

    quarantine and error: each leaked eval row goes to `rejected` (E_LEAK, naming the train
    rows' file:line); error then fails the run in `core._enforce_policy`. warn: the rows stay in
    eval, each named in a warning. Returns (the eval rows kept, the leaks).
    """
    leaks = _leakage.find_leaks(train, held_out)
    if not leaks:
        return held_out, leaks
    if leakage == "warn":
        shown = "; ".join(f"{k.eval_row.file}:{k.eval_row.line} has {k.describe()}" for k in leaks[:3])
        warnings.warn(
            f"{len(leaks)} eval row(s) share an image or a prompt with train rows and stay in eval (data.leakage "
            f"warn, or a hash split of rows that all share one image): {shown}{'; ...' if len(leaks) > 3 else ''}",
            stacklevel=2,
        )
        return held_out, leaks
    fix = (
        "remove the row from the eval data (or its image from the train data); data.leakage: warn (CLI --leakage "
        "warn) keeps it"
    )
    for leak in leaks:
        e = leak.eval_row
        rej = Reject("E_LEAK", f"eval row has {leak.describe()}; scoring it would measure memorisation: {fix}")
        thumbs = [i.path for i in e.images]
        rejected.append(RejectedLine(issue_of(e.file, e.line, rej, e.raw, e.row), thumbs))
    leaked = {id(leak.eval_row) for leak in leaks}
    return [r for r in held_out if id(r) not in leaked], leaks
