"""Call a remote gpubox over streamable HTTP with a bearer token.

On the GPU box:  gpubox serve --transport http --host 0.0.0.0 --token-file ~/.gpubox-token
Here:            GPUBOX_URL=http://gpu-box:8765/mcp GPUBOX_TOKEN=... python examples/remote_http_client.py
(or tunnel:      ssh -N -L 8765:127.0.0.1:8765 user@gpu-box, then GPUBOX_URL=http://127.0.0.1:8765/mcp)
"""

from __future__ import annotations

import json
import os

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


async def main() -> None:
    url = os.environ.get("GPUBOX_URL", "http://127.0.0.1:8765/mcp")
    token = os.environ.get("GPUBOX_TOKEN", "")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # httpx2's default 5 s read timeout is too short for generation or indexing calls.
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=600))
    async with http, Client(streamable_http_client(url, http_client=http)) as client:
        status = await client.call_tool("gpu_status", {})
        print(json.dumps(status.structured_content, indent=2))


if __name__ == "__main__":
    anyio.run(main)
