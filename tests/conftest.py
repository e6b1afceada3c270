from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.settings import Settings

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU visible to NVML")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUBOX_")}
    env.update({"GPUBOX_STATE_DIR": str(tmp_path / "state"), "HF_HUB_OFFLINE": "1", **extra})
    return env


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A real `gpubox serve --transport http` on a free loopback port with a token."""
    port = free_port()
    token = "t0k-" + os.urandom(8).hex()
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    log = tmp_path / "server.log"
    log_handle = log.open("wb")
    proc = subprocess.Popen(
        [GPUBOX, "serve", "--transport", "http", "--port", str(port), "--token-file", str(token_file)],
        env=child_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=log_handle,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(log.read_text())
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.1)
        yield base, token
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log_handle.close()
