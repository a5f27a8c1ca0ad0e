"""The managed server process: ports, health wait, log capture, process-tree stop, signals."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

import httpx
import psutil
import pytest

from pytest_llmperf.backends.base import BackendError
from pytest_llmperf.servers.process import ProcessRegistry, free_port, port_in_use, port_owner, stop_tree, tail

from .doubles.leaks import alive, assert_gone, descendants, read_pids
from .server_helpers import LAUNCHER, PYTHON


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


def test_exits_before_healthy_error_has_exit_code_and_log_tail(registry, tmp_path):
    port = free_port()
    proc = registry.start("TGI", launcher(port), url=f"http://127.0.0.1:{port}", env={"LLMPERF_TGI_DOUBLE_MODE": "exit"})
    with pytest.raises(BackendError) as info:
        proc.wait_ready(health(port), timeout_s=30)
    text = str(info.value)
    assert f"TGI server at http://127.0.0.1:{port} exited before it became healthy (exit code 1)" in text
    assert "Shard 0 failed to start" in text and str(proc.log_path) in text and "--model-id double/m" in text


def test_deadline_stops_the_server_and_says_how_to_wait_longer(registry, tmp_path):
    pidfile = tmp_path / "pids"
    port = free_port()
    proc = registry.start("TGI", launcher(port), url=f"http://127.0.0.1:{port}",
                          env={"LLMPERF_TGI_DOUBLE_MODE": "hang", "LLMPERF_TGI_DOUBLE_PID_FILE": str(pidfile)})
    with pytest.raises(BackendError, match=r"was not healthy after 1\.5 s; stopped it.*--llmperf-server-timeout"):
        proc.wait_ready(health(port), timeout_s=1.5)
    assert not proc.alive()
    assert_gone(read_pids(pidfile), within_s=2)


def test_sigkill_after_grace_when_sigterm_is_ignored(registry, tmp_path):
    pidfile = tmp_path / "pids"
    port = free_port()
    proc = registry.start("TGI", launcher(port, "--num-shard", "2"), url=f"http://127.0.0.1:{port}", grace_s=1.0,
                          env={"LLMPERF_TGI_DOUBLE_MODE": "ignore-sigterm", "LLMPERF_TGI_DOUBLE_PID_FILE": str(pidfile)})
    proc.wait_ready(health(port), timeout_s=30)
    pids = read_pids(pidfile)
    started = time.monotonic()
    registry.stop_all()
    assert time.monotonic() - started >= 0.9
    assert proc.killed == [pids[0]]  # the launcher needed SIGKILL; its shards obeyed SIGTERM
    assert_gone(pids, within_s=2)


def test_program_missing_is_a_clear_error(registry):
    with pytest.raises(BackendError, match=r"(?s)cannot start the TGI server.*no-such-launcher.*installed and on PATH"):
        registry.start("TGI", ["/nonexistent/no-such-launcher"], url="http://127.0.0.1:1")


def test_stop_tree_of_a_finished_process_is_a_no_op():
    child = psutil.Popen([PYTHON, "-c", "pass"])
    child.wait()
    assert stop_tree(child.pid) == []


def test_sigterm_stops_servers_and_interrupts(registry, tmp_path):
    port = free_port()
    proc = registry.start("TGI", launcher(port), url=f"http://127.0.0.1:{port}")
    proc.wait_ready(health(port), timeout_s=30)
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        with registry.handle_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this ends
    assert not proc.alive()
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, signal.default_int_handler, None) or callable(
        signal.getsignal(signal.SIGTERM))


def test_tail_of_missing_and_long_logs(tmp_path):
    assert tail(tmp_path / "none.log") == ""
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(1000)))
    assert tail(log, 3).splitlines() == ["line 997", "line 998", "line 999"]
