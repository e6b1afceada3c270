"""Compile a GBNF grammar once in a child process before the model in this process sees it.

llama.cpp parses a grammar when the sampler is built, and a parser bug (or a grammar this code's checks did not
foresee) ends the process that parses it: an "unknown escape" took the whole server down with SIGSEGV. So each
new grammar is first handed to `llama_sampler_init_grammar` in a short-lived child that loads only the model's
vocabulary; a crash or a refusal there costs one clear error, not the server. Grammars that passed are
remembered (by hash, bounded), so a client that repeats a schema pays the ~1 s check once.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
from collections import OrderedDict
from pathlib import Path

from gpubox.errors import InvalidInputError

PROBE_TIMEOUT_S = 60.0
REMEMBERED = 512

_CHILD = r"""
import ctypes, sys
try:  # libstdc++ global before llama.cpp's libraries load, as llama_import does in the server
    ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
except OSError:
    pass
import llama_cpp as L
grammar = sys.stdin.buffer.read()
L.llama_backend_init()
params = L.llama_model_default_params()
params.vocab_only = True
model = L.llama_model_load_from_file(sys.argv[1].encode(), params)
if not model:
    sys.exit(4)
sampler = L.llama_sampler_init_grammar(L.llama_model_get_vocab(model), grammar, b"root")
if not sampler:
    sys.exit(3)
L.llama_sampler_free(sampler)
L.llama_model_free(model)
"""

_passed: OrderedDict[str, None] = OrderedDict()
_lock = threading.Lock()


def check_in_child(grammar: str, model_path: Path, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise InvalidInputError unless llama.cpp builds a sampler from `grammar` in a child process."""
    key = hashlib.sha256(grammar.encode()).hexdigest()
    with _lock:
        if key in _passed:
            _passed.move_to_end(key)
            return
    _run_child(grammar, model_path, timeout_s)
    with _lock:
        _passed[key] = None
        while len(_passed) > REMEMBERED:
            _passed.popitem(last=False)


def _run_child(grammar: str, model_path: Path, timeout_s: float) -> None:
    env = {**os.environ, "PYTHONNOUSERSITE": "1"}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(model_path)],
            input=grammar.encode(),
            capture_output=True,
            timeout=timeout_s,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise InvalidInputError(
            f"json_schema: llama.cpp did not finish parsing the grammar within {timeout_s:.0f} s; simplify the schema"
        ) from None
    if proc.returncode == 0:
        return
    reason = _reason(proc.stderr.decode(errors="replace"))
    if proc.returncode == 4:  # the vocabulary itself did not load: not the schema's fault
        raise InvalidInputError(f"json_schema could not be checked: llama.cpp could not read {model_path}: {reason}")
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name if -proc.returncode in signal.valid_signals() else "a signal"
        reason = f"llama.cpp's grammar parser crashed ({name}){': ' + reason if reason else ''}"
    raise InvalidInputError(
        f"json_schema produced a grammar llama.cpp refuses: {reason or 'no reason given'}; simplify the schema "
        "(this was caught in a separate process; the server is unaffected)"
    )


def _reason(stderr: str) -> str:
    """llama.cpp's own complaint ("parse: error parsing grammar: unknown escape at ..."), if it printed one."""
    lines = [ln.strip() for ln in stderr.splitlines() if "grammar" in ln.lower() or "error" in ln.lower()]
    text = "; ".join(dict.fromkeys(lines))
    return text if len(text) <= 300 else text[:297] + "..."
