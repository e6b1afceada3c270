"""Model folders are contained file by file (issue #25, round 2): transformers opens every file in an HF folder by
name and follows symlinks, so a real folder inside the model dirs whose weights link outside is refused before
anything is read, naming the file and never its target."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.errors import InvalidInputError, PathNotAllowedError
from gpubox.settings import Settings
from gpubox.tools.inference.registry import check_model_folder, inside_roots
from tests.conftest import call_err

pytestmark = pytest.mark.anyio
SECRET = "TOP-SECRET-OUTSIDE-CONTENT"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[Any, Path, Path]]:
    models = tmp_path / "models"
    folder = models / "linked-hf"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    secret = tmp_path / "outside" / "weights.safetensors"
    secret.parent.mkdir()
    secret.write_text(SECRET)
    (folder / "model.safetensors").symlink_to(secret)
    mcp = build_server(Settings.load(state_dir=tmp_path / "state", model_dirs=[models], allowed_roots=[models]))
    yield mcp, folder, secret
    state_of(mcp).close()


async def test_infer_load_refuses_a_folder_whose_weights_link_outside(env: tuple[Any, Path, Path]) -> None:
    mcp, _folder, secret = env
    async with Client(mcp) as client:
        text = await call_err(client, "infer_load", name="linked-hf")
    assert "'model.safetensors'" in text and "outside the allowed roots" in text
    assert SECRET not in text and str(secret) not in text


def test_every_entry_is_checked_at_any_depth(env: tuple[Any, Path, Path], tmp_path: Path) -> None:
    _mcp, folder, secret = env
    roots = [folder.parent]
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").write_bytes(b"\0" * 8)
    assert inside_roots(folder, roots) == folder.resolve()
    (folder / "nested" / "deeper").mkdir(parents=True)
    (folder / "nested" / "deeper" / "tokenizer.json").symlink_to(secret)
    with pytest.raises(PathNotAllowedError, match=r"'nested/deeper/tokenizer\.json'") as err:
        check_model_folder(folder, roots)
    assert str(secret) not in str(err.value)


def test_a_shard_index_must_name_files_in_the_folder(env: tuple[Any, Path, Path]) -> None:
    _mcp, folder, _secret = env
    (folder / "model.safetensors").unlink()
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"lm_head.weight": "../../outside/weights.safetensors"}}))
    with pytest.raises(InvalidInputError, match="not a plain file name"):
        check_model_folder(folder, [folder.parent])
    index.write_text(json.dumps({"weight_map": {"lm_head.weight": "model-00001-of-00001.safetensors"}}))
    check_model_folder(folder, [folder.parent])
