"""Child processes for work that must not run inside the server: one runner and one environment for them.

A merge that loads a 7B model, a benchmark kernel that hangs or aborts the interpreter: such work runs in a
fresh `python -m ...` whose failure costs only that process. `run_child` starts it in its own process group
(start_new_session), hands its stdout line by line to the caller, keeps the tail of its stderr, and stops the
whole group (the child and any helper it started) when the time limit passes, when the caller is cancelled or
when the child exits and leaves helpers behind: SIGTERM first, then SIGKILL, every wait bounded, nothing
blocking the event loop. The caller turns the `ChildResult` into its own messages.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc

log = logging.getLogger("gpubox.child")

# What every child gets on top of the server's environment (a copy: os.environ itself is never changed).
CHILD_ENV = {
    "HF_HUB_OFFLINE": "1",  # a child never downloads: models come from the box's own folders
    "TOKENIZERS_PARALLELISM": "false",  # tokenizers' thread pool warns (and can deadlock) across forks
    "PYTHONUNBUFFERED": "1",  # progress lines arrive as they are printed, not when a buffer fills
}
TERM_GRACE_S = 5.0  # after SIGTERM, how long the child may take to exit before SIGKILL
KILL_WAIT_S = 10.0  # after SIGKILL, how long to wait for the exit (a process stuck in a driver call may not die)
DRAIN_S = 5.0  # after the exit, how long to wait for output still in the pipes
MAX_LINE = 1 << 20  # a longer stretch without a newline is handed on as a line of its own
STDERR_TAIL = 20_000  # bytes of stderr kept
KEEP_LINES = 200  # stdout lines kept in the result
_POLL_S = (0.02, 0.5)  # first and longest interval between checks for the child's exit

LineHandler = Callable[[str], Awaitable[None]]


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child process: a copy of the server's, with CHILD_ENV and `extra` on top."""
    return {**os.environ, **CHILD_ENV, **extra}


def python_module(module: str, *args: str) -> list[str]:
    """argv that runs `module` with this server's interpreter (so the child sees the same packages); -P: the
    working directory, which `-m` would put first on the import path, cannot shadow a module the child imports."""
    return [sys.executable, "-P", "-m", module, *args]


def import_path() -> str:
    """The server's import path as PYTHONPATH for a child that must see what it sees (a venv, PYTHONPATH, an
    editable install), minus the working directory that `python -m` put first and `-P` keeps out."""
    try:
        here = {"", os.getcwd()}
    except OSError:  # the working directory was deleted: nothing on the path can be it
        here = {""}
    return os.pathsep.join(p for p in sys.path if p not in here)


@dataclass
class ChildResult:
    returncode: int | None  # negative: killed by that signal; None: it did not exit even after SIGKILL
    timed_out: bool  # the time limit passed and the group was stopped
    lines: list[str] = field(default_factory=list)  # the last KEEP_LINES lines of stdout
    stderr: str = ""  # the last STDERR_TAIL bytes of stderr ("" when stderr went to stdout)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


async def run_child(
    argv: Sequence[str],
    *,
    time_limit_s: float,
    on_line: LineHandler | None = None,
    stdin: bytes | None = None,
    stderr_to_stdout: bool = False,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    term_grace_s: float = TERM_GRACE_S,
) -> ChildResult:
    """Run `argv` in its own process group and wait for it, at most `time_limit_s` seconds.

    Each stdout line (decoded as UTF-8, without its newline) goes to `on_line` as it arrives and the last
    KEEP_LINES are kept; `stdin` is written to the child and then closed. On the time limit the group is
    stopped and the result says timed_out; on cancellation (or an exception from `on_line`) the group is stopped
    and the exception propagates. `env` defaults to child_env().
    """
    started = time.monotonic()
    proc = await anyio.open_process(
        list(argv),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if stderr_to_stdout else subprocess.PIPE,
        env=dict(env) if env is not None else child_env(),
        cwd=cwd,
        start_new_session=True,  # its own process group: one signal reaches every helper it starts
    )
    result = ChildResult(returncode=None, timed_out=False)
    try:
        with anyio.move_on_after(time_limit_s) as scope:
            await _collect(proc, result, on_line, stdin)
        result.timed_out = scope.cancelled_caught
    finally:
        with anyio.CancelScope(shield=True):
            await stop_group(proc, term_grace_s)
            await _close_streams(proc)
        result.returncode = proc.returncode
        result.elapsed_s = time.monotonic() - started
    return result


async def _collect(
    proc: anyio.abc.Process, result: ChildResult, on_line: LineHandler | None, stdin: bytes | None
) -> None:
    """Feed stdin, read stdout and stderr, return once the child has exited and its pipes are drained."""
    streams = [s for s in (proc.stdout, proc.stderr) if s is not None]
    drained = anyio.Event()
    open_streams = len(streams)
    failure: Exception | None = None
    err = bytearray()
    lines = _LineSplitter(result.lines, on_line)

    async def on_err(chunk: bytes) -> None:
        err.extend(chunk)
        del err[:-STDERR_TAIL]

    try:
        async with anyio.create_task_group() as tg:

            async def read(stream: anyio.abc.ByteReceiveStream, handle: Callable[[bytes], Awaitable[None]]) -> None:
                nonlocal open_streams, failure
                try:
                    async for chunk in stream:
                        await handle(chunk)
                except Exception as exc:  # the caller's line handler failed: stop, and raise it unwrapped after
                    failure = exc
                    tg.cancel_scope.cancel()
                    return
                open_streams -= 1
                if not open_streams:
                    drained.set()

            if proc.stdout is not None:
                tg.start_soon(read, proc.stdout, lines.feed)
            if proc.stderr is not None:
                tg.start_soon(read, proc.stderr, on_err)
            if proc.stdin is not None:
                tg.start_soon(_feed, proc.stdin, stdin or b"")
            await _exited(proc)
            # helpers the child left in its group would hold the pipes open (and run on unsupervised)
            signal_group(proc.pid, signal.SIGKILL)
            with anyio.move_on_after(DRAIN_S):
                await drained.wait()
            tg.cancel_scope.cancel()
        if failure is not None:
            raise failure
        await lines.flush()
    finally:
        result.stderr = err.decode("utf-8", "replace")


async def _feed(stream: anyio.abc.ByteSendStream, data: bytes) -> None:
    # a child that exits without reading its input is not an error of the runner: its exit status tells
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        await stream.send(data)
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        await stream.aclose()


class _LineSplitter:
    def __init__(self, keep: list[str], on_line: LineHandler | None) -> None:
        self.buf = b""
        self.keep = keep
        self.on_line = on_line

    async def feed(self, chunk: bytes) -> None:
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        if len(self.buf) > MAX_LINE:
            lines.append(self.buf)
            self.buf = b""
        for raw in lines:
            await self._line(raw)

    async def flush(self) -> None:
        if self.buf:
            raw, self.buf = self.buf, b""
            await self._line(raw)

    async def _line(self, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace").rstrip("\r")
        self.keep.append(line)
        del self.keep[:-KEEP_LINES]
        if self.on_line is not None:
            await self.on_line(line)


async def _exited(proc: anyio.abc.Process) -> None:
    """Wait for the child itself to exit. Not `proc.wait()`: on Python 3.11 that also waits until every pipe is
    closed, which a helper the child left running can put off for ever."""
    delay = _POLL_S[0]
    while proc.returncode is None:
        await anyio.sleep(delay)
        delay = min(delay * 1.5, _POLL_S[1])


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to the process group `pgid`; False when there is nothing left to signal (or no permission:
    a member that changed its user is out of reach, and the caller's bounded wait gives up on it)."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


async def stop_group(proc: anyio.abc.Process, term_grace_s: float = TERM_GRACE_S) -> None:
    """Stop `proc`'s process group: SIGTERM while the child runs, up to `term_grace_s` to exit, then SIGKILL to
    whatever is left, up to KILL_WAIT_S. Every wait is bounded; a child that outlives it is logged and left."""
    if proc.returncode is None and signal_group(proc.pid, signal.SIGTERM):
        with anyio.move_on_after(term_grace_s):
            await _exited(proc)
    signal_group(proc.pid, signal.SIGKILL)
    if proc.returncode is None:
        with anyio.move_on_after(KILL_WAIT_S):
            await _exited(proc)
    if proc.returncode is None:
        log.warning("child process %d did not exit %.0f s after SIGKILL; left behind", proc.pid, KILL_WAIT_S)


async def _close_streams(proc: anyio.abc.Process) -> None:
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(Exception):
                await stream.aclose()
