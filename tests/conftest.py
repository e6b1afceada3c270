from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.types import CallToolResult

from gpubox.app import build_server, state_of
from gpubox.extras import EXTRAS, is_available
from gpubox.settings import Settings
from gpubox.tools.inference.llama_import import share_cxx_runtime

# as gpubox does before it imports llama_cpp: tests that import llama_cpp themselves need it too on a build like
# the H200's, whose libllama.so does not list libstdc++ (tools/inference/llama_import.py)
share_cxx_runtime()

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
GPUBOX = str(Path(sys.executable).parent / "gpubox")


def has_gpu() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return n > 0
    except Exception:
        return False


# Optional extras: ONE skip mechanism. A marker `requires_<extra>` for each extra in gpubox.extras.EXTRAS (the
# server's own table of extras and the modules each provides, which `gpubox doctor` reports too): a test carrying
# it is skipped, by the hook below, when any module of that extra is not importable, with a reason naming the
# extra, the pip command and what is missing. No second list of modules here. EXTRAS has the "models" extra (the
# bundled SmolLM2 and MiniLM packages), so no test-only pseudo-extra is needed.
# - one test or one file: decorate it, or `pytestmark = [requires_x, ...]` in the file;
# - every test of a folder: FOLDER_MARKS below;
# - a fixture (pytest ignores marks on fixtures): call skip_without("x") in it.
# `pytest.importorskip` stays only for a module that is no extra's in EXTRAS (each such call says so).
requires_gpu_extra = pytest.mark.requires_gpu  # the 'gpu' extra (nvidia-ml-py); the `gpu` marker is the hardware
requires_llama = pytest.mark.requires_llama
requires_hf = pytest.mark.requires_hf
requires_train = pytest.mark.requires_train
requires_search = pytest.mark.requires_search
requires_models = pytest.mark.requires_models
requires_bench = pytest.mark.requires_bench
requires_model2vec = pytest.mark.requires_model2vec

# Marks for every test under a folder of tests/, declared once here rather than as `pytestmark` in each of its
# files: a folder's conftest.py cannot carry them (pytest reads `pytestmark` from test modules and classes only),
# and a new test file in the folder gets them without having to remember.
FOLDER_MARKS: dict[str, tuple[pytest.MarkDecorator, ...]] = {
    # their modules load real models at fixture time
    "search": (requires_search, requires_models),
    "inference": (requires_llama, requires_models),
    "finetune": (requires_train,),
    # every bench tool call starts a torch worker process, so they are slow too
    "bench": (requires_bench, pytest.mark.slow),
}


@functools.cache
def missing_extra(extra: str) -> str | None:
    """Why tests of `extra` cannot run here, or None when every module EXTRAS lists for it is importable."""
    absent = [dist for module, dist in EXTRAS[extra] if not is_available(module)]
    if not absent:
        return None
    return f"needs the '{extra}' extra (pip install -e '.[{extra}]'): {', '.join(absent)} not installed"


def skip_without(*extras: str) -> None:
    """The `requires_<extra>` check for a fixture, which cannot carry marks: skips the test that uses it."""
    for extra in extras:
        reason = missing_extra(extra)
        if reason is not None:
            pytest.skip(reason)


def pytest_configure(config: pytest.Config) -> None:
    for extra, modules in EXTRAS.items():
        dists = ", ".join(dist for _, dist in modules)
        line = f"requires_{extra}: skipped unless the '{extra}' extra ({dists}) is installed"
        config.addinivalue_line("markers", line)


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects: FOLDER_MARKS adds `slow` to tests/bench/
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests_dir = Path(__file__).resolve().parent
    gpu = None
    for item in items:
        path = item.path.resolve()
        parts = path.relative_to(tests_dir).parts if path.is_relative_to(tests_dir) else ()
        names = [m.name for m in item.iter_markers()]  # its own marks first: decorators, then its file's pytestmark
        for mark in FOLDER_MARKS.get(parts[0], ()) if len(parts) > 1 else ():
            item.add_marker(mark)
            names.append(mark.name)
        for extra in dict.fromkeys(n.removeprefix("requires_") for n in names if n.startswith("requires_")):
            if extra not in EXTRAS:
                raise pytest.UsageError(f"{item.nodeid}: unknown marker requires_{extra} (not in gpubox.extras.EXTRAS)")
            reason = missing_extra(extra)
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=reason))
                break
        if item.get_closest_marker("gpu") is not None:  # the marker, not the keyword: tests/gpu/ is a package
            gpu = has_gpu() if gpu is None else gpu
            if not gpu:
                item.add_marker(pytest.mark.skip(reason="no NVIDIA GPU visible to NVML"))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    root = tmp_path / "root"
    root.mkdir()
    return Settings.load(state_dir=tmp_path / "state", allowed_roots=[root, DATA])


@pytest.fixture
async def server(settings: Settings) -> AsyncIterator[object]:
    mcp = build_server(settings)
    yield mcp
    state_of(mcp).close()


@pytest.fixture(params=["auto", "legacy"])
async def client(request: pytest.FixtureRequest, server: object) -> AsyncIterator[Client]:
    async with Client(server, mode=request.param) as c:  # type: ignore[arg-type]
        yield c


# One way to call a tool in a test: these helpers (not `client.call_tool` and a local wrapper). Tool arguments go as
# keywords; `client` and `tool` are positional-only, so a tool argument may have either name.
async def call_result(client: Client, tool: str, /, **args: Any) -> CallToolResult:
    """Call `tool` and return the whole CallToolResult, for tests that read its content blocks too (images, text);
    fails the test on a tool error or a result without structured content."""
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result


async def call_ok(client: Client, tool: str, /, **args: Any) -> dict[str, Any]:
    """Call `tool` and return its structured result; fails the test on a tool error."""
    structured = (await call_result(client, tool, **args)).structured_content
    assert structured is not None
    return structured


async def call_err(client: Client, tool: str, /, **args: Any) -> str:
    """Call `tool`, expect a tool error, and return its text; fails on success or on a masked error.

    The SDK masks unexpected exceptions as the bare "Error executing tool <name>"; ours carry a message."""
    result = await client.call_tool(tool, args)
    assert result.is_error, result.structured_content
    text = " ".join(getattr(c, "text", "") for c in result.content)
    assert text.strip() != f"Error executing tool {tool}" and "Traceback" not in text, text
    return text


async def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    """Poll `predicate` (a plain or an async callable) until it returns something truthy, and return that; fails
    the test after `timeout` seconds. For a state with no event to wait on: never a fixed sleep instead."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"wait_until: {getattr(predicate, '__qualname__', predicate)} not true after {timeout} s")
        await anyio.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUBOX_")}
    env.update({"GPUBOX_STATE_DIR": str(tmp_path / "state"), "HF_HUB_OFFLINE": "1", **extra})
    return env


@contextmanager
def running_http_server(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[tuple[str, str, subprocess.Popen[bytes], Path]]:
    """A real `gpubox serve --transport http` on a free loopback port with a token file; yields
    (base URL, token, process, path of its stderr log). Extra CLI `args` and `env` go to the child."""
    port = free_port()
    token = "t0k-" + os.urandom(8).hex()
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    log = tmp_path / "server.log"
    log_handle = log.open("wb")
    proc = subprocess.Popen(
        [GPUBOX, "serve", "--transport", "http", "--port", str(port), "--token-file", str(token_file), *args],
        env=env if env is not None else child_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=log_handle,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(log.read_text())
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail(f"gpubox serve did not listen on {port} within 60 s:\n{log.read_text()}")
        yield base, token, proc, log
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log_handle.close()


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A real `gpubox serve --transport http` on a free loopback port with a token."""
    with running_http_server(tmp_path) as (base, token, _, _):
        yield base, token


def load_bench_script(folder: Path, name: str) -> ModuleType:
    """bench/<folder>/<name>.py as a module. bench/ is not a package: each script is loaded under a name unique to
    its folder (so nothing shadows a real module), with its folder on sys.path (scripts import their siblings)."""
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
    spec = importlib.util.spec_from_file_location(f"{folder.name}_{name}", folder / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module
