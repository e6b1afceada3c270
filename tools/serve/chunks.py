"""The shape of an OpenAI-compatible stream's chunks, checked before use: an attached server is any program at a
URL, and a chunk of the wrong shape (a list, a number for content, a string for usage) otherwise surfaced as an
AttributeError or TypeError deep in remote.generate, which the MCP SDK masks as a bare "Error executing tool"."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


class BadChunk(ValueError):
    """What is wrong with a chunk; remote.generate names the engine and quotes the chunk."""


@dataclass
class Chunk:
    pieces: list[str] = field(default_factory=list)  # the text each choice adds
    finish: str | None = None
    usage: dict[str, int] | None = None


def quote(value: object, limit: int = 200) -> str:
    """A short printable copy of what a server sent: a bad chunk may be megabytes."""
    try:
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def parse(chunk: Any, chat: bool) -> Chunk:
    """The text, finish reason and usage of one chunk of /chat/completions (`chat`: choices[].delta.content) or
    /completions (choices[].text); BadChunk says what does not fit. Absent or null fields are allowed (a role-only
    first delta, a usage-only last chunk); fields of the wrong type are not."""
    if not isinstance(chunk, dict):
        raise BadChunk(f"a chunk must be a JSON object, not {type(chunk).__name__}")
    if chunk.get("error") is not None:  # vLLM reports a failure mid-stream as a chunk {"error": {...}}
        raise BadChunk(f"the server reported an error: {quote(chunk['error'])}")
    out = Chunk(usage=_usage(chunk.get("usage")))
    choices = chunk.get("choices")
    if choices is None:
        return out
    if not isinstance(choices, list):
        raise BadChunk("'choices' must be a list")
    for choice in choices:
        if not isinstance(choice, dict):
            raise BadChunk("each choice must be an object")
        if chat:
            delta = choice.get("delta")
            if delta is not None and not isinstance(delta, dict):
                raise BadChunk("'delta' must be an object")
            piece = (delta or {}).get("content")
        else:
            piece = choice.get("text")
        if piece is not None and not isinstance(piece, str):
            raise BadChunk("the content must be a string")
        if piece:
            out.pieces.append(piece)
        finish = choice.get("finish_reason")
        if finish is not None and not isinstance(finish, str):
            raise BadChunk("'finish_reason' must be a string")
        out.finish = finish or out.finish
    return out


def _usage(usage: Any) -> dict[str, int] | None:
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise BadChunk("'usage' must be an object")
    counts: dict[str, int] = {}
    for key in ("prompt_tokens", "completion_tokens"):
        value = usage.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BadChunk(f"usage.{key} must be a whole number")
        counts[key] = value
    return counts
