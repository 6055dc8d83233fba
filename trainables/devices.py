"""The device a trial trains on: picked and set up (CPU threads, matmul precision), cleared of what
finished trials left, and waited for."""

from __future__ import annotations

import atexit
import gc
import hashlib
import re
from pathlib import Path

import torch

from .config import ConfigError, TrainConfig

# The CPU features the math libraries pick their code paths by (ATen's vector width, MKL's and
# oneDNN's kernels): another set rounds otherwise (docs/troubleshooting.md#numbers).
VECTOR_FLAGS = re.compile(r"avx\w*|sse\w*|ssse3|fma\w*|f16c|amx\w*|\w*vnni\w*|vaes|vpclmulqdq|gfni")


def cpu_kernels() -> str:
    """The CPU's vector units as the kernels see them: torch's CPU capability (AVX2, AVX512, ...) and
    8 hex digits of the CPU's vector features (two CPUs of one capability may still take other
    MKL or oneDNN paths), e.g. `AVX2 3f2a9c1e`; the capability alone where the CPU's features
    cannot be read (no /proc/cpuinfo)."""
    capability = torch.backends.cpu.get_cpu_capability()
    try:
        flags = Path("/proc/cpuinfo").read_text().split("\nflags", 1)[1].split("\n", 1)[0].split()
    except (OSError, IndexError):
        return capability
    vector = " ".join(sorted(flag for flag in flags if VECTOR_FLAGS.fullmatch(flag)))
    return f"{capability} {hashlib.sha256(vector.encode()).hexdigest()[:8]}"


def pick_device(name: str) -> torch.device:
    """`name`'s device; ConfigError where torch here has none such (a GPU launch's best config re-run
    on a laptop, a trial on a node without CUDA), before torch fails somewhere inside the trial."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ConfigError(
            f"device: {name}, but torch finds {torch.cuda.device_count()} CUDA device(s) here "
            "(device=auto trains on what there is)"
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(
            f"device: {name}, but torch finds no MPS device here (device=auto trains on what there is)"
        )
    return device


def where(cfg: TrainConfig, device: torch.device) -> str:
    """The device and how a settled config runs on it, for a trial's first log line: its compile
    and bf16 may have been decided by `auto`, which the recorded parameters keep."""
    return str(device) + "".join(
        f", {word}" for word, on in (("compiled", cfg.compile), ("bf16 autocast", cfg.bf16)) if on
    )


def setup_device(cfg: TrainConfig) -> torch.device:
    """The trial's device, with its CPU threads and, on CUDA, its matmul precision (`tf32`) set."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = pick_device(cfg.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = cfg.tf32
    return device


# What free_what_finished_trials_left leaves out of collections goes back in at exit, for the
# interpreter's last collection: extensions that count their objects (nanobind's) print a warning
# for each one it did not free.
atexit.register(gc.unfreeze)


def free_what_finished_trials_left(device: torch.device) -> None:
    """Frees what finished trials left in this process (Tune hands one process trial after trial),
    and on CUDA counts gpu_memory_mib from here. A stack is garbage in a reference cycle (its step
    refers to it), which only Python's occasional full collection frees: its weights, optimizer
    state and CUDA graphs stayed allocated into the next trial. And the allocator keeps freed
    blocks reserved, which the next trial's gpu_memory_mib (peak reserved) counted as its own.

    What survives the collection is the process's own (torch's, Ray's and the modules' objects,
    imported before the first trial or during it, and their caches): it is left out of later
    collections (gc.freeze), which then scan only what the next trial made. Scanning it all took
    0.1-0.5 s on the CPU machine, before every trial (docs/performance.md#orchestration-many-trials).
    A frozen object is still freed when its last reference goes; only a cycle among frozen objects
    would outlive its use, and a finished trial's (its model, optimizer and stack) is garbage here."""
    gc.collect()
    gc.freeze()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work: a timer read before it would time the host's queueing."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
