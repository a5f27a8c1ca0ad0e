"""What NVML says about the GPUs around one run: energy, clocks and throttling.

- `energy_j`: the difference of `nvmlDeviceGetTotalEnergyConsumption` (millijoules since the driver
  loaded; Volta and newer) over the run, summed over the GPUs; metrics.py divides it by the generated
  tokens (`energy_j_per_token`). The counter advances in steps, every 100 ms on an H100 (docs/gpu.md,
  scripts/nvml_energy_steps.py): a run of 60 ms saw 0 or 1 step. So a run gets its own figure only when it
  lasted ENERGY_MIN_RUN_S (ten steps, within 10%), and the report gives each batch size's energy over all
  its runs, whose steps add up.
- `sm_clock_mhz`, `sm_clock_max_mhz`: the lowest SM clock of the GPUs at the end of the run, and that
  GPU's maximum SM clock.
- `throttle_reasons`: NVML's clock-event reasons seen at the start or the end of the run, OR-ed, with
  the idle and application-setting bits left out (they are not slowdowns). A run whose GPU throttled
  (thermal, hardware slowdown, or a power cap that cost clock speed) is flagged in the report and
  warned about: its timings say more about the cooling than about the code.

Absent on a CPU target and wherever NVML cannot answer: never estimated.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

# nvmlClocksEventReason* / nvmlClocksThrottleReason* bits (nvml.h)
THROTTLE_REASONS = {
    0x2: "applications clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake slowdown",
    0x100: "display clocks setting",
}
#: Bits that are not a slowdown of a busy GPU: idle (0x1), clocks the user set (0x2, 0x100).
NOT_SLOWDOWNS = 0x1 | 0x2 | 0x100
#: Bits that a busy GPU sets while it runs at its power limit, at hardly lower clocks: an H100 decoding a 7B
#: model reported the software power cap in most runs at 1965 of its 1980 MHz (docs/gpu.md). They count as
#: throttling only when the SM clock fell below CLOCK_FLOOR of its maximum.
POWER_MANAGEMENT = 0x4 | 0x10
CLOCK_FLOOR = 0.95
#: Shortest run whose own energy figure is kept: ten of the counter's 100 ms steps (measured on an H100).
ENERGY_MIN_RUN_S = 1.0


@contextlib.contextmanager
def open_nvml() -> Iterator[Any | None]:
    """pynvml, initialised, for the duration of a measurement; None without nvidia-ml-py, a driver or a GPU."""
    try:
        import pynvml  # nvidia-ml-py, the [gpu] extra

        pynvml.nvmlInit()
    except Exception:
        yield None
        return
    try:
        yield pynvml
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _handles(nvml: Any) -> list[Any]:
    return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(int(nvml.nvmlDeviceGetCount()))]


def nvml_used_bytes(nvml: Any) -> int | None:
    """Used memory over all GPUs; None when NVML cannot say."""
    try:
        return sum(int(nvml.nvmlDeviceGetMemoryInfo(h).used) for h in _handles(nvml))
    except Exception:  # no driver, no GPU, a lost device: the metric is absent, never made up
        return None


def _energy_mj(nvml: Any) -> int | None:
    try:
        return sum(int(nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in _handles(nvml))
    except Exception:  # pre-Volta GPUs have no energy counter
        return None


def _throttle_mask(nvml: Any) -> int | None:
    read = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    if read is None:
        return None
    try:
        mask = 0
        for handle in _handles(nvml):
            mask |= int(read(handle))
        return mask & ~NOT_SLOWDOWNS
    except Exception:
        return None


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit] or ([f"0x{mask:x}"] if mask else [])


def slowed_by(gpu: dict[str, float]) -> int:
    """The reasons that slowed a run (its `RunSample.gpu` readings): thermal and hardware slowdowns always; a
    power cap or sync boost only with the SM clock below CLOCK_FLOOR of its maximum (or no maximum known)."""
    mask = int(gpu.get("throttle_reasons", 0))
    clock, top = gpu.get("sm_clock_mhz"), gpu.get("sm_clock_max_mhz")
    if clock is not None and top and clock >= CLOCK_FLOOR * top:
        mask &= ~POWER_MANAGEMENT
    return mask


class GpuMeter:
    """Around one run: `start()` reads the energy counter and clock reasons, `stop()` returns the run's values."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self._energy: int | None = None
        self._mask: int | None = None

    def start(self) -> None:
        if self.nvml is None:
            return
        self._energy = _energy_mj(self.nvml)
        self._mask = _throttle_mask(self.nvml)

    def stop(self) -> dict[str, float]:
        if self.nvml is None:
            return {}
        found: dict[str, float] = {}
        energy = _energy_mj(self.nvml)
        if energy is not None and self._energy is not None and energy >= self._energy:
            found["energy_j"] = (energy - self._energy) / 1000
        mask = _throttle_mask(self.nvml)
        if mask is not None and self._mask is not None:
            found["throttle_reasons"] = float(mask | self._mask)
        try:
            clocks = [(self.nvml.nvmlDeviceGetClockInfo(h, self.nvml.NVML_CLOCK_SM), h) for h in _handles(self.nvml)]
            clock, handle = min(clocks, key=lambda c: c[0])
            found["sm_clock_mhz"] = float(clock)
            found["sm_clock_max_mhz"] = float(self.nvml.nvmlDeviceGetMaxClockInfo(handle, self.nvml.NVML_CLOCK_SM))
        except Exception:  # no clock or no maximum: what was read stays
            pass
        return found
