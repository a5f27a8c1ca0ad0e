"""The ref of an A/B comparison, where CI's clone may lack it: the missing-ref message's fix, run as written in a
real single-branch shallow clone (`git clone --depth 1 --branch feature`, as actions/checkout makes one), makes
the ref found and its worktree checked out (orchestrate/worktree.py)."""

import shlex
import subprocess

import pytest

from pytest_llmperf.orchestrate import worktree

pytestmark = pytest.mark.slow  # every test here runs git


def git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def commit(cwd, message):
    git(cwd, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", message)


@pytest.fixture
def origin(tmp_path):
    """A project with main (two commits, a tag) and a feature branch on top."""
    src = tmp_path / "origin"
    src.mkdir()
    git(src, "init", "-q", "-b", "main")
    (src / "engine.py").write_text("DECODE_MS = 3.0\n")
    git(src, "add", "-A")
    commit(src, "one")
    (src / "engine.py").write_text("DECODE_MS = 3.1\n")
    commit(src, "two")
    git(src, "tag", "v1")
    git(src, "checkout", "-q", "-b", "feature")
    (src / "engine.py").write_text("DECODE_MS = 6.0\n")
    commit(src, "feature")
    return src


@pytest.fixture
def shallow(origin, tmp_path):
    """CI's checkout of the pull request: one commit of one branch (file:// so that --depth is honoured)."""
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", "--depth", "1", "--branch", "feature", f"file://{origin}", str(clone))
    assert git(clone, "rev-parse", "--is-shallow-repository") == "true"
    return clone


def fix_of(message):
    """The command the message says to run."""
    return message.split("fetch it first (in CI, before pytest): ", 1)[1]


@pytest.mark.parametrize(("ref", "command"), [
    ("origin/main", "git fetch --depth=1 origin main:refs/remotes/origin/main"),
    ("main", "git fetch --depth=1 origin main:main"),
    ("v1", "git fetch --depth=1 origin v1:v1"),
])
def test_the_fix_for_a_missing_ref_works_in_a_single_branch_shallow_clone(origin, shallow, ref, command):
    """Issue 39, case 11: the message said `git fetch origin main`, which fills only FETCH_HEAD there; the job
    still could not find origin/main."""
    with pytest.raises(worktree.RefError) as missing:
        worktree.resolve(ref, shallow)
    assert fix_of(str(missing.value)) == command
    git(shallow, "fetch", "-q", "origin", "main")  # the old advice: the ref is still not there
    with pytest.raises(worktree.RefError):
        worktree.resolve(ref, shallow)
    subprocess.run(shlex.split(command), cwd=shallow, check=True, capture_output=True)
    expected = git(origin, "rev-parse", "main" if ref != "v1" else "v1^{commit}")
    assert worktree.resolve(ref, shallow)[0] == expected
    with worktree.checkout(ref, shallow) as side:  # what the comparison then does with it
        assert (side.toplevel / "engine.py").read_text() == "DECODE_MS = 3.1\n"
    assert git(shallow, "rev-parse", "HEAD") == git(origin, "rev-parse", "feature")


def test_a_commit_behind_a_shallow_history_asks_to_deepen_it(shallow):
    with pytest.raises(worktree.RefError, match=r"HEAD~1.*history is shallow: deepen it first \(git fetch "
                                                r"--unshallow; actions/checkout: fetch-depth: 0\)"):
        worktree.resolve("HEAD~1", shallow)


def test_a_full_clone_is_told_to_fetch_without_a_depth(origin, tmp_path):
    clone = tmp_path / "full"
    git(tmp_path, "clone", "-q", "--single-branch", "--branch", "feature", f"file://{origin}", str(clone))
    with pytest.raises(worktree.RefError) as missing:
        worktree.resolve("origin/main", clone)
    command = fix_of(str(missing.value))
    assert command == "git fetch origin main:refs/remotes/origin/main"
    subprocess.run(shlex.split(command), cwd=clone, check=True, capture_output=True)
    assert worktree.resolve("origin/main", clone)[0] == git(origin, "rev-parse", "main")
    assert git(clone, "rev-parse", "--is-shallow-repository") == "false"


def test_a_repository_without_a_remote_is_told_to_name_a_commit_it_holds(origin):
    with pytest.raises(worktree.RefError, match="no remote to fetch it from: name a commit it holds"):
        worktree.resolve("origin/main", origin)
