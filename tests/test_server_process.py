"""The managed server process: ports, health wait, log capture, process-tree stop, signals."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import pytest

from pytest_llmperf.measure.backend import BackendError
from pytest_llmperf.processes import free_port, port_in_use, port_owner, stop_tree, tail
from pytest_llmperf.processes import ProcessRegistry

from .doubles.leaks import alive, assert_gone, descendants, read_pids
from .server_helpers import LAUNCHER, PYTHON, TGI_DOUBLE


@pytest.fixture(autouse=True)
def no_leaks():
    before = descendants()
    yield
    assert_gone(descendants() - before)


@pytest.fixture
def registry(tmp_path):
    reg = ProcessRegistry(tmp_path / "logs")
    yield reg
    reg.stop_all()


def health(port):
    return lambda: httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200


def launcher(port, *extra):
    return [str(LAUNCHER), "--model-id", "double/m", "--hostname", "127.0.0.1", "--port", str(port), *extra]


def test_free_port_is_free_and_taken_port_is_detected():
    port = free_port()
    assert not port_in_use(port)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        assert port_in_use(port)
        assert str(os.getpid()) in port_owner(port)


@pytest.mark.slow
def test_start_ready_and_stop_whole_tree(registry, tmp_path, monkeypatch):
    pidfile = tmp_path / "pids"
    port = free_port()
    proc = registry.start("TGI", launcher(port, "--num-shard", "3"), url=f"http://127.0.0.1:{port}",
                          env={"LLMPERF_TGI_DOUBLE_PID_FILE": str(pidfile)})
    took = proc.wait_ready(health(port), timeout_s=30)
    assert took > 0
    pids = read_pids(pidfile)
    assert len(pids) == 4 and all(alive(p) for p in pids)  # launcher + 3 shards
    assert "Args {" in proc.log_tail() and "Connected on 127.0.0.1" in proc.log_tail()
    registry.stop_all()
    assert_gone(pids, within_s=2)
    assert proc.killed == []  # SIGTERM sufficed
    assert "Terminating shards" in proc.log_tail()
    proc.stop()  # twice is fine


@pytest.mark.slow
def test_exits_before_healthy_error_has_exit_code_and_log_tail(registry, tmp_path):
    port = free_port()
    proc = registry.start("TGI", launcher(port), url=f"http://127.0.0.1:{port}",
                          env={"LLMPERF_TGI_DOUBLE_MODE": "exit"})
    with pytest.raises(BackendError) as info:
        proc.wait_ready(health(port), timeout_s=30)
    text = str(info.value)
    assert f"TGI server at http://127.0.0.1:{port} exited before it became healthy (exit code 1)" in text
    assert "Shard 0 failed to start" in text and str(proc.log_path) in text and "--model-id double/m" in text


@pytest.mark.slow
def test_deadline_stops_the_server_and_says_how_to_wait_longer(registry, tmp_path):
    pidfile = tmp_path / "pids"
    port = free_port()
    proc = registry.start("TGI", launcher(port), url=f"http://127.0.0.1:{port}",
                          env={"LLMPERF_TGI_DOUBLE_MODE": "hang", "LLMPERF_TGI_DOUBLE_PID_FILE": str(pidfile)})
    with pytest.raises(BackendError, match=r"was not healthy after 1\.5 s \(the health deadline\), so it was "
                                           r"stopped.*llmperf_server_timeout") as info:
        proc.wait_ready(health(port), timeout_s=1.5)
    assert "exit code" not in str(info.value)  # the code of our own signal says nothing about the server
    assert not proc.alive()
    assert_gone(read_pids(pidfile), within_s=2)


@pytest.mark.slow
def test_sigkill_after_grace_when_sigterm_is_ignored(registry, tmp_path):
    pidfile = tmp_path / "pids"
    port = free_port()
    proc = registry.start("TGI", launcher(port, "--num-shard", "2"), url=f"http://127.0.0.1:{port}", grace_s=1.0,
                          env={"LLMPERF_TGI_DOUBLE_MODE": "ignore-sigterm",
                               "LLMPERF_TGI_DOUBLE_PID_FILE": str(pidfile)})
    proc.wait_ready(health(port), timeout_s=30)
    pids = read_pids(pidfile)
    started = time.monotonic()
    registry.stop_all()
    assert time.monotonic() - started >= 0.9
    assert proc.killed == [pids[0]]  # the launcher needed SIGKILL; its shards obeyed SIGTERM
    assert_gone(pids, within_s=2)


def test_program_missing_is_a_clear_error(registry, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with pytest.raises(BackendError, match=r"(?s)cannot start the TGI server.*no-such-launcher.*installed and on PATH"):
        registry.start("TGI", ["/nonexistent/no-such-launcher"], url="http://127.0.0.1:1")
    assert list((tmp_path / "tmp").iterdir()) == []  # its temp directory is removed too


WRITES_A_TEMP_FILE = ("import pathlib, tempfile, time; path = pathlib.Path(tempfile.gettempdir(), 'vllm_dist_0'); "
                      "path.write_text('x'); print(path, flush=True); time.sleep(60)")


@pytest.mark.slow
def test_a_server_gets_a_temp_directory_of_its_own_removed_when_it_stops(registry, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where this process makes temp directories
    proc = registry.start("vLLM", [PYTHON, "-c", WRITES_A_TEMP_FILE], url="http://127.0.0.1:1")
    deadline = time.monotonic() + 30
    while len(proc.log_path.read_text().splitlines()) < 2 and time.monotonic() < deadline:  # the command, the path
        time.sleep(0.05)
    written = Path(proc.log_path.read_text().splitlines()[1])
    assert written.read_text() == "x" and written.parent == proc.tmp_dir and proc.tmp_dir.parent == tmp_path
    registry.stop(proc)
    assert not proc.tmp_dir.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["logs"]


@pytest.mark.slow
def test_a_tmpdir_the_caller_names_is_kept(registry, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    proc = registry.start("vLLM", [PYTHON, "-c", WRITES_A_TEMP_FILE], url="http://127.0.0.1:1",
                          env={"TMPDIR": str(mine)})
    deadline = time.monotonic() + 30
    while not (mine / "vllm_dist_0").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    registry.stop(proc)
    assert proc.tmp_dir is None and (mine / "vllm_dist_0").read_text() == "x"


def test_stop_tree_of_a_finished_process_is_a_no_op():
    child = psutil.Popen([PYTHON, "-c", "pass"])
    child.wait()
    assert stop_tree(child.pid) == []


@pytest.mark.slow
def test_sigterm_stops_servers_and_interrupts(registry, tmp_path):
    port = free_port()
    proc = registry.start("TGI", launcher(port), url=f"http://127.0.0.1:{port}")
    proc.wait_ready(health(port), timeout_s=30)

    def mine(signum, frame):  # a handler of our own, to see that it is put back
        pass

    saved = {sig: signal.signal(sig, mine) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            with registry.handle_signals():
                assert signal.getsignal(signal.SIGTERM) is not mine
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises before this ends
        assert not proc.alive()
        assert signal.getsignal(signal.SIGTERM) is mine and signal.getsignal(signal.SIGHUP) is mine
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_tail_of_missing_and_long_logs(tmp_path):
    assert tail(tmp_path / "none.log") == ""
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(1000)))
    assert tail(log, 3).splitlines() == ["line 997", "line 998", "line 999"]


def test_a_port_in_time_wait_is_not_taken():
    # The side that closes first keeps the connection in TIME_WAIT on its port: here, the server's.
    # Its listener sets SO_REUSEADDR as servers do (tokio, http.server); the TIME_WAIT inherits it.
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = listener.accept()
        conn.close()
        client.recv(1)  # the server's FIN
        client.close()
    deadline = time.monotonic() + 5
    while not any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_TIME_WAIT
                  for c in psutil.net_connections(kind="tcp4")):
        assert time.monotonic() < deadline, "no TIME_WAIT connection on the port: the test saw nothing"
        time.sleep(0.05)
    assert not port_in_use(port)


def test_stop_after_reaping_never_signals_a_reused_pid(registry):
    port = free_port()
    proc = registry.start("TGI", launcher(port), url=f"http://127.0.0.1:{port}",
                          env={"LLMPERF_TGI_DOUBLE_MODE": "exit"})
    assert proc.exited_within(30)  # reaped: its pid number is free for the kernel to hand out again
    # Stand-in for the kernel reusing the number: a bystander session leader now has "that" pid.
    bystander = psutil.Popen([PYTHON, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        proc.popen.pid = bystander.pid
        proc.stop()
        assert bystander.is_running() and bystander.status() != psutil.STATUS_ZOMBIE
        assert proc.killed == []
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.slow
def test_a_crashed_servers_orphans_are_still_stopped(registry, tmp_path):
    pidfile = tmp_path / "pids"
    port = free_port()
    proc = registry.start("TGI", launcher(port, "--num-shard", "2"), url=f"http://127.0.0.1:{port}",
                          env={"LLMPERF_TGI_DOUBLE_PID_FILE": str(pidfile)})
    proc.wait_ready(health(port), timeout_s=30)
    launcher_pid, *shards = read_pids(pidfile)
    os.kill(launcher_pid, signal.SIGKILL)  # the launcher dies; its shards are orphaned
    assert proc.exited_within(10)  # and reaped
    assert all(alive(p) for p in shards)
    proc.stop()
    assert_gone(shards, within_s=2)


def test_server_is_terminated_when_pytest_is_killed(registry, tmp_path, monkeypatch):
    """PR_SET_PDEATHSIG, set up in the child with prctl resolved in the parent; the server's TMPDIR, which no
    teardown removed, goes when the next server starts."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    script = tmp_path / "parent.py"
    script.write_text(f"""
import sys, tempfile, time
from pathlib import Path
from pytest_llmperf.processes import ProcessRegistry
tempfile.tempdir = {str(temp)!r}
proc = ProcessRegistry(Path({str(tmp_path)!r})).start("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"],
                                                      url="none")
print(proc.pid, proc.tmp_dir, flush=True)
time.sleep(60)
""")
    parent = psutil.Popen([PYTHON, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        child, left = parent.stdout.readline().split()
        assert alive(int(child))
        parent.kill()  # SIGKILL: no teardown runs in the parent
        parent.wait()
        assert_gone([int(child)], within_s=10)
    finally:
        if parent.is_running():
            parent.kill()
            parent.wait()
    assert Path(left).is_dir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    proc = registry.start("sleeper", [PYTHON, "-c", "import time; time.sleep(60)"], url="none")
    assert not Path(left).exists() and list(temp.iterdir()) == [proc.tmp_dir]
    assert f"removed 1 server temp directories that a killed pytest-llmperf run left: {left}" in proc.log_tail()


def _double_on(port):
    base = f"http://127.0.0.1:{port}"
    return [PYTHON, str(TGI_DOUBLE), "--port", str(port)], base, health(port)


@pytest.mark.slow
def test_a_server_that_loses_its_free_port_is_started_again_on_another(registry, monkeypatch):
    from pytest_llmperf.servers import pool

    with socket.socket() as holder:  # another process "took" the port we picked, before the server bound it
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        picks = iter([taken])
        monkeypatch.setattr(pool, "pick_port", lambda name, port: next(picks, None) or free_port())
        server_pool = pool.ServerPool(registry, "double")
        proc = server_pool.start("double", _double_on, port=None, timeout_s=30)
        assert proc.alive() and proc.url != f"http://127.0.0.1:{taken}"
        first_log = sorted(registry.log_dir.glob("double-*.log"))[0]
        assert "Address already in use" in first_log.read_text()


@pytest.mark.slow
def test_a_server_that_keeps_losing_its_port_gives_up_after_three_tries(registry, monkeypatch):
    from pytest_llmperf.servers import pool

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        calls = []
        monkeypatch.setattr(pool, "pick_port", lambda name, port: calls.append(port) or taken)
        server_pool = pool.ServerPool(registry, "double")
        with pytest.raises(BackendError, match=r"(?s)exited before it became healthy.*Address already in use.*"
                                               r"on each of 3 free ports tried.*Pass port="):
            server_pool.start("double", _double_on, port=None, timeout_s=30)
        assert len(calls) == 3
    assert registry.processes == []


@pytest.mark.slow
def test_a_fixed_port_is_not_retried(registry, monkeypatch):
    from pytest_llmperf.servers import pool

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        monkeypatch.setattr(pool, "pick_port", lambda name, port: taken)  # the check passed; the bind fails
        with pytest.raises(BackendError, match=r"(?s)exited before it became healthy.*Address already in use") as info:
            pool.ServerPool(registry, "double").start("double", _double_on, port=taken, timeout_s=30)
    assert "free ports tried" not in str(info.value)


def test_the_leak_check_finds_a_tagged_process_that_outlived_the_session(capsys):
    from .doubles import leaks

    tag = f"leak-check-test-{os.getpid()}"
    straggler = psutil.Popen(
        [PYTHON, "-c", "import time; print('up', flush=True); time.sleep(60)"],
        env={**os.environ, "LLMPERF_LEAK_TAG": tag},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # Until the child has exec'd, /proc shows the parent's environment without the tag (CI saw that race).
        assert straggler.stdout.readline() == "up\n"
        assert leaks.main([tag]) == 1
        assert str(straggler.pid) in capsys.readouterr().out
    finally:
        straggler.kill()
        straggler.wait()
        straggler.stdout.close()
    assert leaks.main([tag]) == 0
