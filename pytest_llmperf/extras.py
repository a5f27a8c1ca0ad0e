"""What each backend needs beyond the core, and the one-line failure when it is not installed.

The plugin's entry point imports only the core (pytest, numpy, scipy, psutil), so installing
pytest-llmperf without extras never breaks pytest. A fixture calls `require` before it imports its
backend: a missing dependency fails the test that asked for that backend, naming the extra to install,
and leaves every other test of the session alone.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Extra:
    """An optional dependency group of pyproject.toml: the modules it provides and how to install it."""

    name: str
    modules: tuple[str, ...]  # imported, in this order, to see whether the extra is usable
    needs: str  # what the message says the backend needs
    install: str

    def missing(self) -> str | None:
        """None when every module imports; else the first import error's message."""
        for module in self.modules:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                return str(exc)
        return None


HF = Extra("hf", ("torch", "transformers"), "torch and transformers", "pip install pytest-llmperf[hf]")
TGI = Extra(
    "tgi",
    ("huggingface_hub", "httpx2", "httpx"),
    "huggingface_hub (>= 2.0, on httpx2) and httpx",
    "pip install pytest-llmperf[tgi]",
)
OPENAI = Extra(
    "openai",
    ("aiohttp", "httpx"),
    "aiohttp (the client) and httpx (health checks)",
    "pip install pytest-llmperf[openai]",
)
# google-jetstream's own requirements pull jax, flax and seqio: its stubs are installed without them.
JETSTREAM = Extra(
    "jetstream",
    ("grpc", "google.protobuf", "jetstream.core.proto.jetstream_pb2_grpc"),
    "grpcio, protobuf and JetStream's gRPC stubs",
    "pip install pytest-llmperf[jetstream] && pip install --no-deps google-jetstream",
)


def require(fixture: str, extra: Extra, *, why: str = "") -> None:
    """Fail the calling test in one line when `extra` is not installed (the user asked for this backend,
    so a skip would hide it)."""
    problem = extra.missing()
    if problem is not None:
        pytest.fail(f"{fixture}{why} needs {extra.needs}: {extra.install} ({problem})", pytrace=False)
