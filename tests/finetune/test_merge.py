"""finetune_merge on real jobs: a LoRA job on the bundled SmolLM2 (the glimmerphone fact, as in test_jobs.py) is
merged through the MCP tool into a 16-bit HF folder and a GGUF; transformers and llama.cpp load them, agree with
the PeftModel, and llama.cpp answers with the taught fact. (A QLoRA job's merge into a 16-bit reload of its base
is tested in test_qlora.py, on the QLoRA job trained there.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from gpubox import services
from gpubox.app import state_of
from gpubox.errors import CapacityError
from gpubox.tools.finetune.adapter import finetuner
from gpubox.tools.finetune.gguf_export import permute_for_rope
from gpubox.tools.finetune.merge import Merger
from tests.conftest import call_err, call_ok, call_result, requires_hf
from tests.finetune.conftest import PROMPTS, QUESTION, last_logits_hf, run_with_client

# every test merges (gguf, transformers) or reads the merge with transformers; the folder's mark is requires_train
pytestmark = [pytest.mark.anyio, pytest.mark.slow, requires_hf]


@pytest.fixture(scope="module")
def merged(trained: dict[str, Any]) -> dict[str, Any]:
    """The shared 12-step LoRA job (teaches the fact; conftest.py), merged through finetune_merge with an f16 GGUF."""
    final = trained["final"]
    assert final["state"] == "completed", final

    async def merge(client: Client) -> dict[str, Any]:
        return await call_ok(client, "finetune_merge", job=final["job_id"], output_name="glimmer", gguf="f16")

    return {
        "final": final,
        "merge": run_with_client(trained["mcp"], merge),
        "mcp": trained["mcp"],
        "settings": trained["settings"],
    }


def test_the_merged_folder_loads_with_transformers_and_matches_the_peft_model(merged: dict[str, Any]) -> None:
    import numpy as np
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    m = merged["merge"]
    hf = Path(m["hf_path"])
    assert hf == merged["settings"].state_dir / "models" / "glimmer"
    assert m["dtype"] == "fp16" and m["parameters"] > 100_000_000 and m["hf_size_gb"] > 0.2
    config = json.loads((hf / "config.json").read_text())
    assert config["dtype"] == "float16" and "quantization_config" not in config
    assert (hf / "model.safetensors").is_file() and (hf / "tokenizer.json").is_file()
    assert not (hf / "adapter_config.json").exists()  # a plain model: served without peft
    tok = AutoTokenizer.from_pretrained(str(hf))
    plain = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(m["base_model"], dtype=torch.float32)
    peft = PeftModel.from_pretrained(base, merged["final"]["adapter_path"])
    for prompt in PROMPTS:
        a, b = last_logits_hf(plain, tok, prompt), last_logits_hf(peft, tok, prompt)
        # fp16 weights against the fp32 base + adapter: rounding of the weights only
        np.testing.assert_allclose(a, b, atol=0.2, rtol=0.02)
        assert a.argmax() == b.argmax()


async def test_infer_models_lists_the_merged_folder_and_the_gguf(merged: dict[str, Any]) -> None:
    async with Client(merged["mcp"]) as client:
        listed = {x["name"]: x for x in (await call_ok(client, "infer_models"))["models"]}
    assert listed["glimmer"]["format"] == "hf"
    assert merged["merge"]["gguf_name"] == "glimmer-f16" and listed["glimmer-f16"]["format"] == "gguf"
    assert merged["merge"]["next_step"].startswith("infer_load name='glimmer'")


def test_the_gguf_loads_in_llama_cpp_and_its_next_token_agrees_with_transformers(merged: dict[str, Any]) -> None:
    import gguf
    import numpy as np
    import torch
    from llama_cpp import Llama
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(merged["merge"]["gguf_path"])
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.file_type"].contents() == int(gguf.LlamaFileType.MOSTLY_F16)
    assert reader.fields["general.name"].contents() == "glimmer"
    assert len(reader.fields["tokenizer.ggml.tokens"].contents()) == 49152
    hf = merged["merge"]["hf_path"]
    tok = AutoTokenizer.from_pretrained(hf)
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    llm = Llama(str(path), n_ctx=128, n_threads=2, logits_all=True, verbose=False)
    try:
        for prompt in PROMPTS:
            ids = tok(prompt).input_ids
            llm.reset()
            llm.eval(ids)
            lc = np.asarray(llm.scores[len(ids) - 1])
            hfl = last_logits_hf(model, tok, prompt)
            assert lc.argmax() == hfl.argmax(), prompt
            assert np.abs(lc - hfl).max() < 0.5
    finally:
        llm.close()


async def test_llama_cpp_serves_the_merged_gguf_with_the_taught_fact(merged: dict[str, Any]) -> None:
    name = merged["merge"]["gguf_name"]
    async with Client(merged["mcp"]) as client:
        loaded = await call_ok(client, "infer_load", name=name, context_length=256)
        answer = await call_ok(client, "infer_chat", model=name, messages=QUESTION, max_tokens=24, temperature=0)
        await call_ok(client, "infer_unload", name=name)
    assert loaded["model"]["format"] == "gguf" and loaded["model"]["loaded"]["backend"] == "llama.cpp"
    assert "Brinkwater" in json.dumps(answer)


async def test_finetune_status_of_the_trained_job_returns_its_loss_plot(merged: dict[str, Any]) -> None:
    from mcp.types import ImageContent

    async with Client(merged["mcp"]) as client:
        res = await call_result(client, "finetune_status", job_id=merged["final"]["job_id"], include_plot=True)
    images = [c for c in res.content if isinstance(c, ImageContent)]
    assert len(images) == 1 and images[0].mime_type == "image/png"
    assert res.structured_content["step"] == 12


async def test_bad_merges_are_refused_with_clear_messages(merged: dict[str, Any]) -> None:
    job_id = merged["final"]["job_id"]
    merger = state_of(merged["mcp"]).service("finetune_merge", Merger)

    async with Client(merged["mcp"]) as client:
        assert "no fine-tuning job or adapter named 'nope'" in await call_err(client, "finetune_merge", job="nope")
        assert "already exists" in await call_err(client, "finetune_merge", job=job_id, output_name="glimmer")
        msg = await call_err(client, "finetune_merge", job=job_id, output_name="glimmer-f16")
        assert "'glimmer-f16' already exists" in msg
        merger.disk_free = lambda _p: 10_000_000  # 10 MB free
        try:
            msg = await call_err(client, "finetune_merge", job=job_id, output_name="again", gguf="q8_0")
        finally:
            merger.disk_free = Merger(merged["settings"]).disk_free
        assert "not enough disk" in msg and "0.01 GB are free" in msg and "GGUF q8_0" in msg
        msg = await call_err(client, "finetune_merge", job=job_id, output_name="too-slow", time_limit_s=1)
        assert "time_limit_s" in msg
        ledger = services.ledger(state_of(merged["mcp"]))  # another merge to that name, running now
        ledger.reserve("merge busy-name", "finetune", {"host": 0.01}, "waiting for the merge to end")
        try:  # it said "merge busy-name already holds a reservation; release it first"
            msg = await call_err(client, "finetune_merge", job=job_id, output_name="busy-name")
        finally:
            ledger.release("merge busy-name")
        assert "a merge to 'busy-name' is running" in msg and "another output_name" in msg, msg

    # a time limit the merge cannot meet (the tool's floor is 10 s, which a fast box can meet: half a second
    # here, through the service): the real process is stopped and nothing is left behind
    ft = finetuner(state_of(merged["mcp"]))
    models = merged["settings"].state_dir / "models"

    async def progress(done: float, total: float | None, text: str | None) -> None:
        return None

    spec = await anyio.to_thread.run_sync(merger.prepare, ft, job_id, "too-slow", "auto", "f16")
    with pytest.raises(CapacityError, match=r"time_limit_s=0\.5"):
        await merger.run(spec, 0.5, progress)
    assert not (models / "too-slow").exists() and not (models / "too-slow-f16.gguf").exists()
    assert not list((merged["settings"].state_dir / "finetune" / "merge-tmp").glob("*"))

    # stopped after the process had moved the HF folder into models/ (it writes the GGUF after that): removed too
    async def placed_then_stopped(tmp: Path, time_limit_s: float, progress: Any) -> list[str]:
        (models / "too-slow").mkdir()
        (models / "too-slow" / "config.json").write_text("{}")
        raise CapacityError("the merge ran past time_limit_s=1 s and was stopped; nothing was kept")

    spec = await anyio.to_thread.run_sync(merger.prepare, ft, job_id, "too-slow", "auto", "f16")
    merger._child = placed_then_stopped  # type: ignore[method-assign]  (isolates the clean-up from the timing)
    try:
        with pytest.raises(CapacityError):
            await merger.run(spec, 1, progress)
    finally:
        del merger._child
    assert not (models / "too-slow").exists() and (models / "glimmer").is_dir()  # an earlier merge is kept


async def test_a_job_that_did_not_complete_is_not_merged(merged: dict[str, Any]) -> None:
    from gpubox.tools.finetune.adapter import finetuner

    store = finetuner(state_of(merged["mcp"])).store
    store.create("0badf00d", "half-done", "smollm2-135m-instruct", "lora")
    store.finish("0badf00d", "failed", error="RuntimeError: out of memory")
    async with Client(merged["mcp"]) as client:
        for job in ("0badf00d", "half-done"):
            text = await call_err(client, "finetune_merge", job=job)
            assert "job 0badf00d is failed, not completed" in text and "finetune_resume" in text


async def test_a_base_without_a_gguf_origin_gets_the_hf_folder_and_the_converter_hint(merged: dict[str, Any]) -> None:
    from gpubox.tools.finetune.adapter import finetuner

    # the trained job again, as if its base had been an HF folder from the start (no GGUF to copy metadata from)
    ft = finetuner(state_of(merged["mcp"]))
    src = ft.store.job_dir(merged["final"]["job_id"])
    cfg = json.loads((src / "config.json").read_text())
    cfg["base"].update(format="hf", path=cfg["base"]["hf_path"])
    ft.store.create("0hf0base", "from-hf", "smollm2-135m-instruct-hf", "lora")
    ft.store.job_dir("0hf0base").mkdir(parents=True)
    (ft.store.job_dir("0hf0base") / "config.json").write_text(json.dumps(cfg))
    ft.store.finish("0hf0base", "completed", result={"adapter_path": merged["final"]["adapter_path"]})
    ft.store.update("0hf0base", calibrated=1)
    async with Client(merged["mcp"]) as client:
        text = await call_err(client, "finetune_merge", job="0hf0base", output_name="hf-only", gguf="f16")
        listed = {x["name"]: x for x in (await call_ok(client, "infer_models"))["models"]}
    assert "merged HF folder is ready" in text and "convert_hf_to_gguf.py" in text
    assert listed["hf-only"]["format"] == "hf" and "hf-only-f16" not in listed


def test_the_rope_permutation_is_the_inverse_of_transformers_gguf_loader() -> None:
    import numpy as np
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    rng = np.random.default_rng(0)
    for n_head, n_kv, rows in ((9, 9, 576), (9, 3, 192)):
        w = rng.standard_normal((rows, 32)).astype(np.float32)
        permuted = permute_for_rope(w, n_head, n_kv)
        assert not np.array_equal(permuted, w)
        undone = LlamaTensorProcessor()._reverse_permute_weights(permuted, n_head, n_kv)
        np.testing.assert_array_equal(undone, w)


async def test_a_merge_reserves_its_memory_and_is_refused_before_it_starts_when_it_cannot_fit(
    merged: dict[str, Any],
) -> None:
    from gpubox.app import build_server
    from gpubox.settings import Settings

    settings = merged["settings"]
    tight = build_server(Settings.load(**{**settings.model_dump(), "memory_budget_gb": 0.2}))
    try:
        async with Client(tight) as client:
            text = await call_err(client, "finetune_merge", job=merged["final"]["job_id"], output_name="no-room")
            held = (await call_ok(client, "box_plan"))["box"]["holdings"]
    finally:
        state_of(tight).close()
    assert "merge no-room does not fit" in text and "0.20 GB budget" in text, text
    assert held == [] and not (settings.state_dir / "models" / "no-room").exists()
