"""OpenAI-compatible servers (vLLM, SGLang, llama.cpp server, TGI's Messages API) over streaming
`/v1/completions` or `/v1/chat/completions`, with aiohttp (the client vLLM's `bench serve` uses) and our
own event-stream reader (`_aio.EventStream`).

The client's own work is kept out of what it measures (docs/servers.md, "The client"): a run's request
body is encoded once and sent by each of its B requests; the event loop and its aiohttp session live
for the backend's life, so connections are reused; a token is stamped as soon as its event is decoded,
as vLLM's bench stamps it. 0.2-0.4 ms of CPU per request here (scripts/client_overhead.py), where the
`openai` package's client, which this replaced, took 1.8-2.1 ms.

One run of batch size B is B concurrent streamed requests. Per request, as vLLM's `bench serve` times it:
- sent: the clock just before the request is posted; TTFT, E2EL are timed from it (metrics.py).
- token arrivals: the clock read right after the chunk's event is decoded (vLLM's bench reads it there); a
  chunk counts where its choice carries token ids; without ids, completions: every chunk with a
  text (vLLM's rule: an empty text, a special token, counts too) except an empty one that only carries
  the finish reason (llama.cpp closes its streams so); chat: every chunk with non-empty `delta.content`
  (a role-only chunk is not a token). A server that packs several tokens in a chunk gives fewer arrivals than
  tokens, and its ITL is then per chunk, as in vLLM's own `bench serve`. ITL excludes the first token.
- generated tokens: `usage.completion_tokens` of the final chunk (`stream_options.include_usage`),
  not the chunk count. A server that sends no usage is an error unless `count_chunks=True`.
- the prompt the server received: `usage.prompt_tokens`, checked against `sequence_length` (a
  mismatch fails the run, naming both) unless `check_prompt_length=False`.
- token ids: with `token_ids=True` (vLLM's `return_token_ids`) every chunk carries its ids, and the
  run reports the generated ids for "outputs unchanged" (judge/outputs.py).

A request that fails while the others go on (its stream cut short, an error event) is a failed
request of the run, named in the report and failing the test; when every request of a run fails, the
run fails (the server is down or refused them).

Fixed output length (`fixed_length`):
- "ignore_eos" (vLLM, SGLang): `ignore_eos: true` and `min_tokens` in the request body; checked:
  a request that returns another count than `decode_length` fails the run.
- "logit_bias": `logit_bias={eos_id: -100}` for `eos_token_ids`, where the server supports it.
- "none": `max_tokens` only; the run fails if a sequence stops early (as TGI's backend does).
Fixed input length: with `truncate_prompt=True` (vLLM's `truncate_prompt_tokens`) the server keeps
the prompt's last `sequence_length` tokens; otherwise the prompt is sent as is, and the server's
`usage.prompt_tokens` must say it received `sequence_length` tokens.

What the events of the stream mean: which chunk carries a token (`is_token`), and which carries an error
(`stream_error`, `ServerAnswered`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from ..measure.backend import Backend, BackendError, Clock, GenerationRequest, OutOfMemory
from ..measure.records import RunSample
from ._aio import (
    EventStream,
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

FIXED_LENGTH = ("ignore_eos", "logit_bias", "none")
APIS = ("completions", "chat")
HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream", "Authorization": "Bearer EMPTY"}


class OpenAICompatBackend(Backend):
    """An OpenAI-compatible server at `url` (the base, without `/v1`)."""

    kind = "openai"
    splits_prefill: ClassVar[bool] = False

    def __init__(
        self,
        url: str,
        *,
        model: str | None = None,
        api: str = "completions",
        fixed_length: str = "ignore_eos",
        eos_token_ids: Sequence[int] = (),
        truncate_prompt: bool = False,
        count_chunks: bool = False,
        server_name: str = "OpenAI-compatible",
        process: ServerProcess | None = None,
        extra_body: Mapping[str, Any] | None = None,
        request_timeout_s: float = 600.0,
        source: str = "",
        describe_extra: Mapping[str, Any] | None = None,
        token_ids: bool = False,
        check_prompt_length: bool = True,
        deterministic: bool = False,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(clock)
        if api not in APIS:
            raise BackendError(f"api must be one of {', '.join(APIS)}, got {api!r}")
        if fixed_length not in FIXED_LENGTH:
            raise BackendError(f"fixed_length must be one of {', '.join(FIXED_LENGTH)}, got {fixed_length!r}")
        if fixed_length == "logit_bias" and not eos_token_ids:
            raise BackendError("fixed_length='logit_bias' needs eos_token_ids (the end-of-sequence token ids)")
        try:
            import aiohttp
        except ImportError as exc:
            raise BackendError(
                f"the OpenAI-compatible backend needs aiohttp: pip install pytest-llmperf[openai] ({exc})"
            ) from exc

        self.url = url.rstrip("/")
        self.api = api
        self.fixed_length = fixed_length
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.truncate_prompt = truncate_prompt
        self.count_chunks = count_chunks
        self.server_name = server_name
        self.process = process
        self.extra_body = dict(extra_body or {})
        self.request_timeout_s = request_timeout_s
        self.source = source
        self.describe_extra = dict(describe_extra or {})
        self.token_ids = token_ids
        self.check_prompt_length = check_prompt_length
        self.deterministic_outputs = deterministic  # the user says greedy decoding on this server repeats itself
        self.model = model or self._served_model()
        self._endpoint = f"{self.url}/v1/{'chat/completions' if api == 'chat' else 'completions'}"
        self._loop = LoopThread("openai")

        async def open_session() -> aiohttp.ClientSession:  # made on the loop that uses it
            # no connection limit (a run of batch size B has B streams open at once), connections kept alive
            # between runs, no proxy from the environment: a benchmark measures the server, not a proxy
            return aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
                timeout=aiohttp.ClientTimeout(total=request_timeout_s),
            )

        self._session = self._loop.run(open_session())
        self.last_prompt_tokens: list[int | None] = []  # usage.prompt_tokens of the last run's requests

    # -- server ---------------------------------------------------------------------------------

    def _where(self) -> str:
        return f"{self.server_name} server at {self.url}" + (f" (from {self.source})" if self.source else "")

    def _served_model(self) -> str:
        import httpx

        try:
            response = httpx.get(f"{self.url}/v1/models", timeout=10)
            response.raise_for_status()
            models = [m["id"] for m in response.json().get("data", [])]
        except (httpx.HTTPError, ValueError, KeyError, AttributeError) as exc:
            raise unreachable(exc, self.process, self._where(), self.source) from exc
        if not models:
            raise BackendError(f"{self._where()}: GET /v1/models lists no model; pass model= explicitly")
        return models[0]

    # -- measurement ---------------------------------------------------------------------------

    def _body(self, request: GenerationRequest) -> bytes:
        """The request body every request of the run sends, encoded once per run."""
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.decode_length,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": request.prompt}]
        else:
            body["prompt"] = request.prompt
        if self.fixed_length == "logit_bias":
            body["logit_bias"] = {str(t): -100 for t in self.eos_token_ids}
        if self.fixed_length == "ignore_eos":
            body.update(ignore_eos=True, min_tokens=request.decode_length)
        if self.truncate_prompt:
            body["truncate_prompt_tokens"] = request.sequence_length
        if self.token_ids:
            body["return_token_ids"] = True
        body.update(self.extra_body)
        return json.dumps(body).encode()

    def generate(self, request: GenerationRequest) -> RunSample:
        if self.process is not None:
            self.process.check_alive()
        from aiohttp import ClientConnectionError

        self.last_prompt_tokens = []
        body = self._body(request)
        try:
            streams, failed, e2e = run_batch(
                self._loop,
                self.clock,
                request.batch_size,
                lambda i, t0: self._one(request, body, t0),
                timeout=self.request_timeout_s + 30,
                where=self._where(),
                process=self.process,
            )
        except BackendError:
            raise
        except ClientConnectionError as exc:  # before any answer: refused, reset (the server is down)
            raise unreachable(exc, self.process, self._where(), self.source) from exc
        except Exception as exc:
            text = str(exc) if isinstance(exc, ServerAnswered) else f"{type(exc).__name__}: {exc}"
            if "out of memory" in text.lower():
                raise OutOfMemory(f"{self._where()}: out of memory at batch size {request.batch_size}: {text}") from exc
            if self.process is not None and self.process.exited_within(1.0):
                raise BackendError(self.process.describe_failure(f"died during a run ({text})")) from exc
            status = exc.where() if isinstance(exc, ServerAnswered) else ""
            raise BackendError(
                f"{self._where()}: request failed at batch size {request.batch_size}{status}: {text}"
            ) from exc
        check_survived(failed, self.process)
        self._check_lengths(request, streams)
        return sample_from(request.batch_size, streams, e2e, failed, with_ids=self.token_ids)

    def _check_lengths(self, request: GenerationRequest, streams: list[Stream]) -> None:
        """Every completed request generated `decode_length` tokens from a prompt of `sequence_length` (as the
        server counts them): a mismatch means the scenario is not what the server ran, for every request."""
        if self.fixed_length != "none" or not self.count_chunks:
            wrong = [(i, s) for i, s in enumerate(streams) if s.server_tokens != request.decode_length]
            if wrong:
                i, s = wrong[0]
                how = {
                    "ignore_eos": "the server ignored ignore_eos/min_tokens (not vLLM or SGLang?): try "
                    "fixed_length='logit_bias' with eos_token_ids, or 'none'",
                    "logit_bias": "the server ignored logit_bias on the end-of-sequence tokens",
                    "none": "the sequence stopped early (no way to forbid the end token was asked for): use "
                    "fixed_length='ignore_eos' or 'logit_bias'",
                }[self.fixed_length]
                raise BackendError(
                    f"{self._where()}: request {i} of batch size {request.batch_size} generated "
                    f"{s.server_tokens} tokens (finish_reason={s.finish_reason}), not "
                    f"decode_length={request.decode_length}; {how}"
                )
        n = prompt_mismatch(streams, request.sequence_length)
        if self.check_prompt_length and n is not None:
            fix = (
                "the prompt was cut to sequence_length with truncate_prompt_tokens, yet the server counts "
                "otherwise (its tokenizer adds tokens?)"
                if self.truncate_prompt
                else "pass truncate_prompt=True where the server has vLLM's truncate_prompt_tokens"
            )
            raise BackendError(
                f"{self._where()}: the server received {n} prompt tokens (usage.prompt_tokens), the "
                f"scenario asks for sequence_length={request.sequence_length}; {fix}, or "
                f"check_prompt_length=False to measure the prompt as the server counts it"
            )

    async def _one(self, request: GenerationRequest, body: bytes, start: int) -> Stream:
        from aiohttp import ClientConnectionError, ClientPayloadError

        stream = Stream()
        clock = self.clock
        stream.sent_ns = clock() - start  # where vLLM's bench serve stamps its send: just before the POST
        async with self._session.post(self._endpoint, data=body, headers=HEADERS) as response:
            if response.status != 200:
                text = await response.text()
                raise ServerAnswered(response.status, f"{response.reason}: {text[:500]}", in_stream=False)
            events, chunks = EventStream(), 0
            ids: list[int] = []
            try:
                async for data in response.content.iter_any():
                    for event in events.feed(data):
                        chunks += self._take(event, start, stream, ids)
                for event in events.close():
                    chunks += self._take(event, start, stream, ids)
            except (ClientPayloadError, ClientConnectionError) as exc:  # the server went on; this stream broke
                raise RequestFailed(
                    f"the stream broke after {len(stream.times_ns)} of {request.decode_length} "
                    f"tokens: {type(exc).__name__}: {exc}"
                ) from exc
        stream.token_ids = ids if self.token_ids else None
        if stream.finish_reason is None and (stream.server_tokens or chunks) < request.decode_length:
            raise RequestFailed(
                f"the stream ended after {stream.server_tokens or chunks} of {request.decode_length} "
                "tokens with no finish_reason: the server cut it short (llama-cpp-python's server "
                "does that to a streaming request when another arrives, unless started with "
                "--interrupt_requests False)"
            )
        if stream.server_tokens is None:
            if not self.count_chunks:
                raise BackendError(
                    f"{self._where()}: the stream sent no `usage` (stream_options.include_usage); "
                    "tokens are counted from usage. Pass count_chunks=True to count content chunks"
                )
            stream.server_tokens = chunks
        return stream

    def _take(self, event: bytes, start: int, stream: Stream, ids: list[int]) -> int:
        """Read one event into `stream`; 1 for a chunk with content (count_chunks counts those), else 0.

        A token's time is read as soon as its event is decoded, where vLLM's bench serve reads it: events that
        came in one read get their own times, microseconds apart, in order (a server that fell behind and sent
        several at once; stamping them with the read's one time gave zero gaps)."""
        if event == b"[DONE]":
            return 0
        data = json.loads(event)
        now = self.clock() - start
        error = stream_error(data)
        if error is not None:
            raise error
        content = None
        for choice in (data.get("choices") or ())[:1]:
            content = (choice.get("delta") or {}).get("content") if self.api == "chat" else choice.get("text")
            chunk_ids = choice.get("token_ids") or ()
            finish_reason = choice.get("finish_reason")
            if chunk_ids or is_token(self.api, content, finish_reason):
                stream.times_ns.append(now)
            if content:
                stream.text += content
            ids += chunk_ids
            if finish_reason:
                stream.finish_reason = finish_reason
        prompt_ids = data.get("prompt_token_ids")
        if prompt_ids is not None and stream.prompt_tokens is None:
            stream.prompt_tokens = len(prompt_ids)
        usage = data.get("usage")
        if usage:
            stream.server_tokens = int(usage["completion_tokens"])
            if usage.get("prompt_tokens") is not None:
                stream.prompt_tokens = int(usage["prompt_tokens"])
            self.last_prompt_tokens.append(usage.get("prompt_tokens"))
        return 1 if content else 0

    # -- lifecycle and description --------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        length = {
            "ignore_eos": "ignore_eos + min_tokens (checked against usage)",
            "logit_bias": f"logit_bias -100 on tokens {list(self.eos_token_ids)} (checked against usage)",
            "none": "max_tokens only",
        }[self.fixed_length]
        return {
            "backend": self.kind,
            "server": self.server_name,
            "model": self.model,
            "url": self.url,
            "api": f"/v1/{'chat/completions' if self.api == 'chat' else 'completions'} (streaming)",
            "device": "server",
            "token_count": (
                "chunk count (server sends no usage)" if self.count_chunks else "server usage.completion_tokens"
            ),
            "output_length": length,
            "input_length": ("truncate_prompt_tokens=sequence_length" if self.truncate_prompt else "prompt sent as is")
            + (
                ", unchecked"
                if not self.check_prompt_length
                else ", unchecked (the server sends no usage)"
                if self.count_chunks
                else ", checked against usage.prompt_tokens"
            ),
            "outputs": (
                outputs_note("token ids (return_token_ids)", self.deterministic_outputs)
                if self.token_ids
                else "not compared (no token ids)"
            ),
            "deterministic_outputs": self.deterministic_outputs,
            "attached": self.process is None,
            **self.describe_extra,
        }

    def close(self) -> None:
        if getattr(self, "_loop", None) is None:
            return
        self._loop.close(self._session.close())
        self._loop = None  # type: ignore[assignment]


class ServerAnswered(Exception):
    """The server answered a request with an error: an HTTP status, or an error event inside a 200 stream
    (TGI validates there; vLLM reports a failure that way once the stream has begun)."""

    def __init__(self, status: int | None, message: str, in_stream: bool) -> None:
        super().__init__(message)
        self.status = status
        self.in_stream = in_stream

    def where(self) -> str:
        """` (HTTP 422)`, ` (HTTP 422, sent in the stream)`, or nothing where no status was given."""
        if self.status is None:
            return " (an error event in the stream)" if self.in_stream else ""
        return f" (HTTP {self.status}{', sent in the stream' if self.in_stream else ''})"


def stream_error(data: dict[str, Any]) -> ServerAnswered | None:
    """The error an event carries (OpenAI's `{"error": {"message", "code"}}`, TGI's `http_status_code`)."""
    error = data.get("error")
    if error is None:
        return None
    if not isinstance(error, dict):
        return ServerAnswered(None, str(error), in_stream=True)
    status = error.get("http_status_code", error.get("code"))
    return ServerAnswered(status if isinstance(status, int) else None, str(error.get("message", error)), in_stream=True)


def is_token(api: str, content: str | None, finish_reason: str | None) -> bool:
    """Whether a streamed chunk without token ids carries a token. Completions: any text, also an empty one (a
    special token), as vLLM's bench serve counts it, except an empty chunk that only closes the stream
    (llama.cpp's last chunk carries the finish reason alone). Chat: non-empty content (a role-only chunk)."""
    if api == "chat":
        return bool(content)
    return content is not None and (content != "" or finish_reason is None)
