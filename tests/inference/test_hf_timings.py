"""transformers' TextIteratorStreamer holds symbols back until the next space, so an answer made of symbols came
as one piece when generate had ended: TTFT was the whole call and decode tok/s six tokens over 0.3 ms (21,000
tok/s). The first token's time now comes from the streamer's put, not from the first text."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.conftest import requires_hf
from tests.finetune.conftest import hf_base  # noqa: F401  (the fixture: the real SmolLM2 as an HF folder)

pytestmark = [requires_hf, pytest.mark.slow]  # the fixture may dequantize the GGUF first


def test_timings_count_tokens_not_the_streamer_s_text_pieces(hf_base: Path) -> None:  # noqa: F811
    from gpubox.tools.inference.backends import GenParams, TransformersBackend

    backend = TransformersBackend(hf_base, None, None, 2048)
    pieces: list[str] = []
    out = backend.generate(
        None, "!" * 40, GenParams(max_tokens=6, temperature=0.0, seed=0), pieces.append, threading.Event()
    )
    assert out.completion_tokens == 6 and out.ttft_s is not None and out.decode_tps is not None
    assert out.ttft_s < out.total_s
    # decode tok/s leaves out the prefill, so it is above the call's average, but not by orders of magnitude
    assert out.decode_tps < 10 * out.completion_tokens / out.total_s, (out, pieces)
