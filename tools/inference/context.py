"""What a request may generate in a loaded model's context: the same rule for infer_chat and infer_complete on
every backend, counted on the prompt the model evaluates (for a chat, its template applied)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpubox.errors import CapacityError


def room_for(prompt_tokens: int, max_tokens: int, fit: bool, n_ctx: int, n_max: int | None = None) -> int:
    """The tokens to generate after the prompt: `max_tokens` when it fits in the context. A caller's that does not
    is refused (as vLLM and OpenAI do), never quietly lowered; the tools' default (`fit`) is lowered to the room left
    (its answer then ends with finish_reason "length"). A prompt that leaves no room is refused either way."""
    room = n_ctx - prompt_tokens
    if max_tokens <= room or (fit and room > 0):
        return min(max_tokens, room)
    raise context_error(prompt_tokens, max_tokens, n_ctx, n_max=n_max)


def context_error(
    prompt_tokens: int,
    max_tokens: int,
    n_ctx: int,
    larger: Callable[[int], str] | None = None,
    n_max: int | None = None,
) -> CapacityError:
    """`n_max`: the most context the model takes (its training length, an engine's positions), when known: a
    larger context beyond it cannot help (infer_load caps context_length there, vLLM refuses max_model_len above
    it). `larger(n)`: how to get a context of n tokens where infer_load does not give it (an engine restarted)."""
    more = larger or (lambda n: f"reload with infer_load context_length={n}")
    need, room = prompt_tokens + max_tokens, n_ctx - prompt_tokens
    fix = f"Shorten the prompt, lower max_tokens to {room} or less" if room > 0 else "Shorten the prompt"
    if n_max is not None and need > n_max and n_ctx < n_max and prompt_tokens < n_max:
        fix += f", or {more(n_max)} and ask for {n_max - prompt_tokens} or less"
    elif n_max is not None and need > n_max:
        fix += f" (the model reads at most {n_max} tokens: no larger context makes room for {need})"
    else:
        fix += f", or {more(need)}"
    return CapacityError(
        f"context length exceeded: the model was loaded with a context of {n_ctx} tokens, but the prompt is "
        f"{prompt_tokens} tokens and max_tokens is {max_tokens} ({need} > {n_ctx}). {fix}."
    )


def trained_context(llm: Any) -> int | None:
    """The most context a llama.cpp model takes (its training length): infer_load caps a reload there."""
    n: Any = getattr(getattr(llm, "_model", None), "n_ctx_train", None)  # llama-cpp-python's LlamaModel
    if not callable(n):
        return None
    trained: Any = n()
    return int(trained)
