"""How a load plan maps onto the box ledger, and which idle models to evict when the ledger is short."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

from gpubox.errors import CapacityError
from gpubox.tools.box.schemas import Admission, Holding
from gpubox.tools.inference.schemas import LoadPlan

PARTIAL = re.compile(r"cuda \((\d+)/(\d+) layers\)")


class Evictable(Protocol):
    name: str
    plan: LoadPlan


class Held(Evictable, Protocol):
    """A resident model as the limits see it: evictable only when idle and unpinned."""

    busy: int
    pinned: bool
    last_used: float


E = TypeVar("E", bound=Evictable)
H = TypeVar("H", bound=Held)


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


def idle_first(resident: Iterable[H]) -> list[H]:
    """Idle, unpinned residents, least recently used first: the only ones a load may evict."""
    return sorted((r for r in resident if r.busy == 0 and not r.pinned), key=lambda r: r.last_used)


def limit_victims(
    resident: Sequence[H],
    loading: Mapping[str, float],
    key: str,
    need_gb: float,
    max_resident: int,
    budget: float | None,
) -> list[H]:
    """The idle models a load of `key` must evict to stay within infer_max_resident and infer_memory_budget_gb
    (`key`'s own loaded copy is not counted: a reload frees it first); CapacityError, naming what holds the
    room, when evicting every idle one would not do. infer_load and box_plan both ask this, so box_plan never
    says "fits" where the load refuses."""
    if budget is not None and need_gb > budget:
        raise CapacityError(f"the model needs ~{need_gb:.1f} GB, above the {budget} GB budget (infer_memory_budget_gb)")
    live = [r for r in resident if r.name != key]
    count = len(live) + sum(1 for k in loading if k != key)
    used = sum(r.plan.estimated_memory_gb for r in live) + sum(gb for k, gb in loading.items() if k != key)
    victims: list[H] = []
    idle = idle_first(live)
    while count >= max_resident or (budget is not None and used + need_gb > budget):
        if not idle:
            raise CapacityError(_refusal(live, key, max_resident, budget))
        r = idle.pop(0)
        victims.append(r)
        count, used = count - 1, used - r.plan.estimated_memory_gb
    return victims


def _refusal(live: Sequence[Held], key: str, max_resident: int, budget: float | None) -> str:
    """Why no eviction makes room, naming what holds it (a pin is the caller's to lift)."""
    held = [f"{r.name} ({'pinned' if r.pinned else 'generating'})" for r in live if r.pinned or r.busy]
    limits = f"infer_max_resident={max_resident}" + (f", infer_memory_budget_gb={budget}" if budget is not None else "")
    return (
        f"no room for {key} within {limits}: held by {', '.join(held) or 'models still loading'}; retry when a "
        "generation or load finishes, infer_unload a pinned model, or raise the limit"
    )
