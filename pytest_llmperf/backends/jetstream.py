"""JetStream over gRPC: the `Orchestrator.Decode` server stream, with JetStream's own stubs.

The stubs come from the `google-jetstream` package (`jetstream.core.proto.jetstream_pb2_grpc`);
they need only grpcio and protobuf, so `pip install --no-deps google-jetstream` is enough on a
client machine (the package's own requirements pull jax, flax and seqio for the server).

One run of batch size B is B concurrent `Decode` streams. JetStream sends one `DecodeResponse`
per generation step (one token per sample unless a tokenizer buffer flushes several), then a
final empty one when the sequence completes. Arrivals are messages: a response with k
`token_ids` is one arrival, as vLLM's `bench serve` counts a chunk, because k arrivals at the same
instant would put k-1 zero gaps into the inter-token latency. Tokens are counted from
`token_ids` (k for that message); the empty final message is neither an arrival nor a token.
Output length: `max_tokens=decode_length`; JetStream stops at its stop tokens and has no
`ignore_eos`, so with `require_full_length` an early stop fails the run. Each request is timed from
its own send (metrics.py); the streamed `token_ids` are the generated ids for "outputs unchanged"
(a change fails only with `deterministic=True`). JetStream does not report the prompt length it kept.
A request that fails while the others go on is a failed request of the run.

`describe()` carries seed 002's columns (device, dtype, batch size, cache length, max input and
output length): the server does not report them, so the fixture passes them in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from ..measure.backend import Backend, BackendError, Clock, GenerationRequest
from ..measure.records import RunSample
from ._aio import (
    LoopThread,
    Stream,
    check_survived,
    completed,
    outputs_note,
    run_concurrently,
    sample_from,
    unreachable,
)

if TYPE_CHECKING:
    from ..processes import ServerProcess


def stubs() -> tuple[Any, Any]:
    """(jetstream_pb2, jetstream_pb2_grpc), or a BackendError saying how to install them."""
    try:
        from jetstream.core.proto import jetstream_pb2, jetstream_pb2_grpc
    except ImportError as exc:
        raise BackendError(
            "the JetStream backend needs JetStream's gRPC stubs: pip install grpcio protobuf "
            f"and pip install --no-deps google-jetstream ({exc})"
        ) from exc
    return jetstream_pb2, jetstream_pb2_grpc


def health_check(target: str, timeout_s: float = 2.0) -> bool:
    """True when the Orchestrator at `target` (host:port) answers HealthCheck with is_live."""
    import grpc

    pb2, pb2_grpc = stubs()
    with grpc.insecure_channel(target) as channel:
        reply = pb2_grpc.OrchestratorStub(channel).HealthCheck(pb2.HealthCheckRequest(), timeout=timeout_s)
    return bool(reply.is_live)


class JetStreamBackend(Backend):
    kind = "jetstream"
    splits_prefill: ClassVar[bool] = False

    def __init__(
        self,
        target: str,
        *,
        model: str = "unknown",
        device: str = "unknown",
        dtype: str = "unknown",
        server_batch_size: int | None = None,
        cache_length: int | None = None,
        max_input_length: int | None = None,
        max_output_length: int | None = None,
        require_full_length: bool = True,
        process: ServerProcess | None = None,
        request_timeout_s: float = 600.0,
        source: str = "",
        deterministic: bool = False,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(clock)
        self.pb2, self.pb2_grpc = stubs()
        self.target = target.removeprefix("grpc://").rstrip("/")
        self.source = source
        host, _, port = self.target.rpartition(":")
        if not host or not port.isdigit() or "://" in self.target:
            raise BackendError(
                f"JetStream: {target!r}"
                + (f" (from {source})" if source else "")
                + " is not HOST:PORT, e.g. 127.0.0.1:9000 (gRPC, no http://)"
            )
        self.model = model
        self.device = device
        self.dtype = dtype
        self.server_batch_size = server_batch_size
        self.cache_length = cache_length
        self.max_input_length = max_input_length
        self.max_output_length = max_output_length
        self.require_full_length = require_full_length
        self.process = process
        self.request_timeout_s = request_timeout_s
        self.deterministic_outputs = deterministic  # the user says greedy decoding on this server repeats itself
        try:
            live = health_check(self.target, timeout_s=10)
        except Exception as exc:
            raise unreachable(exc, self.process, self._where(), self.source, "the address (host:port)") from exc
        if not live:
            raise BackendError(f"{self._where()}: HealthCheck says the server is not live (is_live=false)")
        self._loop = LoopThread("jetstream")
        self._channel, self._stub = self._loop.run(self._connect())

    async def _connect(self) -> tuple[Any, Any]:
        import grpc

        channel = grpc.aio.insecure_channel(self.target)
        return channel, self.pb2_grpc.OrchestratorStub(channel)

    def _where(self) -> str:
        return f"JetStream server at {self.target}" + (f" (from {self.source})" if self.source else "")

    def generate(self, request: GenerationRequest) -> RunSample:
        import grpc

        if self.process is not None:
            self.process.check_alive()
        try:
            results, e2e = self._loop.run(
                run_concurrently(request.batch_size, self.clock, lambda i, t0: self._one(request, t0)),
                timeout=self.request_timeout_s + 30,
            )
            streams, failed = completed(results)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            if code == grpc.StatusCode.UNAVAILABLE:
                raise unreachable(exc, self.process, self._where(), self.source, "the address (host:port)") from exc
            if self.process is not None and self.process.exited_within(1.0):
                raise BackendError(self.process.describe_failure(f"died during a run ({code})")) from exc
            detail = exc.details() if hasattr(exc, "details") else str(exc)
            raise BackendError(
                f"{self._where()}: Decode failed at batch size {request.batch_size}: {code}: {detail}"
            ) from exc
        check_survived(failed, self.process)
        if self.require_full_length:
            for i, s in enumerate(streams):
                if s.server_tokens != request.decode_length:
                    raise BackendError(
                        f"{self._where()}: request {i} of batch size {request.batch_size} returned {s.server_tokens} "
                        f"tokens, not decode_length={request.decode_length} (JetStream stops at its stop tokens and "
                        "has no ignore_eos); pass require_full_length=False to llmperf_jetstream(...) to allow it"
                    )
        return sample_from(request.batch_size, streams, e2e, failed, with_ids=True)

    async def _one(self, request: GenerationRequest, start: int) -> Stream:
        pb2 = self.pb2
        stream = Stream(server_tokens=0, token_ids=[])
        stream.sent_ns = self.clock() - start  # each request is timed from its own send (metrics.py)
        call = self._stub.Decode(
            pb2.DecodeRequest(
                max_tokens=request.decode_length, text_content=pb2.DecodeRequest.TextContent(text=request.prompt)
            ),
            timeout=self.request_timeout_s,
        )
        async for response in call:
            now = self.clock() - start
            if response.WhichOneof("content") != "stream_content":
                continue
            for sample in response.stream_content.samples[:1]:
                if sample.token_ids:  # one arrival per message, k tokens counted
                    stream.times_ns.append(now)
                    stream.server_tokens = (stream.server_tokens or 0) + len(sample.token_ids)
                    stream.token_ids.extend(int(t) for t in sample.token_ids)  # type: ignore[union-attr]
                    stream.text += sample.text
        return stream

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.kind,
            "model": self.model,
            "target": self.target,
            "device": self.device,
            "dtype": self.dtype,
            "server_batch_size": self.server_batch_size,
            "cache_length": self.cache_length,
            "max_input_length": self.max_input_length,
            "max_output_length": self.max_output_length,
            "token_count": "token_ids in the Decode stream (arrivals: one per message)",
            "outputs": outputs_note("token ids", self.deterministic_outputs),
            "deterministic_outputs": self.deterministic_outputs,
            "output_length": "max_tokens=decode_length; JetStream has no ignore_eos"
            + (" (early stops fail the run)" if self.require_full_length else ""),
            "attached": self.process is None,
        }

    def close(self) -> None:
        if getattr(self, "_loop", None) is None:
            return
        self._loop.close(self._channel.close())
        self._loop = None  # type: ignore[assignment]
