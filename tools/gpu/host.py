"""Host (CPU/RAM) facts via psutil."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import psutil

from gpubox.tools.gpu.schemas import HostInfo

GIB = 1024**3


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def host_info() -> HostInfo:
    vm = psutil.virtual_memory()
    try:
        load = os.getloadavg()
    except OSError:  # not on every platform
        load = None
    return HostInfo(
        cpu_model=cpu_model(),
        cpu_count_logical=psutil.cpu_count(logical=True) or 1,
        cpu_count_physical=psutil.cpu_count(logical=False),
        ram_total_gib=round(vm.total / GIB, 2),
        ram_available_gib=round(vm.available / GIB, 2),
        load_average=(round(load[0], 2), round(load[1], 2), round(load[2], 2)) if load else None,
    )
