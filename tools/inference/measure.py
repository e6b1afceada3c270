"""What a load really took, as the device shows it, and the reservation of the next load of the same kind.

A model loaded in the server's own process has no process of its own to measure, so its footprint is taken
around the backend's open: the server's memory per device (RSS on the host, NVML's per-process figure on each
GPU) just before and just after, when no other load is in flight, plus the whole of a model's own process
where it runs in one (llama_process). The figure goes on the model's holding in
the box ledger (box_plan shows it, and warns when it is above the reservation), and when it is above the
estimate it is kept in `<state_dir>/inference/load_memory.json` per load configuration (file, size and mtime,
backend, device, context, KV type, adapter, quantization): the next load of the same configuration reserves
what the last one took instead of the estimate.

It is a lower bound where the weights are memory-mapped and not yet read (llama.cpp maps GGUF files), which
is why only a figure above the estimate replaces it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from gpubox.tools.box.capacity import own_usage, usage_of
from gpubox.tools.box.footprints import FootprintStore, above
from gpubox.tools.box.ledger import Ledger
from gpubox.tools.inference.registry import Discovered
from gpubox.tools.inference.schemas import LoadPlan

log = logging.getLogger("gpubox.inference")
Reader = Callable[[], dict[str, float]]
PidReader = Callable[[int], dict[str, float]]
T = TypeVar("T")


def config_key(d: Discovered, p: LoadPlan, adapter: Discovered | None, quantization: str | None) -> str:
    """One load configuration: the same file (size and mtime too) loaded the same way."""
    parts = [str(d.path)]
    try:
        st = d.path.stat()
        parts += [str(st.st_size), str(int(st.st_mtime))]
    except OSError:
        pass
    parts += [p.backend, p.device, str(p.context_length), p.kv_cache_type, str(adapter.path if adapter else ""),
              str(quantization or "")]  # fmt: skip
    return "|".join(parts)


class LoadMeasurements:
    def __init__(self, state_dir: Path, read: Reader = own_usage, read_pid: PidReader = usage_of) -> None:
        self.store = FootprintStore(state_dir / "inference" / "load_memory.json")
        self.read = read
        self.read_pid = read_pid

    def known(self, key: str) -> dict[str, float] | None:
        """GB per device the last load of this configuration took, when that was above its estimate."""
        return self.store.known(key)

    def around(self, open_it: Callable[[], T], alone: Callable[[], bool]) -> tuple[T, dict[str, float] | None]:
        """`open_it()`, and how much this process grew per device meanwhile, plus all of the process the model
        runs in where it has one of its own (`pid`); None when another load ran too (its growth would be counted
        as this one's)."""
        before = self.read() if alone() else None
        out = open_it()
        if before is None or not alone():
            return out, None
        grew = {d: max(0.0, gb - before.get(d, 0.0)) for d, gb in self.read().items()}
        if isinstance(pid := getattr(out, "pid", None), int):
            for d, gb in self.read_pid(pid).items():
                grew[d] = grew.get(d, 0.0) + gb
        return out, grew

    def settle(self, ledger: Ledger, owner: str, key: str, needs: dict[str, float], used: dict[str, float]) -> None:
        """Put the figure on the holding (box_plan warns when it is above the reservation); keep it for the next
        load of this configuration when it is above the estimate `needs`, forget an older one when it is not.
        A failure to write is logged: the model is loaded and its reservation stands either way."""
        used = {d: gb for d, gb in used.items() if d in needs}
        try:
            ledger.update(owner, measured=used)
            if above(used, needs):
                log.warning(
                    "%s took %.2f GB, above its %.2f GB estimate; the next load of it reserves that",
                    owner, sum(used.values()), sum(needs.values()),
                )  # fmt: skip
                self.store.record(key, used)
            else:
                self.store.forget(key)
        except OSError as exc:
            log.warning("could not record what %s took (%s); its next load reserves the estimate", owner, exc)


def with_last_load(p: LoadPlan, known: dict[str, float] | None) -> LoadPlan:
    """The plan reserving what the last load of the same configuration took, where that is above the estimate."""
    took = sum((known or {}).values())
    if took <= p.estimated_memory_gb:
        return p
    why = f"; reserves {took:.2f} GB, what its last load took (the estimate was {p.estimated_memory_gb:.2f})"
    return p.model_copy(update={"estimated_memory_gb": round(took, 3), "reason": p.reason + why})
