"""The fine-tuning hand-off: adapters written under <state_dir>/finetune/adapters/<name>/ are listed as LoRA
adapters and load onto their base, which may be an HF folder under <state_dir>/finetune/base/ (gpubox's own
state dir, so it is accepted though it is neither a model dir nor an allowed root)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.bundled import smollm2_gguf
from gpubox.settings import Settings
from tests.conftest import call_err, call_ok, requires_hf, requires_train

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def make_base_and_adapter(state: Path) -> tuple[Path, Path]:
    """What the fine-tuning job leaves behind: an HF base folder and a peft adapter trained on it (for a test marked
    requires_hf and requires_train)."""
    import peft
    import torch
    import transformers

    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("needs the bundled SmolLM2 GGUF (gpubox[models])")
    base_dir = state / "finetune" / "base" / "smollm2-hf"
    adapter_dir = state / "finetune" / "adapters" / "ft-colours"
    src = dict(gguf_file=gguf.name)
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), **src)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), dtype=torch.bfloat16, quantization_config=transformers.GgufConfig(dequantize=True), **src
    )
    model.save_pretrained(str(base_dir))
    tok.save_pretrained(str(base_dir))
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    peft_model = peft.get_peft_model(model, cfg)
    peft_model.peft_config["default"].base_model_name_or_path = str(base_dir)  # absolute, as a trainer writes it
    with warnings.catch_warnings():  # peft looks the base name up on a hub to check the vocabulary
        warnings.simplefilter("ignore")
        peft_model.save_pretrained(str(adapter_dir))
    return base_dir, adapter_dir


@requires_hf
@requires_train
async def test_an_adapter_from_fine_tuning_is_listed_and_loads_onto_its_base_in_the_state_dir(tmp_path: Path) -> None:
    state = tmp_path / "state"
    base_dir, _ = make_base_and_adapter(state)
    roots = tmp_path / "elsewhere"
    roots.mkdir()
    mcp = build_server(Settings.load(state_dir=state, allowed_roots=[roots], infer_context_length=256))
    try:
        async with Client(mcp) as client:
            listed = {m["name"]: m for m in (await call_ok(client, "infer_models"))["models"]}
            entry = listed["ft-colours"]
            assert entry["format"] == "lora" and entry["base_model"] == str(base_dir)
            loaded = await call_ok(client, "infer_load", name="ft-colours")
            assert loaded["plan"]["backend"] == "transformers"
            assert loaded["model"]["loaded"]["adapter"] == "ft-colours"
            out = await call_ok(
                client, "infer_complete", model="ft-colours", prompt="The capital of France is", max_tokens=3
            )
            assert out["completion_tokens"] > 0
            assert (await call_ok(client, "infer_unload", name="ft-colours"))["unloaded"]
    finally:
        state_of(mcp).close()


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
