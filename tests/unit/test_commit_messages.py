"""The commit-message rule `make lint` applies (tests/tools/commit_messages.py)."""

import os
import subprocess

import pytest

from tests.tools.commit_messages import boundaries, main, messages_since, problems


@pytest.mark.parametrize(
    "message",
    [
        "Fold late records into silver in one MERGE\n",
        "Fold late records into silver in one MERGE\n\nWhy: the per-window MERGE read every file.\n",
        "x" * 72,
        "Document the tune JSON fields\n\nAsked for in issue 12 of the tracker.\n",
    ],
)
def test_a_good_message_has_no_problem(message):
    assert problems(message) == []


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        ("x" * 73, "subject of 73 characters (at most 72)"),
        ("Fold late records\nWhy: the per-window MERGE read every file.", "no blank line"),
        ("README: session 75's bench figures", "'session 75'"),
        ("Fix issue #12: the claim's version", "'issue #12'"),
        ("Close Issues 20 and 21", "'Issues 20'"),
        ("", "empty subject"),
    ],
)
def test_a_bad_message_is_told_why(message, problem):
    found = problems(message)
    assert len(found) == 1 and problem in found[0], found


def commit(repo, message):
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "--allow-empty", "-m", message], check=True)
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    for variable, value in {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "GIT_CONFIG_GLOBAL": os.devnull,
    }.items():
        monkeypatch.setenv(variable, value)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    return tmp_path


def test_only_commits_after_the_base_are_judged(repo):
    old = commit(repo, "an old subject that is far longer than seventy-two characters, from before the check")
    commit(repo, "Add the check\n\nWhy: subjects grew past what git log shows.")
    commit(repo, "session 3: more")
    assert boundaries(repo, base=old, upstream="origin/main") == [old]
    judged = messages_since(repo, [old])
    assert [message.split("\n")[0] for _, message in judged] == ["session 3: more", "Add the check"]


def test_a_checkout_without_a_branch_point_passes(repo, capsys):
    commit(repo, "x" * 80)
    assert main([str(repo)]) == 0  # neither origin/main nor the base commit is here
    assert "nothing to check" in capsys.readouterr().out
