"""Reading llama-cpp-python's streamed completions into `on_text`, with a prompt stop on `cancel` (the llama.cpp
side of backends.py; hf_stream.py is the transformers side)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass
class Read:
    parts: list[str] = field(default_factory=list)
    first: float | None = None  # perf_counter at the first text
    finish: Literal["stop", "length", "cancelled"] = "length"


def read_chunks(stream: Iterable[dict[str, Any]], on_text: Callable[[str], None], cancel: threading.Event) -> Read:
    """Read a llama-cpp-python completion or chat stream into `on_text`, ending it at once when `cancel` is set."""
    read = Read()
    for chunk in stream:
        choice: dict[str, Any] = chunk["choices"][0]
        text = choice.get("delta", {}).get("content") if "delta" in choice else choice.get("text")
        if text:
            if read.first is None:
                read.first = time.perf_counter()
            read.parts.append(text)
            on_text(text)
        if choice.get("finish_reason"):
            read.finish = "stop" if choice["finish_reason"] == "stop" else "length"
        if cancel.is_set():
            read.finish = "cancelled"
            break
    return read
