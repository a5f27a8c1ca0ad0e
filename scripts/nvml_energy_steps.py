"""How finely NVML's total-energy counter resolves a run: poll it while the GPU works and print the
intervals between its steps, the step sizes and the power they imply (docs/gpu.md).

    python scripts/nvml_energy_steps.py [--seconds 3]

A run shorter than the interval between steps can see no step at all, which is why measure/gpu.py keeps
no per-run energy for such a run and the report sums a batch size's runs.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import pynvml
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    stop = threading.Event()

    def work() -> None:  # bf16 matrix products until told to stop
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        while not stop.is_set():
            a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()

    worker = threading.Thread(target=work)
    worker.start()
    time.sleep(0.5)  # clocks up
    steps: list[tuple[float, int]] = []
    last = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    end = time.perf_counter() + args.seconds
    while time.perf_counter() < end:
        now = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        if now != last:
            steps.append((time.perf_counter(), now - last))
            last = now
    stop.set()
    worker.join()
    intervals = [(b[0] - a[0]) * 1000 for a, b in zip(steps, steps[1:])]
    sizes = [s[1] / 1000 for s in steps[1:]]
    print(f"GPU: {pynvml.nvmlDeviceGetName(handle)}, power limit "
          f"{pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000:.0f} W, max SM clock "
          f"{pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)} MHz")
    if not intervals:
        print(f"the energy counter did not step in {args.seconds} s")
        return
    power = sum(sizes) / (sum(intervals) / 1000)
    print(f"energy counter steps in {args.seconds:.1f} s under load: {len(steps)}; interval median "
          f"{statistics.median(intervals):.1f} ms (min {min(intervals):.1f}, max {max(intervals):.1f}); step median "
          f"{statistics.median(sizes):.2f} J; mean power {power:.0f} W")
    pynvml.nvmlShutdown()


if __name__ == "__main__":
    main()
