"""The probe: a few throwaway steps at the planned micro-batch before the real run, in the worker process.

It measures peak memory (torch.cuda.max_memory_allocated on a GPU, sampled process RSS on CPU) and training
tokens/s, and finds the largest micro-batch that fits by halving on out-of-memory (accumulation doubles, so the
global batch is kept). Its trainer and model are discarded and the random-number state is restored afterwards, so
the real run starts exactly as it would have without a probe: same LoRA init, same data order.
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Callable
from typing import Any

import psutil

OOM_HINT = "use method='qlora', gradient_checkpointing=true or a shorter max_length"


class InjectedOOMError(RuntimeError):
    """Test hook: raised like torch.OutOfMemoryError at the first step of the first N attempts."""


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, InjectedOOMError):
        return True
    try:
        import torch

        return isinstance(exc, torch.OutOfMemoryError)
    except ImportError:
        return False


def _rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state()}
    state["torch"] = torch.get_rng_state()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def _probe_callback(inject: bool) -> Any:
    import torch
    from transformers import TrainerCallback

    cuda = torch.cuda.is_available()
    proc = psutil.Process()

    class ProbeCallback(TrainerCallback):
        def __init__(self) -> None:
            self.steps: list[tuple[float, int]] = []  # (seconds, tokens) per optimizer step
            self.t = 0.0
            self.tokens = 0
            self.peak_rss = proc.memory_info().rss

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if inject:
                raise InjectedOOMError("CUDA out of memory (injected by the test hook)")
            self.peak_rss = max(self.peak_rss, proc.memory_info().rss)
            self.t, self.tokens = time.perf_counter(), state.num_input_tokens_seen or 0

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.peak_rss = max(self.peak_rss, proc.memory_info().rss)
            seen = (state.num_input_tokens_seen or 0) - self.tokens
            self.steps.append((time.perf_counter() - self.t, seen))

        def result(self) -> tuple[float | None, int]:
            # the first step pays for kernel selection and allocator warm-up: time the steady ones when there are
            steady = self.steps[1:] or self.steps
            dt, tokens = sum(s for s, _ in steady), sum(n for _, n in steady)
            peak = torch.cuda.max_memory_allocated() if cuda else self.peak_rss
            return (round(tokens / dt, 2) if dt > 0 and tokens else None), peak

    return ProbeCallback()


def run_probe(
    build: Callable[[int, int, int, list[Any]], Any],
    micro: int,
    accum: int,
    steps: int,
    inject_oom: int,
    log: Callable[[dict[str, Any]], None],
) -> tuple[int, int, dict[str, Any]]:
    """(micro-batch, accumulation, probe record). `build(micro, accum, max_steps, callbacks)` returns a trainer
    on a freshly loaded model; the probe runs `steps` optimizer steps of one micro-batch each."""
    import torch

    cuda = torch.cuda.is_available()
    rng = _rng_state()
    attempt = 0
    tokens_per_s: float | None = None
    peak = 0
    t0 = time.perf_counter()
    try:
        while True:
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            callback = _probe_callback(attempt < inject_oom)
            trainer = None
            try:
                trainer = build(micro, 1, steps, [callback])
                trainer.train()
                tokens_per_s, peak = callback.result()
                break
            except Exception as exc:
                if not is_oom(exc):
                    raise
                if micro == 1:
                    raise RuntimeError(f"out of memory even at per_device_train_batch_size=1; {OOM_HINT}") from exc
                micro, accum, attempt = micro // 2, accum * 2, attempt + 1
                log(
                    {
                        "event": f"probe: out of memory at per_device_train_batch_size={micro * 2}: halved the "
                        f"micro-batch to {micro} and doubled gradient_accumulation_steps to {accum} (global batch "
                        "kept)",
                        "per_device_train_batch_size": micro,
                        "gradient_accumulation_steps": accum,
                        "t": time.time(),
                    }
                )
            finally:
                del trainer
                gc.collect()
                if cuda:
                    torch.cuda.empty_cache()
    finally:
        _set_rng_state(rng)
    record = {
        "steps": steps,
        "per_device_train_batch_size": micro,
        "tokens_per_s": tokens_per_s,
        "peak_memory_gb": round(peak / 1e9, 4) if peak else None,
        "memory_kind": "cuda_max_allocated" if cuda else "cpu_rss",
        "seconds": round(time.perf_counter() - t0, 1),
        "device": "cuda" if cuda else "cpu",
        "gpu_name": torch.cuda.get_device_name(0) if cuda else None,
    }
    return micro, accum, record
