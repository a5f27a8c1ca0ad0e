"""The GPU paths for real, where torch sees a CUDA device and NVML answers: energy, clocks and throttle
reasons (measure/gpu.py), CUDA and NVML memory (measure/memory.py), and the gate on them.

Skipped elsewhere, with the reason: the logic is tested on CPU against a fake NVML (test_run_quality.py,
test_memory.py). What these tests saw on a lent H100 is in docs/gpu.md.
"""

from __future__ import annotations

import json
import re

import pytest

torch = pytest.importorskip("torch", reason="the hf extra is not installed: pip install pytest-llmperf[hf]")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the GPU paths run on a GPU machine (docs/gpu.md)", allow_module_level=True)
pynvml = pytest.importorskip("pynvml", reason="NVML's bindings are not installed: pip install pytest-llmperf[gpu]")
from transformers import LlamaForCausalLM  # noqa: E402, F401  (imported before pytester's in-process runs)

from pytest_llmperf.measure import gpu  # noqa: E402
from pytest_llmperf.measure.memory import MemoryMeter  # noqa: E402


def burn(seconds_of_work: int = 200) -> None:
    """Matrix products in bf16: enough work for the energy counter to advance and the clocks to rise."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(seconds_of_work):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()


def test_nvml_reads_energy_clock_and_reasons_of_a_real_gpu():
    with gpu.open_nvml() as nvml:
        assert nvml is not None, "pynvml is installed and a GPU is present, yet NVML did not initialise"
        meter = gpu.GpuMeter(nvml)
        meter.start()
        burn()
        values = meter.stop()
        used = gpu.nvml_used_bytes(nvml)
    print("NVML around 200 bf16 8192^3 products:", json.dumps(values))
    assert values["energy_j"] > 1.0  # ~0.3 s at hundreds of watts
    assert values["sm_clock_mhz"] > 0
    assert "throttle_reasons" in values  # a mask, idle and user-set bits removed (0 when none)
    assert used is not None and used > 2 ** 28  # this process's context and tensors at least


def test_cuda_peak_allocated_follows_what_a_run_held():
    with gpu.open_nvml() as nvml:
        meter = MemoryMeter(nvml=nvml)
        torch.ones(1, device="cuda")  # CUDA initialised: the meter reads torch.cuda only then
        meter.start()
        held = torch.ones(256 * 2 ** 20 // 4, device="cuda")
        del held
        values = meter.stop()
    print("memory meter:", json.dumps(values))
    assert 256 <= values["cuda_peak_allocated_mib"] < 300
    assert values["gpu_used_mib"] >= 256


SEQUENCE = 64
BENCHMARK = f"""
import pytest

@pytest.mark.llmperf(batch_sizes=[1, 4], sequence_length={SEQUENCE}, decode_length=8, runs=5, warmups=1, max_runs=5)
def test_llama(llmperf, llmperf_hf):
    llmperf.measure(llmperf_hf("tiny-llama", dtype="fp32"))
"""

# A working tree that holds LLMPERF_HOLD_MB more on the GPU during each forward (every page written).
HOLDING_CONFTEST = """
import functools
import os

import pytest
import torch
from transformers import LlamaForCausalLM


@pytest.fixture(autouse=True)
def holding_forward(monkeypatch):
    hold_mb = int(os.environ.get("LLMPERF_HOLD_MB", "0"))
    forward = LlamaForCausalLM.forward

    @functools.wraps(forward)
    def holding(self, *args, **kwargs):
        held = torch.ones(hold_mb * 2 ** 20 // 4, device="cuda") if hold_mb else None
        out = forward(self, *args, **kwargs)
        del held
        return out

    monkeypatch.setattr(LlamaForCausalLM, "forward", holding)
"""


@pytest.fixture
def project(pytester, monkeypatch, model_cache, addopts):
    addopts(f"--llmperf-cache-dir={model_cache}")
    monkeypatch.delenv("LLMPERF_HOLD_MB", raising=False)
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_bench=BENCHMARK)
    pytester.makeconftest(HOLDING_CONFTEST)
    return pytester


@pytest.fixture
def run(run):
    # the device is detected (h100, a100...): the GPU target, its fingerprint and its baseline folder
    return run.without("--llmperf-device").with_flags("--llmperf-rtol=10")


def test_a_gpu_benchmark_records_energy_and_memory_and_gates_200_mb_more_vram(project, run, monkeypatch):
    run("--llmperf-update").assert_outcomes(passed=1)
    reports = list((project.path / "reports").glob("*.json"))
    assert len(reports) == 1 and reports[0].stem != "cpu", reports
    document = json.loads(reports[0].read_text())
    for batch in document["benchmarks"][0]["batches"]:
        print("device", document["device"], "batch size", batch["batch_size"], "runs' NVML readings:",
              [r["gpu"] for r in batch["runs"]], "first run:", json.dumps(batch["runs"][0]["values"], sort_keys=True))
        # the energy counter steps coarsely: a short run may see no step, the batch's runs together do
        assert sum(r["gpu"]["energy_j"] for r in batch["runs"]) > 0
        for v in (r["values"] for r in batch["runs"]):
            assert v["sm_clock_mhz"] > 0 and v.get("energy_j_per_token", 1) > 0
            assert v["cuda_peak_allocated_mib"] > 0 and v["gpu_used_mib"] > v["cuda_peak_allocated_mib"]
    markdown = (project.path / "reports" / f"{document['device']}.md").read_text()
    assert (re.search(r"\| CUDA allocated \(torch\) +\| 1 ", markdown)
            and re.search(r"\| 1 +\| [0-9.]+ J/token", markdown))
    fingerprint = document["fingerprint"]
    assert fingerprint["gpus"] and fingerprint["cuda"], fingerprint

    run().assert_outcomes(passed=1)  # unchanged: outputs equal, memory within its tolerance
    monkeypatch.setenv("LLMPERF_HOLD_MB", "200")
    result = run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*cuda_peak_allocated_mib (peak memory) at batch size 1 regressed: baseline median "
                                 "* MiB, now * MiB (+* MiB, ratio *)*"])
    growth = re.search(r"cuda_peak_allocated_mib \(peak memory\) at batch size 1 regressed: .*?\(\+([0-9.]+) MiB",
                       result.stdout.str())
    assert growth and 190 <= float(growth.group(1)) <= 260, result.stdout.str()[-3000:]
    result.stdout.no_fnmatch_line("*outputs changed*")
