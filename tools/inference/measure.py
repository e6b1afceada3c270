"""What a load really took, as the device shows it, and the reservation of the next load of the same kind.

A model loaded in the server's own process has no process of its own to measure, so its footprint is taken
around the backend's open: the server's memory per device (RSS on the host, NVML's per-process figure on each
GPU) just before and just after, when no other load is in flight. The figure goes on the model's holding in
the box ledger (box_plan shows it, and warns when it is above the reservation), and when it is above the
estimate it is kept in `<state_dir>/inference/load_memory.json` per load configuration (file, size and mtime,
backend, device, context, KV type, adapter, quantization): the next load of the same configuration reserves
what the last one took instead of the estimate.

It is a lower bound where the weights are memory-mapped and not yet read (llama.cpp maps GGUF files), which
is why only a figure above the estimate replaces it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from gpubox.tools.box.ledger import Ledger
from gpubox.tools.inference.registry import Discovered
from gpubox.tools.inference.schemas import LoadPlan

log = logging.getLogger("gpubox.inference")
ABOVE = 1.10  # a measurement this far above the estimate replaces it for the next load
Reader = Callable[[], dict[str, float]]
T = TypeVar("T")


def own_usage() -> dict[str, float]:
    """This process's memory per ledger device, in GB: RSS on 'host', NVML's per-process figure on each GPU."""
    import psutil

    from gpubox.tools.box.capacity import GB, gpu_readings

    out = {"host": psutil.Process().memory_info().rss / GB}
    for device, reading in gpu_readings().items():
        out[device] = reading.by_pid_gb.get(os.getpid(), 0.0)
    return out


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
    def __init__(self, state_dir: Path, read: Reader = own_usage) -> None:
        self.path = state_dir / "inference" / "load_memory.json"
        self.read = read
        self._lock = threading.Lock()

    def _all(self) -> dict[str, dict[str, float]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return {k: {d: float(gb) for d, gb in v.items()} for k, v in data.items() if isinstance(v, dict)}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, AttributeError, TypeError) as exc:  # a damaged file only loses the history
            log.warning("load measurements %s unreadable (%s); loads reserve their estimates", self.path, exc)
            return {}

    def known(self, key: str) -> dict[str, float] | None:
        """GB per device the last load of this configuration took, when that was above its estimate."""
        with self._lock:
            return self._all().get(key)

    def record(self, key: str, used: dict[str, float]) -> None:
        with self._lock:
            data = self._all()
            data[key] = {d: round(gb, 3) for d, gb in used.items()}
            self._write(data)

    def _write(self, data: dict[str, dict[str, float]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.replace(tmp, self.path)

    def around(self, open_it: Callable[[], T], alone: Callable[[], bool]) -> tuple[T, dict[str, float] | None]:
        """`open_it()`, and how much this process grew per device meanwhile; None when another load ran too
        (its growth would be counted as this one's)."""
        before = self.read() if alone() else None
        out = open_it()
        if before is None or not alone():
            return out, None
        after = self.read()
        return out, {d: max(0.0, gb - before.get(d, 0.0)) for d, gb in after.items()}

    def settle(self, ledger: Ledger, owner: str, key: str, needs: dict[str, float], used: dict[str, float]) -> None:
        """Put the figure on the holding (box_plan warns when it is above the reservation); keep it for the next
        load of this configuration when it is above the estimate `needs`, forget an older one when it is not.
        A failure to write is logged: the model is loaded and its reservation stands either way."""
        used = {d: gb for d, gb in used.items() if d in needs}
        try:
            ledger.update(owner, measured=used)
            if sum(used.values()) > sum(needs.values()) * ABOVE:
                log.warning(
                    "%s took %.2f GB, above its %.2f GB estimate; the next load of it reserves that",
                    owner, sum(used.values()), sum(needs.values()),
                )  # fmt: skip
                self.record(key, used)
            else:
                self.forget(key)
        except OSError as exc:
            log.warning("could not record what %s took (%s); its next load reserves the estimate", owner, exc)

    def forget(self, key: str) -> None:
        with self._lock:
            data = self._all()
            if data.pop(key, None) is not None:
                self._write(data)


def with_last_load(p: LoadPlan, known: dict[str, float] | None) -> LoadPlan:
    """The plan reserving what the last load of the same configuration took, where that is above the estimate."""
    took = sum((known or {}).values())
    if took <= p.estimated_memory_gb:
        return p
    why = f"; reserves {took:.2f} GB, what its last load took (the estimate was {p.estimated_memory_gb:.2f})"
    return p.model_copy(update={"estimated_memory_gb": round(took, 3), "reason": p.reason + why})
