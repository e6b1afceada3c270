"""What each device really shows: total and used memory, and how much of it gpubox's own processes hold.

Devices are named 'host' (RAM) and 'cuda:N' in CUDA's visible order (the order a worker's `cuda:N` means), matched
to NVML by UUID because NVML's index order can differ from CUDA_VISIBLE_DEVICES'.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpubox.tools.box.schemas import Holding

GB = 1e9


@dataclass
class Reading:
    total_gb: float | None
    used_gb: float
    by_pid_gb: dict[int, float] = field(default_factory=dict)  # memory per process, where the device tells


def process_tree(pids: Iterable[int]) -> set[int]:
    """`pids` and their descendants that are still alive (a worker's ranks and compile helpers included)."""
    import psutil

    out: set[int] = set()
    for pid in pids:
        try:
            p = psutil.Process(pid)
            out.add(pid)
            out.update(c.pid for c in p.children(recursive=True))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def host_reading(pids: Iterable[int]) -> Reading:
    """RAM: used = total - available (page cache is not 'used'); RSS of each of gpubox's processes."""
    import psutil

    vm = psutil.virtual_memory()
    by_pid: dict[int, float] = {}
    for pid in process_tree(pids):
        try:
            by_pid[pid] = psutil.Process(pid).memory_info().rss / GB
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return Reading(total_gb=vm.total / GB, used_gb=(vm.total - vm.available) / GB, by_pid_gb=by_pid)


def gpu_readings() -> dict[str, Reading]:
    """Each CUDA-visible GPU as NVML shows it; empty without NVML or GPUs."""
    from gpubox.tools.gpu.devices import local_gpus
    from gpubox.tools.gpu.nvml import gpu_status

    status = gpu_status()
    if not status.gpus:
        return {}
    visible = local_gpus()
    order = [g.uuid for g in visible] if visible else [g.uuid for g in status.gpus]
    out: dict[str, Reading] = {}
    for dev in status.gpus:
        if dev.uuid not in order:
            continue
        by_pid = {p.pid: (p.used_memory_mib or 0.0) * 2**20 / GB for p in dev.processes}
        out[f"cuda:{order.index(dev.uuid)}"] = Reading(
            total_gb=dev.memory_total_mib * 2**20 / GB, used_gb=dev.memory_used_mib * 2**20 / GB, by_pid_gb=by_pid
        )
    return out


def read_devices(owned_pids: Iterable[int]) -> dict[str, Reading]:
    """Every device's reading; the host always, GPUs when NVML sees them."""
    pids = {os.getpid(), *owned_pids}
    return {"host": host_reading(pids), **gpu_readings()}


def own_usage() -> dict[str, float]:
    """This process's memory per ledger device, in GB: RSS on 'host', NVML's per-process figure on each GPU."""
    return usage_of(os.getpid())


def usage_of(pid: int) -> dict[str, float]:
    """One process's memory per ledger device, in GB (0 on the host once it has ended)."""
    import psutil

    try:
        out = {"host": psutil.Process(pid).memory_info().rss / GB}
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        out = {"host": 0.0}
    for device, reading in gpu_readings().items():
        out[device] = reading.by_pid_gb.get(pid, 0.0)
    return out


def pid_alive(pid: int | None, started: float | None) -> bool:
    """True while `pid` runs and is the same process (its start time matches, so a reused pid is not it)."""
    import psutil

    if pid is None or pid <= 0:  # a damaged record's -5: psutil raised ValueError, failing every tool that read it
        return False
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(p.create_time() - started) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def same_process(pid: int | None, started: float | None) -> bool:
    """pid_alive, and only with a start time to tell: the test before a signal. Without one, a pid reused by an
    unrelated process read as ours, and serve_stop sent it SIGTERM and SIGKILL."""
    return started is not None and pid_alive(pid, started)


def start_time(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def child_of(pid: int, owned: set[int]) -> bool:
    """Worker ranks and helpers of an owned process (its descendants) count as gpubox's own."""
    import psutil

    try:
        return any(p.pid in owned for p in psutil.Process(pid).parents())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def drift(holdings: list[Holding]) -> list[str]:
    """Warnings for work that uses more than it reserved (by a quarter and 0.25 GB): the estimate was low."""
    out = []
    for h in holdings:
        for device, gb in (h.measured_gb or {}).items():
            reserved = h.devices.get(device, 0.0)
            if gb > reserved * 1.25 + 0.25:
                out.append(
                    f"{h.owner} uses {gb:.2f} GB on {device}, above its {reserved:.2f} GB reservation: the estimate "
                    "was low, so the box may be over-committed"
                )
    return out
