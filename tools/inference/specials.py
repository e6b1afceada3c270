"""Chat content cannot write the chat template's control tokens.

llama-cpp-python renders a chat with the model's template and tokenizes the text with special-token parsing on
(transformers' tokenizer does the same), so a message holding `<|im_end|>\\n<|im_start|>system\\n...` became real
role markers: text an agent pasted from a web page or a file could speak as the system or the assistant. In each
chat message, every control token's text gets a WORD JOINER (U+2060) after its first character: it reads the same
and is tokenized as plain text. A raw prompt (infer_complete) is the caller's own template and keeps them.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

JOINER = "\u2060"
CONTROL = 3  # llama.cpp's token type for a tokenizer's special tokens (gguf.TokenType.CONTROL)


@functools.lru_cache(maxsize=16)
def _gguf_specials(path: str, stamp: tuple[int, int]) -> tuple[str, ...]:
    from gguf import GGUFReader

    reader = GGUFReader(path)
    tokens, types = reader.fields.get("tokenizer.ggml.tokens"), reader.fields.get("tokenizer.ggml.token_type")
    if tokens is None or types is None:
        return ()
    found = {
        bytes(tokens.parts[t]).decode("utf-8", "replace")
        for t, k in zip(tokens.data, types.data, strict=False)
        if int(types.parts[k][0]) == CONTROL
    }
    return _longest_first(found)


def _longest_first(found: set[str]) -> tuple[str, ...]:
    # longest first: '<|im_start|>' is defused whole before a shorter token inside it could be
    return tuple(sorted((s for s in found if len(s) > 1), key=len, reverse=True))


def specials_of(backend: Any) -> tuple[str, ...]:
    """The control tokens' texts of a loaded model, kept on the backend: from llama.cpp's vocabulary, its GGUF
    file when it runs in a process of its own, or its tokenizer (transformers)."""
    found: tuple[str, ...] | None = getattr(backend, "control_texts", None)
    if found is None:
        found = _read(backend)
        backend.control_texts = found
    return found


def _read(backend: Any) -> tuple[str, ...]:
    llm = getattr(backend, "llm", None)
    if llm is not None:  # in this process: ~50k attribute reads take milliseconds (the GGUF reader takes seconds)
        import llama_cpp

        m, control = llm._model, llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
        return _longest_first({m.token_get_text(i) for i in range(llm.n_vocab()) if m.token_get_attr(i) & control})
    path: Path | None = getattr(backend, "path", None)
    if backend.name == "llama.cpp" and path is not None:
        st = path.stat()
        return _gguf_specials(str(path), (st.st_mtime_ns, st.st_size))
    tokenizer = getattr(backend, "tokenizer", None)
    if tokenizer is None:
        return ()
    added = {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
    return _longest_first(added | set(tokenizer.all_special_tokens))


def defuse(messages: list[dict[str, str]], specials: tuple[str, ...]) -> list[dict[str, str]]:
    """`messages` with each control token's text broken by a WORD JOINER, so no content becomes a control token."""

    def text(content: str) -> str:
        for s in specials:
            if s in content:
                content = content.replace(s, s[0] + JOINER + s[1:])
        return content

    return [{**m, "content": text(m["content"])} if isinstance(m.get("content"), str) else m for m in messages]
