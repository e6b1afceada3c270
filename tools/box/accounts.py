"""Per-device accounting of the box ledger: each device's budget, and what is reserved, measured, external and free.

Separate from ledger.py because it is arithmetic over one reading of the devices and a list of holdings, with no
lock, state file or queue: the ledger takes the reading and the holdings under its lock and asks here what they
come to (as admission.py then says whether work fits them).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from gpubox.settings import Settings
from gpubox.tools.box.capacity import Reading, child_of, process_tree
from gpubox.tools.box.schemas import DeviceAccount, Holding


def budget(settings: Settings, device: str, total_gb: float | None) -> float:
    """The setting's budget for `device`, never above what it physically has less the headroom (a 1000 GB budget
    on a 64 GB host would report memory that does not exist and queue work that can never fit, not refuse it)."""
    physical = max(0.0, (total_gb or 0.0) - headroom(settings, total_gb))
    explicit = settings.memory_budgets.get(device, settings.memory_budget_gb)
    if explicit is not None:
        return min(float(explicit), physical) if total_gb is not None else float(explicit)
    return physical


def headroom(settings: Settings, total_gb: float | None) -> float:
    if settings.memory_headroom_gb is not None:
        return settings.memory_headroom_gb
    return max(0.5, 0.05 * (total_gb or 0.0))


def accounts(
    settings: Settings, readings: dict[str, Reading], held: Iterable[Holding], owned: set[int]
) -> dict[str, DeviceAccount]:
    """Each device's account: `held` are all gpubox's holdings on the box, `owned` the pids of gpubox's processes."""
    holdings = list(held)
    out: dict[str, DeviceAccount] = {}
    for device, r in readings.items():
        reserved = sum(h.devices.get(device, 0.0) for h in holdings)
        mine = sum(gb for pid, gb in r.by_pid_gb.items() if pid in owned or child_of(pid, owned))
        external = max(0.0, r.used_gb - mine)
        cap = budget(settings, device, r.total_gb)
        free = cap - reserved
        if r.total_gb is not None:
            free = min(free, r.total_gb - headroom(settings, r.total_gb) - external - max(reserved, mine))
        out[device] = DeviceAccount(
            device=device,
            total_gb=r3(r.total_gb) if r.total_gb is not None else None,
            budget_gb=r3(cap),
            reserved_gb=r3(reserved),
            external_gb=r3(external),
            free_gb=r3(max(0.0, free)),
            measured_gb=r3(mine),
        )
    return out


def measured(h: Holding, readings: dict[str, Reading]) -> Holding:
    """A worker's own memory per device (its process tree). Work inside a server's process (this server's or
    another's: pid == server_pid) shares that process's memory, so it keeps its stored figure."""
    if h.pid is None or h.pid == os.getpid() or h.pid == h.server_pid:
        return h
    tree = process_tree([h.pid])
    per_device = {d: r3(sum(gb for pid, gb in r.by_pid_gb.items() if pid in tree)) for d, r in readings.items()}
    return h.model_copy(update={"measured_gb": {d: gb for d, gb in per_device.items() if d in h.devices}})


def r3(x: float) -> float:
    return round(x, 3)


def rounded(needs: dict[str, float]) -> dict[str, float]:
    return {d: r3(gb) for d, gb in needs.items() if gb > 0}
