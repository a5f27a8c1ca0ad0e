"""Overhead of the HF backend's measurement per decode step, against a bare loop of model(...) calls.

Both decode over the same KV cache shapes (embedded tiny-llama, batch 1, fp32); they alternate
(ABAB...) so a disturbance on a shared machine hits both alike. Prints medians and the overhead.
Usage: python scripts/harness_overhead.py [--reps 30] [--steps 64] [--threads 2]
"""

import argparse
import statistics
import time
from pathlib import Path

import torch

from pytest_llmperf.measure.backend import GenerationRequest
from pytest_llmperf.backends.hf import HFBackend
from pytest_llmperf.backends.models import default_cache_dir, make_prompt, resolve_model


def bare_loop_step_ns(model, input_ids, steps: int) -> float:
    with torch.inference_mode():
        out = model(input_ids=input_ids, use_cache=True, logits_to_keep=1)
        token = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
        past = out.past_key_values
        start = time.perf_counter_ns()
        for _ in range(steps - 1):
            out = model(input_ids=token, past_key_values=past, use_cache=True)
            past = out.past_key_values
            token = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
        return (time.perf_counter_ns() - start) / (steps - 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = resolve_model("tiny-llama", local_models={}, cache_dir=default_cache_dir())
    backend = HFBackend(Path(path), name="tiny-llama")
    request = GenerationRequest(1, 128, args.steps, make_prompt(128))
    input_ids = backend._token_ids(request)
    bare, harness = [], []
    for _ in range(3):  # warm up both
        bare_loop_step_ns(backend.model, input_ids, args.steps)
        backend.generate(request)
    for _ in range(args.reps):
        bare.append(bare_loop_step_ns(backend.model, input_ids, args.steps))
        sample = backend.generate(request)
        harness.append(sum(sample.decode_steps_ns) / len(sample.decode_steps_ns))
    b, h = statistics.median(bare), statistics.median(harness)
    print(f"bare loop: {b / 1e6:.3f} ms/step, harness: {h / 1e6:.3f} ms/step, overhead {100 * (h / b - 1):+.2f}% "
          f"(medians of {args.reps} interleaved reps of {args.steps - 1} decode steps)")


if __name__ == "__main__":
    main()
