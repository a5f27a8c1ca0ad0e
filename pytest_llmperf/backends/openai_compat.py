"""OpenAI-compatible servers (vLLM, SGLang, llama.cpp server, TGI's Messages API) over streaming
`/v1/completions` or `/v1/chat/completions`, with the `openai` package's AsyncOpenAI client.

One run of batch size B is B concurrent streamed requests. Per request:
- TTFT: the first chunk with content (completions: non-empty `text`; chat: non-empty
  `delta.content`); chunks that carry only a role, a finish reason or usage are not tokens.
- token arrivals: every chunk with content is an arrival (vLLM and TGI send one token per chunk;
  a server that packs several tokens in a chunk gives fewer arrivals than tokens, and its ITL is
  then per chunk, as in vLLM's own `bench serve`). ITL excludes the first token.
- generated tokens: `usage.completion_tokens` of the final chunk (`stream_options.include_usage`),
  not the chunk count. A server that sends no usage is an error unless `count_chunks=True`.

Fixed output length (`fixed_length`):
- "ignore_eos" (vLLM, SGLang): `ignore_eos: true` and `min_tokens` in the request body; checked:
  a request that returns another count than `decode_length` fails the run.
- "logit_bias": `logit_bias={eos_id: -100}` for `eos_token_ids`, where the server supports it.
- "none": `max_tokens` only; the run fails if a sequence stops early (as TGI's backend does).
Fixed input length: with `truncate_prompt=True` (vLLM's `truncate_prompt_tokens`) the server keeps
the prompt's last `sequence_length` tokens; otherwise the prompt is sent as is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from ..measure.clock import Clock
from ..measure.records import RunSample
from ._aio import LoopThread, Stream, run_concurrently, sample_from
from .base import Backend, BackendError, GenerationRequest, OutOfMemory

if TYPE_CHECKING:
    from ..servers.process import ServerProcess

FIXED_LENGTH = ("ignore_eos", "logit_bias", "none")
APIS = ("completions", "chat")


class OpenAICompatBackend(Backend):
    """An OpenAI-compatible server at `url` (the base, without `/v1`)."""

    kind = "openai"
    splits_prefill: ClassVar[bool] = False

    def __init__(self, url: str, *, model: str | None = None, api: str = "completions",
                 fixed_length: str = "ignore_eos", eos_token_ids: Sequence[int] = (), truncate_prompt: bool = False,
                 count_chunks: bool = False, server_name: str = "OpenAI-compatible", process: ServerProcess | None = None,
                 extra_body: Mapping[str, Any] | None = None, request_timeout_s: float = 600.0, source: str = "",
                 describe_extra: Mapping[str, Any] | None = None, clock: Clock | None = None) -> None:
        super().__init__(clock)
        if api not in APIS:
            raise BackendError(f"api must be one of {', '.join(APIS)}, got {api!r}")
        if fixed_length not in FIXED_LENGTH:
            raise BackendError(f"fixed_length must be one of {', '.join(FIXED_LENGTH)}, got {fixed_length!r}")
        if fixed_length == "logit_bias" and not eos_token_ids:
            raise BackendError("fixed_length='logit_bias' needs eos_token_ids (the end-of-sequence token ids)")
        from openai import AsyncOpenAI

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
        self.model = model or self._served_model()
        self._loop = LoopThread("openai")
        self._client = AsyncOpenAI(base_url=f"{self.url}/v1", api_key="EMPTY", timeout=request_timeout_s,
                                   max_retries=0)
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
            self._raise_unreachable(exc)
        if not models:
            raise BackendError(f"{self._where()}: GET /v1/models lists no model; pass model= explicitly")
        return models[0]

    def _raise_unreachable(self, exc: BaseException) -> Any:
        if self.process is not None:
            if self.process.exited_within(2.0):
                raise BackendError(self.process.describe_failure(f"died ({type(exc).__name__}: {exc})")) from exc
            raise BackendError(self.process.describe_failure(f"did not answer ({type(exc).__name__}: {exc})")) from exc
        hint = ("check the URL, or unset it to let the fixture start a server" if self.source
                else "is the server running?")
        raise BackendError(f"cannot reach the {self._where()}: {type(exc).__name__}: {exc}; {hint}") from exc

    # -- measurement ---------------------------------------------------------------------------

    def _body(self, request: GenerationRequest) -> dict[str, Any]:
        body: dict[str, Any] = {"stream_options": {"include_usage": True}}
        if self.fixed_length == "ignore_eos":
            body.update(ignore_eos=True, min_tokens=request.decode_length)
        if self.truncate_prompt:
            body["truncate_prompt_tokens"] = request.sequence_length
        body.update(self.extra_body)
        return body

    def generate(self, request: GenerationRequest) -> RunSample:
        if self.process is not None:
            self.process.check_alive()
        from openai import APIConnectionError, APIError, APIStatusError

        self.last_prompt_tokens = []
        try:
            streams, e2e = self._loop.run(run_concurrently(request.batch_size, self.clock,
                                                           lambda i, t0: self._one(request, t0)),
                                          timeout=self.request_timeout_s + 30)
        except BackendError:
            raise
        except APIConnectionError as exc:
            self._raise_unreachable(exc)
            raise  # unreachable
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            if "out of memory" in text.lower():
                raise OutOfMemory(f"{self._where()}: out of memory at batch size {request.batch_size}: {text}") from exc
            if self.process is not None and self.process.exited_within(1.0):
                raise BackendError(self.process.describe_failure(f"died during a run ({text})")) from exc
            status = ""
            if isinstance(exc, APIStatusError):
                status = f" (HTTP {exc.status_code})"
                text += f"; response: {exc.response.text[:500]}"
            elif isinstance(exc, APIError) and isinstance(exc.body, dict) and exc.body.get("http_status_code"):
                # TGI validates inside the stream: a 200 response whose error event names the status
                status = f" (HTTP {exc.body['http_status_code']}, sent in the stream)"
            raise BackendError(f"{self._where()}: request failed at batch size {request.batch_size}{status}: "
                               f"{text}") from exc
        if self.fixed_length != "none" or not self.count_chunks:
            wrong = [(i, s) for i, s in enumerate(streams) if s.server_tokens != request.decode_length]
            if wrong:
                i, s = wrong[0]
                how = {"ignore_eos": "the server ignored ignore_eos/min_tokens (not vLLM or SGLang?): try "
                                     "fixed_length='logit_bias' with eos_token_ids, or 'none'",
                       "logit_bias": "the server ignored logit_bias on the end-of-sequence tokens",
                       "none": "the sequence stopped early (no way to forbid the end token was asked for): use "
                               "fixed_length='ignore_eos' or 'logit_bias'"}[self.fixed_length]
                if s.finish_reason is None:  # no end token: the stream was cut (seen on llama-cpp-python's server)
                    how = ("the stream ended without a finish_reason, so the server cut it short; llama-cpp-python's "
                           "server does that to a streaming request when another arrives unless started with "
                           "--interrupt_requests False")
                raise BackendError(f"{self._where()}: request {i} of batch size {request.batch_size} generated "
                                   f"{s.server_tokens} tokens (finish_reason={s.finish_reason}), not "
                                   f"decode_length={request.decode_length}; {how}")
        return sample_from(request.batch_size, streams, e2e)

    async def _one(self, request: GenerationRequest, start: int) -> Stream:
        stream = Stream()
        common: dict[str, Any] = {"model": self.model, "max_tokens": request.decode_length, "temperature": 0.0,
                                  "stream": True, "extra_body": self._body(request)}
        if self.fixed_length == "logit_bias":
            common["logit_bias"] = {str(t): -100 for t in self.eos_token_ids}
        if self.api == "chat":
            response = await self._client.chat.completions.create(
                messages=[{"role": "user", "content": request.prompt}], **common)
        else:
            response = await self._client.completions.create(prompt=request.prompt, **common)
        chunks = 0
        async for chunk in response:
            now = self.clock() - start
            for choice in chunk.choices or []:
                content = choice.delta.content if self.api == "chat" else choice.text
                if content:
                    stream.times_ns.append(now)
                    chunks += 1
                if choice.finish_reason:
                    stream.finish_reason = choice.finish_reason
            if chunk.usage is not None:
                stream.server_tokens = int(chunk.usage.completion_tokens)
                self.last_prompt_tokens.append(chunk.usage.prompt_tokens)
        stream.end_ns = self.clock() - start
        if stream.server_tokens is None:
            if not self.count_chunks:
                raise BackendError(f"{self._where()}: the stream sent no `usage` (stream_options.include_usage); "
                                   "tokens are counted from usage. Pass count_chunks=True to count content chunks")
            stream.server_tokens = chunks
        return stream

    # -- lifecycle and description --------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        length = {"ignore_eos": "ignore_eos + min_tokens (checked against usage)",
                  "logit_bias": f"logit_bias -100 on tokens {list(self.eos_token_ids)} (checked against usage)",
                  "none": "max_tokens only"}[self.fixed_length]
        return {
            "backend": self.kind,
            "server": self.server_name,
            "model": self.model,
            "url": self.url,
            "api": f"/v1/{'chat/completions' if self.api == 'chat' else 'completions'} (streaming)",
            "device": "server",
            "token_count": "chunk count (server sends no usage)" if self.count_chunks else "server usage.completion_tokens",
            "output_length": length,
            "input_length": "truncate_prompt_tokens=sequence_length" if self.truncate_prompt else "prompt sent as is",
            "attached": self.process is None,
            **self.describe_extra,
        }

    def close(self) -> None:
        if getattr(self, "_loop", None) is None:
            return
        try:
            self._loop.run(self._client.close(), timeout=10)
        except Exception:  # noqa: BLE001 - the server may be gone already
            pass
        self._loop.close()
        self._loop = None  # type: ignore[assignment]
