#!/usr/bin/env python3
"""A gRPC double of JetStream's Orchestrator, built on JetStream's own stubs (google-jetstream).

Why a double beside JetStream's own server (tox -e jetstream runs that, with its mock engine): the
real one needs jax 0.4.38 and flax in a venv of its own, and its mock engine cannot be told to be
slow, stop early or fail on cue; the double can, for tox -e test. It serves the same service from
the same generated code, so message shapes are JetStream's by construction; its behaviour follows
jetstream/core/orchestrator.py: a generate
engine with `batch_size` slots (requests beyond it wait for a free slot), one DecodeResponse per
generation step with the sample's `text` and `token_ids`, then a final empty StreamContent sample
when the request completes (process_result_tokens marks it complete and returns an empty sample),
`max_tokens` generated tokens, stop at `eos_after` if set, and HealthCheck's `is_live`.
`tokens_per_message` > 1 sends k token_ids per message, as a flushing tokenizer buffer does.

Checked against JetStream's own server (0.2.2, mock engine; tests/test_jetstream_e2e.py compares the
two): a prompt longer than `max_prefill_length` is not refused but cut to its last tokens, with a
warning in the server's log (token_utils.pad_tokens), and an error in any of the server's threads
SIGKILLs the whole server mid-stream (`exit_after_tokens` does the same after N streamed tokens).

Timing: prefill `prefill_ms_per_token` x input tokens, then `token_delay_ms` per step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from typing import Any

import grpc
from jetstream.core.proto import jetstream_pb2 as pb2
from jetstream.core.proto import jetstream_pb2_grpc as pb2_grpc

WORDS = ("the", "of", "and", "a", "to", "in", "is", "was")
DEFAULTS: dict[str, Any] = {"batch_size": 4, "prefill_ms_per_token": 0.05, "token_delay_ms": 4.0,
                            "eos_after": None, "exit_after_requests": None, "exit_after_tokens": None,
                            "max_prefill_length": 1024, "tokens_per_message": 1}


class Orchestrator(pb2_grpc.OrchestratorServicer):
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = {**DEFAULTS, **config}
        self.slots = asyncio.Semaphore(int(self.config["batch_size"]))
        self.requests = 0
        self.tokens = 0  # streamed over all requests, for exit_after_tokens

    async def Decode(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC method name
        self.requests += 1
        limit = self.config["exit_after_requests"]
        if limit is not None and self.requests > int(limit):
            sys.stderr.write(f"orchestrator: exiting at request {self.requests} (exit_after_requests)\n")
            sys.stderr.flush()
            os._exit(3)
        if request.WhichOneof("content") == "token_content":
            prompt_len, client_side = len(request.token_content.token_ids), True
        else:
            prompt_len, client_side = len(request.text_content.text.split()), False
        if prompt_len > self.config["max_prefill_length"]:  # JetStream keeps the last tokens and says so in its log
            sys.stderr.write("orchestrator: WARNING Provided sequence longer than available.\n")
            prompt_len = int(self.config["max_prefill_length"])
        async with self.slots:
            await asyncio.sleep(self.config["prefill_ms_per_token"] * prompt_len / 1000)
            eos_after = self.config["eos_after"]
            per_message = int(self.config["tokens_per_message"])  # a detokenizer buffer flushing k at once
            ids: list[int] = []
            for step in range(max(int(request.max_tokens), 0)):
                if step:
                    await asyncio.sleep(self.config["token_delay_ms"] / 1000)
                if eos_after is not None and step >= int(eos_after):
                    break
                self._maybe_die()
                ids.append(100 + step % len(WORDS))
                if len(ids) == per_message:
                    yield self._message(ids, client_side)
                    ids = []
            if ids:
                yield self._message(ids, client_side)
            yield pb2.DecodeResponse(stream_content=pb2.DecodeResponse.StreamContent(
                samples=[pb2.DecodeResponse.StreamContent.Sample()]))

    def _maybe_die(self) -> None:
        """exit_after_tokens: as JetStream's server SIGKILLs itself when one of its threads raises."""
        self.tokens += 1
        limit = self.config["exit_after_tokens"]
        if limit is not None and self.tokens > int(limit):
            sys.stderr.write(f"Thread detokenize-0 encountered an error (exit_after_tokens={limit})\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    @staticmethod
    def _message(ids: list[int], client_side: bool) -> Any:
        sample = pb2.DecodeResponse.StreamContent.Sample(token_ids=ids)
        if not client_side:
            sample.text = "".join(" " + WORDS[i - 100] for i in ids)
        return pb2.DecodeResponse(stream_content=pb2.DecodeResponse.StreamContent(samples=[sample]))

    async def HealthCheck(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb2.HealthCheckResponse(is_live=True)


async def serve(host: str, port: int, config: dict[str, Any], startup_s: float) -> None:
    await asyncio.sleep(startup_s)
    server = grpc.aio.server()
    pb2_grpc.add_OrchestratorServicer_to_server(Orchestrator(config), server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise SystemExit(f"orchestrator: failed to bind {host}:{port}")
    await server.start()
    sys.stderr.write(f"orchestrator: serving on {host}:{port}\n")
    sys.stderr.flush()
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="JetStream Orchestrator double")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--config", default="{}")
    parser.add_argument("--startup-s", type=float, default=0.0)
    parser.add_argument("--fail", action="store_true", help="exit while 'loading', as a broken server does")
    args = parser.parse_args(argv)
    if args.fail:
        sys.stderr.write("orchestrator: failed to load checkpoint: no such file\n")
        return 1
    asyncio.run(serve(args.host, args.port, json.loads(args.config), args.startup_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
