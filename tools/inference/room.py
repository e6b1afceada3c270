"""How a load plan maps onto the box ledger, and which idle models to evict when the ledger is short."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol, TypeVar

from gpubox.tools.box.schemas import Admission, Holding
from gpubox.tools.inference.schemas import LoadPlan

PARTIAL = re.compile(r"cuda \((\d+)/(\d+) layers\)")


class Evictable(Protocol):
    name: str
    plan: LoadPlan


E = TypeVar("E", bound=Evictable)


def owner_of(key: str) -> str:
    return f"model {key}"


def ledger_needs(p: LoadPlan) -> dict[str, float]:
    """GB per ledger device. A partial offload splits the estimate by the share of layers on the GPU (the KV
    cache follows its layers in llama.cpp, so the split is proportional)."""
    gb = p.estimated_memory_gb
    if not p.device.startswith("cuda"):
        return {"host": gb}
    m = PARTIAL.fullmatch(p.device)
    if m is None:
        return {"cuda:0": gb}
    share = int(m.group(1)) / max(1, int(m.group(2)))
    return {"cuda:0": gb * share, "host": gb * (1 - share)}


def reload_needs(needs: dict[str, float], held: Holding | None) -> dict[str, float]:
    """What a load needs beyond what the model's loaded copy (`held`) holds: a reload frees that copy first."""
    if held is None:
        return needs
    return {dev: max(0.0, gb - held.devices.get(dev, 0.0)) for dev, gb in needs.items()}


def shortfall_victims(admission: Admission, idle: Sequence[E]) -> list[E] | None:
    """The least recently used idle models whose eviction covers every blocked device's shortfall, or None when
    evicting all of them would not (then nothing is evicted: another family holds the memory)."""
    short = {b.device: b.need_gb - b.free_gb for b in admission.blockers}
    victims: list[E] = []
    for r in idle:
        if all(gb <= 1e-9 for gb in short.values()):
            break
        frees = ledger_needs(r.plan)
        if not any(frees.get(d, 0) > 0 for d in short):
            continue
        victims.append(r)
        for d in short:
            short[d] -= frees.get(d, 0.0)
    return victims if all(gb <= 1e-9 for gb in short.values()) else None
