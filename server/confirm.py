"""Confirmation before costly work, when the client can ask its user (MCP elicitation, form mode).

A costly tool takes a parameter `Annotated[Confirmation, Resolve(resolver)]`: the SDK runs the resolver before
the tool body and keeps the parameter out of the input schema. The resolver returns `Elicit(message, Confirm)`
when the client declared the elicitation capability, so the user sees what will start (time, memory, cost) and
accepts or declines; a client without it is not asked and the work starts as before. Both protocol eras work:
the SDK sends a mid-call request (up to 2025-11-25) or an input-required round (2026-07-28).
"""

from __future__ import annotations

from typing import Any

from mcp.server.elicitation import AcceptedElicitation, ElicitationResult
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.resolve import Elicit
from pydantic import BaseModel, Field

from gpubox.errors import DeclinedError


class Confirm(BaseModel):
    confirm: bool = Field(default=True, description="Start it")


Confirmation = ElicitationResult[Confirm]


def can_ask(ctx: Context[Any, Any]) -> bool:
    caps = ctx.client_capabilities
    el = caps.elicitation if caps is not None else None
    return el is not None and (el.form is not None or el.url is None)


def go_ahead() -> Confirm:
    """No question: the SDK injects it as an acceptance, and the tool body runs (reporting its own errors)."""
    return Confirm()


def ask(ctx: Context[Any, Any], message: str) -> Elicit[Confirm] | Confirm:
    """What a resolver returns: the question for a client that can ask, else an acceptance (nobody to ask)."""
    if not can_ask(ctx):
        return go_ahead()
    return Elicit(message, Confirm)


def require(answer: Confirmation, what: str) -> None:
    """Raise DeclinedError unless the user accepted and confirmed."""
    data = answer.data if isinstance(answer, AcceptedElicitation) else None
    if isinstance(data, AcceptedElicitation):  # a resolver's own acceptance, wrapped once more by the SDK
        data = data.data
    if isinstance(data, Confirm) and data.confirm:
        return
    how = "declined" if answer.action == "decline" or answer.action == "accept" else "dismissed"
    raise DeclinedError(f"{what} was not started: the user {how} the confirmation. Nothing is running.")
