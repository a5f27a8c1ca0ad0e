"""The fork server (orchestrate/forkserver.py and zygote.py): a real server process forking real pytest workers.

What a forked worker must be is what `python -c WORKER_MAIN ...` was: its side's directory, environment and
sys.path, its own session, the descriptors it was given, its exit code and log; stopped with the server.
"""

import json
import os
import signal
import subprocess
import sys
import time
from types import ModuleType

import psutil
import pytest

from pytest_llmperf.orchestrate import forkserver
from pytest_llmperf.orchestrate.forkserver import (BASE_PRELOAD, TORCH_PRELOAD, ForkServer, ForkServerError,
                                                   preload_for, server_env)

PROBE = """
import json, os, sys
import sidemod

def test_probe():
    fd = int(os.environ["PROBE_FDS"])
    with open(os.environ["PROBE_OUT"], "w") as out:
        json.dump({"cwd": os.getcwd(), "path": sys.path, "side": sidemod.SIDE, "env": os.environ["PROBE"],
                   "message": os.read(fd, 100).decode(), "own_session": os.getsid(0) == os.getpid(),
                   "parent": os.getppid(), "pytest_preloaded": "pytest" in sys.modules}, out)
    print("the probe ran")
"""


@pytest.fixture
def server(tmp_path):
    started = ForkServer.start(tmp_path, server_env("steady"), ["pytest", "json", "no_such_module_here"]).ready()
    yield started
    started.close()


def side(tmp_path, name, test_body):
    root = tmp_path / name
    lib = tmp_path / f"{name}-lib"
    root.mkdir()
    lib.mkdir()
    (root / "test_probe.py").write_text(test_body)
    (lib / "sidemod.py").write_text(f"SIDE = {name!r}\n")
    return root, lib


def spawn(server, root, lib, tmp_path, *, env=None, fds_env=None, args=("test_probe.py",)):
    log = open(tmp_path / f"{root.name}.log", "wb")  # noqa: SIM115 - closed by the caller's test
    argv = [*args, "-q", "-s", "-p", "no:cacheprovider"]
    child = server.spawn([sys.executable, "-c", "import pytest; pytest.console_main()", *argv], argv, cwd=root,
                         env={**os.environ, "PROBE_OUT": str(tmp_path / f"{root.name}.json"), **(env or {})},
                         pythonpath=[str(lib)], log_fd=log.fileno(), fds_env=fds_env or {})
    log.close()  # the worker holds its own copy
    return child


@pytest.mark.slow
def test_only_site_packages_are_imported_before_the_fork_and_the_rest_is_said(server):
    assert server.imported == ["pytest"]
    assert "not from site-packages" in server.skipped["json"]  # the standard library: a worker imports it itself
    assert server.skipped["no_such_module_here"] == "not installed"


def test_a_forked_worker_is_its_side_in_its_directory_with_its_environment_and_descriptors(server, tmp_path):
    sides = {name: side(tmp_path, name, PROBE) for name in ("A", "B")}
    children = {}
    for name, (root, lib) in sides.items():
        read, write = os.pipe()
        os.write(write, f"turns of {name}".encode())
        os.close(write)
        children[name] = spawn(server, root, lib, tmp_path, env={"PROBE": name}, fds_env={"PROBE_FDS": (read,)})
        os.close(read)  # the worker has its own copy, under a number of its own
    for name, child in children.items():
        assert child.wait(timeout=60) == 0, (tmp_path / f"{name}.log").read_text()
        probe = json.loads((tmp_path / f"{name}.json").read_text())
        root, lib = sides[name]
        path = probe["path"]  # pytest put the test's directory first; then python -c's "", PYTHONPATH, the rest
        assert probe["cwd"] == str(root) and path.index("") + 1 == path.index(str(lib)) < len(path) - 1
        assert probe["side"] == name and probe["env"] == name and probe["message"] == f"turns of {name}"
        assert probe["own_session"] and probe["parent"] == server.proc.pid and probe["pytest_preloaded"]
        assert "the probe ran" in (tmp_path / f"{name}.log").read_text()


@pytest.mark.parametrize(("body", "code"), [("def test_x():\n    assert False\n", 1),
                                            ("import os\n\ndef test_x():\n    os._exit(3)\n", 3)])
def test_a_workers_exit_code_is_its_own(server, tmp_path, body, code):
    root, lib = side(tmp_path, "A", body)
    child = spawn(server, root, lib, tmp_path)
    assert child.wait(timeout=60) == code
    assert child.poll() == code


def test_a_late_worker_times_out_and_closing_the_server_stops_it(tmp_path):
    server = ForkServer.start(tmp_path, server_env("system"), ["pytest"]).ready()
    try:
        root, lib = side(tmp_path, "A", "import time\n\ndef test_x():\n    time.sleep(120)\n")
        child = spawn(server, root, lib, tmp_path)
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=0.5)
        assert psutil.pid_exists(child.pid)
    finally:
        server.close()
    assert not alive(child.pid)
    assert not alive(server.proc.pid)


def test_a_server_that_dies_takes_its_workers_and_says_so(server, tmp_path):
    root, lib = side(tmp_path, "A", "import time\n\ndef test_x():\n    time.sleep(120)\n")
    child = spawn(server, root, lib, tmp_path)
    os.kill(server.proc.pid, signal.SIGKILL)
    with pytest.raises(ForkServerError, match="fork server"):
        child.wait(timeout=30)
    deadline = time.monotonic() + 10
    while alive(child.pid) and time.monotonic() < deadline:  # SIGTERM from PR_SET_PDEATHSIG, then pytest's exit
        time.sleep(0.1)
    assert not alive(child.pid)


@pytest.mark.slow
def test_a_server_that_cannot_start_is_an_error_naming_its_log(tmp_path, monkeypatch):
    monkeypatch.setattr(forkserver, "ZYGOTE", tmp_path / "missing.py")
    server = ForkServer.start(tmp_path, server_env("system"), ["pytest"])
    with pytest.raises(ForkServerError, match=r"(?s)exited with code 1; its log ends with:\n.*No such file"):
        server.ready(timeout_s=60)
    server.close()


def alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def module(name, **names):
    made = ModuleType(name)
    vars(made).update(names)
    return made


def test_torch_is_imported_for_a_plugin_fixture_or_a_test_that_refers_to_it():
    torch_nn = module("torch.nn")
    engine = module("myengine", nn=torch_nn)
    loaded = {"myengine": engine, "torch.nn": torch_nn}
    plain = module("test_plain", pytest=pytest)
    assert preload_for([["llmperf", "llmperf_hf"]], [plain], loaded) == [*BASE_PRELOAD, *TORCH_PRELOAD]
    assert preload_for([["llmperf_offload"]], [], loaded) == [*BASE_PRELOAD, *TORCH_PRELOAD]
    assert preload_for([["llmperf", "engine"]], [plain], loaded) == list(BASE_PRELOAD)
    assert preload_for([["llmperf"]], [module("test_direct", nn=torch_nn)], loaded)[-1] == TORCH_PRELOAD[-1]

    class Engine:  # a Backend the test module imports from a module of the user's that imports torch
        pass
    Engine.__module__ = "myengine"
    assert preload_for([["llmperf"]], [module("test_hop", Engine=Engine)], loaded)[-1] == TORCH_PRELOAD[-1]


def test_the_servers_environment_holds_the_allocators_settings():
    assert server_env("steady", {"A": "1"})["MALLOC_TRIM_THRESHOLD_"]
    assert "MALLOC_TRIM_THRESHOLD_" not in server_env("system", {"A": "1"})
    assert server_env("system", {"A": "1"}) == {"A": "1", "PYTHONUNBUFFERED": "1"}


def test_the_server_is_not_imported_as_part_of_the_package():
    """It must not import either side's pytest-llmperf: the standard library only."""
    import ast

    tree = ast.parse(forkserver.ZYGOTE.read_text())
    # the module's own imports (a forked worker imports pytest, as the worker it becomes)
    imports = [alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names]
    imports += [node.module or "" for node in tree.body if isinstance(node, ast.ImportFrom)]
    assert imports and all(name.split(".")[0] in sys.stdlib_module_names for name in imports)


def test_a_side_with_its_own_copy_of_a_preloaded_module_gets_a_fresh_interpreter(tmp_path):
    """A checkout that vendors a library the server imported (here idna) must measure its own copy: that worker is
    exec'd, as `-o llmperf_worker_start=exec` would start it, and its log says why."""
    server = ForkServer.start(tmp_path, server_env("system"), ["pytest", "idna"]).ready()
    try:
        root, lib = side(tmp_path, "A", "import idna, os\n\ndef test_x():\n    assert idna.OURS\n"
                                        "    assert os.read(int(os.environ['PROBE_FDS']), 10) == b'turn'\n")
        (root / "idna.py").write_text("OURS = True\n")
        (lib / "pytest_llmperf_dir").mkdir()  # a plain directory shadows nothing
        read, write = os.pipe()
        os.write(write, b"turn")
        os.close(write)
        command = [sys.executable, "-c", "import pytest, sys; sys.exit(pytest.console_main())",
                   "test_probe.py", "-q", "-s", "-p", "no:cacheprovider"]
        with open(tmp_path / "A.log", "wb") as log:
            child = server.spawn(command, command[3:], cwd=root, env={**os.environ, "PYTHONPATH": str(lib)},
                                 pythonpath=[str(lib)], log_fd=log.fileno(), fds_env={"PROBE_FDS": (read,)})
        os.close(read)
        assert child.wait(timeout=60) == 0, (tmp_path / "A.log").read_text()
        assert "this side has its own idna: the worker starts from scratch" in (tmp_path / "A.log").read_text()
    finally:
        server.close()
