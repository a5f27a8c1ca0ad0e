"""Our OpenAI-compatible client's own cost per request, against a local server that answers at once.

    python scripts/client_overhead.py [--runs 200] [--batch-sizes 1 4] [--output-len 8] [--token-gap-ms 0]
                                      [--json FILE]

A double in a child process (this script with `--serve`, asyncio, standard library) answers every
`POST /v1/completions` with a stream vLLM's server would send for `--output-len` tokens (one chunk per
token with its `token_ids`, the prompt ids in the first, the finish reason, a `usage` chunk, `[DONE]`),
chunked as uvicorn sends it, prebuilt so that it costs the double next to nothing. With `--token-gap-ms`
it sleeps that long between chunks, so that each token arrives on its own, as from a real server (each
arrival then wakes the client up once).

It measures `OpenAICompatBackend.generate` (this checkout's, as `llmperf_vllm` configures it: ignore_eos,
truncate_prompt, token_ids) in runs of batch size B, after warmups, and prints per B:
- **CPU per request**: this process's CPU time (every thread: the caller, the event loop, the garbage
  collector) over the runs, divided by the requests. The double runs in another process, so this is our
  client's own work, and a busy machine does not inflate it the way it inflates wall time.
- **wall per run**: how long `generate` took, median; against an instant server this is mostly our work.
- **send spread** (B > 1): last `sent_ns` - first `sent_ns` of a run, median, as xcheck_vllm_bench.py
  reports it; and the **arrival spread**: the same for the times the double finished reading each
  request (CLOCK_MONOTONIC in both processes), which also catches work done after the timestamp.
- **stamp to arrival**: the double's arrival time - the request's `sent_ns`, median: our work between
  taking the send timestamp and the request being on the wire.

With vLLM installed (run it with the vllm env's python), it measures vLLM's own bench client the same
way (`vllm.benchmarks.lib.endpoint_request_func.async_request_openai_completions`, one aiohttp session,
B requests started at once as `bench serve` starts them), for comparison; docs/servers.md has the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's pytest_llmperf

MODEL = "tiny-llama"
PROMPT_TOKENS = 128


# -- the double ---------------------------------------------------------------------------------------

def vllm_stream(output_len: int) -> list[bytes]:
    """The SSE events vLLM 0.32's server sends for a streamed completion with return_token_ids and usage."""
    base = {"id": "cmpl-double", "object": "text_completion", "created": 1, "model": MODEL}
    events = []
    for i in range(output_len):
        choice = {"index": 0, "text": " tok", "logprobs": None, "finish_reason": "length" if i == output_len - 1
                  else None, "stop_reason": None, "token_ids": [1000 + i]}
        chunk: dict[str, Any] = {**base, "choices": [choice], "usage": None}
        if i == 0:
            chunk["prompt_token_ids"] = list(range(1, PROMPT_TOKENS + 1))
        events.append(chunk)
    events.append({**base, "choices": [], "usage": {"prompt_tokens": PROMPT_TOKENS, "total_tokens":
                                                    PROMPT_TOKENS + output_len, "completion_tokens": output_len}})
    return [b"data: " + json.dumps(e, separators=(", ", ": ")).encode() + b"\n\n" for e in events] + \
        [b"data: [DONE]\n\n"]


def chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
        b"transfer-encoding: chunked\r\n\r\n")


async def serve(port: int, output_len: int, gap_s: float) -> None:
    """Answer every POST with the prebuilt stream; GET /_arrivals returns (and clears) the arrival times."""
    events = [chunked(e) for e in vllm_stream(output_len)]
    whole = HEAD + b"".join(events) + b"0\r\n\r\n"
    models = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
    arrivals: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            import socket
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                if length:
                    await reader.readexactly(length)
                arrived = time.monotonic_ns()
                if head.startswith(b"POST"):
                    arrivals.append(arrived)
                    if gap_s:
                        writer.write(HEAD)
                        for event in events:
                            writer.write(event)
                            await writer.drain()
                            await asyncio.sleep(gap_s)
                        writer.write(b"0\r\n\r\n")
                    else:
                        writer.write(whole)
                else:
                    body = json.dumps(arrivals).encode() if head.startswith(b"GET /_arrivals") else models
                    if head.startswith(b"GET /_arrivals"):
                        arrivals.clear()
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                                 % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


# -- the measurement ----------------------------------------------------------------------------------

def arrivals(url: str) -> list[int]:
    import httpx

    return json.loads(httpx.get(f"{url}/_arrivals", timeout=10).content)


def spread(times: list[int]) -> float:
    return (max(times) - min(times)) / 1e6


class RunStartClock:
    """perf_counter_ns (CLOCK_MONOTONIC, as the double's monotonic_ns) that remembers its first reading after
    `start = None`: a run's start, from which the backend counts `sent_ns`."""

    start: int | None = None

    def __call__(self) -> int:
        now = time.perf_counter_ns()
        if self.start is None:
            self.start = now
        return now


def measure_ours(url: str, batch_size: int, runs: int, output_len: int) -> dict[str, float]:
    """Our backend, as llmperf_vllm configures it: CPU and wall per run, send and arrival spreads."""
    from pytest_llmperf.measure.backend import GenerationRequest
    from pytest_llmperf.backends.models import make_prompt
    from pytest_llmperf.backends.openai_compat import OpenAICompatBackend

    clock = RunStartClock()
    backend = OpenAICompatBackend(url, model=MODEL, server_name="double", fixed_length="ignore_eos",
                                  truncate_prompt=True, token_ids=True, clock=clock)
    request = GenerationRequest(batch_size, PROMPT_TOKENS, output_len, make_prompt(PROMPT_TOKENS))
    try:
        for _ in range(max(10, runs // 10)):
            backend.generate(request)
        arrivals(url)
        walls, sends, wire, lag = [], [], [], []
        cpu0 = time.process_time()
        for _ in range(runs):
            clock.start = None
            t0 = time.perf_counter_ns()
            sample = backend.generate(request)
            walls.append((time.perf_counter_ns() - t0) / 1e6)
            assert sample.generated_tokens == batch_size * output_len, sample
            sends.append([clock.start + s for s in sample.sent_ns or []])  # sent_ns counts from the run's start
        cpu = time.process_time() - cpu0
    finally:
        backend.close()
    got = arrivals(url)
    for i, sent in enumerate(sends):  # the double saw the runs' requests in order, batch_size at a time
        wire.append(got[i * batch_size:(i + 1) * batch_size])
        lag.append(statistics.median(sorted(wire[-1])[k] - sorted(sent)[k] for k in range(batch_size)) / 1e6)
    return summary(cpu, walls, [spread(s) for s in sends], [spread(w) for w in wire], lag, batch_size, runs)


def measure_vllm(url: str, batch_size: int, runs: int, output_len: int) -> dict[str, float] | None:
    """vLLM's bench client against the same double: B requests started at once on one aiohttp session."""
    try:
        from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_completions
    except ImportError:
        return None
    import aiohttp

    from pytest_llmperf.backends.models import make_prompt

    prompt = make_prompt(PROMPT_TOKENS)

    async def all_runs() -> tuple[float, list[float], list[list[int]]]:
        # as bench serve's session: its connector settings (limit, keepalive) and timeout
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300, use_dns_cache=True,
                                         keepalive_timeout=60, enable_cleanup_closed=True, force_close=False)
        async with aiohttp.ClientSession(connector=connector, trust_env=True,
                                         timeout=aiohttp.ClientTimeout(total=6 * 60 * 60)) as session:
            inputs = RequestFuncInput(prompt=prompt, api_url=f"{url}/v1/completions", prompt_len=PROMPT_TOKENS,
                                      output_len=output_len, model=MODEL, extra_body={"temperature": 0.0,
                                                                                       "ignore_eos": True})

            async def run() -> list[float]:
                outs = await asyncio.gather(*(async_request_openai_completions(inputs, session)
                                              for _ in range(batch_size)))
                assert all(o.success for o in outs), [o.error for o in outs]
                return [o.start_time for o in outs]

            for _ in range(max(10, runs // 10)):
                await run()
            await asyncio.to_thread(arrivals, url)
            walls, starts = [], []
            cpu0 = time.process_time()
            for _ in range(runs):
                t0 = time.perf_counter()
                starts.append(await run())
                walls.append((time.perf_counter() - t0) * 1000)
            return time.process_time() - cpu0, walls, starts

    cpu, walls, starts = asyncio.run(all_runs())
    got = arrivals(url)
    sends = [[int(s * 1e9) for s in run] for run in starts]
    wire = [got[i * batch_size:(i + 1) * batch_size] for i in range(runs)]
    lag = [statistics.median(sorted(w)[k] - sorted(s)[k] for k in range(batch_size)) / 1e6
           for s, w in zip(sends, wire)]
    return summary(cpu, walls, [spread(s) for s in sends], [spread(w) for w in wire], lag, batch_size, runs)


def summary(cpu_s: float, walls: list[float], sends: list[float], wire: list[float], lag: list[float],
            batch_size: int, runs: int) -> dict[str, float]:
    return {"cpu_ms_per_request": cpu_s * 1000 / (runs * batch_size), "wall_ms_per_run": statistics.median(walls),
            "send_spread_ms": statistics.median(sends), "arrival_spread_ms": statistics.median(wire),
            "stamp_to_arrival_ms": statistics.median(lag)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="timed runs per batch size (after warmups)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--output-len", type=int, default=8)
    parser.add_argument("--token-gap-ms", type=float, default=0.0, help="the double's pause between chunks")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve, args.output_len, args.token_gap_ms / 1000))
        return
    from pytest_llmperf.processes import free_port

    port = free_port()
    double = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--output-len", str(args.output_len),
                               "--token-gap-ms", str(args.token_gap_ms)], stdout=subprocess.PIPE, text=True)
    try:
        assert double.stdout is not None and double.stdout.readline().strip() == "ready"
        url = f"http://127.0.0.1:{port}"
        load = os.getloadavg()
        rows = {}
        for bs in args.batch_sizes:
            rows[f"ours bs={bs}"] = measure_ours(url, bs, args.runs, args.output_len)
            theirs = measure_vllm(url, bs, args.runs, args.output_len)
            if theirs is not None:
                rows[f"vLLM bench bs={bs}"] = theirs
    finally:
        double.terminate()
        double.wait(10)
    print(f"\n{args.runs} runs per batch size, output {args.output_len} tokens, token gap {args.token_gap_ms} ms; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start")
    print("| client | CPU per request (ms) | wall per run (ms) | send spread (ms) | arrival spread (ms) | "
          "stamp to arrival (ms) |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['cpu_ms_per_request']:.3f} | {r['wall_ms_per_run']:.3f} | {r['send_spread_ms']:.3f} | "
              f"{r['arrival_spread_ms']:.3f} | {r['stamp_to_arrival_ms']:.3f} |")
    if args.json:
        args.json.write_text(json.dumps({"load": load, "args": vars(args) | {"json": str(args.json)}, "rows": rows},
                                        indent=1))


if __name__ == "__main__":
    main()
