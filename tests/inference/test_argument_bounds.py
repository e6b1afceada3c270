"""Sampling arguments at their edges are refused by the tool's schema, before any model is touched: an empty stop
string (it ended every output at once), an overlong one (transformers builds its stop matcher in time that grows
faster than linearly, holding the model), a seed beyond the 32 bits llama.cpp takes (it was silently cut, and
torch.manual_seed raised a masked error)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.settings import Settings
from tests.conftest import call_err

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ({"stop": [""]}, "at least 1 character"),
        ({"stop": ["x" * 257]}, "at most 256 characters"),
        ({"seed": 2**32}, "less than or equal to 4294967295"),
    ],
)
async def test_sampling_arguments_beyond_their_bounds_are_refused_by_name(
    tmp_path: Path, args: dict[str, object], says: str
) -> None:
    mcp = build_server(Settings.load(state_dir=tmp_path / "state"))
    try:
        async with Client(mcp) as c:
            text = await call_err(c, "infer_complete", prompt="Hi", max_tokens=2, **args)
            assert says in text, text
            assert state_of(mcp).peek("inference") is None  # refused before the inference service was built
    finally:
        state_of(mcp).close()
