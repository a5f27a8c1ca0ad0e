"""`pytest-llmperf bisect GOOD BAD --packages` (issue 49, item 2): delta debugging against an injected oracle, the
step's requirements and the report (fast), and bisections of a real dependency bump of 12 packages, each step built
by real uv offline from local wheels and measured by the plugin's own A/B job (slow).

The margins of the slow tests: the packages set the simulated engine's decode time (tests/bisect_package_projects.py),
with a 2% lognormal noise per run, so a step's ratio has a 95% interval of about +-0.01 at 4 processes of 3 runs a
side: a 25% or 30% slowdown is 0.2 beyond the A/B tolerance (0.05), a package that is not slower 0.05 within it.
"""

from __future__ import annotations

import itertools
import json
import os
import random

import pytest

from pytest_llmperf.bisection import BAD, GOOD, SKIP, Step
from pytest_llmperf.bisection_packages import (
    CHECK,
    COMPLEMENT,
    CONSTRAINTS,
    PART,
    UNRESOLVED,
    WHOLE,
    Delta,
    PackageBisection,
    requirement_name,
    split,
    step_requirements,
)
from pytest_llmperf.bisection_run import build_settings
from pytest_llmperf.environments.inputs import find_inputs
from pytest_llmperf.environments.records import PackageChange
from pytest_llmperf.orchestrate.options import OPTIONS

from .bisect_package_projects import PACKAGES, make_bump, run_check
from .bisect_projects import PYTEST_ARGS, git

STEP_ARGS = (*PYTEST_ARGS, "--llmperf-processes=4", "-o", "llmperf_max_processes=4")


def oracle(slow, needs=None, undecided=frozenset()):
    """A step's outcome as a package bisection's would be: BAD where the subset holds one of the `slow` groups,
    UNRESOLVED where it holds a package without the one its 2.0 `needs`, SKIP for a subset in `undecided`."""
    asked = []

    def test(subset, role):
        asked.append((subset, role))
        chosen = set(subset)
        if any(a in chosen and b not in chosen for a, b in (needs or {}).items()):
            return UNRESOLVED
        if frozenset(subset) in undecided:
            return SKIP
        return BAD if any(set(group) <= chosen for group in slow) else GOOD

    return test, asked


def minimize(*args, **kwargs):
    test, asked = oracle(*args, **kwargs)
    return Delta(PACKAGES).run(test), asked


def test_split_makes_parts_whose_sizes_differ_by_one_at_most():
    assert split(tuple("abcdefg"), 2) == [tuple("abc"), tuple("defg")]
    assert [len(p) for p in split(tuple(range(12)), 5)] == [2, 2, 2, 3, 3]
    assert split(("a",), 1) == [("a",)]


@pytest.mark.parametrize("slow", PACKAGES)
def test_one_slow_package_among_12_is_named_in_at_most_5_steps_wherever_it_is(slow):
    found, asked = minimize([(slow,)])
    assert found == (slow,)
    assert len(asked) <= 5  # 4 splits and the step of the package itself; plain ddmin takes up to 8
    assert asked[-1][0] == (slow,)  # the package named is the last subset measured (slower)
    assert len({s for s, _ in asked}) == len(asked)  # no subset measured twice


def test_two_packages_slow_only_together_are_both_named_wherever_they_are():
    counts = []
    for pair in itertools.combinations(PACKAGES, 2):
        found, asked = minimize([pair])
        assert found == pair, pair
        assert asked[[s for s, _ in asked].index(pair)][0] == pair  # measured, not inferred
        assert len({s for s, _ in asked}) == len(asked)
        counts.append(len(asked))
    assert max(counts) <= 17  # measured: 13 on average over the 66 pairs


def test_a_subset_uv_cannot_build_is_split_differently():
    needs = {"pkg06": "pkg07"}  # pkg06's 2.0 requires pkg07's 2.0
    for slow in PACKAGES:
        found, asked = minimize([(slow,)], needs)
        if slow == "pkg06":  # it cannot be built without pkg07: the smallest set that can
            assert found == ("pkg06", "pkg07")
        else:
            assert found == (slow,), slow
        assert (PACKAGES[:6], PART) in asked  # the first half holds pkg06 without pkg07: uv cannot build it
        assert len(asked) <= 12


def test_a_whole_that_is_not_slower_ends_it_measured():
    found, asked = minimize([])
    assert found is None
    assert asked[-1] == (PACKAGES, WHOLE)  # measured at last, not taken
    assert len(asked) <= 6


def test_a_single_changed_package_is_one_step():
    test, asked = oracle([("a",)])
    assert Delta(("a",)).run(test) == ("a",) and asked == [(("a",), WHOLE)]
    test, asked = oracle([])
    assert Delta(("a",)).run(test) is None and len(asked) == 1


def test_steps_that_cannot_decide_are_gone_around_and_the_result_is_always_measured():
    rng = random.Random(49)
    subsets = [tuple(c) for r in range(1, 12) for c in itertools.combinations(PACKAGES, r) if r <= 2 or r >= 10]
    for slow in ("pkg01", "pkg07", "pkg12"):
        undecided = frozenset(frozenset(s) for s in rng.sample(subsets, 30)) - {frozenset((slow,))}
        found, asked = minimize([(slow,)], undecided=undecided)
        assert found == (slow,)
        assert (found, PART) in asked or (found, CHECK) in asked


def test_the_roles_say_why_each_subset_was_measured():
    _, asked = minimize([("pkg04", "pkg09")])
    roles = {role for _, role in asked}
    assert roles <= {PART, COMPLEMENT, CHECK, WHOLE} and COMPLEMENT in roles and WHOLE in roles


def test_requirement_names_are_read_as_uv_reads_them():
    assert requirement_name("fastlib==1.0") == "fastlib"
    assert requirement_name("Fast_Lib[extra] >= 1 ; python_version > '3'  # why") == "fast-lib"
    assert requirement_name("torch @ https://x/torch.whl") == "torch"
    for other in ("--find-links wheels", "-e ./libs/x", "./vendor/x.whl", "# pinned", "", "https://x/y.whl"):
        assert requirement_name(other) is None


def test_a_steps_requirements_pin_goods_set_with_the_subset_at_bads_versions(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    for root, version in ((good, "1.0"), (bad, "2.0")):
        (root / "wheels").mkdir(parents=True)
        (root / "requirements.txt").write_text(
            f"--find-links wheels\n-r requirements-base.txt\nfastlib=={version}  # the engine's\nnumpy>=1\n"
            f"slowlib=={version} \\\n    --hash=sha256:abc\n"
        )
        (root / "requirements-base.txt").write_text(f"tabulate=={version}\n--extra-index-url https://example.com/i\n"
                                                    f"-i https://example.com/{version}\n-f https://example.com/links\n")
    good_in, bad_in = find_inputs(good), find_inputs(bad)
    changes = [PackageChange("fastlib", "1.0", "2.0"), PackageChange("newlib", None, "3.0"),
               PackageChange("slowlib", "1.0", "2.0"), PackageChange("tabulate", "1.0", "2.0")]  # fmt: skip
    installed = {"fastlib": "1.0", "slowlib": "1.0", "tabulate": "1.0", "numpy": "2.4.6", "pytest": "9.0.1"}
    files = step_requirements(good_in, bad_in, ("requirements.txt",), installed, changes, ("fastlib", "newlib"), "s")
    assert files["requirements.txt"] == (
        "--find-links wheels\n-r requirements-base.txt\nnumpy>=1\n"
        f"# s\n--extra-index-url https://example.com/2.0\n--find-links {bad / 'wheels'}\n-c {CONSTRAINTS}\n"
        "fastlib==2.0\nnewlib==3.0\nslowlib==1.0\ntabulate==1.0\n"
    )  # BAD's index an extra one; what GOOD has as written (the extra index, the find-links URL) not again
    assert files["requirements-base.txt"] == (
        "--extra-index-url https://example.com/i\n-i https://example.com/1.0\n-f https://example.com/links\n"
    )
    assert files[CONSTRAINTS] == "numpy==2.4.6\npytest==9.0.1\n"  # the unchanged packages at GOOD's versions


def test_the_report_names_the_packages_their_steps_and_the_cost():
    changes = [PackageChange("pkg03", "1.0", "2.0"), PackageChange("pkg04", None, "2.0")]
    result = PackageBisection("a" * 40, "b" * 40, changes, "pytest tests")
    from pytest_llmperf.bisection import step_outcome

    row = {"nodeid": "t::e", "metric": "decode_token_ms", "batch_size": 1, "ratio": 1.25, "ci_low": 1.24,
           "ci_high": 1.26, "verdict": "regressed"}  # fmt: skip
    outcome, why, shown = step_outcome({"verdicts": [row]}, 1)
    result.steps += [
        Step(1, "a" * 40, "pkg03 pkg04", "a" * 40, PART, UNRESOLVED, "uv cannot build these together: x", None, 1.0,
             -1, "l1", ("pkg03 1.0 -> 2.0", "pkg04 1.0 -> 2.0")),
        Step(2, "a" * 40, "pkg03", "a" * 40, CHECK, outcome, why, shown, 20.0, 1, "l2", ("pkg03 1.0 -> 2.0",)),
    ]  # fmt: skip
    result.status, result.culprits, result.found_by, result.builds = "found", changes[:1], 2, 3
    assert result.verdict() == ("the package(s) that make it slower: pkg03 1.0 -> 2.0 (step 2: decode_token_ms bs 1 "
                                "ratio 1.250 [1.240, 1.260] regressed)")  # fmt: skip
    assert result.exit_code() == 0 and result.jobs() == 1
    assert result.cost() == "2 step(s): 1 A/B job(s), 3 environment(s) built by uv, in 0 s"
    text = result.markdown()
    assert "| 2 (check) | pkg03" in text and "unresolved: uv cannot build these together" in text
    assert "| pkg03   | 1.0  | 2.0 |" in text and "| pkg04   | -    | 2.0 |" in text
    document = json.loads(json.dumps(result.document()))
    assert document["culprits"] == [{"name": "pkg03", "base": "1.0", "head": "2.0"}] and document["steps"][1]["packages"] == ["pkg03 1.0 -> 2.0"]
    result.status, result.steps[0] = "not-in-packages", Step(1, "a", "pkg03 pkg04", "a", WHOLE, GOOD, "fine", None,
                                                                 1.0, 0, "l")  # fmt: skip
    assert result.verdict().startswith("GOOD's code with all of BAD's package versions is not slower (step 1: fine)")
    assert result.exit_code() == 1


def test_the_steps_build_as_their_ab_jobs_do(monkeypatch, tmp_path):
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    monkeypatch.setenv("UV_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    args, env_dir, settings = build_settings(["tests", "-o", "llmperf_env_dir=envs", "-ollmperf_env_extras=gpu"])
    assert env_dir == tmp_path / "envs" and args[-2:] == ["-o", f"llmperf_env_dir={tmp_path / 'envs'}"]
    assert settings.offline and settings.extras == ("gpu",) and settings.groups == ()
    monkeypatch.setenv("PYTEST_ADDOPTS", "-o llmperf_env_groups=bench,docs")
    assert build_settings([])[2].groups == ("bench", "docs")
    assert build_settings(["--override-ini=llmperf_env_groups=gpu"])[2].groups == ("gpu",)  # the command line's wins
    from pytest_llmperf.bisection_run import BisectError

    with pytest.raises(BisectError, match="code-only runs every step in this one"):
        build_settings(["--llmperf-compare-deps=code-only"])
    with pytest.raises(BisectError, match="--llmperf-base-python replaces GOOD's"):
        build_settings(["--llmperf-base-python", "/opt/py/bin/python"])


# -- real uv, real A/B jobs -------------------------------------------------------------------------------------------


@pytest.fixture
def user_env(tmp_path_factory):
    """The environment a user's bisection runs in: no LLMPERF_* option inherited, uv offline (the wheels are the
    project's), a uv cache and an environments' cache of the test's own, temporary worktrees under its own TMPDIR."""
    base = tmp_path_factory.mktemp("bisect-packages")
    env = {k: v for k, v in os.environ.items() if k not in {o.env for o in OPTIONS if o.env}}
    env.update(UV_OFFLINE="1", UV_CACHE_DIR=str(base / "uv-cache"), PYTEST_ADDOPTS=f"-o llmperf_env_dir={base / 'envs'}",
               TMPDIR=str(base / "tmp"))  # fmt: skip
    (base / "tmp").mkdir()
    return env


@pytest.mark.slow
def test_one_package_of_12_that_is_25_percent_slower_is_named_in_at_most_5_builds_and_jobs(tmp_path, user_env):
    project = tmp_path / "project"
    good, bad = make_bump(project, slow={"pkg09": 1.25})  # a place that takes the most steps (5)
    done = run_check(project, good, bad, "--packages", "--", *STEP_ARGS, env=user_env, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((project / "reports" / "bisect" / "bisect.json").read_text())
    assert report["status"] == "found" and report["culprits"] == [{"name": "pkg09", "base": "1.0", "head": "2.0"}]
    assert len(report["changes"]) == 12
    steps = report["steps"]
    assert len(steps) <= 5 and report["jobs"] == len(steps)
    assert report["builds"] <= 2 + len(steps)  # GOOD's and BAD's, then one a step: each job reuses them
    last = steps[report["found_by"] - 1]
    assert last["packages"] == ["pkg09 1.0 -> 2.0"] and last["outcome"] == BAD and 1.15 < last["row"]["ratio"] < 1.35
    assert "bisect: the package(s) that make it slower: pkg09 1.0 -> 2.0 (step" in done.stdout
    assert "bisect: step 1 (part): 6 of 12 package(s) at BAD's versions: pkg01 pkg02" in done.stdout
    assert "| pkg09" in (project / "reports" / "bisect" / "bisect.md").read_text()
    assert git(project, "worktree", "list").count("\n") == 0
    assert list(os.scandir(user_env["TMPDIR"])) == []


@pytest.mark.slow
def test_two_packages_slow_only_together_are_both_named_and_a_set_uv_cannot_build_is_said(tmp_path, user_env):
    project = tmp_path / "project"
    # pkg10's 2.0 is 30% slower beside pkg03's 2.0 only; pkg06's 2.0 requires pkg07's 2.0
    good, bad = make_bump(project, together=("pkg03", "pkg10", 1.3), requires={"pkg06": "pkg07"})
    done = run_check(project, good, bad, "--packages", "--", *STEP_ARGS, env=user_env, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((project / "reports" / "bisect" / "bisect.json").read_text())
    assert report["status"] == "found"
    assert [c["name"] for c in report["culprits"]] == ["pkg03", "pkg10"]
    assert "the package(s) that make it slower together: pkg03 1.0 -> 2.0; pkg10 1.0 -> 2.0" in done.stdout
    unresolved = [s for s in report["steps"] if s["outcome"] == UNRESOLVED]
    assert unresolved and all("pkg06" in s["subject"].split() and "pkg07" not in s["subject"].split()
                              for s in unresolved)  # fmt: skip
    assert "uv cannot build these together" in unresolved[0]["why"] and "pkg07" in unresolved[0]["why"]
    assert report["jobs"] == len(report["steps"]) - len(unresolved)
    assert list(os.scandir(user_env["TMPDIR"])) == []


@pytest.mark.slow
def test_a_project_built_from_a_lock_is_refused_with_the_way_out_before_any_build(tmp_path, user_env):
    project = tmp_path / "project"
    good, _ = make_bump(project, slow={"pkg01": 1.25})
    done = run_check(project, good, good, "--packages", env=user_env, timeout=300)
    assert done.returncode == 2 and "have the same dependency files: no package differs" in done.stderr
    (project / "pyproject.toml").write_text('[project]\nname = "demo"\nversion = "0"\ndependencies = ["pkg01"]\n')
    (project / "uv.lock").write_text("version = 1\n")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "a lock")
    (project / "uv.lock").write_text("version = 1\nrevision = 2\n")
    git(project, "commit", "-qam", "the lock again")
    done = run_check(project, "HEAD~1", "HEAD", "--packages", env=user_env, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "is built from uv.lock" in done.stderr and "uv export --frozen --no-hashes" in done.stderr
    assert not os.path.exists(user_env["PYTEST_ADDOPTS"].split("=", 1)[1])  # nothing was built
    assert list(os.scandir(user_env["TMPDIR"])) == []


def test_what_uv_said_is_one_line_without_its_interpreter_line():
    from pytest_llmperf.bisection_run import _uv_said
    from pytest_llmperf.environments.records import BuildFailed

    failed = BuildFailed("building ... failed (exit 1):\n    cd x && uv pip install\n  uv said:\n    Using Python 3.11.7 "
                         "environment at: /e\n    × No solution found when resolving dependencies:\n    ╰─▶ Because "
                         "pkg06==2.0 depends on pkg07>=2.0\n")  # fmt: skip
    assert _uv_said(failed) == "No solution found when resolving dependencies: Because pkg06==2.0 depends on pkg07>=2.0"
