"""A full disk, told apart from other failures so that a job can say so in one line."""

from __future__ import annotations

import errno
import os
import shutil

# What the JVM's IOException and Python's OSError both say for ENOSPC.
NO_SPACE = os.strerror(errno.ENOSPC)
MB = 1024 * 1024


def local_folder(root: str) -> str | None:
    """The folder of a lakehouse ``root`` on this machine; None for one on object storage."""
    if "://" in root and not root.startswith("file:"):
        return None
    return root.removeprefix("file://").removeprefix("file:")


def out_of_space(error: BaseException | str) -> bool:
    """Whether ``error`` (a Py4J error's text carries the Java causes) is a full disk."""
    return NO_SPACE in str(error)


def full_disk_hint(root: str | None = None) -> str:
    """What to do once a job failed for a full disk, with the free space of the lakehouse
    at ``root`` where the job knows it."""
    folder = None if root is None else local_folder(root)
    where = "a disk of this machine (the lakehouse's, Spark's local folders or the upload buffer)"
    if folder is not None:
        free = shutil.disk_usage(nearest_existing(folder)).free
        where = f"the disk of {folder} ({free / MB:.1f} MB free) or of Spark's local folders"
    return (
        f"a disk is full ({NO_SPACE}): {where}. Nothing past the last committed batch "
        "was kept: free space, then start the job again and it resumes from there"
    )


def nearest_existing(folder: str) -> str:
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    return folder
