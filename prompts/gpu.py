"""Prompts around GPU health."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from pydantic import Field


def register(mcp: MCPServer[Any]) -> None:
    @mcp.prompt(title="GPU health check")
    def gpu_health_check(
        workload: Annotated[str, Field(description="What you plan to run, e.g. 'QLoRA on a 7B model'")] = "",
    ) -> str:
        """Ask the model to read gpu_status and judge whether the box is healthy and free for a workload."""
        goal = f" before running: {workload}" if workload else ""
        return (
            f"Check this GPU box's health{goal}. Call the `gpu_status` tool (or read `gpu://status`). "
            "Report per GPU: free vs total memory, utilisation, temperature, power draw vs limit, any "
            "throttle reasons and ECC errors, and which processes hold memory. If `available` is false, "
            "explain the reason and what to install or check. End with a one-line verdict: ready, busy, "
            "or unhealthy, and why."
        )

    @mcp.prompt(title="Session report")
    def session_report() -> str:
        """Ask the model to summarise this GPU-box session: cost, what was done, what to save before shutdown."""
        return (
            "Write a short end-of-session report for this rented GPU box. Read `box://session` (or call "
            "`gpu_status` and use its `session` block). Give: uptime, price per hour and its source, cost so far, "
            "budget left and when it runs out at this rate; how busy the GPU was (busy share, idle minutes — say "
            "plainly if utilisation was not measured) and which kinds of work used it, with minutes each. Then "
            "list what to save before shutting the box down: fine-tuned adapters (`finetune_list`), search "
            "indexes worth keeping (`search_list`), benchmark results, and any running job that would be lost. "
            "End with a one-line recommendation: keep working, or stop the box now."
        )
