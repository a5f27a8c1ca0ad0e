"""`OffloadEngine`: load a transformers MoE model with its experts split between a fast and a slow tier.

    engine = OffloadEngine("/models/mixtral", OffloadOptions(dtype="bf16", expert_budget_gb=20))
    out = engine.generate(input_ids, max_new_tokens=8)     # greedy; tokens equal model.generate
    out.counters["hit_rate"], engine.report()["costs"]
    engine.calibrate([input_ids], max_new_tokens=32, path="popularity.json")  # then OffloadOptions(popularity=...)
    engine.close()

Start-up: non-expert weights go to the fast device; the expert budget is computed (user budget and
free memory minus a computed reserve); experts are ranked (popularity profile or round robin) and
split into tiers; the cost model is measured; the model's experts implementation is switched to ours.
While it runs, the live cost model (online.py) corrects the measured costs from the engine's own timings.
`generate` returns a `Generation`: the new tokens, per-step times and counters.

`OffloadEngine.from_config` makes a MoE model with random weights in place (`random_model`), for shapes whose
checkpoint cannot be stored: non-expert weights are made directly on the fast device (from the meta device,
nothing read from disk); the experts are generated there too, per layer, when the engine splits them into tiers.
Timing depends on shapes, not weights.

`OffloadOptions`: everything the engine can be told, checked (`validated`) before anything is loaded.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import psutil
import torch

from ..measure.backend import Clock, perf_counter_clock, synchronized_clock
from .costs import CostModel, fixed_costs, measure_costs
from .experts import OffloadedLayer, detach_experts
from .online import OnlineCosts
from .placement import (
    Budget,
    GiB,
    PlacementError,
    options_budget,
    place,
    profile_ranking,
    read_profile,
    round_robin_ranking,
    write_profile,
)
from .runtime import OffloadStats, Runtime, Staging, host_empty, torch_threads
from .scheduler import SCHEDULES, Scheduler
from .seam import IMPLEMENTATION, ExpertsSite, OffloadError, find_experts, register_implementation

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def physical_cores() -> int:
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


@dataclass(frozen=True)
class OffloadOptions:
    """Everything the engine can be told. Each field is documented in docs/offload.md."""

    fast_device: str = "auto"  # "auto": cuda if available, else cpu
    slow_device: str = "cpu"
    dtype: str = "fp32"
    expert_budget_gb: float | None = None  # most GiB of experts on the fast tier (None: as many as fit)
    device_memory_gb: float | None = None  # emulate a fast device of this size (e.g. 24 for an RTX 3090)
    reserve_gb: float | None = None  # fast memory for KV + activations; None: computed. Staging is added on top
    max_batch_size: int = 8  # the reserve is sized for this batch ...
    max_seq_len: int = 1024  # ... and this many tokens per sequence
    popularity: str | None = None  # a profile JSON from calibrate(); None: round robin across layers
    schedule: str = "makespan"  # makespan | fiddler | cpu | fetch
    latency_cpu: float | None = None  # override: slow-tier ms per token (Fiddler's 7)
    latency_gpu: float | None = None  # override: ms per fetched expert (Fiddler's 70)
    online_costs: bool = True  # correct the (non-overridden) costs from the engine's own timings while it runs
    online_window: int = 8  # observations per tier and token-count bucket the live estimate is the median of
    online_probe_every: int = 32  # plans a learning tier may go unobserved before one expert is sent there
    threads: int | None = None  # torch threads during generate; None: physical cores (split with the worker on cpu)
    overlap: bool = True  # run CPU experts on the worker thread while the fast tier works
    pin_memory: bool | None = None  # pin the slow tier; None: when the fast device is CUDA
    cpu_timeout_s: float | None = 300.0  # a worker-thread CPU job slower than this is an error, not a hang

    def validated(self) -> OffloadOptions:
        def bad(name: str, value: Any, want: str) -> OffloadError:
            return OffloadError(f"offload option {name}={value!r}: {want}")

        if self.dtype not in DTYPES:
            raise bad("dtype", self.dtype, f"use one of {', '.join(DTYPES)}")
        if self.schedule not in SCHEDULES:
            raise bad("schedule", self.schedule, f"use one of {', '.join(SCHEDULES)}")
        for name in (
            "expert_budget_gb",
            "device_memory_gb",
            "reserve_gb",
            "latency_cpu",
            "latency_gpu",
            "cpu_timeout_s",
        ):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or value < 0 or math.isnan(value)):
                raise bad(name, value, "use a number >= 0, or leave it unset")
        if not isinstance(self.online_costs, bool):
            raise bad("online_costs", self.online_costs, "use True or False")
        for name in ("max_batch_size", "max_seq_len", "online_window", "online_probe_every"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise bad(name, getattr(self, name), "use an integer >= 1")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise bad("threads", self.threads, "use an integer >= 1, or leave it unset for the physical core count")
        fast = self.resolved_fast_device()
        if torch.device(fast).type == "cuda" and not torch.cuda.is_available():
            raise bad("fast_device", self.fast_device, "CUDA is not available here; use fast_device='cpu'")
        if torch.device(self.slow_device).type != "cpu":
            raise bad("slow_device", self.slow_device, "the slow tier is host memory; use 'cpu'")
        return self

    def resolved_fast_device(self) -> str:
        if self.fast_device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.fast_device


class OffloadEngine:
    """A transformers MoE model whose experts live on two tiers. See the module docstring."""

    def __init__(
        self,
        model_path: str | Path,
        options: OffloadOptions | None = None,
        *,
        costs: CostModel | None = None,
        clock: Clock | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        options = (options or OffloadOptions()).validated()
        self.model_path: Path | None = Path(model_path)  # None: a model from memory or a config
        try:
            tokenizer = AutoTokenizer.from_pretrained(self.model_path, local_files_only=True)
            # Loaded on the host first: experts are split into tiers before anything reaches the device.
            model = AutoModelForCausalLM.from_pretrained(
                self.model_path, local_files_only=True, dtype=DTYPES[options.dtype]
            )
        except OSError as exc:
            raise OffloadError(f"cannot load model from {self.model_path}: {exc}") from exc
        self._setup(model, tokenizer, options, costs, clock, name=str(model_path))

    @classmethod
    def from_model(
        cls,
        model: torch.nn.Module,
        tokenizer: Any = None,
        options: OffloadOptions | None = None,
        *,
        costs: CostModel | None = None,
        clock: Clock | None = None,
        name: str | None = None,
    ) -> OffloadEngine:
        """Wrap a model already in memory (on the host). The engine takes it over: its experts are moved."""
        self = cls.__new__(cls)
        self.model_path = None
        options = (options or OffloadOptions()).validated()
        self._setup(
            model.to(DTYPES[options.dtype]), tokenizer, options, costs, clock, name=name or type(model).__name__
        )
        return self

    @classmethod
    def from_config(
        cls,
        config: Any,
        tokenizer: Any = None,
        options: OffloadOptions | None = None,
        *,
        costs: CostModel | None = None,
        clock: Clock | None = None,
        seed: int = 0,
        name: str | None = None,
    ) -> OffloadEngine:
        """A model with random weights made in place (nothing read from disk): non-expert weights directly on
        the fast device, experts generated there and split into tiers. For shapes too big to save,
        e.g. Mixtral-8x7B on a machine with a 64 GB disk. Timing depends on shapes, not weights."""
        options = (options or OffloadOptions()).validated()
        model, sites, random_weights = random_model(config, options, seed)

        self = cls.__new__(cls)
        self.model_path = None
        self._setup(
            model,
            tokenizer,
            options,
            costs,
            clock,
            name=name or f"{type(model).__name__} (random)",
            weight_source=random_weights,
            sites=sites,
        )
        return self

    # -- start-up ---------------------------------------------------------------------------------

    def _setup(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        options: OffloadOptions,
        costs: CostModel | None,
        clock: Clock | None,
        *,
        name: str,
        weight_source: Any = None,
        sites: Any = None,
    ) -> None:
        self.name = name
        self.options = options
        self.tokenizer = tokenizer
        self.fast = torch.device(options.resolved_fast_device())
        self.slow = torch.device(options.slow_device)
        self.dtype = DTYPES[options.dtype]
        self.threads = options.threads or physical_cores()
        self._closed = False
        config = model.config
        sites = sites if sites is not None else find_experts(model)
        self.sites = sites
        self.num_layers = len(sites)
        self.num_experts = sites[0].num_experts
        if any(s.num_experts != self.num_experts for s in sites):
            raise OffloadError("MoE layers with different expert counts are not supported yet")

        # 1. Take the experts out of the model, move everything else to the fast device.
        if weight_source is None:
            source, gu_shape, dn_shape = detach_experts(sites)
        else:
            source = weight_source
            gu_shape, dn_shape = source(sites[0])[1:]
        model.to(self.fast)
        self.model = model.eval()
        elem = torch.empty(0, dtype=self.dtype).element_size()
        self.expert_bytes = int((math.prod(gu_shape[1:]) + math.prod(dn_shape[1:])) * elem)

        # 2. The budget: user budget vs free memory minus a computed reserve.
        self.budget = self._plan_budget(config, elem)
        # 3. Ranking and placement.
        if options.popularity:
            counts = read_profile(Path(options.popularity), num_layers=self.num_layers, num_experts=self.num_experts)
            ranking, self.ranking_source = profile_ranking(counts), f"profile {options.popularity}"
        else:
            ranking, self.ranking_source = round_robin_ranking(self.num_layers, self.num_experts), "round robin"
        self.resident = place(ranking, self.budget.n_experts, self.num_layers, self.num_experts)

        # 4. Tiers, staging, worker, stats.
        pin = options.pin_memory if options.pin_memory is not None else self.fast.type == "cuda"
        self.stats = OffloadStats(self.num_layers, self.num_experts)
        staging = Staging(gu_shape[1:], dn_shape[1:], self.dtype, self.fast)
        base_costs = costs
        self.runtime = Runtime(
            fast=self.fast,
            slow=self.slow,
            stats=self.stats,
            staging=staging,
            scheduler=Scheduler(costs or fixed_costs(1.0, 1.0, self.expert_bytes), options.schedule),  # measured below
            expert_bytes=self.expert_bytes,
            threads=self.threads,
            # Both sides compute on the same cores only when the fast tier is the CPU
            # (measured: docs/offload.md, "Threads").
            split_threads=self.fast.type == "cpu",
            cpu_timeout_s=options.cpu_timeout_s,
            overlap=options.overlap,
            clock=clock or perf_counter_clock,
        )
        self.layers = []
        for site in sites:
            weights, _, _ = source(site)
            self.layers.append(OffloadedLayer(site, self.resident[site.layer], self.runtime, weights, pin))
        self.pinned = all(layer.pinned for layer in self.layers if layer.slow_gate_up is not None)

        # 5. The cost model, measured here on one expert of the real shape (unless injected).
        if base_costs is None:
            base_costs = self._measure_costs(pin)
        elif base_costs.source == "measured" and base_costs.calibration is None:
            base_costs = replace(base_costs, source="injected")  # the report says how the costs were obtained
        self.measured_costs = base_costs
        # What set_costs(None) goes back to: the measured (or injected) model with the options' overrides.
        try:
            self.startup_costs = base_costs.with_overrides(
                base_costs.latency_cpu if options.latency_cpu is None else options.latency_cpu,
                base_costs.latency_gpu if options.latency_gpu is None else options.latency_gpu,
            )
        except ValueError as exc:
            raise OffloadError(str(exc)) from None
        self.runtime.scheduler = Scheduler(self._live(self.startup_costs), options.schedule)

        # 6. Switch the experts implementation (the registry is global; the state lives on the modules).
        register_implementation()
        model.set_experts_implementation(IMPLEMENTATION)
        if model.config._experts_implementation != IMPLEMENTATION:
            raise OffloadError(f"{type(model).__name__} did not accept experts_implementation={IMPLEMENTATION!r}")
        if self.fast.type == "cuda":
            self.clock: Clock = synchronized_clock(torch.cuda.synchronize, clock or perf_counter_clock)
        else:
            self.clock = clock or perf_counter_clock

    def _plan_budget(self, config: Any, elem: int) -> Budget:
        o = self.options
        free = torch.cuda.mem_get_info(self.fast)[0] if self.fast.type == "cuda" else psutil.virtual_memory().available
        if o.device_memory_gb is not None:  # an emulated card: its size minus what we already put on it
            on_device = sum(t.numel() * t.element_size() for t in (*self.model.parameters(), *self.model.buffers()))
            free = min(free, int(o.device_memory_gb * GiB) - on_device)
        try:
            return options_budget(config, o, int(free), self.expert_bytes, self.num_layers * self.num_experts, elem)
        except PlacementError as exc:
            raise OffloadError(str(exc)) from None

    def _measure_costs(self, pin: bool) -> CostModel:
        """Measured on the slow tier's own storage (pinned where it is): fetches copy from there, and a
        pageable copy of a resident expert would time the wrong bandwidth."""
        if (layer := next((lay for lay in self.layers if lay.slow_gate_up is not None), None)) is not None:
            assert layer.slow_gate_up is not None and layer.slow_down is not None  # the tier is set as a pair
            gu, dn = layer.slow_gate_up[0], layer.slow_down[0]
        else:  # every expert is resident (nothing is ever fetched): a slow-tier-like host copy of one
            layer = self.layers[0]
            assert layer.fast_gate_up is not None and layer.fast_down is not None
            gu, pinned = host_empty(layer.fast_gate_up[0].shape, self.dtype, pin)
            dn, _ = host_empty(layer.fast_down[0].shape, self.dtype, pinned)
            gu.copy_(layer.fast_gate_up[0])
            dn.copy_(layer.fast_down[0])
        with self.threads_applied():
            return measure_costs(slow_weights=(gu, dn), fast_device=str(self.fast), act=layer.module.act_fn)

    # -- running ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def threads_applied(self, threads: int | None = None) -> Iterator[None]:
        """torch's thread count is process-wide: set it for the duration, then restore it."""
        self.runtime.threads = threads or self.threads
        with torch_threads(self.runtime.threads):
            yield

    def _live(self, costs: CostModel) -> OnlineCosts:
        o = self.options
        # Modes only where both tiers compute on the host: the layer's wall time is then the work itself.
        return OnlineCosts(
            costs,
            window=o.online_window,
            probe_every=o.online_probe_every,
            enabled=o.online_costs,
            modes=o.overlap and self.fast.type == "cpu",
        )

    def set_costs(
        self, *, latency_cpu: float | None = None, latency_gpu: float | None = None, schedule: str | None = None
    ) -> None:
        """Change the cost overrides and the schedule between runs. For the costs, None means the start-up
        value (OffloadOptions.latency_cpu / latency_gpu if set, else the measured or injected cost); for
        the schedule, None keeps the current one. The live model starts again from the start-up costs."""
        base = self.startup_costs
        try:
            costs = base.with_overrides(
                base.latency_cpu if latency_cpu is None else latency_cpu,
                base.latency_gpu if latency_gpu is None else latency_gpu,
            )
            self.runtime.scheduler = Scheduler(self._live(costs), schedule or self.runtime.scheduler.schedule)
        except ValueError as exc:
            raise OffloadError(str(exc)) from None

    @property
    def costs(self) -> OnlineCosts:
        """The live cost model in use (its `base` is the start-up model with the overrides)."""
        return cast(OnlineCosts, self.runtime.scheduler.costs)  # every engine scheduler is built on live costs

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, *, clock: Clock | None = None) -> Generation:
        """Greedy decoding over the KV cache for exactly `max_new_tokens` tokens; counters cover this call."""
        if self._closed:
            raise OffloadError("the engine is closed")
        if max_new_tokens < 1:
            raise OffloadError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        clock = clock or self.clock
        model = self.model
        self.stats.reset()
        live = self.costs
        seen, probes, sequential = sum(live.observations.values()), live.probes, live.sequential_plans
        input_ids = input_ids.to(self.fast)
        times: list[int] = []
        with self.threads_applied(), torch.inference_mode():
            start = clock()
            self.runtime.phase = "prefill"
            try:
                out = model(input_ids=input_ids, use_cache=True, logits_to_keep=1)
                token = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
                times.append(clock())
                past = getattr(out, name := "cache" if hasattr(out, "cache") else "past_key_values")  # 5.24 on: cache
                tokens = [token]
                self.runtime.phase = "decode"
                for _ in range(max_new_tokens - 1):
                    out = model(input_ids=token, use_cache=True, **{name: past})
                    past = getattr(out, name)
                    token = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
                    tokens.append(token)
                    times.append(clock())
            finally:
                # A direct `engine.model(...)` call after a failed run must not count as decode.
                self.runtime.phase = "prefill"
        rel = [t - start for t in times]
        counters = self.stats.counters()  # settles CUDA timings first: they feed the live model
        counters.update(
            live.counters(),
            **{
                "costs.observations": float(sum(live.observations.values()) - seen),
                "costs.probes": float(live.probes - probes),
                "costs.sequential_plans": float(live.sequential_plans - sequential),
            },
        )
        return Generation(
            tokens=torch.cat(tokens, dim=1),
            step_times_ns=rel,
            prefill_ns=rel[0],
            decode_steps_ns=[b - a for a, b in itertools.pairwise(rel)],
            counters=counters,
        )

    def calibrate(self, inputs: Sequence[torch.Tensor], max_new_tokens: int, path: str | Path) -> Path:
        """Run `inputs` and write the popularity profile (token-expert assignments per layer and expert)."""
        total = np.zeros((self.num_layers, self.num_experts), dtype=np.int64)
        tokens = 0
        for ids in inputs:
            self.generate(ids, max_new_tokens)
            total += self.stats.assignments.sum(axis=0)
            tokens += int(ids.numel()) + ids.shape[0] * (max_new_tokens - 1)
        return write_profile(Path(path), total, model=self.name, tokens=tokens)

    def report(self) -> dict[str, Any]:
        """Start-up decisions, for logs and `describe()`: budget, placement, costs (start-up and live), devices."""
        return {
            "model": self.name,
            "fast_device": str(self.fast),
            "slow_device": str(self.slow),
            "dtype": self.options.dtype,
            "experts": self.num_layers * self.num_experts,
            "moe_layers": self.num_layers,
            "fast_experts_per_layer": [sum(r) for r in self.resident],
            "ranking": self.ranking_source,
            "budget": self.budget.summary(),
            "costs": self.costs.summary(),  # start-up model, how it was obtained, and the live model
            "schedule": self.runtime.scheduler.schedule,
            "overlap": self.options.overlap,
            "slow_tier_pinned": self.pinned,
            "threads": self.threads,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "options": asdict(self.options),
        }

    def close(self) -> None:
        """Stop the worker thread and free both tiers. Safe to call twice."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self.runtime.close()
        for layer in self.layers:
            layer.module._llmperf_offload = None
            layer.fast_gate_up = layer.fast_down = layer.slow_gate_up = layer.slow_down = None
        self.layers = []
        self.model = None
        if self.fast.type == "cuda":
            torch.cuda.empty_cache()

    def __enter__(self) -> OffloadEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Generation:
    """One greedy generation: the new tokens, per-step times (ns, from the engine's clock) and counters."""

    tokens: torch.Tensor  # [batch, new_tokens]
    step_times_ns: list[int]  # time at which each new token was available, from the start of prefill
    prefill_ns: int
    decode_steps_ns: list[int]
    counters: dict[str, float] = field(default_factory=dict)


def random_model(
    config: Any, options: OffloadOptions, seed: int = 0
) -> tuple[torch.nn.Module, list[ExpertsSite], Callable[[Any], Any]]:
    """The model (on the fast device, experts emptied), its experts sites, and the engine's weight source:
    `source(site)` gives `(make(ids) -> (gate_up, down), gate_up_shape, down_shape)` for that layer."""
    from transformers import AutoModelForCausalLM

    fast = torch.device(options.resolved_fast_device())
    dtype = DTYPES[options.dtype]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    sites = find_experts(model)
    gen = torch.Generator(device=fast).manual_seed(seed)
    shapes = {id(s.module): (tuple(s.module.gate_up_proj.shape), tuple(s.module.down_proj.shape)) for s in sites}
    for s in sites:
        s.adapter.detach(s.module, torch.device("meta"))
    model.to_empty(device=fast)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.numel() == 0:
                continue
            if "norm" in pname:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
        model.apply(reinit_buffers)

    def random_weights(site: Any) -> Any:
        gu_shape, dn_shape = shapes[id(site.module)]

        def make(ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
            gu = torch.empty((len(ids), *gu_shape[1:]), dtype=dtype, device=fast).normal_(0, 0.02, generator=gen)
            dn = torch.empty((len(ids), *dn_shape[1:]), dtype=dtype, device=fast).normal_(0, 0.02, generator=gen)
            return gu, dn

        return make, gu_shape, dn_shape

    return model, sites, random_weights


def reinit_buffers(module: torch.nn.Module) -> None:
    """Buffers made on the meta device (rotary `inv_freq`) hold garbage after `to_empty`: recompute them."""
    if not (hasattr(module, "inv_freq") and hasattr(module, "rope_type")):
        return
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    init = (
        module.compute_default_rope_parameters
        if module.rope_type == "default"
        else ROPE_INIT_FUNCTIONS[module.rope_type]
    )
    inv_freq, _ = init(module.config)
    module.inv_freq.copy_(inv_freq)
    if isinstance(getattr(module, "original_inv_freq", None), torch.Tensor):
        module.original_inv_freq.copy_(inv_freq)
