"""Streaming from transformers' generate: the model runs on a thread of its own while the caller reads its
TextIteratorStreamer. The reader wakes every STREAM_POLL_S, because a generate call that fails before its first
token may never end the stream, and gives the caller an error after STALL_S without a token."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from gpubox.errors import GpuboxError

STREAM_POLL_S = 1.0  # how often the transformers reader wakes to see whether the generate thread died
STALL_S = 600.0  # no token for this long: the generate thread is stuck; give the caller an error


def timed_streamer(tokenizer: Any) -> Any:
    """A TextIteratorStreamer that notes when generate hands it the first new token (`first_token`). Its text
    lags the tokens (it holds a word back until the word ends), so a short answer's first text came when the
    generation had ended: TTFT was the whole call and decode tok/s tokens over a few milliseconds."""
    from transformers import TextIteratorStreamer

    class Timed(TextIteratorStreamer):
        first_token: float | None = None

        def put(self, value: Any) -> None:
            if self.first_token is None and not self.next_tokens_are_prompt:
                self.first_token = time.perf_counter()
            super().put(value)

    # the timeout lets the reader notice a generate thread that died without ending the stream (read_stream)
    return Timed(tokenizer, skip_prompt=True, skip_special_tokens=True, timeout=STREAM_POLL_S)


def generate_into(model: Any, gen_kwargs: dict[str, Any], streamer: Any, out: dict[str, Any]) -> None:
    """The generate thread: the output ids, or the exception, land in `out`."""
    import torch

    try:
        with torch.inference_mode():
            out["ids"] = model.generate(**gen_kwargs)
    except BaseException as exc:  # handed to the caller by the reader's side; the streamer must still end
        out["err"] = exc
        streamer.end()


def read_stream(
    streamer: Any, worker: threading.Thread, cancel: threading.Event, on_text: Callable[[str], None]
) -> tuple[list[str], float | None]:
    """Hand each streamed piece to `on_text` until the stream ends or the generate thread is gone; returns the
    pieces and when the first came. A thread that yields nothing for STALL_S is cancelled and reported."""
    first: float | None = None
    parts: list[str] = []
    last = time.perf_counter()
    while True:
        try:
            piece = next(streamer)
        except StopIteration:
            break
        except queue.Empty:  # no token within STREAM_POLL_S: is the generate thread still there?
            if not worker.is_alive():
                break
            if time.perf_counter() - last > STALL_S:
                cancel.set()
                raise GpuboxError(f"transformers produced no token for {STALL_S:.0f} s; generation stopped") from None
            continue
        last = time.perf_counter()
        if piece:
            if first is None:
                first = time.perf_counter()
            parts.append(piece)
            on_text(piece)
    return parts, first


def cut_at_stop(text: str, stop: list[str]) -> str:
    """The text up to each stop string in turn: transformers keeps the stop string, llama.cpp drops it."""
    for s in stop:
        if s in text:
            text = text[: text.index(s)]
    return text
