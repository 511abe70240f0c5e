"""The error staging raises, and what its messages share (a full disk, sizes for people)."""

from __future__ import annotations

import errno

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class StageError(RuntimeError):
    """Staging failed; the message names the source or file and the fix."""


def size_text(n: float) -> str:
    """Bytes for people: '1.5 GB', '12.0 MB', '640 B'."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"
