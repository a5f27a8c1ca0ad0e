"""A simulated engine: timings from a cost model with seeded noise, no model, no sleeping.

For testing the gate and the plugin deterministically (a slowdown is a factor, not a guess), and
for users who want to see what their alpha/rtol settings catch before running real hardware.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from ..measure.backend import Backend, GenerationRequest, OutOfMemory
from ..measure.records import RunSample


class SimulatedBackend(Backend):
    kind = "simulated"
    splits_prefill: ClassVar[bool] = True

    def __init__(
        self,
        *,
        prefill_ms_per_token: float = 0.05,
        decode_ms: float = 5.0,
        decode_ms_per_seq: float = 0.5,
        noise: float = 0.02,
        seed: int = 0,
        prefill_slowdown: float = 1.0,
        decode_slowdown: float = 1.0,
        oom_from_batch: int | None = None,
        fail_at: Mapping[int, str] | None = None,
        first_token: int = 100,
        changed_from: int | None = None,
    ) -> None:
        super().__init__()
        self.prefill_ms_per_token = prefill_ms_per_token
        self.decode_ms = decode_ms
        self.decode_ms_per_seq = decode_ms_per_seq
        self.noise = noise
        self.prefill_slowdown = prefill_slowdown
        self.decode_slowdown = decode_slowdown
        self.oom_from_batch = oom_from_batch
        self.fail_at = dict(fail_at or {})
        # Generated ids: first_token, first_token + 1, ... (greedy and deterministic, as an in-process engine's);
        # from position `changed_from` on, every id is one higher: a change that alters the outputs.
        self.first_token = first_token
        self.changed_from = changed_from
        self.rng = np.random.default_rng(seed)
        self.calls = 0

    def _jitter(self) -> float:
        return float(np.exp(self.rng.normal(0.0, self.noise)))

    def generate(self, request: GenerationRequest) -> RunSample:
        self.calls += 1
        bs = request.batch_size
        if self.oom_from_batch is not None and bs >= self.oom_from_batch:
            raise OutOfMemory(f"simulated: batch size {bs} does not fit")
        if bs in self.fail_at:
            raise RuntimeError(self.fail_at[bs])
        ms = 1_000_000
        tokenize = int(0.1 * ms)
        prefill = int(
            self.prefill_ms_per_token * request.sequence_length * bs * ms * self.prefill_slowdown * self._jitter()
        )
        steps = [
            int((self.decode_ms + self.decode_ms_per_seq * bs) * ms * self.decode_slowdown * self._jitter())
            for _ in range(request.decode_length - 1)
        ]
        times = [tokenize + prefill]
        for step in steps:
            times.append(times[-1] + step)
        ids = [
            self.first_token + i + (self.changed_from is not None and i >= self.changed_from)
            for i in range(request.decode_length)
        ]
        return RunSample(
            batch_size=bs,
            token_times_ns=[list(times) for _ in range(bs)],
            end_to_end_ns=times[-1],
            tokenize_ns=tokenize,
            prefill_ns=prefill,
            decode_steps_ns=steps,
            detokenize_ns=int(0.05 * ms),
            generated_tokens=bs * request.decode_length,
            output_ids=[list(ids) for _ in range(bs)],
            output_texts=[" ".join(f"t{t}" for t in ids) for _ in range(bs)],
        )

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.kind,
            "model": "simulated",
            "dtype": "fp32",
            "device": "cpu",
            "prefill_ms_per_token": self.prefill_ms_per_token,
            "decode_ms": self.decode_ms,
        }
