from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import psutil
import pytest
from mcp import Client

# Every test here is marked requires_bench (torch in the worker, matplotlib for plots in the server) and slow (each
# tool call starts a torch worker process): FOLDER_MARKS in tests/conftest.py.
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


@pytest.fixture
async def bench_client(server: Any) -> AsyncIterator[Client]:
    """One protocol era only: every call starts a torch worker, and the CPU is shared."""
    async with Client(server) as c:
        yield c
