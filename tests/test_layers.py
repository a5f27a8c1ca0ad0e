"""The package's layers: data flows one way, scenario -> backend -> samples -> verdict -> stored and reported, and
the imports say so. Read from the source (every import, also those inside functions and for typing only)."""

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_llmperf"

#: Lowest first. A module may import its own layer and the layers below it.
LAYERS = (
    ("utilities", ("files", "extras", "warning")),
    ("measure", ("measure",)),  # the scenario, the Backend interface, runs and their metrics
    ("backends", ("backends", "offload", "processes")),  # what implements the interface, and the processes it runs
    ("environments", ("environments",)),  # each A/B side's dependencies: detected, built with uv, checked
    ("judge", ("judge",)),  # statistics, verdicts, the baseline store
    ("history", ("history",)),  # every job's results across jobs: the store, series, change points
    ("report", ("report",)),
    ("orchestrate", ("orchestrate", "servers", "offload.fixture")),  # the session, fixtures, workers, on top
    ("entry points", ("plugin", "cli", "__init__", "__main__", "bisection", "bisection_packages", "bisection_run")),
)
#: Imports that run back up a layer, each named with its reason where it is: at most one.
UPWARD_ALLOWED: set[tuple[str, str]] = set()


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        found[".".join(parts[:-1]) if parts[-1] == "__init__" and len(parts) > 1 else ".".join(parts)] = path
    return found


def _layer(module: str) -> int:
    best, rank = -1, None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), index
    assert rank is not None, f"pytest_llmperf.{module} is in no layer of tests/test_layers.py"
    return rank


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `module` imports (relative and absolute)."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("pytest_llmperf"):
                target = node.module.removeprefix("pytest_llmperf").lstrip(".")
            else:
                continue
            for alias in node.names:
                candidate = f"{target}.{alias.name}" if target else alias.name
                found.add(candidate if candidate in known else target)
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("pytest_llmperf.") for a in node.names
                      if a.name.startswith("pytest_llmperf.")}
    return {m for m in found if m in known and m != module}


GRAPH = {module: _imports(module, path, set(_modules())) for module, path in _modules().items()}


def test_every_import_runs_down_or_across_a_layer():
    upward = sorted((m, t) for m, targets in GRAPH.items() for t in targets if _layer(t) > _layer(m))
    assert set(upward) <= UPWARD_ALLOWED, f"imports that run back up a layer: {upward}"
    assert len(UPWARD_ALLOWED) <= 1


def test_no_import_circles():
    def cycle_from(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, trail = stack.pop()
            for target in GRAPH[node]:
                if target == start:
                    return trail
                if target not in seen:
                    seen.add(target)
                    stack.append((target, [*trail, target]))
        return None

    circles = {tuple(sorted(c)) for m in GRAPH if (c := cycle_from(m)) is not None}
    assert not circles, f"import circles: {sorted(circles)}"


@pytest.mark.parametrize("module", sorted(_modules()))
def test_a_module_reads_in_one_sitting(module):
    lines = len(_modules()[module].read_text().splitlines())
    assert lines <= 900, f"pytest_llmperf/{module.replace('.', '/')}.py has {lines} lines"


def test_the_layers_name_every_package():
    by_layer = defaultdict(list)
    for module in GRAPH:
        by_layer[LAYERS[_layer(module)][0]].append(module)
    assert set(by_layer) == {name for name, _ in LAYERS}
