"""A reload with new settings that is refused leaves the loaded model as it was (tools/inference/manager.py):
it unloaded the working copy first, so the next request brought it back with defaults, unpinned."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.settings import Settings
from tests.conftest import call_err, call_ok

pytestmark = pytest.mark.anyio

MODEL = "smollm2-135m-instruct"


async def loaded(c: Client) -> dict[str, tuple[int, bool]]:
    models = (await call_ok(c, "infer_models"))["models"]
    return {m["name"]: (m["loaded"]["context_length"], m["loaded"]["pinned"]) for m in models if m["loaded"]}


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ({"backend": "transformers", "quantization": "4bit"}, "needs an HF folder"),  # refused before the unload
        ({"context_length": 8192}, "budget"),  # refused after it: no room for the larger context
    ],
    ids=["bad-arguments", "no-room"],
)
async def test_a_refused_reload_keeps_the_model_loaded_as_it_was(
    tmp_path: Path, change: dict[str, object], refusal: str
) -> None:
    # 1024 tokens of context fit in the budget (about 0.67 GB planned), 8192 do not (about 0.91 GB)
    settings = Settings.load(state_dir=tmp_path / "state", allowed_roots=[tmp_path], infer_memory_budget_gb=0.8)
    server = build_server(settings)
    try:
        async with Client(server) as c:  # type: ignore[arg-type]
            await call_ok(c, "infer_load", name=MODEL, context_length=1024, pin=True)
            assert await loaded(c) == {MODEL: (1024, True)}
            assert refusal in await call_err(c, "infer_load", name=MODEL, **change)
            assert await loaded(c) == {MODEL: (1024, True)}
    finally:
        state_of(server).close()
