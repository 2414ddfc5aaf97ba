"""Checks run before any build work, each failing with a message that says what to do."""

from __future__ import annotations

import shutil
from pathlib import Path

DISK_MARGIN = 1.25  # temporary files and the log on top of the engine itself


class PreflightError(Exception):
    """The build cannot start; the message says why and what to do."""


def check_disk(target_dir: Path, needed_bytes: int) -> None:
    target_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(target_dir).free
    needed = int(needed_bytes * DISK_MARGIN)
    if free < needed:
        raise PreflightError(
            f"not enough disk under {target_dir}: the build needs about {needed / 2**30:.1f} GiB "
            f"and {free / 2**30:.1f} GiB is free"
        )
