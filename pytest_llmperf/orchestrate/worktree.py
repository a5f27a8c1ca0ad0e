"""The reference side of an A/B comparison: a git ref checked out into a temporary worktree.

`--llmperf-compare REF` measures the working tree (B) against REF (A) in one job. REF is checked out
with `git worktree add --detach` into a temporary directory, which is removed afterwards whatever
happens (a failed test, an error, Ctrl-C). The user's project imports from the side being measured:
the workers of A get A's checkout (and its `src/`, if any) first on PYTHONPATH, which wins over an
editable install of the working tree.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..files import claim, owner_gone


class RefError(ValueError):
    """A ref that cannot be compared against: not a git repository, an unknown ref."""


@dataclass(frozen=True)
class Checkout:
    ref: str
    commit: str
    toplevel: Path  # the worktree's top directory
    root: Path  # the pytest rootdir's counterpart inside it
    source: Path  # the top directory of the working tree it was checked out from
    cleared: tuple[tuple[Path, int], ...] = ()  # worktrees a killed run left, removed first: (path, its pid)

    @property
    def label(self) -> str:
        return f"{self.ref} ({self.commit[:10]})"

    @property
    def pythonpath(self) -> tuple[str, ...]:
        return import_path(self.toplevel, self.root)

    def counterpart(self, path: Path) -> Path:
        """Where a path of the working tree (an ini file, a directory) lies in this checkout; itself if outside."""
        try:
            return self.toplevel / Path(path).resolve().relative_to(self.source.resolve())
        except ValueError:
            return Path(path)


def import_path(toplevel: Path, root: Path) -> tuple[str, ...]:
    """What a side's workers put first on PYTHONPATH, so that each side imports its own project, also where an
    installed copy of it would win: its `src/` (a src layout), its rootdir, its top directory."""
    paths = [str(toplevel / "src")] if (toplevel / "src").is_dir() else []
    if root != toplevel:
        paths.append(str(root))
    return (*paths, str(toplevel))


def _git(args: list[str], cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RefError(done.stderr.strip() or f"git {' '.join(args)} failed with code {done.returncode}")
    return done.stdout.strip()


def resolve(ref: str, rootdir: Path) -> tuple[str, Path]:
    """(commit, git toplevel) of `ref` as seen from `rootdir`; RefError with the fix otherwise."""
    try:
        toplevel = Path(_git(["rev-parse", "--show-toplevel"], rootdir))
    except OSError as exc:
        raise RefError(f"--llmperf-compare {ref}: cannot run git ({exc}); install git") from None
    except RefError as exc:
        raise RefError(f"--llmperf-compare {ref}: {rootdir} is not inside a git repository ({exc})") from None
    try:
        commit = _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], toplevel)
    except RefError:
        raise RefError(
            f"--llmperf-compare {ref}: no such commit, branch or tag in {toplevel}. Name one that "
            f"`git rev-parse {ref}` finds (e.g. HEAD, origin/main); {fetch_hint(ref, toplevel)}"
        ) from None
    return commit, toplevel


def fetch_hint(ref: str, toplevel: Path) -> str:
    """How to fetch `ref` so that `git rev-parse ref` finds it, also in a single-branch shallow clone (CI's
    `actions/checkout` default), where `git fetch origin main` fills only FETCH_HEAD: the refspec names where
    it goes, and a shallow clone fetches one commit (--depth=1), all a worktree of it needs."""
    try:
        remotes = _git(["remote"], toplevel).split()
        shallow = _git(["rev-parse", "--is-shallow-repository"], toplevel) == "true"
    except (RefError, OSError):
        remotes, shallow = [], False
    if not remotes:
        return "this repository has no remote to fetch it from: name a commit it holds"
    if any(c in ref for c in "~^@:"):  # HEAD~1, main^: a commit the shallow history stops short of
        return (
            "this clone's history is shallow: deepen it first (git fetch --unshallow; actions/checkout: fetch-depth: 0)"
            if shallow
            else "fetch what it names first"
        )
    depth = "--depth=1 " if shallow else ""
    named = sorted((r for r in remotes if ref.removeprefix("refs/remotes/").startswith(f"{r}/")), key=len)
    if named:  # origin/main: into the remote-tracking ref that names it
        remote = named[-1]
        branch = ref.removeprefix("refs/remotes/")[len(remote) + 1 :]
        command = f"git fetch {depth}{remote} {branch}:refs/remotes/{remote}/{branch}"
    else:
        remote = "origin" if "origin" in remotes else remotes[0]
        is_sha = 7 <= len(ref) <= 40 and all(c in "0123456789abcdef" for c in ref.lower())
        # a commit by its hash needs no ref; a branch or tag name becomes a local one of that name (git infers which)
        command = f"git fetch {depth}{remote} {ref}" + ("" if is_sha else f":{ref}")
    return f"fetch it first (in CI, before pytest): {command}"


PREFIX = "llmperf-ref-"


def remove_orphans(toplevel: Path) -> list[tuple[Path, int]]:
    """Remove our worktrees whose pytest process is gone (it was killed with SIGKILL, which no cleanup
    survives), so they do not pile up in the repository's `git worktree list`; (path, the pid that made it)."""
    removed = []
    listing = _git(["worktree", "list", "--porcelain"], toplevel)
    for line in listing.splitlines():
        path = Path(line.removeprefix("worktree ")) if line.startswith("worktree ") else None
        if path is None or not path.parent.name.startswith(PREFIX) or path.name != "ref":
            continue
        owner = owner_gone(path.parent)
        if owner is None:
            continue  # running, or not one we can vouch for
        with contextlib.suppress(RefError, OSError, subprocess.SubprocessError):
            _git(["worktree", "remove", "--force", str(path)], toplevel)
        shutil.rmtree(path.parent, ignore_errors=True)
        removed.append((path, owner))
    return removed


@contextlib.contextmanager
def checkout(ref: str, rootdir: Path) -> Iterator[Checkout]:
    """Check `ref` out into a temporary worktree for the duration of the block."""
    commit, toplevel = resolve(ref, rootdir)
    cleared: list[tuple[Path, int]] = []
    with contextlib.suppress(RefError, OSError, subprocess.SubprocessError):
        cleared = remove_orphans(toplevel)
    parent = Path(tempfile.mkdtemp(prefix=PREFIX))
    claim(parent)
    path = parent / "ref"
    try:
        _git(["worktree", "add", "--detach", "--force", str(path), commit], toplevel)
        root = path / Path(rootdir).resolve().relative_to(toplevel.resolve())
        yield Checkout(ref, commit, path, root, toplevel, tuple(cleared))
    finally:
        with contextlib.suppress(RefError, OSError, subprocess.SubprocessError):
            _git(["worktree", "remove", "--force", str(path)], toplevel)
        shutil.rmtree(parent, ignore_errors=True)
        with contextlib.suppress(RefError, OSError, subprocess.SubprocessError):
            _git(["worktree", "prune"], toplevel)
