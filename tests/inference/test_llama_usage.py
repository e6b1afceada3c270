"""What a llama.cpp generation reports and how it samples (tools/inference/backends.LlamaBackend), on the bundled
SmolLM2-135M GGUF: prompt tokens with a cached prompt prefix, and fresh randomness for unseeded requests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpubox.bundled import smollm2_gguf
from gpubox.tools.inference.backends import GenOutput, GenParams, LlamaBackend

CHAT = [{"role": "user", "content": "Name three colours of the rainbow, one per line."}]


def gguf() -> Path:
    path = smollm2_gguf()
    assert path is not None
    return path


@pytest.fixture
def backend() -> Iterator[LlamaBackend]:
    be = LlamaBackend(gguf(), 512, 0, "f16", 1)
    try:
        yield be
    finally:
        be.close()


def run(be: LlamaBackend, p: GenParams, *, chat: bool = True, prompt: str = "The capital of France is") -> GenOutput:
    return be.generate(CHAT if chat else None, None if chat else prompt, p, lambda _t: None, threading.Event())


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "complete"])
def test_a_repeated_prompt_reports_all_its_tokens_though_llama_cpp_reused_its_cache(
    backend: LlamaBackend, chat: bool
) -> None:
    # the second request's prefix is in llama.cpp's cache, so it evaluates one token: usage must still say the
    # prompt's length (it said 1)
    p = GenParams(max_tokens=4, temperature=0.0, seed=1)
    first, second = run(backend, p, chat=chat), run(backend, p, chat=chat)
    assert first.prompt_tokens > 4
    assert second.prompt_tokens == first.prompt_tokens
    if not chat:
        assert first.prompt_tokens == backend.count("The capital of France is")


def test_unseeded_sampling_is_not_replayed_by_a_fresh_load_nor_steered_by_an_earlier_seed() -> None:
    # llama-cpp-python derives an unseeded request's seed from the last one: every fresh server replayed the
    # same "random" texts, and a client's seed=42 decided what the next unseeded client got
    p = GenParams(max_tokens=24, temperature=1.5, top_k=0, top_p=1.0, repeat_penalty=1.0)
    runs = []
    for _ in range(2):
        be = LlamaBackend(gguf(), 512, 0, "f16", 1)
        try:
            run(be, GenParams(max_tokens=4, temperature=1.0, seed=42), chat=False)
            runs.append([run(be, p, chat=False, prompt="Tell me a word:").text for _ in range(2)])
        finally:
            be.close()
    assert runs[0] != runs[1], runs
