"""AppState.service: each family's service built once, per-service build locks, close() during a build, and a
factory that asks for itself."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from gpubox.settings import Settings
from gpubox.state import AppState


class Svc:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def state(tmp_path: Path) -> AppState:
    return AppState(Settings.load(state_dir=tmp_path / "s"))


def test_a_service_built_while_close_runs_is_closed_and_not_kept(tmp_path: Path) -> None:
    st = state(tmp_path)
    entered, go = threading.Event(), threading.Event()
    built: list[Svc] = []
    errors: list[BaseException] = []

    def slow(_s: Settings) -> Svc:
        entered.set()
        assert go.wait(30)
        built.append(Svc())
        return built[-1]

    def build() -> None:
        try:
            st.service("slow", slow)
        except RuntimeError as exc:
            errors.append(exc)

    t = threading.Thread(target=build)
    t.start()
    assert entered.wait(30)
    st.close()  # the server shuts down while the build runs
    go.set()
    t.join(30)
    assert built and built[0].closed  # nothing left running (a model manager's reaper, a database)
    assert errors and "after the server closed" in str(errors[0])
    assert st.peek("slow") is None


def test_a_factory_that_asks_for_its_own_service_fails_at_once(tmp_path: Path) -> None:
    st = state(tmp_path)

    def cyclic(_s: Settings) -> Any:
        return st.service("a", lambda _x: st.service("b", lambda _y: st.service("a", lambda _z: Svc())))

    with pytest.raises(RuntimeError, match="asked for itself"):
        st.service("a", cyclic)
    assert st.service("a", lambda _s: Svc()).closed is False  # a later, sound build still works


def test_a_slow_build_holds_up_only_its_own_service(tmp_path: Path) -> None:
    st = state(tmp_path)
    entered, go = threading.Event(), threading.Event()

    def slow(_s: Settings) -> Svc:
        entered.set()
        assert go.wait(30)
        return Svc()

    t = threading.Thread(target=lambda: st.service("slow", slow))
    t.start()
    assert entered.wait(30)
    try:
        other = st.service("fast", lambda _s: Svc())  # returns while 'slow' is still being built
        assert st.peek("slow") is None and other is st.service("fast", lambda _s: Svc())
    finally:
        go.set()
        t.join(30)
    assert st.peek("slow") is not None
