"""Every error gpubox raises on purpose, in one tree.

    GpuboxError                 base; its message always says what to do next
    ├── InvalidInputError       an argument is out of range or malformed
    │   └── UnknownNameError    a name (GPU, model, index, tool) is not known; lists close matches
    ├── PathNotAllowedError     a path lies outside the allowed roots (or escapes them by .. or a symlink)
    ├── MissingExtraError       an optional dependency is not installed; names the extra to install
    ├── NotFoundError           something that should exist on disk does not (model file, index)
    ├── CapacityError           the work cannot fit (memory, context length, resident-model budget)
    ├── BusyError               the resource is in use by another request or job
    ├── UpstreamError           a model server gpubox routes to answered wrongly or stopped answering (not the input)
    ├── OutputRejectedError     generated output breaks the schema the caller asked for; names the violation
    ├── DeclinedError           the user declined a confirmation (MCP elicitation); nothing was started
    └── ConfigError             settings are invalid or unsafe (e.g. public bind without a token)

Core modules raise these; the MCP adapter layer (gpubox.registry) turns them into ToolError so the
client's model reads the message, while unexpected exceptions stay masked by the SDK.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def cut(text: str, limit: int = 64) -> str:
    """A name a client sent, as an error message shows it: a 5 MB name came back whole."""
    return text if len(text) <= limit else text[:limit] + "..."


class GpuboxError(Exception):
    """Base class: a deliberate, user-facing error whose message names the fix."""


class InvalidInputError(GpuboxError):
    """An argument is out of range, malformed or inconsistent with another argument."""


class UnknownNameError(InvalidInputError):
    """A name is not known. The message lists the closest valid names."""

    def __init__(self, kind: str, name: str, valid: Iterable[str], hint: str = "") -> None:
        name = cut(name)  # matched too: difflib on megabytes is slow
        choices = sorted(set(valid))
        close = difflib.get_close_matches(name, choices, n=5, cutoff=0.5)  # 0.4 offered 'nodes' for 'bogus'
        lowered = [c for c in choices if name.lower() in c.lower() and c not in close]
        suggestions = (close + lowered)[:5]
        parts = [f"unknown {kind} '{name}'."]
        if suggestions:
            parts.append("Did you mean: " + ", ".join(suggestions) + "?")
        shown = choices if len(choices) <= 40 else [*choices[:40], f"... ({len(choices) - 40} more)"]
        if shown:
            parts.append(f"Valid {kind} names: " + ", ".join(shown) + ".")
        if hint:
            parts.append(hint)
        super().__init__(" ".join(parts))
        self.kind = kind
        self.name = name
        self.suggestions = suggestions
        self.hint = hint


class OutputRejectedError(GpuboxError):
    """Generated output does not satisfy the requested JSON schema. The message keeps the text."""


class DeclinedError(GpuboxError):
    """The user declined (or dismissed) the confirmation of costly work: nothing was started."""


class PathNotAllowedError(GpuboxError):
    """A path resolves outside every allowed root."""


class MissingExtraError(GpuboxError):
    """An optional dependency is missing."""

    def __init__(self, feature: str, extra: str, module: str) -> None:
        super().__init__(
            f"{feature} needs the Python module '{module}', which is not installed. "
            f"Install it with: pip install 'gpubox[{extra}]'"
        )
        self.extra = extra
        self.module = module


class NotFoundError(GpuboxError):
    """Something expected on disk or in a registry is not there."""


class CapacityError(GpuboxError):
    """The request cannot fit: memory, context length or a configured budget."""


class BusyError(GpuboxError):
    """The resource is busy with other work."""


class UpstreamError(GpuboxError):
    """The model server behind a served name (a vLLM engine gpubox started, a server attached with serve_attach)
    answered as no OpenAI-compatible server should (a chunk that is not JSON or of the wrong shape, a stream cut
    short, a line without end, a broken model list) or stopped answering. Kept apart from InvalidInputError, which
    tells the caller to change its arguments: here the same request succeeds once the server is fixed, so the
    message names the server and its URL, quotes what it sent, and says what to do about the server."""

    LEAD = "The model server is at fault, not this request's arguments"

    def __init__(self, server: str, fault: str, fix: str, sent: str | None = None) -> None:
        said = f"; it sent: {sent}" if sent is not None else ""
        super().__init__(f"{server} {fault}{said}. {self.LEAD} (other arguments will not help): {fix}")
        self.server = server
        self.fault = fault
        self.sent = sent


class ConfigError(GpuboxError):
    """Settings are invalid or unsafe."""
