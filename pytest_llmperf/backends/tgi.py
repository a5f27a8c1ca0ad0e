"""text-generation-inference (TGI) over HTTP, with huggingface_hub's AsyncInferenceClient.

One run of batch size B is B concurrent `text_generation(stream=True, details=True)` requests.
Per request: when it was sent and the arrival of every streamed token (TGI sends one SSE event per
generated token), so TTFT is the first event after its own send and inter-token latency the gaps
after it (metrics.py). Generated tokens are counted from the last event's
`details.generated_tokens`, never from the number of events; the prompt the server kept is
`details.input_length`, checked against `sequence_length`; each event's `token.id` gives the
generated ids for "outputs unchanged" (judge/outputs.py; a change fails only where the user says the
server is deterministic, `deterministic=True`). A request whose stream breaks while the others go
on is a failed request of the run; when every request fails, the run fails.

Input length: `truncate=sequence_length` makes TGI keep exactly the prompt's last
`sequence_length` tokens (the prompt is longer). Output length: `max_new_tokens=decode_length`,
greedy. TGI's HTTP API has no `ignore_eos` (its own benchmark reaches the shards over gRPC to get
one), so a sequence can end early at an end-of-sequence token; with `require_full_length` (the
default) such a run is an error naming the sequence, because runs of different lengths are not
comparable.

Limits: TGI's router validates every request (`truncate` <= max_input_tokens, input +
max_new_tokens <= max_total_tokens) and refuses requests beyond max_concurrent_requests. Before a
run the request is checked against the server's GET /info, and a mismatch is an error naming the
launcher argument to raise, instead of B validation errors per run.

text-generation-launcher's arguments: `TGILauncherArgs` holds those of seeds 000/001 and builds the command line
that the llmperf_tgi fixture (servers/fixtures.py) starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ..measure.backend import Backend, BackendError, Clock, GenerationRequest, OutOfMemory
from ..measure.records import RunSample
from ._aio import (
    LoopThread,
    RequestFailed,
    Stream,
    check_survived,
    outputs_note,
    prompt_mismatch,
    run_batch,
    sample_from,
    unreachable,
)

if TYPE_CHECKING:
    from ..processes import ServerProcess


def is_transport_error(exc: BaseException) -> bool:
    """True when the connection failed (refused, reset, closed mid-stream) rather than TGI answering.

    AsyncInferenceClient (huggingface_hub >= 2.0) talks through httpx2, whose exceptions are not
    httpx's; /info is read with httpx. Timeouts are not transport errors here: the client turns
    them into InferenceTimeoutError, and a slow server is not an unreachable one.
    """
    import httpx
    import httpx2

    if isinstance(exc, (httpx2.TimeoutException, httpx.TimeoutException)):
        return False
    return isinstance(exc, (httpx2.TransportError, httpx.TransportError, ConnectionError))


def _is_oom(text: str) -> bool:
    text = text.lower()
    return "out of memory" in text or "outofmemory" in text


class TGIBackend(Backend):
    """A TGI server at `url` (started by the `llmperf_tgi` fixture, or attached to)."""

    kind = "tgi"
    splits_prefill: ClassVar[bool] = False

    def __init__(
        self,
        url: str,
        *,
        launcher_args: TGILauncherArgs | None = None,
        process: ServerProcess | None = None,
        require_full_length: bool = True,
        request_timeout_s: float = 600.0,
        source: str = "",
        deterministic: bool = False,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(clock)
        from huggingface_hub import AsyncInferenceClient

        self.url = url.rstrip("/")
        self.launcher_args = launcher_args
        self.process = process
        self.require_full_length = require_full_length
        self.request_timeout_s = request_timeout_s
        self.source = source  # where the URL came from, for error messages
        self.deterministic_outputs = deterministic  # the user says greedy decoding on this server repeats itself
        self.info = self._fetch_info()
        self._loop = LoopThread("tgi")
        self._client = AsyncInferenceClient(model=self.url, timeout=request_timeout_s)
        self._loop.run(self._allow_offline_mode())
        self.last_finish_reasons: list[str | None] = []

    async def _allow_offline_mode(self) -> None:
        """HF_HUB_OFFLINE=1 (common in air-gapped CI, set by our tox envs) makes huggingface_hub's
        HTTP session refuse every request, also to a TGI server on loopback that has nothing to do
        with the Hub. In offline mode, give the client a session without that hook (otherwise the
        same as huggingface_hub's default_async_client_factory)."""
        from huggingface_hub import constants

        if not constants.is_offline_mode():
            return
        import httpx2  # huggingface_hub's own HTTP library
        from huggingface_hub.utils._http import async_hf_response_event_hook

        session = httpx2.AsyncClient(
            event_hooks={"response": [async_hf_response_event_hook]}, follow_redirects=True, timeout=None
        )
        self._client._async_client = await self._client.exit_stack.enter_async_context(session)

    # -- server ---------------------------------------------------------------------------------

    def _where(self) -> str:
        return f"TGI server at {self.url}" + (f" (from {self.source})" if self.source else "")

    def _fetch_info(self) -> dict[str, Any]:
        import httpx

        try:
            response = httpx.get(f"{self.url}/info", timeout=10)
            response.raise_for_status()
            info = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise unreachable(exc, self.process, self._where(), self.source) from exc
        if not isinstance(info, dict) or "model_id" not in info:
            raise BackendError(
                f"{self._where()}: GET /info did not return TGI's Info (no model_id): {info!r:.200}. "
                "Is this a text-generation-inference server?"
            )
        return info

    # -- measurement ---------------------------------------------------------------------------

    def check_limits(self, request: GenerationRequest) -> None:
        """Raise a BackendError naming the launcher argument to raise when the server's limits
        (GET /info) cannot admit `request`: TGI would answer every request with a validation error
        (or `overloaded` beyond max_concurrent_requests)."""
        info = self.info
        limits = (
            # (limit in /info (older TGI: max_input_length), launcher flag, what the request needs, why)
            (
                info.get("max_input_tokens", info.get("max_input_length")),
                "--max-input-tokens",
                request.sequence_length,
                f"truncate=sequence_length={request.sequence_length}",
            ),
            (
                info.get("max_total_tokens"),
                "--max-total-tokens",
                request.sequence_length + request.decode_length,
                f"sequence_length + decode_length = {request.sequence_length + request.decode_length}",
            ),
            (
                info.get("max_concurrent_requests"),
                "--max-concurrent-requests",
                request.batch_size,
                f"batch size {request.batch_size} (concurrent requests)",
            ),
        )
        for limit, flag, needed, what in limits:
            if isinstance(limit, int) and needed > limit:
                name = flag[2:].replace("-", "_")
                keyword = f" (llmperf_tgi(..., {name}={needed}))" if self.process is not None else ""
                raise BackendError(
                    f"{self._where()}: {what} exceeds the server's {name}={limit} (GET /info), so TGI "
                    f"would reject every request. Start TGI with {flag} {needed} or more{keyword}"
                )

    def generate(self, request: GenerationRequest) -> RunSample:
        if self.process is not None:
            self.process.check_alive()
        self.check_limits(request)
        try:
            streams, failed, e2e = run_batch(
                self._loop,
                self.clock,
                request.batch_size,
                lambda i, t0: self._one(request, i, t0),
                timeout=self.request_timeout_s + 30,
                where=self._where(),
                process=self.process,
            )
        except BackendError:
            raise
        except Exception as exc:
            from huggingface_hub.errors import TextGenerationError

            text = f"{type(exc).__name__}: {exc}"
            if _is_oom(text):
                raise OutOfMemory(f"{self._where()}: out of memory at batch size {request.batch_size}: {text}") from exc
            answered = isinstance(exc, TextGenerationError)  # TGI sent an error (validation, overloaded, ...)
            if not answered and is_transport_error(exc):
                raise unreachable(exc, self.process, self._where(), self.source) from exc
            if self.process is not None and self.process.exited_within(1.0):
                raise BackendError(self.process.describe_failure(f"died during a run ({text})")) from exc
            raise BackendError(f"{self._where()}: request failed at batch size {request.batch_size}: {text}") from exc
        check_survived(failed, self.process)
        self.last_finish_reasons = [s.finish_reason for s in streams]
        received = prompt_mismatch(streams, request.sequence_length)
        if received is not None:
            raise BackendError(
                f"{self._where()}: the server kept {received} prompt tokens "
                f"(details.input_length), the scenario asks for sequence_length={request.sequence_length}: "
                "truncate=sequence_length keeps the prompt's last tokens but cannot lengthen it; give a longer "
                "prompt"
            )
        if self.require_full_length:
            short = [(i, s) for i, s in enumerate(streams) if s.server_tokens != request.decode_length]
            if short:
                i, s = short[0]
                raise BackendError(
                    f"{self._where()}: sequence {i} of batch size {request.batch_size} generated {s.server_tokens} "
                    f"tokens (finish_reason={s.finish_reason}), not decode_length={request.decode_length}. TGI's HTTP "
                    "API cannot ignore the end-of-sequence token; use a prompt/model that does not stop early, or "
                    "pass require_full_length=False to llmperf_tgi(...) to measure variable lengths"
                )
        return sample_from(request.batch_size, streams, e2e, failed, with_ids=True)

    async def _one(self, request: GenerationRequest, index: int, start: int) -> Stream:
        stream = Stream(token_ids=[])
        stream.sent_ns = self.clock() - start  # each request is timed from its own send (metrics.py)
        events = await self._client.text_generation(
            request.prompt,
            stream=True,
            details=True,
            max_new_tokens=request.decode_length,
            do_sample=False,
            truncate=request.sequence_length,
            return_full_text=False,
        )
        try:
            async for event in events:
                stream.times_ns.append(self.clock() - start)
                stream.token_ids.append(int(event.token.id))  # type: ignore[union-attr]
                stream.text += "" if event.token.special else event.token.text
                if event.details is not None:
                    stream.server_tokens = int(event.details.generated_tokens)
                    stream.finish_reason = str(event.details.finish_reason)
                    stream.prompt_tokens = getattr(event.details, "input_length", None)
        except Exception as exc:
            if is_transport_error(exc):  # the server went on; this stream broke
                raise RequestFailed(
                    f"the stream broke after {len(stream.times_ns)} of {request.decode_length} "
                    f"tokens: {type(exc).__name__}: {exc}"
                ) from exc
            raise
        if stream.server_tokens is None:
            raise RequestFailed(
                f"the stream ended after {len(stream.times_ns)} of {request.decode_length} tokens "
                "without `details` (generated_tokens): the server cut it short"
            )
        return stream

    # -- lifecycle and description --------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "backend": self.kind,
            "model": self.info.get("model_id"),
            "url": self.url,
            "device": "server",
            "dtype": (self.launcher_args.dtype or "auto") if self.launcher_args else "unknown",
            "server_version": self.info.get("version"),
            "max_input_tokens": self.info.get("max_input_tokens"),
            "max_total_tokens": self.info.get("max_total_tokens"),
            "token_count": "server details.generated_tokens",
            "input_length": "truncate=sequence_length, checked against details.input_length",
            "outputs": outputs_note("token ids", self.deterministic_outputs),
            "deterministic_outputs": self.deterministic_outputs,
            "output_length": "max_new_tokens=decode_length, greedy; TGI has no ignore_eos"
            + (" (early stops fail the run)" if self.require_full_length else ""),
            "attached": self.process is None,
        }
        if self.launcher_args is not None:
            args = self.launcher_args
            data["launcher_args"] = args.to_json()
            # what sets this server apart in seed 001's sweeps; the report's grid labels columns with it
            data["variant"] = (
                f"num_shard={args.num_shard if args.num_shard is not None else 'default'} "
                f"quantize={args.quantize or 'none'}"
            )
        return data

    def close(self) -> None:
        if getattr(self, "_loop", None) is None:
            return
        self._loop.close(self._client.close())
        self._loop = None  # type: ignore[assignment]


QUANTIZE = (
    "awq",
    "compressed-tensors",
    "eetq",
    "exl2",
    "gptq",
    "marlin",
    "bitsandbytes",
    "bitsandbytes-nf4",
    "bitsandbytes-fp4",
    "fp8",
)


@dataclass(frozen=True)
class TGILauncherArgs:
    """`text-generation-launcher` arguments (seed 000's "text_generation_launcher: Args").

    None leaves the launcher's own default. `extra_args` are appended as given.
    """

    model_id: str
    num_shard: int | None = None
    quantize: str | None = None
    dtype: str | None = None
    revision: str | None = None
    sharded: bool | None = None
    max_concurrent_requests: int | None = None
    max_best_of: int | None = None
    max_stop_sequences: int | None = None
    max_input_tokens: int | None = None
    max_total_tokens: int | None = None
    max_batch_prefill_tokens: int | None = None
    max_batch_total_tokens: int | None = None
    max_batch_size: int | None = None
    waiting_served_ratio: float | None = None
    max_waiting_tokens: int | None = None
    trust_remote_code: bool = False
    disable_custom_kernels: bool = False
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.quantize is not None and self.quantize not in QUANTIZE:
            raise BackendError(f"TGI: --quantize {self.quantize!r} is not one of {', '.join(QUANTIZE)}")
        if self.num_shard is not None and self.num_shard < 1:
            raise BackendError(f"TGI: num_shard must be >= 1, got {self.num_shard}")

    def argv(
        self,
        launcher: str,
        *,
        host: str,
        port: int,
        prometheus_port: int | None = None,
        shard_uds_path: str | None = None,
        master_port: int | None = None,
    ) -> list[str]:
        """The launcher's command line. Host, ports and the shard socket are per server, so that
        two launchers (or a leftover one) never share the defaults 3000/9000/29500 and
        /tmp/text-generation-server."""
        argv = [launcher, "--model-id", self.model_id, "--hostname", host, "--port", str(port)]
        if prometheus_port is not None:
            argv += ["--prometheus-port", str(prometheus_port)]
        if shard_uds_path is not None:
            argv += ["--shard-uds-path", shard_uds_path]
        if master_port is not None:
            argv += ["--master-port", str(master_port)]
        for f in dataclasses.fields(self):
            if f.name in ("model_id", "extra_args"):
                continue
            value = getattr(self, f.name)
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                if f.name == "sharded":
                    argv += [flag, "true" if value else "false"]
                elif value:
                    argv.append(flag)
            elif value is not None:
                argv += [flag, str(value)]
        return [*argv, *self.extra_args]

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["extra_args"] = list(self.extra_args)
        return data


SEED_MAX_INPUT_TOKENS = 1000

SEED_MAX_TOTAL_TOKENS = 1512


def seed_launcher_args(
    model_id: str,
    num_shard: int = 1,
    quantize: str | None = None,
    *,
    sequence_length: int = 1024,
    decode_length: int = 8,
    extra_args: Sequence[str] = (),
) -> TGILauncherArgs:
    """Seed 000's launcher settings (bloomz-7b1-mt experiment), with limits that admit the scenario.

    The seed lists max_input_length 1000 beside sequence length 1024: its text-generation-benchmark
    sends batches to the shards over gRPC, past the router. We go through the router's HTTP API,
    which rejects `truncate` above max_input_tokens and inputs + max_new_tokens above
    max_total_tokens (validation.rs), so both are raised to the scenario where the seed's are lower.
    """
    return TGILauncherArgs(
        model_id=model_id,
        num_shard=num_shard,
        quantize=quantize,
        max_concurrent_requests=128,
        max_best_of=2,
        max_stop_sequences=4,
        max_input_tokens=max(SEED_MAX_INPUT_TOKENS, sequence_length),
        max_total_tokens=max(SEED_MAX_TOTAL_TOKENS, sequence_length + decode_length),
        max_batch_total_tokens=32000,
        max_waiting_tokens=20,
        extra_args=tuple(extra_args),
    )
