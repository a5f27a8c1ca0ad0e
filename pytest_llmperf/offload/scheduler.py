"""Per-layer decision for experts that are not resident: run on the slow tier (CPU) or fetch.

Fiddler enumerates all 2^E splits (and minimises the sum, not the makespan it describes). We balance
the makespan `max(cpu_total, fast_total)` greedily, which is O(E log E) and scales to 64+ experts:

1. The fast tier starts with the cost of the resident experts that have tokens.
2. Non-resident experts are taken in decreasing order of their cheaper cost (longest first, as in LPT
   scheduling) and each goes where it would finish earlier; a tie goes to the fast tier.
3. The result is compared with the per-expert rule (each expert where it alone is cheaper, Fiddler's
   decision) and the smaller makespan wins, so the greedy plan is never worse than Fiddler's.

With Fiddler's costs (7 per token, 70 per fetch) a lone non-resident expert therefore runs on CPU
exactly when it has fewer than 10 tokens.

With a live cost model (online.py) the `makespan` and `fiddler` schedules also probe: when a tier that
learns has gone unused for a while, the plan sends it the non-resident expert with the fewest tokens once,
so a start-up figure that is too high for that tier gets observed and corrected.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .costs import CostModel
from .online import OnlineCosts

SCHEDULES = ("makespan", "fiddler", "cpu", "fetch")


@dataclass(frozen=True)
class LayerPlan:
    """Where each expert with tokens runs in one layer's forward."""

    resident: tuple[int, ...]  # on the fast tier already
    cpu: tuple[int, ...]  # run on the slow tier by the worker thread
    fetch: tuple[int, ...]  # copied to the fast tier's staging buffers, then run there
    cpu_ms: float = 0.0  # the cost model's estimate of each side
    fast_ms: float = 0.0
    sequential: bool = False  # run the two sides one after the other (Fiddler), not overlapped

    @property
    def makespan_ms(self) -> float:
        return self.cpu_ms + self.fast_ms if self.sequential else max(self.cpu_ms, self.fast_ms)


def both_sides(plan: LayerPlan) -> bool:
    """CPU experts and fast-tier work in one layer: the only plans where overlapping them matters."""
    return bool(plan.cpu) and bool(plan.resident or plan.fetch)


@dataclass
class Scheduler:
    """Plans one layer from its per-expert token counts. `schedule` is one of SCHEDULES:

    - `makespan` (default): greedy makespan balance, the two tiers overlapped;
    - `fiddler`: Fiddler's published policy, each expert where it alone is cheaper, tiers run one after the other;
    - `cpu`: every non-resident expert on the slow tier (llama.cpp's `--cpu-moe`);
    - `fetch`: every non-resident expert fetched (mixtral-offloading's policy, without its cache).
    """

    costs: CostModel | OnlineCosts
    schedule: str = "makespan"

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule {self.schedule!r} is not one of {', '.join(SCHEDULES)}")

    def plan(self, counts: Sequence[int], resident: Sequence[bool]) -> LayerPlan:
        if len(counts) != len(resident):
            raise ValueError(f"{len(counts)} token counts for {len(resident)} experts")
        c = self.costs
        res = tuple(e for e, n in enumerate(counts) if n > 0 and resident[e])
        todo = [e for e, n in enumerate(counts) if n > 0 and not resident[e]]
        fast0 = sum(c.resident_ms(int(counts[e])) for e in res)
        # Each expert priced once per plan: a live model's prices are not free to look up.
        p = Prices(
            res,
            fast0,
            {e: c.cpu_ms(int(counts[e])) for e in todo},
            {e: c.fetch_ms(int(counts[e])) for e in todo},
            tuple(int(n) for n in counts),
        )
        if self.schedule == "cpu":
            return p.plan(todo, [])
        if self.schedule == "fetch":
            return p.plan([], todo)
        per_expert_cpu = [e for e in todo if p.cpu[e] < p.fetch[e]]
        per_expert_fetch = [e for e in todo if e not in per_expert_cpu]
        fiddler = p.plan(per_expert_cpu, per_expert_fetch, sequential=self.schedule == "fiddler")
        if self.schedule == "fiddler":
            return self._probe(fiddler, p)
        greedy = self._greedy(todo, p)
        best = self._probe(greedy if greedy.makespan_ms <= fiddler.makespan_ms else fiddler, p)
        return self._mode(best, fiddler, p)

    def _mode(self, overlapped: LayerPlan, rule: LayerPlan, p: Prices) -> LayerPlan:
        """With a live model that learns modes: the overlapped plan or the per-expert rule run one side after
        the other, whichever is cheaper once each is scaled by what such layers really took (online.py)."""
        c = self.costs
        if not isinstance(c, OnlineCosts) or not c.learns("overlap"):
            return overlapped
        if not both_sides(overlapped):  # CPU experts alone: nothing to overlap them with, so no hand-off
            return p.plan(overlapped.cpu, overlapped.fetch, sequential=bool(overlapped.cpu))
        sequential = p.plan(rule.cpu, rule.fetch, sequential=True)
        tokens = sum(p.counts)
        if c.wants_probe("overlap"):
            c.probed("overlap")
            return overlapped
        if both_sides(sequential) and c.wants_probe("sequential"):
            c.probed("sequential")
            c.sequential_plans += 1
            return sequential
        if sequential.makespan_ms * c.scale("sequential", tokens) < overlapped.makespan_ms * c.scale("overlap", tokens):
            c.sequential_plans += both_sides(sequential)
            return sequential
        return overlapped

    def _probe(self, plan: LayerPlan, p: Prices) -> LayerPlan:
        """With a live model: move the smallest expert to a learning tier this plan leaves unused and
        that has gone unobserved for `probe_every` plans (see the module docstring)."""
        c = self.costs
        if not isinstance(c, OnlineCosts):
            return plan
        c.planned()
        smallest = lambda experts: min(experts, key=lambda e: (p.counts[e], e))  # noqa: E731
        if not plan.cpu and plan.fetch and c.wants_probe("cpu"):
            e = smallest(plan.fetch)
            c.probed("cpu")
            return p.plan([e], [f for f in plan.fetch if f != e], plan.sequential)
        if not plan.fetch and plan.cpu and (c.wants_probe("copy") or c.wants_probe("gpu")):
            e = smallest(plan.cpu)
            c.probed("copy")
            return p.plan([f for f in plan.cpu if f != e], [e], plan.sequential)
        return plan

    @staticmethod
    def _greedy(todo: list[int], p: Prices) -> LayerPlan:
        order = sorted(todo, key=lambda e: (-min(p.cpu[e], p.fetch[e]), e))
        cpu_t, fast_t = 0.0, p.fast0
        cpu, fetch = [], []
        for e in order:
            if cpu_t + p.cpu[e] < fast_t + p.fetch[e]:
                cpu.append(e)
                cpu_t += p.cpu[e]
            else:
                fetch.append(e)
                fast_t += p.fetch[e]
        return p.plan(sorted(cpu), sorted(fetch))


@dataclass(frozen=True)
class Prices:
    """One layer's experts priced once: resident cost, and each non-resident expert on either tier."""

    resident: tuple[int, ...]
    fast0: float
    cpu: dict[int, float]
    fetch: dict[int, float]
    counts: tuple[int, ...]

    def plan(self, cpu: Sequence[int], fetch: Sequence[int], sequential: bool = False) -> LayerPlan:
        return LayerPlan(
            resident=self.resident,
            cpu=tuple(cpu),
            fetch=tuple(fetch),
            cpu_ms=sum(self.cpu[e] for e in cpu),
            fast_ms=self.fast0 + sum(self.fetch[e] for e in fetch),
            sequential=sequential,
        )
