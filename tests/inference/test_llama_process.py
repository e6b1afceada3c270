"""llama.cpp models in a process of their own (infer_llama_process='always'; 'auto' picks it on GPU builds, where a
CUDA llama.cpp crashed in the server's process on H100/H200 boxes): the real bundled SmolLM2 through MCP, streaming,
schemas, cancel, errors with their type, and a crash of the child that the server survives and recovers from."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.bundled import smollm2_gguf
from gpubox.errors import CapacityError, GpuboxError
from gpubox.settings import Settings
from gpubox.tools.inference.adapter import manager
from gpubox.tools.inference.llama_process import LlamaProcessBackend, _rebuilt
from tests.conftest import call_err, call_ok, skip_without, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
MODEL = "smollm2-135m-instruct"
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


async def test_cancel_reaches_the_child_and_errors_keep_their_type(env: Any) -> None:
    async with Client(env[0]) as client:
        await call_ok(client, "infer_complete", model=MODEL, prompt="Hi", max_tokens=2)
        with anyio.move_on_after(0.8):
            await client.call_tool("infer_complete", {"prompt": "Once upon a time", "max_tokens": 4000})
        with anyio.fail_after(10):  # behind 4000 uncancelled tokens this would wait ~40 s
            after = await call_ok(client, "infer_complete", prompt="Hello", max_tokens=4, temperature=0)
        text = await call_err(client, "infer_complete", prompt="word " * 1500, max_tokens=8)
    assert after["completion_tokens"] <= 4
    assert "context length exceeded" in text and "1024" in text  # CapacityError, raised again on this side


async def test_a_crash_of_the_child_is_reported_and_the_next_request_loads_the_model_again(env: Any) -> None:
    async with Client(env[0]) as client:
        await call_ok(client, "infer_load", name=MODEL)
        old = worker_pid(env[0])
        os.kill(old, signal.SIGSEGV)
        await wait_until(lambda: not is_worker(old), timeout=10)
        text = await call_err(client, "infer_complete", model=MODEL, prompt="Hi", max_tokens=4)
        assert "ended during" in text and "SIGSEGV" in text and "loads it again" in text
        assert (await call_ok(client, "gpu_status")) is not None  # the server lives
        again = await call_ok(client, "infer_complete", model=MODEL, prompt="Hi", max_tokens=4)
        assert again["completion_tokens"] > 0 and worker_pid(env[0]) != old
        owners = [h["owner"] for h in (await call_ok(client, "box_plan"))["box"]["holdings"]]
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
    assert type(odd) is GpuboxError and str(odd) == "no such model"
    other = _rebuilt({"type": "ValueError", "message": "Failed to load model"})
    assert type(other) is RuntimeError and str(other) == "ValueError: Failed to load model"
