"""The hardware target and the environment fingerprint.

Detection must be cheap, because the plugin loads in every pytest run: the GPU is found through
NVML (pynvml) or `nvidia-smi`, never by importing torch. The fingerprint (taken once per session,
when a benchmark runs) records what a baseline is valid for: CPU and GPU models, memory, driver,
CUDA and library versions, the git commit.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

_VENDOR_WORDS = {"nvidia", "geforce", "tesla", "quadro", "amd", "radeon", "instinct", "graphics"}


def gpu_slug(name: str) -> str:
    """A short target name from a GPU name: 'NVIDIA A100-SXM4-80GB' -> 'a100', 'NVIDIA GeForce RTX 3090'
    -> 'rtx3090', 'NVIDIA H100 80GB HBM3' -> 'h100'."""
    words = [w for w in re.split(r"[\s_]+", name.lower()) if w and w not in _VENDOR_WORDS]
    if not words:
        return "gpu"
    first = words[0].split("-")[0]
    if first in {"rtx", "gtx"} and len(words) > 1:
        first += words[1].split("-")[0]
    return re.sub(r"[^a-z0-9]+", "", first) or "gpu"


def gpus() -> list[dict[str, Any]]:
    """Name, memory and driver of each visible NVIDIA GPU; empty without one."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            driver = pynvml.nvmlSystemGetDriverVersion()
            found = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(handle)
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
                found.append(
                    {
                        "name": name if isinstance(name, str) else name.decode(),
                        "memory_gb": round(memory / 2**30, 1),
                        "driver": driver if isinstance(driver, str) else driver.decode(),
                    }
                )
            return found
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no pynvml, no driver, no GPU: try nvidia-smi
        pass
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            found.append({"name": parts[0], "memory_gb": round(float(parts[1]) / 1024, 1), "driver": parts[2]})
    return found


def detect_device() -> str:
    """'cpu' without a GPU, else the slug of the first GPU's name."""
    found = gpus()
    return gpu_slug(found[0]["name"]) if found else "cpu"


#: ISA extensions that change which kernels torch/oneDNN run, hence the timings of the same code.
KERNEL_ISA_FLAGS = (
    "avx2",
    "avx512f",
    "avx512_bf16",
    "avx512_fp16",
    "avx512_vnni",
    "avx_vnni",
    "amx_bf16",
    "amx_int8",
    "amx_tile",
    "asimd",
    "sve",
    "sve2",
)


def _cpuinfo_fields() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break
            key, sep, value = line.partition(":")
            if sep:
                fields.setdefault(key.strip().lower(), value.strip())
    except OSError:
        pass
    return fields


def cpu_identity() -> dict[str, Any]:
    """The CPU's model name, and what tells two CPUs apart when the name does not: a virtual machine may
    report just 'AMD EPYC' on hosts of different generations, one with AVX-512 BF16 and one with AVX2
    only, where the same code runs several times apart. Vendor, family/model/stepping and the
    kernel-relevant ISA."""
    fields = _cpuinfo_fields()
    flags = set((fields.get("flags") or fields.get("features") or "").split())
    signature = " ".join(f"{k}={fields[k]}" for k in ("vendor_id", "cpu family", "model", "stepping") if k in fields)
    return {
        "cpu_model": fields.get("model name") or platform.processor() or platform.machine(),
        "cpu_signature": signature or platform.machine(),
        "cpu_isa": [flag for flag in KERNEL_ISA_FLAGS if flag in flags],
    }


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def git(root: Path, *args: str) -> str | None:
    """git's output in `root`, stripped; None where git is missing, fails or times out."""
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def dirty(root: Path, own: Sequence[Path] = ()) -> bool | None:
    """Whether the tracked files have changes, leaving out the plugin's own (`own`: the history store, the report
    directory): a store committed by mistake changes with every job, and must not make every later job's tree
    dirty. None where git cannot tell. The one rule: the fingerprint's `git.dirty` and the history's runs."""
    top = git(root, "rev-parse", "--show-toplevel")
    if top is None:
        return None
    excluded = []
    for path in own:
        try:
            excluded.append(f":(exclude,top){Path(path).resolve().relative_to(Path(top).resolve()).as_posix()}")
        except ValueError:  # outside the repository: git does not see it
            continue
    text = git(root, "status", "--porcelain", "--untracked-files=no", "--", ":(top)", *excluded)
    return None if text is None else bool(text)


def git_commit(root: Path, own: Sequence[Path] = ()) -> dict[str, Any]:
    """The commit checked out and whether the tree is dirty besides the plugin's own files (`dirty`)."""
    sha = git(root, "rev-parse", "HEAD")
    return {"commit": sha, "dirty": dirty(root, own) if sha else None}


def fingerprint(root: Path, own: Sequence[Path] = ()) -> dict[str, Any]:
    """This machine and its software; `own`: the plugin's files in the tree, which do not make it dirty."""
    cuda = None
    if "torch" in sys.modules:  # only if a backend already imported it: never import torch for this
        cuda = getattr(sys.modules["torch"].version, "cuda", None)
    return {
        **cpu_identity(),
        "cpu_cores_physical": psutil.cpu_count(logical=False),
        "cpu_cores_logical": psutil.cpu_count(logical=True),
        "ram_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "gpus": gpus(),
        "cuda": cuda,
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git": git_commit(root, own),
        "threads_env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in os.environ},
    }


SOFTWARE_KEYS = ("torch", "transformers", "cuda", "python", "malloc")


CPU_KEYS = ("cpu_model", "cpu_signature", "cpu_isa")


def describe_cpu(fp: Mapping[str, Any]) -> str:
    """'AMD EPYC [vendor_id=AuthenticAMD cpu family=26 model=2 stepping=1; avx2 avx512f]'."""
    isa = fp.get("cpu_isa")
    detail = "; ".join(p for p in (fp.get("cpu_signature") or "", " ".join(isa or [])) if p)
    return f"{fp.get('cpu_model')} [{detail or 'no CPU signature recorded'}]"


def hardware_mismatch(baseline: Mapping[str, Any], current: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """('gpu' | 'cpu', baseline's, current's) when the baseline was measured on other hardware. A baseline
    without the CPU signature (older files) counts as other hardware: it cannot show it is the same."""
    base_gpus = [g.get("name") for g in baseline.get("gpus") or []]
    cur_gpus = [g.get("name") for g in current.get("gpus") or []]
    if base_gpus != cur_gpus:
        return "gpu", ", ".join(base_gpus) or "no GPU", ", ".join(cur_gpus) or "no GPU"
    if any(baseline.get(key) != current.get(key) for key in CPU_KEYS):
        return "cpu", describe_cpu(baseline), describe_cpu(current)
    return None


def software_drift(baseline: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    drift: dict[str, tuple[Any, Any]] = {}
    for key in SOFTWARE_KEYS:
        if baseline.get(key) != current.get(key):
            drift[key] = (baseline.get(key), current.get(key))
    # the distributions both sessions' benchmarks imported (a baseline recorded before they were kept has none)
    base_packages, packages = baseline.get("packages") or {}, current.get("packages") or {}
    for name in sorted(set(base_packages) & set(packages)):
        if base_packages[name] != packages[name] and name not in drift:
            drift[name] = (base_packages[name], packages[name])
    base_driver = {g.get("driver") for g in baseline.get("gpus") or []}
    cur_driver = {g.get("driver") for g in current.get("gpus") or []}
    if base_driver != cur_driver:
        drift["driver"] = (", ".join(sorted(map(str, base_driver))), ", ".join(sorted(map(str, cur_driver))))
    return drift
