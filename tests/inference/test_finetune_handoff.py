"""The fine-tuning hand-off's boundary: an adapter under <state_dir>/finetune/adapters/ whose base lies outside
the state dir and the allowed roots is refused without probing that base. (A real job's adapter loading onto its
base in the state dir is tested with the shared trained job in tests/finetune/test_jobs.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.settings import Settings
from tests.conftest import call_err

pytestmark = pytest.mark.anyio


async def test_an_adapter_whose_absolute_base_lies_outside_is_refused_without_probing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    secret = tmp_path / "secret-base"
    secret.mkdir()
    (secret / "config.json").write_text("{}")
    (secret / "model.safetensors").write_bytes(b"")
    for name, base in (("stray", secret), ("stray-missing", tmp_path / "no-such-base")):
        adapter = state / "finetune" / "adapters" / name
        adapter.mkdir(parents=True)
        (adapter / "adapter_config.json").write_text(f'{{"base_model_name_or_path": "{base}", "peft_type": "LORA"}}')
        (adapter / "adapter_model.safetensors").write_bytes(b"")
    mcp = build_server(Settings.load(state_dir=state, allowed_roots=[state]))
    try:
        async with Client(mcp) as client:
            texts = [await call_err(client, "infer_load", name=name) for name in ("stray", "stray-missing")]
        assert "is not among the models here" in texts[0]
        # the same answer whether or not the outside folder exists
        assert texts[0].replace(str(secret), "X").replace("stray", "S") == texts[1].replace(
            str(tmp_path / "no-such-base"), "X"
        ).replace("stray-missing", "S")
    finally:
        state_of(mcp).close()
