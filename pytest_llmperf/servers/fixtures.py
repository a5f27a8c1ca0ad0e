"""Fixtures that start (or attach to) inference servers: `llmperf_tgi`, `llmperf_openai`,
`llmperf_vllm`, `llmperf_jetstream`.

Each is a session-scoped factory returning a backend for `llmperf.measure(...)`. A started server
gets a free port on 127.0.0.1, a health wait with a deadline (`llmperf_server_timeout`) and a log
file whose tail is shown when it fails to start or dies. A server is reused by later calls with
the same arguments; a call with other arguments stops the previous server of that kind first
(one at a time, as GPU memory demands). Everything is stopped at the end of the session, also
after failures and Ctrl-C; SIGTERM to pytest stops the servers and interrupts the session.

With `--llmperf-tgi-url`, `--llmperf-openai-url` or `--llmperf-jetstream-url` (or their ini/env
twins) the factory attaches to that server instead of starting one.

The fixtures live in one module per server (tgi_fixture.py, openai_fixtures.py, jetstream_fixture.py)
on top of pool.py; this module holds `llmperf_servers` and gathers them all, so that importing it (the
plugin does, or `-p pytest_llmperf.servers.fixtures`) registers every server fixture.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..processes import ProcessRegistry
from .jetstream_fixture import llmperf_jetstream  # noqa: F401  (registered where this module is a plugin)
from .openai_fixtures import llmperf_openai, llmperf_vllm  # noqa: F401
from .tgi_fixture import llmperf_tgi  # noqa: F401


@pytest.fixture(scope="session")
def llmperf_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessRegistry]:
    """Every server process this session starts; all stopped (process trees) at the end."""
    registry = ProcessRegistry(tmp_path_factory.mktemp("llmperf-servers"))
    with registry.handle_signals():
        try:
            yield registry
        finally:
            registry.stop_all()
