"""What an in-process load really took (tools/inference/measure.py): measured around the backend's open, shown on
the model's holding in box_plan, warned about when above the reservation, and reserved by the next load of the
same configuration. Real loads of the bundled SmolLM2; where the figure must be known exactly, the reading of
the server's own memory (the unit's one input from outside) is scripted."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from gpubox import services
from gpubox.app import build_server, state_of
from gpubox.settings import Settings
from gpubox.tools.box.ledger import Ledger
from gpubox.tools.inference.measure import LoadMeasurements, with_last_load
from gpubox.tools.inference.schemas import LoadPlan
from tests.conftest import call_ok

pytestmark = pytest.mark.anyio
MODEL = "smollm2-135m-instruct"
OWNER = f"model {MODEL}"


def holding(box: dict[str, object]) -> dict[str, object]:
    return {h["owner"]: h for h in box["box"]["holdings"]}[OWNER]  # type: ignore[index]


@pytest.mark.slow
async def test_a_real_load_is_measured_on_its_holding(tmp_path: Path) -> None:
    mcp = build_server(Settings.load(state_dir=tmp_path / "state"))
    try:
        async with Client(mcp) as c:
            await call_ok(c, "infer_load", name=MODEL, context_length=512)
            held = holding(await call_ok(c, "box_plan"))
    finally:
        state_of(mcp).close()
    assert set(held["measured_gb"]) == {"host"} and held["measured_gb"]["host"] >= 0  # type: ignore[index]


@pytest.mark.slow
async def test_a_load_above_its_estimate_is_warned_about_and_its_next_load_reserves_what_it_took(
    tmp_path: Path,
) -> None:
    mcp = build_server(Settings.load(state_dir=tmp_path / "state"))
    readings = iter([{"host": 1.0}, {"host": 4.5}])  # the server's RSS before and after the backend's open
    services.models(state_of(mcp)).measured.read = lambda: next(readings)
    try:
        async with Client(mcp) as c:
            first = await call_ok(c, "infer_load", name=MODEL, context_length=512)
            box = await call_ok(c, "box_plan")
            estimate = first["plan"]["estimated_memory_gb"]
            assert estimate < 1.0 and holding(box)["measured_gb"] == {"host": 3.5}
            assert any(f"{OWNER} uses 3.50 GB on host" in w for w in box["box"]["warnings"]), box["box"]["warnings"]
            await call_ok(c, "infer_unload", name=MODEL)
            services.models(state_of(mcp)).measured.read = lambda: {"host": 1.0}  # the second load grows nothing
            again = await call_ok(c, "infer_load", name=MODEL, context_length=512)
            held = holding(await call_ok(c, "box_plan"))
            other_ctx = await call_ok(c, "box_plan", load=MODEL, context_length=1024)
    finally:
        state_of(mcp).close()
    assert again["plan"]["estimated_memory_gb"] == 3.5 and "what its last load took" in again["plan"]["reason"]
    assert held["devices"] == {"host": 3.5}  # reserved as measured, not as estimated
    # another configuration (another context) keeps its own estimate; it fits in what the loaded copy holds (a
    # reload frees that copy first)
    assert other_ctx["plan"]["estimated_memory_gb"] < 1.0 and other_ctx["admission"]["fits"], other_ctx


def test_only_a_load_alone_is_measured_and_only_a_figure_above_the_estimate_is_kept(tmp_path: Path) -> None:
    settings = Settings.load(state_dir=tmp_path / "state", memory_budget_gb=8)
    ledger, seq = Ledger(settings), iter([{"host": 2.0}, {"host": 2.2}])
    m = LoadMeasurements(settings.state_dir, read=lambda: next(seq))
    assert m.around(lambda: "backend", alone=lambda: False) == ("backend", None)  # another load ran meanwhile
    be, used = m.around(lambda: "backend", alone=lambda: True)
    assert be == "backend" and used == pytest.approx({"host": 0.2})
    ledger.reserve("model x", "inference", {"host": 1.0}, "infer_unload name='x'")
    m.settle(ledger, "model x", "cfg", {"host": 1.0}, {"host": 0.2})
    assert m.known("cfg") is None and ledger.holding("model x").measured_gb == {"host": 0.2}  # type: ignore[union-attr]
    m.settle(ledger, "model x", "cfg", {"host": 1.0}, {"host": 1.6, "cuda:0": 0.0})
    assert m.known("cfg") == {"host": 1.6}
    assert LoadMeasurements(settings.state_dir).known("cfg") == {"host": 1.6}  # kept across restarts
    plan = LoadPlan(
        backend="llama.cpp", device="cpu", n_gpu_layers=0, context_length=512, kv_cache_type="f16",
        free_vram_gb=None, estimated_memory_gb=1.0, fits=True, reason="cpu",
    )  # fmt: skip
    assert with_last_load(plan, {"host": 0.5}) is plan
    assert with_last_load(plan, m.known("cfg")).estimated_memory_gb == 1.6
    m.settle(ledger, "model x", "cfg", {"host": 1.0}, {"host": 0.9})  # judged against the estimate: forgotten
    assert m.known("cfg") is None
    m.store.path.unlink()
    m.store.path.mkdir()  # a file that cannot be written (even by root): the load stands, its figure is not kept
    m.settle(ledger, "model x", "cfg", {"host": 1.0}, {"host": 3.0})
    assert m.known("cfg") is None and ledger.holding("model x").measured_gb == {"host": 3.0}  # type: ignore[union-attr]
    m.store.path.rmdir()
    (settings.state_dir / "inference" / "load_memory.json").write_text("{broken")
    assert LoadMeasurements(settings.state_dir).known("cfg") is None  # a damaged file loses only the history
