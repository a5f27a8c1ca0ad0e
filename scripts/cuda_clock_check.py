"""Our clock beside CUDA events, on the same forwards: is what the HF backend times what the GPU spent?

The HF backend (backends/hf.py) reads a clock that synchronizes the device before each reading, so a prefill or
decode-step time is host work plus the GPU's kernels plus the sync. Here every forward of its loop is also
bracketed with `torch.cuda.Event(enable_timing=True)` records, and both are printed per phase: the events give
the device's span of each forward (from its first kernel's launch position in the stream to its last's end),
ours the whole step as a user of the engine waits for it (tokenization excluded, argmax and the cache
included). On a GPU machine:

    python scripts/cuda_clock_check.py --model llama-2-7b --batch-sizes 1 8 --runs 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama-2-7b")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--sequence-length", type=int, default=1024)
    parser.add_argument("--decode-length", type=int, default=8)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args()

    import torch

    from pytest_llmperf.backends.hf import HFBackend
    from pytest_llmperf.backends.models import resolve_model
    from pytest_llmperf.measure.backend import GenerationRequest
    from pytest_llmperf.measure.scenario import make_prompt

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this compares our clock with CUDA events on a GPU")
    path = resolve_model(args.model, local_models={}, cache_dir=Path(args.cache_dir) if args.cache_dir else None,
                         build_device="cuda")
    backend = HFBackend(path, name=args.model, dtype=args.dtype, device="cuda")
    spans: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    forward = backend.model.forward

    def timed_forward(*a, **kw):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = forward(*a, **kw)
        end.record()
        spans.append((start, end))
        return out

    backend.model.forward = timed_forward
    print(f"| model | batch | phase | ours (ms, median of {args.runs}) | CUDA events around the forward (ms) | "
          "ours - events (ms) |")
    print("|---|---|---|---|---|---|")
    for batch in args.batch_sizes:
        request = GenerationRequest(batch, args.sequence_length, args.decode_length, make_prompt(args.sequence_length))
        backend.generate(request)  # warmup
        ours: dict[str, list[float]] = {"prefill": [], "decode step": []}
        events: dict[str, list[float]] = {"prefill": [], "decode step": []}
        for _ in range(args.runs):
            spans.clear()
            sample = backend.generate(request)
            torch.cuda.synchronize()
            times = [s.elapsed_time(e) for s, e in spans]
            ours["prefill"].append(sample.prefill_ns / 1e6)
            events["prefill"].append(times[0])
            ours["decode step"] += [step / 1e6 for step in sample.decode_steps_ns]
            events["decode step"] += times[1:]
        for phase in ("prefill", "decode step"):
            mine, theirs = statistics.median(ours[phase]), statistics.median(events[phase])
            print(f"| {args.model} | {batch} | {phase} | {mine:.3f} | {theirs:.3f} | {mine - theirs:+.3f} |")
    backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
