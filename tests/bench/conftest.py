from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import psutil
import pytest
from mcp import Client

from gpubox.extras import is_available

# bench runs need torch (in the worker) and matplotlib (plots in the server); without them every test here skips
MISSING = [m for m in ("torch", "matplotlib") if not is_available(m)]
# a CPU sweep small enough for a 2-core box: two head dims, one short sequence
SMALL = {"device": "cpu", "heads": 2, "seq_len": 64, "head_dim": [16, 32], "warmup": 1, "iterations": 2}
PNG = b"\x89PNG\r\n\x1a\n"


def bench_workers() -> list[psutil.Process]:
    """The bench worker processes this test process started (directly or not)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "gpubox.tools.bench.worker" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:  # exited while we looked
            continue
    return found


@pytest.hookimpl(tryfirst=True)  # before -m "not slow" deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason=f"needs the 'bench' extra (pip install -e '.[bench]'): {', '.join(MISSING)} missing")
    for item in items:
        if "tests/bench/" in str(item.path):
            item.add_marker(pytest.mark.slow)  # every bench tool call starts a torch worker process
            if MISSING:
                item.add_marker(skip)


@pytest.fixture
async def bench_client(server: Any) -> AsyncIterator[Client]:
    """One protocol era only: every call starts a torch worker, and the CPU is shared."""
    async with Client(server) as c:
        yield c
