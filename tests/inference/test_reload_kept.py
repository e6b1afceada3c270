"""A reload with new settings that is refused leaves the loaded model as it was (tools/inference/manager.py):
it unloaded the working copy first, so the next request brought it back with defaults, unpinned."""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from gpubox import services
from gpubox.app import build_server, state_of
from gpubox.errors import CapacityError
from gpubox.settings import Settings
from tests.conftest import call_err, call_ok, wait_until

pytestmark = pytest.mark.anyio

MODEL = "smollm2-135m-instruct"


async def loaded(c: Client) -> dict[str, tuple[int, bool]]:
    models = (await call_ok(c, "infer_models"))["models"]
    return {m["name"]: (m["loaded"]["context_length"], m["loaded"]["pinned"]) for m in models if m["loaded"]}


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ({"backend": "transformers", "quantization": "4bit"}, "needs an HF folder"),  # refused before the unload
        ({"context_length": 8192}, "budget"),  # refused after it: no room for the larger context
    ],
    ids=["bad-arguments", "no-room"],
)
async def test_a_refused_reload_keeps_the_model_loaded_as_it_was(
    tmp_path: Path, change: dict[str, object], refusal: str
) -> None:
    # 1024 tokens of context fit in the budget (about 0.67 GB planned), 8192 do not (about 0.91 GB)
    settings = Settings.load(state_dir=tmp_path / "state", allowed_roots=[tmp_path], infer_memory_budget_gb=0.8)
    server = build_server(settings)
    try:
        async with Client(server) as c:  # type: ignore[arg-type]
            await call_ok(c, "infer_load", name=MODEL, context_length=1024, pin=True)
            assert await loaded(c) == {MODEL: (1024, True)}
            assert refusal in await call_err(c, "infer_load", name=MODEL, **change)
            assert await loaded(c) == {MODEL: (1024, True)}
    finally:
        state_of(server).close()


async def test_a_request_that_waited_out_a_refused_reload_finds_the_model_as_it_was(tmp_path: Path) -> None:
    # the reload waits for a running request, a second request waits for the reload; when the reload is refused,
    # the second one must not load the model with defaults (unpinned) before it is restored
    settings = Settings.load(state_dir=tmp_path / "state", allowed_roots=[tmp_path], infer_memory_budget_gb=0.8)
    server = build_server(settings)
    mgr = services.models(state_of(server))
    restore = mgr._restore

    def waiter_first(spec: dict[str, Any]) -> None:  # the interleaving the race needs: the waiting request loads
        with mgr._changed:  # the model before the restore runs
            assert mgr._changed.wait_for(lambda: MODEL in mgr.resident and MODEL not in mgr._loading, 60)
        restore(spec)

    mgr._restore = waiter_first  # type: ignore[method-assign]
    try:
        async with Client(server) as c:  # type: ignore[arg-type]
            await call_ok(c, "infer_load", name=MODEL, context_length=1024, pin=True)
            streaming = anyio.Event()

            async def progress(_p: float, _t: float | None, _m: str | None) -> None:
                streaming.set()

            async with anyio.create_task_group() as tg:
                long = {"prompt": "0 0 0 0", "max_tokens": 300, "temperature": 0, "repeat_penalty": 1.0}
                tg.start_soon(functools.partial(c.call_tool, "infer_complete", long, progress_callback=progress))
                await streaming.wait()
                tg.start_soon(functools.partial(call_err, c, "infer_load", name=MODEL, context_length=8192))
                await wait_until(lambda: mgr.loading(MODEL), 30)
                tg.start_soon(functools.partial(call_ok, c, "infer_complete", prompt="Hi", max_tokens=1, model=MODEL))
            assert await loaded(c) == {MODEL: (1024, True)}
    finally:
        state_of(server).close()


def test_a_load_answers_with_its_own_copy_when_another_replaced_it_at_once(tmp_path: Path) -> None:
    """Two loads of one model with different contexts run one after the other (last one wins); the first one's
    answer was read back from the registry after its load ended, so it described the second load's copy."""
    settings = Settings.load(state_dir=tmp_path / "state", allowed_roots=[tmp_path])
    server = build_server(settings)
    mgr = services.models(state_of(server))
    entry, second = mgr.entry, {}

    def replaced_first(d: Any, *args: Any) -> Any:  # the other client's load lands in between
        if not second:
            second["started"] = True
            second["result"] = mgr.load(MODEL, context_length=512)
        return entry(d, *args)

    mgr.entry = replaced_first  # type: ignore[method-assign]
    try:
        first = mgr.load(MODEL, context_length=1024)
        assert first.plan.context_length == 1024
        assert first.model.loaded is not None and first.model.loaded.context_length == 1024
        if second:  # the fixed load reads no registry entry, so the other load does not run here
            assert second["result"].model.loaded.context_length == 512
    finally:
        state_of(server).close()


@pytest.mark.parametrize("reload_fails", [False, True], ids=["load-succeeds", "pinned-reload-fails"])
async def test_an_unload_during_a_load_of_the_model_waits_for_it_and_unloads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reload_fails: bool
) -> None:
    """infer_unload answered `unloaded: false` at once while the model was loading, and the load then left it
    loaded (a failed reload of a pinned model even restored the pinned copy): memory the user freed stayed held."""
    from gpubox.tools.inference import manager as manager_mod

    server = build_server(Settings.load(state_dir=tmp_path / "state", allowed_roots=[tmp_path]))
    mgr = services.models(state_of(server))
    real_open, opening, release = manager_mod.open_backend, threading.Event(), threading.Event()

    def held_open(*args: Any, **kwargs: Any) -> Any:
        if opening.is_set():  # a restore of the earlier copy (the bug) loads for real
            return real_open(*args, **kwargs)
        opening.set()
        release.wait(60)
        if reload_fails:
            raise CapacityError("out of memory (the test's)")
        return real_open(*args, **kwargs)

    try:
        async with Client(server) as c:  # type: ignore[arg-type]
            if reload_fails:
                await call_ok(c, "infer_load", name=MODEL, context_length=512, pin=True)
            monkeypatch.setattr(manager_mod, "open_backend", held_open)
            async with anyio.create_task_group() as tg:
                tg.start_soon(functools.partial(call_tool_quiet, c, "infer_load", name=MODEL, context_length=1024))
                await anyio.to_thread.run_sync(opening.wait, 60)
                unloaded = anyio.Event()

                async def unload() -> None:
                    await call_tool_quiet(c, "infer_unload", name=MODEL)
                    unloaded.set()

                tg.start_soon(unload)  # it waits for the load (before the fix it answered at once)
                await wait_until(lambda: MODEL in getattr(mgr, "_unload_asked", ()) or unloaded.is_set(), 30)
                release.set()
            monkeypatch.setattr(manager_mod, "open_backend", real_open)
            assert await loaded(c) == {}
            assert (await call_ok(c, "box_plan"))["box"]["holdings"] == []
    finally:
        release.set()
        state_of(server).close()


async def call_tool_quiet(c: Client, tool: str, **args: Any) -> None:
    await c.call_tool(tool, args)  # the load's refusal is the test's own doing: only the end state matters


def test_a_restore_that_an_unload_overtook_loads_nothing(tmp_path: Path) -> None:
    """A failed reload restores the earlier copy from its saved arguments; an infer_unload that lands between
    the failure and the restore drops those arguments, and the restore must then load nothing (it loaded the
    model again, pinned, after the user unloaded it)."""
    server = build_server(Settings.load(state_dir=tmp_path / "state", allowed_roots=[tmp_path]))
    mgr = services.models(state_of(server))
    try:
        spec = {"name": MODEL, "context_length": 512, "pin": True}
        mgr._respawn[MODEL] = spec
        mgr.unload(MODEL, missing_ok=True)  # the user's unload: forgets the saved arguments
        mgr._restore(spec)
        assert mgr.loaded() == {}
    finally:
        state_of(server).close()
