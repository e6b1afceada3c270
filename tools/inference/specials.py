"""Chat content cannot write the chat template's control tokens.

llama-cpp-python renders a chat with the model's template and tokenizes the text with special-token parsing on
(transformers' tokenizer does the same), so a message holding `<|im_end|>\\n<|im_start|>system\\n...` became real
role markers: text an agent pasted from a web page or a file could speak as the system or the assistant. In each
chat message, every control token's text gets a WORD JOINER (U+2060) after its first character: it reads the same
and is tokenized as plain text. A raw prompt (infer_complete) is the caller's own template and keeps them. vLLM
renders and tokenizes a chat the same way: a chat routed to an engine gpubox runs is defused with the tokens of the
served folder's tokenizer files (of_served); an attached server's tokenizer is not known here.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

JOINER = "\u2060"
# Tokens a tokenizer splits out of any text although not marked special (llama.cpp USER_DEFINED, transformers'
# non-special added tokens) that read as structure: '<tool_call>', '<|im_start|>' in some ChatML conversions,
# '[INST]'. Markup-like tokens without '|' or '_' ('<table>' in Gemma) and whitespace runs are left as they are.
ROLE_LIKE = re.compile(r"<[^<>\s]*[|_][^<>\s]*>|\[/?[A-Z_]+\]")


def _longest_first(found: set[str]) -> tuple[str, ...]:
    # longest first: '<|im_start|>' is defused whole before a shorter token inside it could be
    return tuple(sorted((s for s in found if len(s) > 1), key=len, reverse=True))


def specials_of(backend: Any) -> tuple[str, ...]:
    """The texts of a loaded model's control tokens, kept on the backend: from llama.cpp's vocabulary (in this
    process, or asked of the process the model runs in) or from its tokenizer (transformers)."""
    found: tuple[str, ...] | None = getattr(backend, "control_texts", None)
    if found is None:
        found = _read(backend)
        backend.control_texts = found
    return found


def _read(backend: Any) -> tuple[str, ...]:
    ask = getattr(backend, "ask_control_texts", None)
    if ask is not None:  # a model in a process of its own
        return tuple(str(t) for t in ask())
    llm = getattr(backend, "llm", None)
    if llm is not None:  # ~50k attribute reads: milliseconds. llama.cpp's own types, after its load-time fixes
        import llama_cpp

        m = llm._model
        control, user = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL, llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
        texts = ((m.token_get_text(i), m.token_get_attr(i)) for i in range(llm.n_vocab()))
        return _longest_first({t for t, a in texts if a & control or (a & user and ROLE_LIKE.fullmatch(t))})
    tokenizer = getattr(backend, "tokenizer", None)
    if tokenizer is None:
        return ()
    added = tokenizer.added_tokens_decoder.values()
    found = {t.content for t in added if t.special or ROLE_LIKE.fullmatch(t.content)}
    return _longest_first(found | set(tokenizer.all_special_tokens))


@functools.lru_cache(maxsize=16)
def of_folder(folder: str, stamp: float | None = None) -> tuple[str, ...]:
    """The control-token texts of an HF folder's tokenizer (a model an engine serves), read from tokenizer.json
    and tokenizer_config.json without loading transformers; `stamp` (the files' mtime) keys the cache."""
    found: set[str] = set()
    for name, key in (("tokenizer.json", "added_tokens"), ("tokenizer_config.json", "added_tokens_decoder")):
        try:
            doc = json.loads((Path(folder) / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        tokens = doc.get(key) if isinstance(doc, dict) else None
        entries = tokens.values() if isinstance(tokens, dict) else tokens if isinstance(tokens, list) else []
        for t in entries:
            text = t.get("content") if isinstance(t, dict) else None
            if isinstance(text, str) and (t.get("special") or ROLE_LIKE.fullmatch(text)):
                found.add(text)
    return _longest_first(found)


def of_served(folder: str) -> tuple[str, ...]:
    """of_folder, read again when the tokenizer files change."""
    files = [Path(folder) / n for n in ("tokenizer.json", "tokenizer_config.json")]
    return of_folder(folder, max((f.stat().st_mtime for f in files if f.is_file()), default=None))


def defuse(messages: list[dict[str, str]], specials: tuple[str, ...]) -> list[dict[str, str]]:
    """`messages` with each control token's text broken by a WORD JOINER, so no content becomes a control token."""

    def text(content: str) -> str:
        for s in specials:
            if s in content:
                content = content.replace(s, s[0] + JOINER + s[1:])
        return content

    return [{**m, "content": text(m["content"])} if isinstance(m.get("content"), str) else m for m in messages]
