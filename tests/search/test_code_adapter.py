"""gpubox's code-tuned adapter for the bundled MiniLM: merged exactly, refused for a model it was not made for, and
better than plain MiniLM at matching a description to its code on code nobody here wrote and it never trained on
(the standard library's own docstrings)."""

from __future__ import annotations

import ast
import json
import sysconfig
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpubox.bundled import minilm_dir
from gpubox.tools.search import code_adapter
from gpubox.tools.search.embedder import Embedder

pytestmark = [pytest.mark.slow, pytest.mark.requires_models, pytest.mark.requires_search]

STDLIB_MODULES = ("json", "email", "http", "urllib", "logging", "argparse", "csv", "zipfile", "tarfile", "shutil")


def _model() -> Path:
    path = minilm_dir()
    assert path is not None
    return path


def _stdlib_pairs(limit: int) -> list[tuple[str, str]]:
    """(first docstring sentence, the function without its docstring) from the standard library, in file order."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for m in STDLIB_MODULES for p in [lib / f"{m}.py", *sorted((lib / m).glob("*.py"))])
    pairs: list[tuple[str, str]] = []
    for f in files:
        if not f.is_file():
            continue
        src = f.read_text(encoding="utf-8")
        lines = src.splitlines()
        for node in ast.walk(ast.parse(src)):
            if not isinstance(node, ast.FunctionDef) or not ast.get_docstring(node) or node.end_lineno is None:
                continue
            doc = " ".join(str(ast.get_docstring(node)).split("\n\n")[0].split())
            body = node.body[0]
            code = lines[node.lineno - 1 : body.lineno - 1] + lines[(body.end_lineno or body.lineno) : node.end_lineno]
            if len(doc.split()) >= 5 and len(code) >= 3:
                pairs.append((doc, f"{f.relative_to(lib)}\nfunction {node.name}\n" + textwrap.dedent("\n".join(code))))
    return pairs[:limit]


def _mrr(embedder: Embedder, pairs: list[tuple[str, str]]) -> float:
    docs = embedder.encode([c for _, c in pairs])
    total = 0.0
    for i, (query, _) in enumerate(pairs):
        scores: Any = docs @ embedder.encode_query(query)
        total += 1.0 / (1 + int((scores > scores[i]).sum()))
    return total / len(pairs)


def test_the_adapter_describes_code_better_than_plain_minilm_on_code_it_never_saw() -> None:
    pairs = _stdlib_pairs(150)
    assert len(pairs) == 150
    plain = _mrr(Embedder(_model(), max_seq_length=256), pairs)
    tuned = _mrr(Embedder(_model(), max_seq_length=256, adapter=True), pairs)
    assert tuned > plain + 0.02, (plain, tuned)


def test_the_merge_adds_exactly_the_low_rank_updates() -> None:
    import torch
    from safetensors.torch import load_file
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(_model()), device="cpu", local_files_only=True)
    bert = model[0].auto_model
    name = "encoder.layer.3.attention.self.query"
    before = bert.get_submodule(name).weight.detach().clone()
    assert code_adapter.merge(bert) == 36  # six linear layers in each of six blocks
    t = load_file(str(code_adapter.FILE))
    expected = before + t[f"{name}.lora_b"].float() @ t[f"{name}.lora_a"].float()
    assert torch.allclose(bert.get_submodule(name).weight, expected, atol=1e-6)


def test_an_adapter_for_another_shape_is_refused(tmp_path: Path) -> None:
    from transformers import BertConfig, BertModel

    config = json.loads((_model() / "config.json").read_text())
    small = BertModel(BertConfig(**{**config, "hidden_size": 128, "num_attention_heads": 2, "intermediate_size": 256}))
    with pytest.raises(ValueError, match="is 384x384, not"):
        code_adapter.merge(small)


def test_only_the_bundled_model_takes_the_adapter(tmp_path: Path) -> None:
    assert Embedder(_model(), adapter=True).adapter == code_adapter.NAME
    assert Embedder(_model()).adapter is None
    # another sentence-transformers folder of the same shape (a copy's config stands for it: nothing is loaded)
    other = tmp_path / "other-minilm"
    other.mkdir()
    (other / "config.json").write_text((_model() / "config.json").read_text())
    assert Embedder(other, adapter=True).adapter is None
    static = tmp_path / "m2v"
    static.mkdir()
    (static / "config.json").write_text(json.dumps({"model_type": "model2vec"}))
    assert Embedder(static, adapter=True).adapter is None


@pytest.mark.gpu
def test_the_merge_runs_on_the_gpu_where_the_model_lives() -> None:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(_model()), device="cuda", local_files_only=True)
    assert code_adapter.merge(model[0].auto_model) == 36
