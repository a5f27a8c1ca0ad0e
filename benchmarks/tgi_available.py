"""Whether the shipped TGI/JetStream suites can run here, and why not (for the skip reason)."""

from __future__ import annotations

import os
import shutil

import pytest

from pytest_llmperf.orchestrate.options import OPTIONS_BY_NAME


def visible_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no torch, or no driver
        return 0


def require_tgi(config: pytest.Config) -> bool:
    """True when attaching by URL; False when the launcher can start one; skip otherwise."""
    if OPTIONS_BY_NAME["tgi_url"].value(config):
        return True
    launcher = OPTIONS_BY_NAME["tgi_launcher"].value(config)
    if shutil.which(launcher) is None:
        pytest.skip(f"no TGI here: {launcher!r} is not on PATH. Attach to a server with --llmperf-tgi-url=URL, "
                    "or install text-generation-inference (-o llmperf_tgi_launcher=PATH)")
    if visible_gpus() == 0 and not os.environ.get("LLMPERF_TGI_ALLOW_CPU"):
        pytest.skip("text-generation-launcher found but no GPU is visible; set LLMPERF_TGI_ALLOW_CPU=1 to run "
                    "TGI on CPU anyway, or attach with --llmperf-tgi-url=URL")
    return False


def require_jetstream(config: pytest.Config, command: str = "") -> None:
    """Skip unless attaching by URL or a command (LLMPERF_JETSTREAM_COMMAND) starts the server."""
    if not OPTIONS_BY_NAME["jetstream_url"].value(config) and not command:
        pytest.skip("no JetStream server: start one (python run_server.py ...) and pass "
                    "--llmperf-jetstream-url=HOST:PORT (ini llmperf_jetstream_url), "
                    "or set LLMPERF_JETSTREAM_COMMAND to a command line with {port} that starts one")
