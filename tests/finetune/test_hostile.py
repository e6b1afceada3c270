"""Hostile input to finetune_plan (issue #25, round 2): every refusal is a clear tool error naming the field, file
or row and what to change, never the SDK's bare "Error executing tool"; folders whose files link outside the
allowed roots are refused without reading those files. Plan-only: nothing trains, no weights are loaded."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.errors import InvalidInputError
from gpubox.tools.finetune import targets
from gpubox.tools.finetune.schemas import FinetuneRequest, ResolvedBase
from tests.conftest import call_err, has_gpu, requires_hf
from tests.finetune.conftest import DATASET, make_settings

pytestmark = pytest.mark.anyio
SECRET = "TOP-SECRET-OUTSIDE-CONTENT"


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    mcp = build_server(make_settings(tmp_path / "root"))
    async with Client(mcp) as c:
        yield c
    state_of(mcp).close()


async def plan_err(client: Client, **args: Any) -> str:
    args.setdefault("dataset", str(DATASET))
    return await call_err(client, "finetune_plan", **args)


def save_dataset(folder: Path, rows: list[dict[str, Any]]) -> list[str]:
    """A real datasets.save_to_disk folder; returns the names of the files in it."""
    import datasets  # the folder's requires_train checks it

    datasets.Dataset.from_list(rows).save_to_disk(str(folder))
    return sorted(p.name for p in folder.iterdir())


def tiny_model(folder: Path) -> Path:
    """An HF folder with a real (tiny) Llama config.json: enough for the plan's module-name check."""
    folder.mkdir(parents=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_hidden_layers": 1,
        "vocab_size": 64,
        "max_position_embeddings": 64,
    }
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


# --- case 4: files inside a dataset or model folder that link outside ----------------------------------------------


async def test_a_dataset_folder_whose_files_link_outside_is_refused_unread(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = tmp_path / "outside" / "ds"
    names = save_dataset(outside, [{"text": SECRET}, {"text": SECRET + " 2"}])
    linked = tmp_path / "root" / "ds" / "arrow_symlinked"
    linked.mkdir(parents=True)  # a real folder inside the root; only its files are links
    for name in names:
        (linked / name).symlink_to(outside / name)
    import datasets

    opened: list[str] = []
    monkeypatch.setattr(datasets, "load_from_disk", lambda path, **_: opened.append(path))
    msg = await plan_err(client, dataset=str(linked))
    assert "outside the allowed roots" in msg and "symlink" in msg
    assert any(f"'{n}'" in msg for n in names), msg  # the file is named
    assert SECRET not in msg and str(outside) not in msg
    assert opened == []  # the folder never reached datasets


async def test_a_dataset_folder_naming_data_files_outside_it_is_refused(client: Client, tmp_path: Path) -> None:
    outside = tmp_path / "outside" / "ds"
    save_dataset(outside, [{"text": SECRET}])
    folder = tmp_path / "root" / "ds"
    save_dataset(folder, [{"text": "fine"}])
    state = json.loads((folder / "state.json").read_text())
    arrow = state["_data_files"][0]["filename"]
    state["_data_files"][0]["filename"] = f"../../outside/ds/{arrow}"  # datasets joins it onto the folder
    (folder / "state.json").write_text(json.dumps(state))
    msg = await plan_err(client, dataset=str(folder))
    assert "state.json" in msg and "not a plain file name" in msg and SECRET not in msg


async def test_a_dataset_dict_naming_a_split_outside_it_is_refused(client: Client, tmp_path: Path) -> None:
    folder = tmp_path / "root" / "dd"
    save_dataset(folder / "train", [{"text": "fine"}])
    (folder / "dataset_dict.json").write_text(json.dumps({"splits": ["../../outside"]}))
    msg = await plan_err(client, dataset=str(folder))
    assert "dataset_dict.json" in msg and "split" in msg and "not a plain file name" in msg


async def test_a_model_folder_whose_weights_link_outside_is_refused(client: Client, tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "root" / "models" / "evil")
    secret = tmp_path / "outside" / "weights.safetensors"
    secret.parent.mkdir(parents=True)
    secret.write_text(SECRET)
    (model / "model.safetensors").symlink_to(secret)
    msg = await plan_err(client, model=str(model))
    assert "'model.safetensors'" in msg and "outside the allowed roots" in msg
    assert SECRET not in msg and str(secret) not in msg


async def test_a_sharded_model_index_naming_shards_outside_is_refused(client: Client, tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "root" / "models" / "sharded")
    index = {"weight_map": {"lm_head.weight": "/etc/passwd"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    msg = await plan_err(client, model=str(model))
    assert "model.safetensors.index.json" in msg and "not a plain file name" in msg


# --- case 6: what the SDK used to mask ------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [0, -1, 2**31, 100_000])
async def test_an_out_of_range_micro_batch_names_the_field(client: Client, batch: int) -> None:
    msg = await plan_err(client, per_device_train_batch_size=batch)
    assert "per_device_train_batch_size" in msg and "between 1 and 4096" in msg


@pytest.mark.parametrize("modules", [[], [f"m{i}" for i in range(65)]])
async def test_an_empty_or_overlong_target_list_names_the_field(client: Client, modules: list[str]) -> None:
    msg = await plan_err(client, lora_target_modules=modules)
    assert "lora_target_modules" in msg and "1 to 64" in msg


@pytest.mark.parametrize("field", ["dataset", "model"])
async def test_a_path_component_over_255_bytes_is_an_input_error(client: Client, field: str) -> None:
    msg = await plan_err(client, **{field: "sub/" + "a" * 300})
    assert field in msg and "300 bytes" in msg and "255" in msg


def write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


async def test_unparseable_dataset_files_name_the_file_and_the_line(client: Client, tmp_path: Path) -> None:
    root = tmp_path / "root"
    msg = await plan_err(client, dataset=write(root / "deep.jsonl", "[" * 100_000 + "\n"))
    assert "deep.jsonl line 1" in msg and "too deeply" in msg
    msg = await plan_err(client, dataset=write(root / "deep.json", "[" * 100_000))
    assert "deep.json" in msg and "too deeply" in msg
    msg = await plan_err(client, dataset=write(root / "big.jsonl", '{"text": "ok"}\n{"text": ' + "9" * 5000 + "}\n"))
    assert "big.jsonl line 2" in msg and "4300 digits" in msg
    msg = await plan_err(client, dataset=write(root / "long.csv", "text\nshort\n" + "x" * 140_000 + "\n"))
    assert "long.csv row 2" in msg and "131072" in msg and "JSONL" in msg


async def test_a_garbage_parquet_file_is_an_input_error(client: Client, tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")  # datasets' dependency, not a module of an extra in gpubox.extras.EXTRAS
    path = tmp_path / "root" / "garbage.parquet"
    path.write_bytes(os.urandom(4096))
    msg = await plan_err(client, dataset=str(path))
    assert "garbage.parquet is not a readable Parquet file" in msg


async def test_a_corrupt_arrow_folder_is_an_input_error(client: Client, tmp_path: Path) -> None:
    folder = tmp_path / "root" / "corrupt"
    names = save_dataset(folder, [{"text": "a"}, {"text": "b"}])
    arrow = next(n for n in names if n.endswith(".arrow"))
    (folder / arrow).write_bytes(b"not arrow at all" * 64)
    msg = await plan_err(client, dataset=str(folder))
    assert "not a readable datasets.save_to_disk folder" in msg and "save_to_disk" in msg


# --- case 8: plans that cannot run ----------------------------------------------------------------------------------


async def test_bf16_with_fp16_is_refused(client: Client) -> None:
    msg = await plan_err(client, bf16=True, fp16=True)
    assert "bf16=true and fp16=true" in msg and "one mixed precision" in msg


async def test_weight_format_is_one_of_a_fixed_set(client: Client) -> None:
    full = json.loads((await client.read_resource("gpubox://tools/finetune_plan")).contents[0].text)  # type: ignore[union-attr]
    schema = json.dumps(full["properties"]["weight_format"])
    assert "nf4_dq" in schema and "enum" in schema
    msg = await plan_err(client, weight_format="/proc/self/environ")
    assert "weight_format" in msg and "nf4_dq" in msg and "PATH=" not in msg
    msg = await plan_err(client, method="lora", weight_format="nf4")
    assert "weight_format 'nf4' does not go with method 'lora'" in msg and "bf16" in msg


async def test_more_processes_than_the_box_can_run_are_refused(client: Client) -> None:
    msg = await plan_err(client, num_processes=64)
    assert "num_processes=64" in msg and ("GPU" in msg if has_gpu() else "CPU core" in msg)


@requires_hf
async def test_target_modules_the_model_lacks_are_refused_with_the_real_names(client: Client, tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "root" / "models" / "tiny")
    msg = await plan_err(client, model=str(model), lora_target_modules=["no_such_module", "q_proj"])
    assert "'no_such_module' not found in tiny" in msg and "q_proj, up_proj, v_proj" in msg
    msg = await plan_err(client, model=str(model), lora_target_modules=["mlp"])
    assert "'mlp'" in msg and "cannot wrap" in msg


def test_the_target_check_matches_names_as_peft_does() -> None:
    base = ResolvedBase(name="m", path="/m", format="hf", hf_path="/m", hf_ready=False)
    modules = {"model.layers.0.self_attn.q_proj": True, "model.layers.0.mlp": False, "lm_head": True}
    ok = FinetuneRequest(dataset="d", lora_target_modules=["q_proj", "self_attn.q_proj", "lm_head"])
    assert targets.check(ok, base, modules) == []
    assert targets.check(FinetuneRequest(dataset="d", method="full", lora_target_modules=["x"]), base, {}) == []
    with pytest.raises(InvalidInputError, match="'proj' not found"):
        targets.check(FinetuneRequest(dataset="d", lora_target_modules=["proj"]), base, modules)  # suffix by "."


@pytest.mark.slow
@requires_hf
async def test_target_modules_are_checked_against_the_bundled_gguf(client: Client) -> None:
    msg = await plan_err(client, lora_target_modules=["no_such_module"])
    assert "not found in smollm2-135m-instruct" in msg and "q_proj" in msg


async def test_a_stored_plan_that_no_longer_validates_is_an_input_error(client: Client, tmp_path: Path) -> None:
    plans = tmp_path / "root" / "state" / "finetune" / "plans"
    plans.mkdir(parents=True, exist_ok=True)
    (plans / "0123abcd.json").write_text(json.dumps({"plan_id": "0123abcd", "request": {"weight_format": "x"}}))
    msg = await call_err(client, "finetune_launch", plan_id="0123abcd")
    assert "plan '0123abcd' no longer validates" in msg and "finetune_plan again" in msg


def test_real_save_to_disk_folders_still_load_with_the_checks_on(tmp_path: Path) -> None:
    from gpubox.tools.finetune import data

    root = tmp_path / "root"
    save_dataset(root / "ds", [{"text": "a"}, {"text": "b"}])
    assert data.load(root / "ds", [root]) == ("text", [{"text": "a"}, {"text": "b"}])
    import datasets

    split = datasets.Dataset.from_list([{"prompt": "p", "completion": "c"}])
    datasets.DatasetDict({"train": split, "test": split}).save_to_disk(str(root / "dd"))
    (root / "linked").symlink_to(root / "ds", target_is_directory=True)  # a link that stays inside the roots
    assert data.load(root / "dd", [root])[0] == "prompt_completion"
    assert data.load(root / "linked", [root])[1] == [{"text": "a"}, {"text": "b"}]


async def test_finetune_merge_refuses_a_base_folder_whose_files_link_outside(tmp_path: Path) -> None:
    from gpubox.tools.finetune.adapter import finetuner

    mcp = build_server(make_settings(tmp_path / "root"))
    ft = finetuner(state_of(mcp))
    base = tiny_model(tmp_path / "root" / "models" / "base-hf")  # a user's HF folder the job trained on
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "w.safetensors").write_text(SECRET)
    (base / "model.safetensors").symlink_to(tmp_path / "outside" / "w.safetensors")
    adapter = ft.adapters_dir / "ad"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    ft.store.create("abc1", "ad", "base-hf", "lora")
    ft.store.job_dir("abc1").mkdir(parents=True)
    hf = {"hf_path": str(base), "format": "hf", "path": str(base), "name": "base-hf"}
    (ft.store.job_dir("abc1") / "config.json").write_text(json.dumps({"adapter_dir": str(adapter), "base": hf}))
    ft.store.update("abc1", state="completed")
    try:
        async with Client(mcp) as client:
            msg = await call_err(client, "finetune_merge", job="abc1")
    finally:
        state_of(mcp).close()
    assert "'model.safetensors'" in msg and "outside the allowed roots" in msg and SECRET not in msg
