#!/usr/bin/env python3
"""A local double of text-generation-inference's HTTP API, standard library only.

Faithful to TGI's router (router/src/server.rs, lib.rs, validation.rs): routes `/` (compat: list
for non-stream, SSE when "stream": true), `/generate`, `/generate_stream`, `/info`, `/health`,
`/v1/models`, `/v1/completions`, `/v1/chat/completions`; SSE events `data:{json}` with
`index`, `token {id, text, logprob, special}`, `generated_text` and `details {finish_reason,
generated_tokens, seed, input_length}` on the last event.

Errors as the router sends them (server.rs `From<InferError>`, validation.rs): on `/generate` (and
`/` without stream) a JSON body `{"error", "error_type"}` with TGI's status (422 validation, 429
overloaded, 424 generation); on `/generate_stream` (and `/` with stream) the response is a 200
event stream whose event carries that same `{"error", "error_type"}`, because the router validates
inside the stream; on the streaming /v1 routes the event is OpenAI's `{"error": {"message",
"http_status_code": 422}}`. Messages are InferError's: "Input validation error: " + the
ValidationError text, checked in the router's order (`truncate` in 1..=max_input_tokens, then
input length = min(tokens, truncate) against max_total_tokens and max_input_tokens).

Tokens are words (the prompt is split on whitespace, like the embedded models' tokenizer).
Timing is a cost model with settable delays, so a test can slow it down by a known factor:
prefill = `prefill_ms_per_token` x input tokens, then each token takes `token_delay_ms` x
(1 + `batch_factor` x (concurrent requests - 1)). Settings change at run time with
`POST /_double/config` (JSON); `GET /_double/stats` counts requests.

Fault injection: `eos_after` (stop with eos_token after N tokens, as a real model may),
`error_after` (a TGI error event mid-stream), `exit_after_requests` (the process dies, as a
crashed server does), `drop_after` with `drop_every` (every `drop_every`-th request's connection
is closed after `drop_after` tokens, mid-stream, while the server goes on serving the others),
`output_salt` (other tokens for the same prompt, as a change to the model would give).

On the /v1 routes, as vLLM's server: `truncate_prompt_tokens` keeps the prompt's last k tokens, and
`return_token_ids` puts each chunk's `token_ids` in its choice and the `prompt_token_ids` in the first.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

EOS_ID = 2
WORDS = ("the", "of", "and", "a", "to", "in", "is", "was", "for", "on", "as", "with", "by", "at", "from", "it")

DEFAULTS: dict[str, Any] = {
    "model_id": "double/tiny",
    "max_input_tokens": 1000,
    "max_total_tokens": 1512,
    "max_concurrent_requests": 128,
    "max_best_of": 2,
    "max_stop_sequences": 4,
    "max_client_batch_size": 4,
    "prefill_ms_per_token": 0.05,
    "token_delay_ms": 5.0,
    "batch_factor": 0.1,
    "eos_after": None,
    "error_after": None,
    "exit_after_requests": None,
    "drop_after": None,
    "drop_every": 1,
    "output_salt": "",
}


class State:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = dict(config)
        self.lock = threading.Lock()
        self.active = 0
        self.requests = 0

    def get(self, key: str) -> Any:
        with self.lock:
            return self.config[key]


def token_for(step: int, seed: str) -> tuple[int, str]:
    word = WORDS[(zlib.crc32(f"{seed}:{step}".encode()) + step) % len(WORDS)]
    return 100 + WORDS.index(word), " " + word


class RouterError(Exception):
    """An InferError of TGI's router: its message, error_type and the status /generate answers with."""

    status = 500
    error_type = "unknown"
    prefix = ""

    def __init__(self, message: str) -> None:
        super().__init__(self.prefix + message)


class ValidationError(RouterError):
    status, error_type, prefix = 422, "validation", "Input validation error: "


class Overloaded(RouterError):
    status, error_type = 429, "overloaded"


class GenerationError(RouterError):
    status, error_type = 424, "generation"


class Dropped(Exception):
    """The connection is to be closed mid-stream (drop_after): no final event, no chunked-encoding end."""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, fmt: str, *args: Any) -> None:  # access log, like TGI's router
        sys.stderr.write("%s INFO router: %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"), fmt % args))

    # -- plumbing ------------------------------------------------------------------------------

    def setup(self) -> None:
        # Without TCP_NODELAY, Nagle's algorithm holds each small SSE write until the client's
        # delayed ACK (~40 ms) and tokens arrive in bursts: measured, not hypothetical.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().setup()

    def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, error_type: str) -> None:
        self._json(status, {"error": message, "error_type": error_type})

    def _fail(self, exc: RouterError, streaming: bool, openai: bool) -> None:
        """An error before any token, as the router sends it on this route (see the module doc)."""
        if not streaming:
            self._error(exc.status, str(exc), exc.error_type)
            return
        self._start_sse()
        self._stream_error(exc, openai)
        if openai:
            self._chunk("data: [DONE]\n\n")  # the /v1 streams end with it, also after an error
        self._end_chunks()

    def _stream_error(self, exc: RouterError, openai: bool) -> None:
        if openai:  # InferError::into_openai_event
            self._chunk("data: " + json.dumps({"error": {"message": str(exc), "http_status_code": 422}}) + "\n\n")
        else:
            self._event({"error": str(exc), "error_type": exc.error_type})

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        return json.loads(raw or b"{}")

    def _start_sse(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("X-Accel-Buffering", "no")
        self.end_headers()

    def _chunk(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _event(self, payload: Any) -> None:
        # axum's Event::json_data writes `data:` with no space, as TGI does
        self._chunk("data:" + (payload if isinstance(payload, str) else json.dumps(payload)) + "\n\n")

    def _end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    # -- routes --------------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802
        state = self.server.state
        if self.path in ("/health", "/", "/ping"):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/info":
            c = state.config
            self._json(200, {
                "model_id": c["model_id"], "model_sha": None, "model_pipeline_tag": "text-generation",
                "max_concurrent_requests": c["max_concurrent_requests"], "max_best_of": c["max_best_of"],
                "max_stop_sequences": c["max_stop_sequences"], "max_input_tokens": c["max_input_tokens"],
                "max_total_tokens": c["max_total_tokens"], "validation_workers": 2,
                "max_client_batch_size": c["max_client_batch_size"], "router": "text-generation-router",
                "version": "3.3.6-double", "sha": None, "docker_label": None})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [
                {"id": state.config["model_id"], "object": "model", "created": 0,
                 "owned_by": state.config["model_id"]}]})
        elif self.path == "/_double/stats":
            with state.lock:
                self._json(200, {"requests": state.requests, "active": state.active, "config": state.config})
        else:
            self._error(404, f"no route {self.path}", "not_found")

    def do_POST(self) -> None:  # noqa: N802
        state = self.server.state
        try:
            body = self._body()
        except json.JSONDecodeError as exc:
            self._error(422, f"Failed to deserialize the JSON body into the target type: {exc}", "validation")
            return
        if self.path == "/_double/config":
            with state.lock:
                unknown = set(body) - set(state.config)
                if unknown:
                    self._error(400, f"unknown settings {sorted(unknown)}", "double")
                    return
                state.config.update(body)
            self._json(200, state.config)
            return
        routes = {"/": self._compat, "/generate": self._generate, "/generate_stream": self._generate_stream,
                  "/v1/completions": self._completions, "/v1/chat/completions": self._chat}
        route = routes.get(self.path)
        if route is None:
            self._error(404, f"no route {self.path}", "not_found")
            return
        streaming = self.path == "/generate_stream" or bool(body.get("stream"))
        openai = self.path.startswith("/v1/")
        with state.lock:
            if state.active >= state.config["max_concurrent_requests"]:
                overloaded = True
            else:
                overloaded = False
                state.active += 1
                state.requests += 1
                number = state.requests
        if overloaded:
            self._fail(Overloaded("Model is overloaded"), streaming, openai)
            return
        limit = state.get("exit_after_requests")
        if limit is not None and number > int(limit):  # dies as request N+1 arrives, others mid-stream
            sys.stderr.write(f"router: exiting after {number - 1} requests (exit_after_requests)\n")
            sys.stderr.flush()
            os._exit(3)
        self.number = number
        try:
            route(body)
        except RouterError as exc:  # raised before the first token: nothing was sent yet
            self._fail(exc, streaming, openai)
        except Dropped:
            self.close_connection = True
            self.wfile.flush()
            self.request.shutdown(socket.SHUT_RDWR)
        finally:
            with state.lock:
                state.active -= 1

    # -- generation ----------------------------------------------------------------------------

    def _validate(self, inputs: str, max_new_tokens: int, truncate: int | None = None) -> int:
        """The input length the router keeps, or its ValidationError (validation.rs, in its order)."""
        c = self.server.state.config
        if max_new_tokens <= 0:
            raise ValidationError("`max_new_tokens` must be strictly positive")
        if not inputs:
            raise ValidationError("`inputs` cannot be empty")
        if truncate is not None and (truncate == 0 or truncate > c["max_input_tokens"]):
            raise ValidationError(f"`truncate` must be strictly positive and less than {c['max_input_tokens']}. "
                                  f"Given: {truncate}")
        n = len(inputs.split())
        if truncate is not None:
            n = min(n, truncate)  # the router keeps the last `truncate` tokens
        if n + max_new_tokens > c["max_total_tokens"]:
            raise ValidationError(f"`inputs` tokens + `max_new_tokens` must be <= {c['max_total_tokens']}. "
                                  f"Given: {n} `inputs` tokens and {max_new_tokens} `max_new_tokens`")
        if n > c["max_input_tokens"]:
            raise ValidationError(f"`inputs` must have less than {c['max_input_tokens']} tokens. Given: {n}")
        return n

    def _validate_params(self, inputs: str, params: dict[str, Any]) -> int:
        truncate = params.get("truncate")
        return self._validate(inputs, int(params["max_new_tokens"]), None if truncate is None else int(truncate))

    def _tokens(self, inputs: str, max_new: int, allow_eos: bool) -> Any:
        """Yield (index, id, text, special, finish_reason or None) with the cost model's delays."""
        state = self.server.state
        n = len(inputs.split())
        time.sleep(state.get("prefill_ms_per_token") * n / 1000)
        eos_after = state.get("eos_after") if allow_eos else None
        error_after = state.get("error_after")
        for step in range(max_new):
            if step:
                with state.lock:
                    active = state.active
                    delay = state.config["token_delay_ms"] * (1 + state.config["batch_factor"] * (active - 1))
                time.sleep(delay / 1000)
            if error_after is not None and step >= int(error_after):
                raise GenerationError("Request failed during generation: Server error: CUDA out of memory (double)")
            drop_after = state.get("drop_after")
            if drop_after is not None and step >= int(drop_after) and self.number % int(state.get("drop_every")) == 0:
                raise Dropped()
            if eos_after is not None and step >= int(eos_after):
                yield step + 1, EOS_ID, "</s>", True, "eos_token"
                return
            tid, text = token_for(step, inputs[:64] + state.get("output_salt"))
            yield step + 1, tid, text, False, ("length" if step == max_new - 1 else None)

    @staticmethod
    def _params(body: dict[str, Any]) -> dict[str, Any]:
        params = dict(body.get("parameters") or {})
        params.setdefault("max_new_tokens", 100)
        return params

    def _compat(self, body: dict[str, Any]) -> None:
        if body.get("stream"):
            self._generate_stream(body)
        else:
            self._generate(body, as_list=True)

    def _generate(self, body: dict[str, Any], as_list: bool = False) -> None:
        inputs, params = body.get("inputs", ""), self._params(body)
        n = self._validate_params(inputs, params)
        tokens, finish = [], "length"
        for index, tid, text, special, reason in self._tokens(inputs, int(params["max_new_tokens"]), True):
            tokens.append({"id": tid, "text": text, "logprob": -0.5, "special": special})
            finish = reason or finish
        text = "".join(t["text"] for t in tokens if not t["special"])
        out: dict[str, Any] = {"generated_text": (inputs + text) if params.get("return_full_text") else text}
        if params.get("details"):
            out["details"] = {"finish_reason": finish, "generated_tokens": len(tokens), "seed": params.get("seed"),
                              "prefill": [], "tokens": tokens}
        self._json(200, [out] if as_list else out, {"x-generated-tokens": str(len(tokens)),
                                                      "x-prompt-tokens": str(n)})

    def _generate_stream(self, body: dict[str, Any]) -> None:
        inputs, params = body.get("inputs", ""), self._params(body)
        if (params.get("best_of") or 1) != 1:
            raise ValidationError("`best_of` != 1 is not supported when streaming tokens")
        n = self._validate_params(inputs, params)
        self._start_sse()
        text = ""
        try:
            for index, tid, token_text, special, reason in self._tokens(inputs, int(params["max_new_tokens"]), True):
                text += "" if special else token_text
                event: dict[str, Any] = {"index": index, "token": {"id": tid, "text": token_text, "logprob": -0.5,
                                                                   "special": special},
                                         "generated_text": None, "details": None}
                if reason is not None:
                    event["generated_text"] = (inputs + text) if params.get("return_full_text") else text
                    if params.get("details"):
                        event["details"] = {"finish_reason": reason, "generated_tokens": index,
                                            "seed": params.get("seed"), "input_length": n}
                self._event(event)
        except GenerationError as exc:
            self._stream_error(exc, openai=False)
        self._end_chunks()

    def _openai(self, body: dict[str, Any], chat: bool) -> None:
        if chat:
            inputs = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        else:
            prompt = body.get("prompt", "")
            inputs = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
        max_new = int(body.get("max_tokens") or body.get("max_completion_tokens") or 100)
        if body.get("truncate_prompt_tokens") is not None:  # vLLM's: keep the last k tokens
            inputs = " ".join(inputs.split()[-int(body["truncate_prompt_tokens"]):])
        n = self._validate(inputs, max_new)
        with_ids = bool(body.get("return_token_ids"))
        bias = body.get("logit_bias") or {}
        allow_eos = not body.get("ignore_eos") and float(bias.get(str(EOS_ID), 0)) > -100
        model = self.server.state.config["model_id"]
        kind = "chat.completion.chunk" if chat else "text_completion"
        base = {"id": "double", "object": kind, "created": int(time.time()), "model": model,
                "system_fingerprint": "3.3.6-double"}

        def choice(text: str | None, finish: str | None, tid: int | None = None) -> dict[str, Any]:
            ids = {"token_ids": [tid]} if with_ids and tid is not None else {}
            if chat:
                delta = {"role": "assistant", "content": text} if text is not None else {}
                return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, **ids}
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish, **ids}

        generated, finish, pieces = 0, "length", []
        if not body.get("stream"):
            for _, _, text, special, reason in self._tokens(inputs, max_new, allow_eos):
                generated += 1
                pieces.append("" if special else text)
                finish = "stop" if reason == "eos_token" else (reason or finish)
            usage = {"prompt_tokens": n, "completion_tokens": generated, "total_tokens": n + generated}
            message = ({"message": {"role": "assistant", "content": "".join(pieces)}} if chat
                       else {"text": "".join(pieces)})
            self._json(200, {**base, "object": "chat.completion" if chat else "text_completion",
                             "choices": [{"index": 0, **message, "logprobs": None, "finish_reason": finish}],
                             "usage": usage})
            return
        self._start_sse()
        try:
            for _, tid, text, special, reason in self._tokens(inputs, max_new, allow_eos):
                generated += 1
                finish_out = None if reason is None else ("stop" if reason == "eos_token" else reason)
                chunk = {**base, "choices": [choice("" if special else text, finish_out, tid)]}
                if with_ids and generated == 1:
                    chunk["prompt_token_ids"] = list(range(1000, 1000 + n))
                self._chunk("data: " + json.dumps(chunk) + "\n\n")
        except GenerationError as exc:
            self._stream_error(exc, openai=True)
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": n, "completion_tokens": generated, "total_tokens": n + generated}
            self._chunk("data: " + json.dumps({**base, "choices": [], "usage": usage}) + "\n\n")
        self._chunk("data: [DONE]\n\n")
        self._end_chunks()

    def _completions(self, body: dict[str, Any]) -> None:
        self._openai(body, chat=False)

    def _chat(self, body: dict[str, Any]) -> None:
        self._openai(body, chat=True)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default backlog of 5 drops connections when a batch of 32 connects at once;
    # TGI's router (tokio) listens with a backlog of 1024
    request_queue_size = 1024
    state: State


def make_server(host: str, port: int, config: dict[str, Any]) -> Server:
    server = Server((host, port), Handler)
    server.state = State({**DEFAULTS, **config})
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hostname", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--config", default="{}", help="JSON settings over the defaults")
    args = parser.parse_args(argv)
    server = make_server(args.hostname, args.port, json.loads(args.config))
    sys.stderr.write(f"router: Connected on {args.hostname}:{args.port}\n")
    sys.stderr.flush()
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
