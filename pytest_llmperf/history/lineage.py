"""What git says about the commit a job measured: its time, its branch, the default branch, and whether and where
the commit lies on the default branch's first-parent line (the order of a series: merges into main, never the
commits of a merged branch, never job time).

Asked with a timeout; no git, no repository, or a shallow clone (which cannot see the line) gives None where it
cannot tell, never an error. A CI job checks out with its full history (actions/checkout `fetch-depth: 0`) to order
its rows; rows without an order are ordered by commit time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..judge.fingerprint import git

MAX_LINE = 20_000  # first-parent commits read at most


def default_branch(root: Path, given: str | None = None) -> str | None:
    """The branch whose first-parent line is the history: given, else origin's HEAD, else main or master."""
    if given:
        return given
    remote = git(root, "symbolic-ref", "--short", "refs/remotes/origin/HEAD")
    if remote:
        return remote.removeprefix("origin/")
    for name in ("main", "master"):
        if git(root, "rev-parse", "--verify", "--quiet", f"refs/heads/{name}") is not None:
            return name
    return None


def branch_ref(root: Path, branch: str) -> str | None:
    """The local or remote-tracking ref of the branch, whichever exists (CI checkouts often lack the local one)."""
    for ref in (f"refs/remotes/origin/{branch}", f"refs/heads/{branch}"):
        if git(root, "rev-parse", "--verify", "--quiet", ref) is not None:
            return ref
    return None


def first_parent_line(root: Path, branch: str) -> list[str]:
    """The default branch's first-parent commits, oldest first (empty where git cannot tell)."""
    ref = branch_ref(root, branch)
    if ref is None or git(root, "rev-parse", "--is-shallow-repository") == "true":
        return []
    text = git(root, "rev-list", "--first-parent", f"--max-count={MAX_LINE}", ref)
    return list(reversed(text.split())) if text else []


def current_branch(root: Path) -> str | None:
    """The job's branch: GitHub's names for it where set (a pull request's head, a push's ref), else git's."""
    for name in ("GITHUB_HEAD_REF", "GITHUB_REF_NAME"):
        if os.environ.get(name):
            return os.environ[name]
    found = git(root, "rev-parse", "--abbrev-ref", "HEAD")
    return None if found in (None, "HEAD") else found


@dataclass(frozen=True)
class Placement:
    sha: str
    time: str | None
    order: int | None  # 1-based position on the default branch's first-parent line; None when not on it


def place(root: Path, ref: str, line: list[str]) -> Placement | None:
    """Where a commit (any ref) lies; None where git cannot resolve it."""
    sha = git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if not sha:
        return None
    when = git(root, "show", "-s", "--format=%cI", sha) or None
    index = {c: i for i, c in enumerate(line, 1)}
    return Placement(sha, when, index.get(sha))


def ci_url() -> str | None:
    """The CI run's page, where the CI says it (GitHub Actions)."""
    server, repo, run = (os.environ.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID"))
    return f"{server}/{repo}/actions/runs/{run}" if server and repo and run else None
