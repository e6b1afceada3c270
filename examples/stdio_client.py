"""Drive gpubox over stdio with the official MCP Python client.

python examples/stdio_client.py            # starts `gpubox serve` as a child process
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import anyio
from mcp import Client, StdioServerParameters


async def main() -> None:
    command = shutil.which("gpubox") or os.path.join(os.path.dirname(sys.executable), "gpubox")
    # MCP clients pass only an allow-listed environment to the child: forward what gpubox needs.
    env = {k: v for k, v in os.environ.items() if k.startswith(("GPUBOX_", "CUDA_", "HF_"))}
    env["PATH"] = os.environ.get("PATH", "")
    async with Client(StdioServerParameters(command=command, args=["serve"], env=env)) as client:
        tools = [t.name for t in (await client.list_tools()).tools]
        print("tools:", ", ".join(tools))
        status = await client.call_tool("gpu_status", {})
        print(json.dumps(status.structured_content, indent=2))


if __name__ == "__main__":
    anyio.run(main)
