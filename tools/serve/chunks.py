"""The shape of an OpenAI-compatible stream's chunks, checked before use: an attached server is any program at a
URL, and a chunk of the wrong shape (a list, a number for content, a string for usage) otherwise surfaced as an
AttributeError or TypeError deep in remote.generate, which the MCP SDK masks as a bare "Error executing tool"."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gpubox.errors import BusyError, GpuboxError, InvalidInputError, UpstreamError


class BadChunk(ValueError):
    """What is wrong with a chunk; remote.generate names the engine and quotes the chunk."""


class ReportedError(Exception):
    """A well-formed chunk in which the server reports an error instead of an answer (vLLM's streaming error
    response, {"error": {"message", "type", "param", "code"}}, for an exception raised after the stream began):
    not a malformed chunk. `error` is the object as sent; `classify` says whose fault it is."""

    def __init__(self, error: Any) -> None:
        super().__init__(quote(error))
        self.error = error


# What an error's type says when its code does not: vLLM's (create_error_response) and OpenAI's own
_REFUSED_TYPES = {"BadRequestError", "invalid_request_error", "UnprocessableEntityError", "NotFoundError"}
_BUSY_TYPES = {"ServiceUnavailableError", "RateLimitError", "rate_limit_exceeded"}


def classify(error: Any, who: str, fix: str) -> GpuboxError:
    """The gpubox error for an error the server reported in its stream, by its HTTP-like code (the type when there
    is none): a 4xx other than 429 refuses the request's arguments (InvalidInputError, the server's own message),
    a 429 or 503 is an overload to retry (BusyError), anything else is the server's fault (UpstreamError). vLLM
    sends BadRequestError with code 400 unless the exception says otherwise, InternalServerError with 500 for an
    engine that failed mid-generation."""
    fields = error if isinstance(error, dict) else {}
    message = fields.get("message", error)
    said = message if isinstance(message, str) else quote(message)
    said = said if len(said) <= 800 else f"{said[:800]}... ({len(said)} characters)"
    kind = fields.get("type")
    code = _code(fields.get("code"))
    label = ", ".join(str(x) for x in (kind, code) if x is not None)
    label = f" ({label})" if label else ""
    if code in (429, 503) or (code is None and kind in _BUSY_TYPES):
        return BusyError(f"{who} is overloaded and ended its answer{label}: {said}; retry later")
    if (code is not None and 400 <= code < 500) or (code is None and kind in _REFUSED_TYPES):
        return InvalidInputError(f"{who} refused the request while answering{label}; the engine said: {said}")
    return UpstreamError(who, f"reported an error in its stream{label}: {said}", fix, sent=quote({"error": error}))


def _code(value: Any) -> int | None:
    """An error's code as a number: vLLM sends an int, OpenAI a string that may name no status at all."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


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
    /completions (choices[].text); BadChunk says what does not fit, ReportedError carries an error the server sent
    in place of an answer. Absent or null fields are allowed (a role-only first delta, a usage-only last chunk);
    fields of the wrong type are not."""
    if not isinstance(chunk, dict):
        raise BadChunk(f"a chunk must be a JSON object, not {type(chunk).__name__}")
    if chunk.get("error") is not None:  # vLLM reports a failure mid-stream as a chunk {"error": {...}}
        raise ReportedError(chunk["error"])
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
            out.pieces.append(_valid(piece))
        finish = choice.get("finish_reason")
        if finish is not None and not isinstance(finish, str):
            raise BadChunk("'finish_reason' must be a string")
        out.finish = finish or out.finish
    return out


def _valid(piece: str) -> str:
    """`piece` as text that can be sent on: JSON's "\\ud800" escape without its pair decodes to a lone surrogate,
    which no UTF-8 encoder takes (the answer failed to serialise: a bare tool error). It becomes U+FFFD."""
    try:
        piece.encode("utf-8")
    except UnicodeEncodeError:
        return piece.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return piece


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
