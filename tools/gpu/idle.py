"""Idle guard: stop a rented box that nobody is using, so an idle GPU does not burn the budget.

After `idle_shutdown_minutes` with no MCP request, no running work (inference, indexing, fine-tuning,
benchmarks) and the GPU idle, the guard warns (server log and MCP log notifications to connected clients),
waits `idle_grace_seconds`, re-checks, and runs `idle_command` once (argv split with shlex, no shell).
Any request or work during the grace period cancels the countdown.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from gpubox.settings import Settings
from gpubox.tools.gpu.session import SessionMeter

log = logging.getLogger("gpubox.idle")

State = Literal["watching", "warned", "fired", "dry_run_fired"]


@dataclass
class IdleDecision:
    state: State
    idle_s: float
    reason: str


def _run_command(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"failed: {exc}"
    return f"exit {done.returncode}"


class IdleGuard:
    """A small state machine stepped by `check()`; `start()` runs it in a daemon thread."""

    def __init__(
        self,
        meter: SessionMeter,
        settings: Settings,
        *,
        run: Callable[[list[str]], str] = _run_command,
    ) -> None:
        if settings.idle_shutdown_minutes is None:
            raise ValueError("IdleGuard needs idle_shutdown_minutes")
        self.meter = meter
        self.settings = settings
        self.run = run
        self.limit_s = settings.idle_shutdown_minutes * 60
        self.state: State = "watching"
        self.warned_at: float | None = None
        self.result: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _busy_reason(self) -> str | None:
        active = self.meter.active()
        if active:
            return "work running: " + ", ".join(active)
        if self.meter.gpu_idle() is False:
            return "GPU busy"
        return None

    def check(self) -> IdleDecision:
        now = self.meter.clock()
        idle_s = now - self.meter.last_request
        if self.state in ("fired", "dry_run_fired"):
            return IdleDecision(self.state, idle_s, self.result or "already fired")
        busy = self._busy_reason()
        if busy is not None or idle_s < self.limit_s:
            if self.state == "warned":
                log.info("idle shutdown cancelled: %s", busy or "a request arrived")
            self.state, self.warned_at = "watching", None
            return IdleDecision("watching", idle_s, busy or f"last request {idle_s / 60:.1f} min ago")
        argv = shlex.split(self.settings.idle_command or "")
        if self.state == "watching":
            self.state, self.warned_at = "warned", now
            msg = (
                f"gpubox: no request for {idle_s / 60:.1f} min and nothing running; in "
                f"{self.settings.idle_grace_seconds:.0f} s it will run {argv or '(no command)'}"
                + (" (dry run: nothing is executed)" if self.settings.idle_dry_run else "")
                + ". Any request cancels this."
            )
            log.warning(msg)
            self.meter.broadcast_warning(msg)
            return IdleDecision("warned", idle_s, msg)
        assert self.warned_at is not None
        if now - self.warned_at < self.settings.idle_grace_seconds:
            return IdleDecision("warned", idle_s, "grace period")
        if self.settings.idle_dry_run or not argv:
            self.state, self.result = "dry_run_fired", f"dry run: would run {argv}"
            log.warning(self.result)
        else:
            self.state = "fired"
            log.warning("idle shutdown: running %s", argv)
            self.result = f"ran {argv}: {self.run(argv)}"
            log.warning(self.result)
        return IdleDecision(self.state, idle_s, self.result)

    def start(self, interval_s: float | None = None) -> None:
        period = interval_s if interval_s is not None else min(30.0, max(1.0, self.settings.idle_grace_seconds / 4))

        def loop() -> None:
            while not self._stop.wait(period):
                try:
                    self.check()
                except Exception:  # the guard must never take the server down
                    log.exception("idle guard check failed")

        self._thread = threading.Thread(target=loop, name="gpubox-idle-guard", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
