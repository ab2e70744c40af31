"""A small filesystem (a tmpfs with a size) to fill up, for the full-disk tests."""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def small_disk(mount: Path, megabytes: int) -> Iterator[Path]:
    """``mount`` (created) as a tmpfs of ``megabytes``, unmounted on exit."""
    mount.mkdir(parents=True, exist_ok=True)
    size = f"size={megabytes}m"
    subprocess.run(["mount", "-t", "tmpfs", "-o", size, "tidemark-full", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=True)


def fill(disk: Path) -> Path:
    """A file that takes every byte left on ``disk``, down to its last block."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as handle:
        for chunk in (1024 * 1024, 4096, 1):
            try:
                while True:
                    handle.write(b"\0" * chunk)
            except OSError as error:
                assert error.errno == errno.ENOSPC
    return filler
