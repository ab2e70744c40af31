"""Commit messages as CONTRIBUTING.md asks for them, checked by ``make lint``: a
subject of at most 72 characters, a blank line between it and any body, and no
"session N" or "issue N" in it (the subject says what changed; a tracker's
numbering belongs in the body, where it can be explained).

    .venv/bin/python -m tests.tools.commit_messages

It reads the commits on HEAD since the branch point with ``origin/main``, never
those at or before :data:`BASE` (the history written before this check, which it
does not judge). A fresh clone whose HEAD is the branch point has nothing to
check and passes; so does a checkout that has neither ``origin/main`` nor
:data:`BASE` (a shallow copy), where there is no branch point to count from.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The last commit before this check existed: older history is left as it is.
BASE = "a5c82bab26896b99ccb44e050823f57c766e4ac2"
UPSTREAM = "origin/main"
MAX_SUBJECT = 72
NUMBERED = re.compile(r"\b(session|issue)s?\s+#?\d+", re.IGNORECASE)
# Between the fields of one commit and after each commit in ``git log``'s output.
FIELD, RECORD = "\x1f", "\x1e"


def problems(message: str) -> list[str]:
    """What is wrong with one commit message (its raw text, subject first)."""
    lines = message.strip("\n").split("\n")
    subject = lines[0].rstrip()
    found = []
    if not subject:
        found.append("empty subject")
    if len(subject) > MAX_SUBJECT:
        found.append(f"subject of {len(subject)} characters (at most {MAX_SUBJECT})")
    if len(lines) > 1 and lines[1].strip():
        found.append("no blank line between the subject and the body")
    mention = NUMBERED.search(subject)
    if mention:
        found.append(f"the subject names {mention.group(0)!r}: say what changed, explain in the body")
    return found


def git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = ["git", "-C", str(repo), *args]
    try:
        return subprocess.run(command, capture_output=True, text=True, check=False)
    except FileNotFoundError:  # no git here: nothing is a checkout
        return subprocess.CompletedProcess(command, 127, "", "git is not installed")


def exists(repo: Path, revision: str) -> bool:
    return git(repo, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}").returncode == 0


def boundaries(repo: Path, base: str = BASE, upstream: str = UPSTREAM) -> list[str]:
    """The commits whose history is not checked: the branch point with ``upstream``
    and ``base``, each when this checkout has it."""
    found = []
    if exists(repo, upstream):
        merge_base = git(repo, "merge-base", "HEAD", upstream)
        if merge_base.returncode == 0:
            found.append(merge_base.stdout.strip())
    if exists(repo, base):
        found.append(base)
    return found


def messages_since(repo: Path, excluded: Sequence[str]) -> list[tuple[str, str]]:
    """(short hash, raw message) of every commit on HEAD that no ``excluded`` commit reaches."""
    listed = git(repo, "log", f"--format=%h{FIELD}%B{RECORD}", "HEAD", *(f"^{commit}" for commit in excluded))
    if listed.returncode != 0:
        raise RuntimeError(f"git log failed: {listed.stderr.strip()}")
    commits = []
    for record in listed.stdout.split(RECORD):
        if FIELD in record:
            short, message = record.strip("\n").split(FIELD, 1)
            commits.append((short, message))
    return commits


def main(argv: Sequence[str] | None = None) -> int:
    repo = Path(argv[0]) if argv else REPO
    if not exists(repo, "HEAD"):
        print("commit messages: not a git checkout; nothing to check")
        return 0
    excluded = boundaries(repo)
    if not excluded:
        print(f"commit messages: neither {UPSTREAM} nor the base commit is here; nothing to check")
        return 0
    commits = messages_since(repo, excluded)
    failed = 0
    for short, message in commits:
        for problem in problems(message):
            subject = message.strip("\n").split("\n")[0]
            print(f"{short} {subject!r}: {problem}", file=sys.stderr)
            failed += 1
    print(f"commit messages: {len(commits)} checked, {failed} problem(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
