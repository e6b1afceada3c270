"""One client's work never stalls another's: loads happen outside the locks that status and generation need,
a model is never closed under a running request, and a failing generate thread reaches the caller."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.bundled import smollm2_gguf
from gpubox.settings import Settings
from gpubox.tools.inference import manager as manager_mod
from gpubox.tools.inference.adapter import manager
from gpubox.tools.inference.backends import GenParams
from gpubox.tools.inference.registry import DEFAULT_MODEL
from tests.conftest import call_err, call_ok, requires_hf, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Any]:
    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("needs the bundled SmolLM2 GGUF (gpubox[models])")
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(gguf, models / "smollm2-copy.gguf")
    settings = Settings.load(
        state_dir=tmp_path / "state", model_dirs=[models], allowed_roots=[tmp_path], infer_context_length=512
    )
    mcp = build_server(settings)
    yield mcp
    state_of(mcp).close()


@requires_hf
async def test_status_answers_while_one_client_generates_and_another_loads_a_model(
    env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Client(env) as a, Client(env) as b, Client(env) as c:
        await call_ok(a, "infer_load", name=DEFAULT_MODEL, context_length=256)
        stop = anyio.Event()
        loaded = anyio.Event()
        times: dict[str, float] = {}

        async def generate_until_stopped() -> None:  # short requests: each one ends with a release
            while not stop.is_set():
                await call_ok(a, "infer_complete", prompt="Count: 1, 2, 3,", max_tokens=4, temperature=0)
                await anyio.sleep(0.2)  # leave the 2-core box some CPU for B's load

        async def load_other() -> None:
            await call_ok(b, "infer_load", name="smollm2-copy", backend="llama.cpp", context_length=256)
            times["loaded"] = time.perf_counter()
            loaded.set()

        # B's backend is built only once C has its answers: the load is certain to span them however fast the box
        building, answered = threading.Event(), threading.Event()

        def held_open(*args: Any, **kwargs: Any) -> Any:
            building.set()
            answered.wait(120)  # a load that held the lock A releases under would stall C: fail, not hang
            return real_open(*args, **kwargs)

        real_open = manager_mod.open_backend
        monkeypatch.setattr(manager_mod, "open_backend", held_open)
        async with anyio.create_task_group() as tg:
            tg.start_soon(generate_until_stopped)
            tg.start_soon(load_other)
            # B's backend is being built (its room reserved in `_loading` right before) while A generates
            await wait_until(building.is_set, timeout=120)
            times["asked"] = time.perf_counter()
            for _ in range(3):
                await call_ok(c, "gpu_status")
            times["answered"] = time.perf_counter()
            answered.set()
            with anyio.fail_after(600):
                await loaded.wait()
            stop.set()
    # before the fix, A's release() waited on the event loop for the lock B's load held: C waited for the load
    assert times["answered"] < times["loaded"]
    assert times["answered"] - times["asked"] < 30  # generous: gpu_status takes milliseconds


def test_the_reaper_never_closes_a_model_that_an_acquire_took_while_it_was_deciding(
    env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    mgr = manager(state_of(env))
    mgr._stop.set()  # drive the reaper by hand
    mgr.load(DEFAULT_MODEL, context_length=256, keep_alive_s=1)
    taken: list[manager_mod.Resident] = []
    real_info = manager_mod.log.info

    def acquire_meanwhile(msg: str, *args: Any) -> None:  # the reaper logs as it decides to unload
        if msg.startswith("unloading") and not taken:
            t = threading.Thread(target=lambda: taken.append(mgr.acquire(DEFAULT_MODEL)))
            t.start()
            t.join(timeout=120)
        real_info(msg, *args)

    monkeypatch.setattr(manager_mod.log, "info", acquire_meanwhile)
    mgr.reap(now=time.time() + 3600)
    assert taken, "the reaper did not unload the idle model"
    r = taken[0]
    try:
        assert mgr.resident.get(r.name) is r  # what the acquire got is still registered, so not closed
        out = r.backend.generate(None, "Hi", GenParams(max_tokens=2, temperature=0), lambda s: None, threading.Event())
        assert out.completion_tokens > 0
        assert mgr.reap(now=time.time() + 3600) == []  # busy: skipped
    finally:
        mgr.release(r)
    assert mgr.reap(now=time.time() + 3600) == [DEFAULT_MODEL]


def test_unload_waits_for_the_running_request_and_eviction_skips_busy_models(env: Any) -> None:
    mgr = manager(state_of(env))
    mgr.settings.infer_max_resident = 1
    r = mgr.acquire(DEFAULT_MODEL)
    try:
        from gpubox.errors import CapacityError

        with pytest.raises(CapacityError, match="generating"):
            mgr.load("smollm2-copy", context_length=256)  # the only resident model is busy: not evicted
        done: list[bool] = []
        t = threading.Thread(target=lambda: done.append(mgr.unload(DEFAULT_MODEL).unloaded))
        t.start()
        t.join(timeout=1.0)
        assert not done and t.is_alive()  # waiting for our request
        out = r.backend.generate(None, "Hi", GenParams(max_tokens=2, temperature=0), lambda s: None, threading.Event())
        assert out.completion_tokens > 0
    finally:
        mgr.release(r)
    t.join(timeout=60)
    assert done == [True] and DEFAULT_MODEL not in mgr.resident


@requires_hf
async def test_an_exception_in_transformers_generate_reaches_the_caller_and_the_model_unloads(env: Any) -> None:
    import torch

    mgr = manager(state_of(env))
    async with Client(env) as client:
        await call_ok(client, "infer_load", name="smollm2-copy", backend="transformers", context_length=256)
        model = mgr.resident["smollm2-copy"].backend.model  # type: ignore[union-attr]
        for exc, expect in (
            (RuntimeError("boom in generate"), "transformers generation failed: RuntimeError: boom in generate"),
            (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), "out of memory while generating"),
        ):

            def failing(*args: Any, _exc: BaseException = exc, **kwargs: Any) -> Any:
                raise _exc

            model.generate = failing
            with anyio.fail_after(300):  # before the fix the reader waited for the dead thread forever
                text = await call_err(client, "infer_complete", model="smollm2-copy", prompt="Hi", max_tokens=8)
            assert expect in text
        assert mgr.resident["smollm2-copy"].busy == 0
        unloaded = await call_ok(client, "infer_unload", name="smollm2-copy")
        assert unloaded["unloaded"] and "smollm2-copy" not in mgr.resident


async def test_requests_waiting_for_a_busy_model_hold_no_worker_thread_and_a_cancelled_one_never_runs(
    env: Any,
) -> None:
    mgr = manager(state_of(env))
    pool = anyio.to_thread.current_default_thread_limiter()
    async with Client(env) as a, Client(env) as b:
        await call_ok(a, "infer_load", name=DEFAULT_MODEL, context_length=512)
        r = mgr.resident[DEFAULT_MODEL]
        prompts: list[str | None] = []
        real = r.backend.generate

        go = threading.Event()  # the first request generates only once the waiters are gone: it spans them all

        def spy(messages: Any, prompt: str | None, *args: Any) -> Any:
            prompts.append(prompt)
            go.wait(120)
            return real(messages, prompt, *args)

        r.backend.generate = spy  # type: ignore[method-assign]
        long = {"prompt": "Count: 1, 2, 3,", "max_tokens": 200, "temperature": 0}
        async with anyio.create_task_group() as running:
            running.start_soon(lambda: call_ok(a, "infer_complete", **long))
            await wait_until(lambda: prompts, timeout=60)  # the model is generating the first request
            async with anyio.create_task_group() as waiting:
                for i in range(60):  # more than the pool's 40 threads, all waiting for the one model
                    waiting.start_soon(lambda i=i: call_ok(b, "infer_complete", prompt=f"waiter {i}", max_tokens=2))
                await wait_until(lambda: r.busy == 61, timeout=60)
                assert pool.borrowed_tokens < 10  # they wait on the event loop, not each in a blocked thread
                status = await call_ok(b, "gpu_status")  # another tool still gets a thread at once
                assert status is not None
                waiting.cancel_scope.cancel()  # their clients give up
            await wait_until(lambda: r.busy == 1, timeout=60)  # only the first request holds the model now
            go.set()
        await wait_until(lambda: r.busy == 0, timeout=60)
    assert prompts == ["Count: 1, 2, 3,"]  # no cancelled waiter's prompt was evaluated


async def test_a_cancelled_load_answers_at_once_and_what_it_leaves_is_unloaded(
    env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """infer_load ran the load in a worker thread the cancel waited for: a client's cancel returned only when the
    load ended, and the model it no longer wanted stayed loaded."""
    building, release = threading.Event(), threading.Event()
    real_open = manager_mod.open_backend

    def held_open(*args: Any, **kwargs: Any) -> Any:
        building.set()
        release.wait(120)
        return real_open(*args, **kwargs)

    monkeypatch.setattr(manager_mod, "open_backend", held_open)
    mgr = manager(state_of(env))
    async with Client(env) as a, Client(env) as b:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: call_ok(a, "infer_load", name="smollm2-copy"))
            await wait_until(building.is_set, timeout=120)
            with anyio.fail_after(10):  # the load is held open: only a call that does not wait for it ends here
                tg.cancel_scope.cancel()
        assert building.is_set() and not release.is_set()
        release.set()  # the load ends now; what it left is unloaded after it
        await wait_until(lambda: "smollm2-copy" not in mgr.loaded() and not mgr.loading("smollm2-copy"), timeout=120)
        listed = {m["name"]: m for m in (await call_ok(b, "infer_models"))["models"]}
    assert listed["smollm2-copy"]["loaded"] is None
