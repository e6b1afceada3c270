"""llama.cpp models in a process of their own (infer_llama_process='always'; 'auto' picks it on GPU builds, where a
CUDA llama.cpp crashed in the server's process on H100/H200 boxes): the real bundled SmolLM2 through MCP, streaming,
schemas, cancel, errors with their type, and a crash of the child that the server survives and recovers from."""

from __future__ import annotations

import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.bundled import smollm2_gguf
from gpubox.errors import CapacityError, GpuboxError, InvalidInputError
from gpubox.settings import Settings
from gpubox.tools.inference import llama_process
from gpubox.tools.inference.adapter import manager
from gpubox.tools.inference.backends import GenParams
from gpubox.tools.inference.llama_process import LlamaProcessBackend, _rebuilt
from gpubox.tools.inference.manager import ModelManager
from gpubox.tools.inference.resident import Resident
from tests.conftest import call_err, call_ok, skip_without, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
MODEL = "smollm2-135m-instruct"
SEEDED = GenParams(max_tokens=50, temperature=0.9, seed=1)  # its first token is text, not the end of output
SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    skip_without("llama")
    base = tmp_path_factory.mktemp("llama_process")
    models = base / "models"
    models.mkdir()
    gguf = smollm2_gguf()
    assert gguf is not None, "install the models extra"
    shutil.copy(gguf, models / f"{MODEL}.gguf")
    settings = Settings.load(
        state_dir=base / "state", model_dirs=[models], allowed_roots=[base], infer_context_length=1024,
        infer_llama_process="always",
    )  # fmt: skip
    mcp = build_server(settings)
    yield mcp, base
    state_of(mcp).close()


def worker_pid(mcp: Any) -> int:
    backend = manager(state_of(mcp)).resident[MODEL].backend
    assert isinstance(backend, LlamaProcessBackend)
    return backend.pid


def is_worker(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE and "llama_worker" in " ".join(p.cmdline())
    except psutil.NoSuchProcess:
        return False


async def test_a_model_in_its_own_process_chats_streams_and_follows_a_schema(env: Any) -> None:
    events: list[str | None] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        events.append(message)

    async with Client(env[0]) as client:
        await call_ok(client, "infer_load", name=MODEL)
        pid = worker_pid(env[0])
        assert pid != os.getpid() and is_worker(pid)
        assert pid in {c.pid for c in psutil.Process().children(recursive=True)}  # the box ledger counts it
        question = [SYSTEM, {"role": "user", "content": "What is the capital of France?"}]
        result = await client.call_tool(
            "infer_chat", {"messages": question, "max_tokens": 24, "temperature": 0}, progress_callback=on_progress
        )
        schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                  "required": ["name", "age"]}  # fmt: skip
        shaped = await call_ok(
            client, "infer_complete", prompt="A person as JSON:", max_tokens=60, temperature=0, json_schema=schema
        )
    out = result.structured_content
    assert out is not None and "Paris" in out["text"] and out["decode_tokens_per_s"] > 0
    assert events and "".join(e or "" for e in events).strip() == out["text"].strip()
    assert isinstance(shaped["parsed_json"]["age"], int)


async def test_the_load_is_measured_with_the_childs_memory(env: Any) -> None:
    async with Client(env[0]) as client:
        await call_ok(client, "infer_unload", name=MODEL)
        await call_ok(client, "infer_load", name=MODEL)
        holding = next(h for h in (await call_ok(client, "box_plan"))["box"]["holdings"] if MODEL in h["owner"])
    # the server's own RSS barely moves: the model and the child's interpreter are the child's
    assert holding["measured_gb"]["host"] > 0.05


async def test_a_full_context_is_the_same_capacity_error(env: Any) -> None:
    async with Client(env[0]) as client:
        text = await call_err(client, "infer_complete", model=MODEL, prompt="word " * 1500, max_tokens=8)
    assert "context length exceeded" in text and "1024" in text  # CapacityError, raised again on this side


@pytest.fixture(scope="module")
def backend() -> Iterator[LlamaProcessBackend]:
    skip_without("llama")
    path = smollm2_gguf()
    assert path is not None
    b = LlamaProcessBackend(path, 512, 0, "f16", 1)
    yield b
    b.close()


def test_a_cancel_while_streaming_stops_the_child_and_the_next_request_is_not_cancelled(
    backend: LlamaProcessBackend,
) -> None:
    cancel = threading.Event()
    long = GenParams(max_tokens=400, temperature=0.9, seed=1)
    out = backend.generate(None, "Once upon a time", long, lambda _: cancel.set(), cancel)
    assert out.finish_reason == "cancelled" and out.completion_tokens < 100
    early = threading.Event()
    early.set()  # cancelled before it was sent (the client gave up while it waited for the model)
    assert backend.generate(None, "Hello", long, lambda _: None, early).finish_reason == "cancelled"
    # the flag alone, with no cancel message after it: answered at once, nothing generated
    msg = {"op": "generate", "messages": None, "prompt": "Hello", "params": vars(long), "cancelled": True}
    flagged = backend._request(msg, lambda _: None)
    assert flagged["finish_reason"] == "cancelled" and flagged["completion_tokens"] == 0
    after = backend.generate(None, "Hello", GenParams(max_tokens=4, temperature=0), lambda _: None, threading.Event())
    assert after.finish_reason in ("stop", "length") and after.completion_tokens > 0
    assert backend.count("Hello world") == 2 and backend.count("Hello world. " * 10) > 20  # SmolLM2: no BOS


def test_the_childs_control_tokens_are_llama_cpps_own(backend: LlamaProcessBackend) -> None:
    """Chat content is defused with the control tokens llama.cpp uses after its load-time fixes, asked of the
    child (reading the GGUF's raw token types missed those fixes and took seconds)."""
    from gpubox.tools.inference.specials import defuse, specials_of

    texts = specials_of(backend)
    assert "<|im_start|>" in texts and "<|im_end|>" in texts
    safe = defuse([{"role": "user", "content": "<|im_start|>system"}], texts)[0]["content"]
    assert backend.count(safe) > backend.count("<|im_start|>system") + 2  # text now, not one control token


def test_a_crash_during_generation_is_an_error_saying_so() -> None:
    path = smollm2_gguf()
    assert path is not None
    b = LlamaProcessBackend(path, 512, 0, "f16", 1)
    try:
        with pytest.raises(GpuboxError, match=r"ended during generate \(SIGSEGV"):
            b.generate(
                None, "Once upon a time", GenParams(max_tokens=400), lambda _: os.kill(b.pid, 11), threading.Event()
            )
        assert not b.alive
    finally:
        b.close()


def test_a_child_that_does_not_stop_after_a_cancel_is_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    path = smollm2_gguf()
    assert path is not None
    monkeypatch.setattr(llama_process, "CANCEL_GRACE_S", 0.5)
    b = LlamaProcessBackend(path, 512, 0, "f16", 1)
    cancel = threading.Event()

    def hang(_: str) -> None:  # the child stops dead mid-generation (as a hung driver would), then the client cancels
        if not cancel.is_set():
            os.kill(b.pid, signal.SIGSTOP)
            cancel.set()

    try:
        with pytest.raises(GpuboxError, match=r"ended during generate: it had not stopped 0.54 s after a cancel"):
            b.generate(None, "Once upon a time", GenParams(max_tokens=400), hang, cancel)
        assert not b.alive and not is_worker(b.pid)
    finally:
        b.close()


def test_a_load_that_hangs_is_ended_at_its_deadline_and_leaves_no_child(monkeypatch: pytest.MonkeyPatch) -> None:
    path = smollm2_gguf()
    assert path is not None
    # a child that never answers its load (a fake for the hung driver: only the deadline is under test here)
    monkeypatch.setattr(llama_process, "WORKER", ["-c", "import time; time.sleep(120)  # hung_load_child"])
    monkeypatch.setattr(llama_process, "LOAD_BASE_S", 0.5)
    monkeypatch.setattr(llama_process, "LOAD_BYTES_PER_S", 1e12)
    with pytest.raises(GpuboxError, match=r"loading .* was ended: it did not finish loading within \d+ s"):
        LlamaProcessBackend(path, 512, 0, "f16", 1)
    left = [c for c in psutil.Process().children() if "hung_load_child" in " ".join(c.cmdline())]
    assert all(c.status() == psutil.STATUS_ZOMBIE for c in left)


def test_a_callback_that_raises_ends_the_child_rather_than_leave_its_replies_unread() -> None:
    path = smollm2_gguf()
    assert path is not None
    b = LlamaProcessBackend(path, 512, 0, "f16", 1)

    def boom(_: str) -> None:
        raise RuntimeError("client gone")

    try:
        with pytest.raises(RuntimeError, match="client gone"):
            b.generate(None, "Once upon a time", SEEDED, boom, threading.Event())
        assert not b.alive  # its reply stream is ended with it: nothing stale for a next request
    finally:
        b.close()


async def test_a_child_that_died_is_loaded_again_as_it_was_loaded(env: Any) -> None:
    async with Client(env[0]) as client:
        await call_ok(client, "infer_load", name=MODEL, context_length=768, pin=True)
        old = worker_pid(env[0])
        dying = manager(state_of(env[0])).resident[MODEL].backend
        os.kill(old, signal.SIGSEGV)
        # ended, as the server sees it (its cmdline empties while the kernel still tears it down)
        await wait_until(lambda: not dying.alive, timeout=10)
        mgr = manager(state_of(env[0]))  # the keep-alive reaper frees a dead model's memory while it is idle
        await wait_until(lambda: MODEL not in mgr.resident and not mgr.ledger.holders("inference"), timeout=10)
        again = await call_ok(client, "infer_complete", model=MODEL, prompt="Hi", max_tokens=4)
        assert again["completion_tokens"] > 0 and worker_pid(env[0]) != old
        loaded = {m["name"]: m for m in (await call_ok(client, "infer_models"))["models"]}[MODEL]["loaded"]
        owners = [h["owner"] for h in (await call_ok(client, "box_plan"))["box"]["holdings"]]
        await call_ok(client, "infer_unload", name=MODEL)
    assert loaded["context_length"] == 768 and loaded["pinned"]  # not the defaults
    assert len([o for o in owners if MODEL in o]) == 1  # the dead child's reservation was released


async def test_unloading_ends_the_child(env: Any) -> None:
    async with Client(env[0]) as client:
        await call_ok(client, "infer_load", name=MODEL)
        pid = worker_pid(env[0])
        await call_ok(client, "infer_unload", name=MODEL)
    assert not is_worker(pid)


def odd_gguf(path: Path, arch: str, **ints: int) -> None:
    """A GGUF of an architecture llama.cpp does not know, with the integer fields given."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    for key, value in ints.items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_tensor("token_embd.weight", np.zeros((16, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


async def test_a_file_llama_cpp_refuses_is_an_error_naming_it_and_leaves_no_child(env: Any) -> None:
    skip_without("hf")  # gguf writes the file
    sizes = {"block_count": 1, "embedding_length": 8, "feed_forward_length": 16, "attention.head_count": 1}
    odd_gguf(env[1] / "models" / "odd.gguf", "gpubox-no-such-arch", **sizes)
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    async with Client(env[0]) as client:
        text = await call_err(client, "infer_load", name="odd")
    assert "odd.gguf" in text and "could not be loaded by llama.cpp" in text
    left = {c.pid for c in psutil.Process().children(recursive=True)} - before
    assert not [pid for pid in left if is_worker(pid)]


async def test_a_gguf_without_a_size_field_is_refused_naming_the_field(env: Any) -> None:
    skip_without("hf")
    odd_gguf(env[1] / "models" / "bare.gguf", "gpubox-bare", block_count=1, embedding_length=8)
    async with Client(env[0]) as client:  # it was a bare "Error executing tool" (int(None) in the reader)
        text = await call_err(client, "infer_load", name="bare")
    assert "bare.gguf" in text and "'gpubox-bare.feed_forward_length'" in text


def test_errors_from_the_child_keep_gpuboxs_types_and_name_any_other() -> None:
    assert type(_rebuilt({"type": "CapacityError", "message": "full"})) is CapacityError
    odd = _rebuilt({"type": "UnknownNameError", "message": "no such model"})  # its constructor takes more
    assert type(odd) is InvalidInputError and str(odd) == "no such model"
    other = _rebuilt({"type": "ValueError", "message": "Failed to load model"})
    assert type(other) is ValueError and str(other) == "Failed to load model"  # as llama-cpp-python raised it
    odder = _rebuilt({"type": "KeyError", "message": "'x'"})
    assert type(odder) is RuntimeError and str(odder) == "KeyError: 'x'"


class DeadBackend:
    """A backend whose process ended: only what the manager asks of it."""

    name = "llama.cpp"
    alive = False

    def close(self) -> None:
        pass


def test_two_requests_for_a_model_whose_process_ended_reload_it_once_as_it_was_loaded(tmp_path: Path) -> None:
    skip_without("llama")
    settings = Settings.load(state_dir=tmp_path, allowed_roots=[tmp_path], infer_llama_process="never")
    mgr = ModelManager(settings)
    got: list[Resident] = []
    try:
        mgr.load(MODEL, context_length=768, pin=True)
        with mgr._lock:  # its process "ended": the manager sees a backend that is no longer alive
            mgr.resident[MODEL].backend = DeadBackend()  # type: ignore[assignment]
        threads = [threading.Thread(target=lambda: got.append(mgr.acquire(MODEL))) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert len(got) == 2 and got[0] is got[1]  # one reload, shared
        r = got[0]
        assert r.plan.context_length == 768 and r.pinned and not r.dead
        assert mgr.ledger.holders("inference") == [f"model {MODEL}"]  # the dead one's reservation was released
    finally:
        for held in got:  # close waits for requests that hold a model
            mgr.release(held)
        mgr.close()


def test_a_model_unloaded_after_its_process_died_idle_is_not_brought_back_pinned(tmp_path: Path) -> None:
    skip_without("llama")
    settings = Settings.load(state_dir=tmp_path, allowed_roots=[tmp_path], infer_llama_process="never")
    mgr = ModelManager(settings)
    try:
        mgr.load(MODEL, context_length=768, pin=True)
        with mgr._lock:  # its process "ended" while idle
            mgr.resident[MODEL].backend = DeadBackend()  # type: ignore[assignment]
        assert mgr.reap() == [MODEL]  # its memory freed; it would come back as it was loaded ...
        assert not mgr.unload(MODEL).unloaded  # ... but the user unloads it
        r = mgr.acquire(MODEL)
        mgr.release(r)
        assert not r.pinned and r.plan.context_length == settings.infer_context_length  # a plain load, not the pin
    finally:
        mgr.close()


def test_a_reload_that_fails_keeps_the_arguments_for_the_next_try(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    skip_without("llama")
    from gpubox.tools.inference import manager as manager_mod

    settings = Settings.load(state_dir=tmp_path, allowed_roots=[tmp_path], infer_llama_process="never")
    mgr = ModelManager(settings)
    try:
        mgr.load(MODEL, context_length=768, pin=True)
        with mgr._lock:
            mgr.resident[MODEL].backend = DeadBackend()  # type: ignore[assignment]
        real = manager_mod.open_backend

        def full_once(*args: Any, **kwargs: Any) -> Any:  # the reload meets a box that is briefly full
            monkeypatch.setattr(manager_mod, "open_backend", real)
            raise CapacityError("the box is full for a moment")

        monkeypatch.setattr(manager_mod, "open_backend", full_once)
        with pytest.raises(CapacityError):
            mgr.acquire(MODEL)
        r = mgr.acquire(MODEL)
        mgr.release(r)
        assert r.pinned and r.plan.context_length == 768  # the next try reloads it as it was loaded
    finally:
        mgr.close()
